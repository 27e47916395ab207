//! The node redo log against the real daemon (issue 42, items 1, 2 and 6): what start-up does
//! with a damaged `shards/node.redo`, and what the process does when an fsync fails.
//!
//! **The damage matrix.** One data dir is prepared once (see [`Template`]): acknowledged SDK
//! writes, the last [`BURST`] of them landing in the log right before a kill -9. Each case
//! copies that dir, damages the copy's log and starts the daemon on it. The contract checked
//! for every case: the daemon EITHER starts and every acknowledged write reads back with its
//! bytes, OR it refuses (non-zero exit, no panic) with a line naming the log, saying
//! "Refusing to start" and what to do — it never starts with fewer writes. Each case also
//! names which of the two it must be.
//!
//! What cannot be told from an honest log is named, not hidden (see `redo/scan.rs`): damage
//! confined to the last append looks exactly like that append torn by a power cut, so a
//! flipped byte in the last record starts without that one write; and a log of exactly the
//! round before the node file's is what a crash between a checkpoint's durable commit and the
//! new round's marker leaves, so such a log starts without whatever the current round held.
//!
//! **Fsync failures.** `NOKV_TEST_FAIL_FSYNC=log:N` / `store:N` lets N fsyncs of the log / the
//! node file succeed and fails every later one with EIO; the daemon must log one ERROR naming
//! the file and the errno and exit with `EXIT_SYNC_FAILED`, and a restart without the fault
//! must bring back every write that was answered OK.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::OnceLock;

use nokv_client::Client;
use nokv_client::sdk::RetryPolicy;
use nokv_proto::v1 as pb;
use nokv_server::meta::fatal::EXIT_SYNC_FAILED;
use nokv_tests::{Daemon, files_under, pseudo_random_bytes};

const WS: &str = "ws";
/// Every daemon here runs without the periodic inventory: its start-up scan appends a batch
/// of its own every few milliseconds, which would interleave with (and follow) the writes
/// whose records the cases damage.
const ARGS: &[&str] = &["--inventory-interval", "off"];
/// Writes made right before the kill -9, each its own append (one client, one at a time).
const BURST: usize = 20;
const MIB: u64 = 1 << 20;
/// The on-disk framing of `meta/durability/format.rs`: magic u32, payload length u32, sequence u64, first
/// sequence of the append u64, checksum u64 (little-endian), then the payload.
const HEADER: u64 = 32;
const RECORD: u32 = 0x6e6b_7632;
const MARKER: u32 = 0x6e6b_726d;

// ---------------------------------------------------------------------------------------------
// Writes and reads through the SDK
// ---------------------------------------------------------------------------------------------

/// One acknowledged small file.
#[derive(Clone)]
struct Write {
    path: String,
    body: Vec<u8>,
}

impl std::fmt::Debug for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path)
    }
}

/// `n` distinct small files named `tag-NN.txt` of about `len` bytes, bodies pseudo-random
/// (so each record's payload can be told apart by its body).
fn files(tag: &str, n: usize, len: usize) -> Vec<Write> {
    let seed = tag
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(131) + u64::from(b));
    (0..n)
        .map(|i| Write {
            path: format!("{tag}-{i:02}.txt"),
            body: pseudo_random_bytes(seed << 8 | i as u64, len + i),
        })
        .collect()
}

/// Bodies of the small-file template: many records in the log's first MiB.
const SMALL: usize = 200;
/// Bodies of the large-file template: the burst's records run past the log's first MiB.
const LARGE: usize = 96 << 10;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// An SDK client of `d` that tries each call once: a write the daemon never answered (it
/// exited) fails at once instead of being retried against a dead endpoint.
fn client(rt: &tokio::runtime::Runtime, d: &Daemon) -> Client {
    rt.block_on(d.sdk()).with_retry(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    })
}

fn write(rt: &tokio::runtime::Runtime, c: &Client, w: &Write) -> Result<(), String> {
    rt.block_on(c.write(pb::WriteRequest {
        workspace: WS.into(),
        path: w.path.clone(),
        data: w.body.clone().into(),
        ..Default::default()
    }))
    .map(drop)
    .map_err(|e| e.to_string())
}

/// Writes every file of `ws`, each acknowledged before the next is sent.
fn write_all(rt: &tokio::runtime::Runtime, c: &Client, ws: &[Write]) {
    for w in ws {
        write(rt, c, w).unwrap_or_else(|e| panic!("write {}: {e}", w.path));
    }
}

/// The writes of `ws` that do not read back from `d` with their bytes, each with what was
/// read instead.
fn not_read_back(d: &Daemon, ws: &[Write]) -> Vec<String> {
    let rt = runtime();
    let c = rt.block_on(d.sdk());
    ws.iter()
        .filter_map(|w| match rt.block_on(c.read(WS, &w.path)) {
            Ok(r) if r.data == w.body => None,
            Ok(r) => Some(format!("{} (other bytes: {} read)", w.path, r.data.len())),
            Err(e) if e.is("NotFound") => Some(format!("{} (not found)", w.path)),
            Err(e) => panic!("read {}: {e}", w.path),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The log file, as the daemon frames it
// ---------------------------------------------------------------------------------------------

fn log_path(dir: &Path) -> PathBuf {
    dir.join("shards").join("node.redo")
}

/// One record found in the log.
#[derive(Debug, Clone)]
struct Rec {
    offset: u64,
    seq: u64,
    /// The first sequence of the append that wrote it.
    first: u64,
    payload: Vec<u8>,
}

/// The round marker at offset 0 and the records after it with consecutive sequences (the
/// checksum needs the round id, which only the node file holds: stale records of earlier
/// rounds behind the tail have lower sequences, so they never continue the run).
#[derive(Debug, Clone)]
struct LogView {
    len: u64,
    records: Vec<Rec>,
}

impl LogView {
    fn read(path: &Path) -> LogView {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(
            u32_at(0),
            MARKER,
            "{} starts with a round marker",
            path.display()
        );
        let start = u64_at(8);
        let mut records = Vec::new();
        let mut at = HEADER as usize;
        let mut last = start;
        while at + HEADER as usize <= bytes.len()
            && u32_at(at) == RECORD
            && u64_at(at + 8) == last + 1
        {
            let len = u32_at(at + 4) as usize;
            let body = at + HEADER as usize;
            let Some(payload) = bytes.get(body..body + len) else {
                break;
            };
            records.push(Rec {
                offset: at as u64,
                seq: u64_at(at + 8),
                first: u64_at(at + 16),
                payload: payload.to_vec(),
            });
            last += 1;
            at = body + len;
        }
        LogView {
            len: bytes.len() as u64,
            records,
        }
    }

    /// The index of the record whose payload carries `w`'s body.
    fn record_of(&self, w: &Write) -> Option<usize> {
        // The first bytes of a pseudo-random body are as good as the whole.
        let probe = &w.body[..w.body.len().min(64)];
        self.records
            .iter()
            .position(|r| r.payload.windows(probe.len()).any(|b| b == probe))
    }
}

// ---------------------------------------------------------------------------------------------
// The shared data dir
// ---------------------------------------------------------------------------------------------

/// A stopped data dir whose log holds a burst of acknowledged writes, each its own record.
struct Template {
    dir: PathBuf,
    /// Every acknowledged write, in order.
    acked: Vec<Write>,
    /// The writes of the last burst, all in the log (in order, maybe among the daemon's own).
    burst: Vec<Write>,
    log: LogView,
    /// The log as the first daemon left it (kill -9): two restarts ago.
    round_1: PathBuf,
    /// The log as the second daemon left it (killed at once after its start).
    round_2: PathBuf,
}

/// Small files, built once per test binary run under cargo's scratch dir for integration
/// tests (rebuilt from nothing every run).
fn template() -> &'static Template {
    static TEMPLATE: OnceLock<Template> = OnceLock::new();
    TEMPLATE.get_or_init(|| build_template("small", SMALL))
}

/// Like [`template`] with large small files: the log is more than 1 MiB long.
fn large_template() -> &'static Template {
    static TEMPLATE: OnceLock<Template> = OnceLock::new();
    TEMPLATE.get_or_init(|| build_template("large", LARGE))
}

fn build_template(name: &str, len: usize) -> Template {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("redo_log")
        .join(name);
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("data");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = runtime();
    let mut acked = Vec::new();

    // Daemon 1 (round 1): a few writes, kill -9; its log is kept aside.
    let d = Daemon::start_in(&dir, ARGS);
    let early = files("early", 5, len);
    write_all(&rt, &client(&rt, &d), &early);
    acked.extend(early);
    d.kill9();
    let round_1 = root.join("round-1.redo");
    std::fs::copy(log_path(&dir), &round_1).unwrap();

    // Daemon 2 begins round 2 at its start (its marker is durable before it listens).
    Daemon::start_in(&dir, ARGS).kill9();
    let round_2 = root.join("round-2.redo");
    std::fs::copy(log_path(&dir), &round_2).unwrap();

    // Daemon 3 begins round 3. A round also ends after ~1 s of writing (a checkpoint puts its
    // records into the node file and the log starts over), so a burst is repeated until one
    // lands in a single round: then every write of it is in the log and only there.
    let d = Daemon::start_in(&dir, ARGS);
    let c = client(&rt, &d);
    let warm_up = files("warm-up", 1, len);
    write_all(&rt, &c, &warm_up);
    acked.extend(warm_up);
    for attempt in 0..5 {
        let burst = files(&format!("burst{attempt}"), BURST, len);
        write_all(&rt, &c, &burst);
        acked.extend(burst.clone());
        let log = LogView::read(&log_path(&dir));
        // The daemon's own batches (sequence counters, empty batches) may come between and
        // after the writes; each write is one record, in order.
        let at: Vec<Option<usize>> = burst.iter().map(|w| log.record_of(w)).collect();
        if at.iter().any(Option::is_none) {
            continue;
        }
        let at: Vec<usize> = at.into_iter().flatten().collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "each write of the burst is one record, in order: {at:?}"
        );
        drop(c);
        d.kill9();
        let log = LogView::read(&log_path(&dir));
        assert!(
            log.records.len() > at[BURST - 1],
            "kill -9 keeps what was fsynced"
        );
        return Template {
            dir,
            acked,
            burst,
            log,
            round_1,
            round_2,
        };
    }
    panic!("no burst of {BURST} writes landed in one round of the log in 5 attempts");
}

// ---------------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------------

/// What a damaged start must come to.
#[derive(Debug)]
enum Expect {
    /// Refused, naming the log.
    Refused,
    /// Starts; every acknowledged write reads back except (at most) these, which cannot be
    /// told from an honest shorter log (named in each case).
    Starts { may_lose: Vec<Write> },
}

impl Expect {
    fn starts_with_all() -> Expect {
        Expect::Starts { may_lose: vec![] }
    }
}

/// What a start came to.
#[derive(Debug)]
enum Outcome {
    Refused,
    /// Started; these acknowledged writes did not read back.
    Started {
        lost: Vec<String>,
    },
}

/// Copies `from` (a stopped data dir) to a fresh directory.
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for f in files_under(from) {
        let dest = to.path().join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dest).unwrap();
    }
    to
}

/// Starts the daemon on `dir` (whose log was damaged), checks the contract common to every
/// case, and says what happened. A refusal must change nothing: the log is as it was left.
fn start_damaged(dir: &Path, acked: &[Write], case: &str) -> Outcome {
    let log = log_path(dir);
    let before = std::fs::metadata(&log).ok().map(|m| m.len());
    // Its first MiB (a 2 GiB log is not read whole).
    let head = |p: &Path| {
        let mut b = Vec::new();
        let f = std::fs::File::open(p).ok()?;
        std::io::Read::read_to_end(&mut std::io::Read::take(f, MIB), &mut b).ok()?;
        Some(b)
    };
    let head_before = head(&log);
    match Daemon::try_start_in_with_env(dir, ARGS, &[]) {
        Ok(d) => {
            let lost = not_read_back(&d, acked);
            assert!(d.terminate().success(), "{case}: graceful stop");
            Outcome::Started { lost }
        }
        Err((status, stdout, stderr)) => {
            assert_refusal(case, &log, status, &stdout, &stderr);
            assert_eq!(
                std::fs::metadata(&log).ok().map(|m| m.len()),
                before,
                "{case}: a refused start leaves the log as it was"
            );
            assert!(
                head(&log) == head_before,
                "{case}: a refused start leaves the log as it was"
            );
            Outcome::Refused
        }
    }
}

#[track_caller]
fn assert_refusal(case: &str, log: &Path, status: ExitStatus, stdout: &str, stderr: &str) {
    assert!(
        !status.success(),
        "{case}: exit status {status}\nstderr: {stderr}"
    );
    assert!(!stdout.contains("listening"), "{case}: stdout: {stdout}");
    assert!(!stderr.contains("panicked"), "{case}: stderr: {stderr}");
    let canonical = std::fs::canonicalize(log.parent().unwrap())
        .unwrap()
        .join("node.redo");
    let line = stderr
        .lines()
        .find(|l| {
            l.contains(&canonical.display().to_string()) || l.contains(&log.display().to_string())
        })
        .unwrap_or_else(|| panic!("{case}: no line names {}\nstderr: {stderr}", log.display()));
    for says in ["Refusing to start", "--accept-loss"] {
        assert!(
            line.contains(says),
            "{case}: the refusal says {says:?}: {line}"
        );
    }
}

/// A damage done to a copy's log file.
type Damage = Box<dyn Fn(&Path)>;

/// Runs every case on its own copy of the small-file template.
fn run(cases: Vec<(&str, Damage, Expect)>) {
    run_on(template(), cases)
}

/// Runs every case on its own copy of `t` and asserts its expected outcome.
fn run_on(t: &Template, cases: Vec<(&str, Damage, Expect)>) {
    for (case, damage, expect) in cases {
        let copy = copy_dir(&t.dir);
        damage(&log_path(copy.path()));
        let outcome = start_damaged(copy.path(), &t.acked, case);
        eprintln!("{case}: expected {expect:?}, got {outcome:?}");
        match (&expect, &outcome) {
            (Expect::Refused, Outcome::Refused) => {}
            (Expect::Starts { may_lose }, Outcome::Started { lost }) => {
                let allowed: Vec<&str> = may_lose.iter().map(|w| w.path.as_str()).collect();
                let beyond: Vec<&String> = lost
                    .iter()
                    .filter(|l| !allowed.iter().any(|a| l.starts_with(&format!("{a} "))))
                    .collect();
                assert!(
                    beyond.is_empty(),
                    "{case}: started with fewer acknowledged writes than allowed (may lose \
                     {allowed:?}): lost {beyond:?}"
                );
            }
            (Expect::Refused, Outcome::Started { lost }) => panic!(
                "{case}: expected a refusal naming the log, but the daemon started; acknowledged \
                 writes lost: {} of {}: {lost:?}",
                lost.len(),
                t.acked.len()
            ),
            (Expect::Starts { .. }, Outcome::Refused) => {
                panic!("{case}: expected a start, but the daemon refused")
            }
        }
    }
}

fn set_len(len: u64) -> Damage {
    Box::new(move |log: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(log)
            .unwrap()
            .set_len(len)
            .unwrap()
    })
}

/// XORs the byte at `at` with `mask`.
fn flip(at: u64, mask: u8) -> Damage {
    Box::new(move |log: &Path| {
        let mut bytes = std::fs::read(log).unwrap();
        bytes[at as usize] ^= mask;
        std::fs::write(log, bytes).unwrap();
    })
}

/// The middle byte of record `r`'s payload.
fn payload_middle(r: &Rec) -> u64 {
    r.offset + HEADER + r.payload.len() as u64 / 2
}

// ---------------------------------------------------------------------------------------------
// The damage matrix
// ---------------------------------------------------------------------------------------------

/// The control case: without damage, kill -9 loses nothing (so a refusal or a loss below is
/// the damage's doing, not the crash's).
#[test]
fn an_undamaged_log_after_kill_9_brings_back_every_acknowledged_write() {
    run(vec![(
        "undamaged",
        Box::new(|_: &Path| {}),
        Expect::starts_with_all(),
    )]);
}

/// Missing, emptied, zeroed or cut (at any length that is not a multiple of 1 MiB): the node
/// file records the round the log must hold, so each is refused.
#[test]
fn a_deleted_emptied_zeroed_or_cut_log_is_refused_naming_it() {
    let t = template();
    let mid = &t.log.records[t.log.records.len() / 2];
    let mid_record = mid.offset + HEADER / 2 + mid.payload.len() as u64 / 2;
    let mut cases: Vec<(&str, Damage, Expect)> = vec![
        (
            "deleted",
            Box::new(|log: &Path| std::fs::remove_file(log).unwrap()),
            Expect::Refused,
        ),
        (
            "zeroed",
            Box::new(|log: &Path| {
                let len = std::fs::metadata(log).unwrap().len();
                std::fs::write(log, vec![0u8; len as usize]).unwrap()
            }),
            Expect::Refused,
        ),
        ("truncated at 0", set_len(0), Expect::Refused),
        ("cut mid-record", set_len(mid_record), Expect::Refused),
    ];
    // Seeded "random" cut points over the whole file, none a multiple of 1 MiB.
    let random: Vec<u64> = pseudo_random_bytes(42, 24)
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()) % (t.log.len - 1) + 1)
        .filter(|at| at % MIB != 0)
        .collect();
    let names: Vec<String> = random.iter().map(|at| format!("cut at {at}")).collect();
    for (at, name) in random.iter().zip(&names) {
        cases.push((name, set_len(*at), Expect::Refused));
    }
    run(cases);
}

/// A bad record followed by valid records that later appends wrote (after the bad one was
/// acknowledged) is damage, not a torn tail: refused.
#[test]
fn a_damaged_first_or_middle_record_is_refused_naming_the_log() {
    let t = template();
    let records = &t.log.records;
    let first = &records[0];
    let mid = &records[records.len() / 2];
    run(vec![
        (
            "a byte of the first record flipped",
            flip(payload_middle(first), 0x01),
            Expect::Refused,
        ),
        (
            "a byte of a middle record flipped",
            flip(payload_middle(mid), 0x80),
            Expect::Refused,
        ),
        (
            "a middle record's sequence flipped",
            flip(mid.offset + 8, 0x02),
            Expect::Refused,
        ),
        (
            "a middle record's checksum flipped",
            flip(mid.offset + 24, 0x10),
            Expect::Refused,
        ),
    ]);
}

/// A log two rounds behind the node file (copied aside, then two restarts) is refused: its
/// marker is neither the file's round nor the one before.
#[test]
fn a_stale_log_from_an_earlier_round_is_refused_naming_it() {
    let t = template();
    let stale = t.round_1.clone();
    run(vec![(
        "the log of two rounds ago",
        Box::new(move |log: &Path| {
            std::fs::copy(&stale, log).unwrap();
        }),
        Expect::Refused,
    )]);
}

/// A 2 GiB (sparse) log is more than any log nokv writes: refused without being read.
#[test]
fn a_two_gib_log_is_refused_naming_it() {
    run(vec![(
        "a 2 GiB sparse log",
        set_len(2 << 30),
        Expect::Refused,
    )]);
}

/// Named, not hidden: a flipped byte in the LAST record looks exactly like the last append
/// torn by a power cut (nothing valid follows it), so the daemon starts without that one
/// write — every other acknowledged write must read back.
#[test]
fn damage_confined_to_the_last_append_starts_without_only_that_write() {
    let t = template();
    let last = t.log.records.last().unwrap();
    // The writes whose records the last append wrote (usually the burst's last write; none
    // if the daemon's own batch came last).
    let last_append: Vec<Write> = t
        .acked
        .iter()
        .filter(|w| {
            t.log
                .record_of(w)
                .is_some_and(|i| t.log.records[i].seq >= last.first)
        })
        .cloned()
        .collect();
    eprintln!("the last append holds {last_append:?}");
    run(vec![(
        "a byte of the last record flipped (indistinguishable from a torn last append)",
        flip(payload_middle(last), 0x04),
        Expect::Starts {
            may_lose: last_append,
        },
    )]);
}

/// Named, not hidden: a log cut at exactly 1 MiB (the unit it grows by) looks like one whose
/// last append, growing it, was torn by a power cut. The scan cannot tell the two apart, so
/// the daemon starts without every write whose record lay past the cut — not only the last
/// append's: the cut here goes through an earlier one, and every later append goes with it.
#[test]
fn a_log_cut_at_a_mebibyte_boundary_starts_without_the_writes_past_the_cut() {
    let t = large_template();
    assert!(t.log.len > MIB, "the large burst runs past the first MiB");
    let past_cut: Vec<Write> = t
        .burst
        .iter()
        .filter(|w| {
            let r = &t.log.records[t.log.record_of(w).unwrap()];
            r.offset + HEADER + r.payload.len() as u64 > MIB
        })
        .cloned()
        .collect();
    assert!(
        past_cut.len() > 1,
        "the cut goes through an append that is not the last"
    );
    eprintln!(
        "a cut at 1 MiB: {} appends past it may be lost",
        past_cut.len()
    );
    run_on(
        t,
        vec![(
            "cut at 1 MiB (indistinguishable from a torn growing append)",
            set_len(MIB),
            Expect::Starts { may_lose: past_cut },
        )],
    );
}

/// A log of exactly the round before the node file's is what a crash between a checkpoint's
/// durable commit and the new round's marker leaves; it is told from a copy of that log taken
/// earlier by the note the old round writes in its log, before that commit, announcing the new
/// round. The copy put back here was taken before daemon 3's open announced round 3: refused
/// (accepting it would lose every write of the current round).
#[test]
fn a_log_of_the_previous_round_copied_before_the_current_round_began_is_refused() {
    let t = template();
    let stale = t.round_2.clone();
    run(vec![(
        "the log of the previous round",
        Box::new(move |log: &Path| {
            std::fs::copy(&stale, log).unwrap();
        }),
        Expect::Refused,
    )]);
}

/// `nokv-server recover`: without `--accept-loss` it reports and changes nothing (exit 1);
/// with it, it keeps every write before the damage, names the sequence numbers it drops (the
/// damaged record's through the last one behind it), moves the log aside, and the daemon then
/// starts with exactly the writes before the damage.
#[test]
fn recover_with_accept_loss_keeps_the_writes_before_the_damage_and_names_what_it_drops() {
    let t = template();
    let records = &t.log.records;
    let burst_at: Vec<usize> = t
        .burst
        .iter()
        .map(|w| t.log.record_of(w).unwrap())
        .collect();
    let damaged = burst_at[BURST / 2];
    let copy = copy_dir(&t.dir);
    let data = copy.path().to_str().unwrap().to_string();
    flip(payload_middle(&records[damaged]), 0x10)(&log_path(copy.path()));
    let log_before = std::fs::read(log_path(copy.path())).unwrap();

    let dry = nokv_tests::server_command(&["recover", "--data-dir", &data, "--json"]);
    assert_eq!(dry.status, 1, "a loss not accepted: {}", dry.stderr);
    let report = dry.json();
    assert_eq!(report["applied_changes"], false);
    assert!(
        report["problem"]
            .as_str()
            .unwrap()
            .contains("damaged at offset")
    );
    assert_eq!(
        std::fs::read(log_path(copy.path())).unwrap(),
        log_before,
        "a dry run changes nothing"
    );

    let done =
        nokv_tests::server_command(&["recover", "--data-dir", &data, "--accept-loss", "--json"]);
    assert_eq!(done.status, 0, "{}", done.stderr);
    let report = done.json();
    assert_eq!(report["applied_changes"], true);
    assert_eq!(report["dropped_from"], records[damaged].seq);
    assert!(report["dropped_through"].as_u64().unwrap() >= records.last().unwrap().seq);
    let aside = PathBuf::from(report["moved_to"].as_str().unwrap());
    assert_eq!(
        std::fs::read(&aside).unwrap(),
        log_before,
        "the damaged log kept aside"
    );

    let d = Daemon::start_in(copy.path(), ARGS);
    let kept: Vec<Write> = t
        .acked
        .iter()
        .filter(|w| t.log.record_of(w).is_none_or(|r| r < damaged))
        .cloned()
        .collect();
    assert!(
        not_read_back(&d, &kept).is_empty(),
        "every write before the damage"
    );
    let dropped: Vec<Write> = t
        .burst
        .iter()
        .filter(|w| t.log.record_of(w).is_some_and(|r| r >= damaged))
        .cloned()
        .collect();
    assert_eq!(
        not_read_back(&d, &dropped).len(),
        dropped.len(),
        "the dropped writes, as reported"
    );
}

// ---------------------------------------------------------------------------------------------
// Fsync failures
// ---------------------------------------------------------------------------------------------

/// Starts a daemon on `dir` with the fsync fault `spec`, writes files one at a time until a
/// write is not answered OK (or `bound` writes were answered, which fails the test), and
/// returns the daemon, the acknowledged writes and the error of the first write that was not.
fn write_until_refused(dir: &Path, spec: &str, bound: usize) -> (Daemon, Vec<Write>, String) {
    let d = Daemon::start_in_with_env(dir, ARGS, &[("NOKV_TEST_FAIL_FSYNC", spec)]);
    write_on_until_refused(d, spec, bound)
}

fn write_on_until_refused(d: Daemon, spec: &str, bound: usize) -> (Daemon, Vec<Write>, String) {
    let rt = runtime();
    let c = client(&rt, &d);
    let mut acked = Vec::new();
    for w in files(&format!("fsync-{}", spec.replace(':', "-")), bound, SMALL) {
        match write(&rt, &c, &w) {
            Ok(()) => acked.push(w),
            Err(e) => return (d, acked, e),
        }
    }
    panic!("{bound} writes were acknowledged with {spec}: the fault never fired");
}

/// Asserts the daemon ended with `EXIT_SYNC_FAILED` and exactly one ERROR line, naming `file`
/// and the errno.
#[track_caller]
fn assert_fsync_exit(d: Daemon, file: &Path) {
    let (status, _, stderr) = d.wait_for_exit();
    assert_eq!(
        status.code(),
        Some(EXIT_SYNC_FAILED),
        "{status}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one ERROR line\nstderr: {stderr}");
    let canonical = std::fs::canonicalize(file).unwrap();
    assert!(
        errors[0].contains(&canonical.display().to_string())
            || errors[0].contains(&file.display().to_string()),
        "the ERROR names {}: {}",
        file.display(),
        errors[0]
    );
    assert!(
        errors[0].contains("Input/output error") && errors[0].contains("os error 5"),
        "the ERROR names the errno: {}",
        errors[0]
    );
}

/// Restarts on `dir` without the fault; every acknowledged write reads back.
#[track_caller]
fn assert_all_read_back(dir: &Path, acked: &[Write]) {
    let d = Daemon::start_in(dir, ARGS);
    assert_eq!(not_read_back(&d, acked), Vec::<String>::new());
    let (status, _, stderr) = d.terminate_collecting_output();
    assert!(status.success(), "{status}\nstderr: {stderr}");
}

/// The open of a new data dir fsyncs the log (its round's marker, and the daemon's own first
/// batches, whose number varies with start-up's background work); then one fsync per write
/// (one client, one write at a time). `log:N` is tried from N = 10 up, each on a new data dir:
/// every run must exit 74 with one ERROR naming the log, before or after some writes were
/// acknowledged; the first N that lets writes be acknowledged must bring all of them back.
#[test]
fn a_failed_fsync_of_the_redo_log_ends_the_process_and_the_restart_keeps_every_acknowledged_write()
{
    for n in (10..=100).step_by(10) {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("log:{n}");
        let (d, acked, error) = write_until_refused(dir.path(), &spec, 1000);
        eprintln!("{spec}: {} acknowledged, then: {error}", acked.len());
        assert!(
            acked.len() < n,
            "one log fsync per acknowledged write: {} acknowledged with {spec}",
            acked.len()
        );
        assert_fsync_exit(d, &log_path(dir.path()));
        if !acked.is_empty() {
            assert_all_read_back(dir.path(), &acked);
            return;
        }
    }
    panic!("no write was acknowledged before the log's 100th fsync");
}

/// The node file is fsynced by durable commits: at open (their number varies with
/// start-up's background work), by the periodic checkpoint after ~1 s of writing, and by the
/// daemon's own durable writes. `store:N` is tried from N = 16 up: while the open itself meets
/// the failure it must exit 74 before listening; the first N that lets it listen fails the
/// first durable commit after the open — the window where a failure taken for a recoverable
/// one would reopen the store in-process.
#[test]
fn a_failed_fsync_of_the_node_file_ends_the_process_and_the_restart_keeps_every_acknowledged_write()
{
    let dir = tempfile::tempdir().unwrap();
    let node_file = dir.path().join("shards").join("node.redb");
    Daemon::start_in(dir.path(), ARGS).terminate();
    let mut n = 16;
    let (d, spec) = loop {
        assert!(n < 64, "the open never listened with store:N up to {n}");
        let spec = format!("store:{n}");
        match Daemon::try_start_in_with_env(dir.path(), ARGS, &[("NOKV_TEST_FAIL_FSYNC", &spec)]) {
            Ok(d) => break (d, spec),
            Err((status, _, stderr)) => {
                assert_eq!(
                    status.code(),
                    Some(EXIT_SYNC_FAILED),
                    "{spec}: a failed fsync at open ends the process with EX_IOERR: {stderr}"
                );
                n += 1;
            }
        }
    };
    let (d, acked, error) = write_on_until_refused(d, &spec, 100_000);
    eprintln!("{spec}: {} acknowledged, then: {error}", acked.len());
    // The write the failed fsync stopped is never answered: the process is gone. An answer
    // such as "the shard is reopening it" or "Internal: I/O error" means the failure was taken
    // for a recoverable one (issue 42 item 1: "fsyncgate").
    assert!(
        error.contains("transport error"),
        "{spec}: a failed fsync of the node file was answered instead of ending the process: \
         {error}"
    );
    assert_fsync_exit(d, &node_file);
    assert_all_read_back(dir.path(), &acked);
}
