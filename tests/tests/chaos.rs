//! The fault-schedule harness (issue 9, item 6): the real `nokv-server` run through random,
//! seeded schedules of kill -9 (mid-publish, mid-commit, mid-reconcile), provider faults
//! injected by the daemon's test-only fault layer (`NOKV_TEST_FAULTS`: fail before send,
//! write-then-lose-response, a PUT held past the upload lease that lands late, a delete
//! outage, slow GETs) and lost client responses (the SDK's `LostResponses` hook).
//!
//! After each schedule the daemon is restarted and the invariants are checked:
//! * every acknowledged small write and every acknowledged publish reads back byte-identical
//!   (a later unacknowledged write to the same path may have won instead: its bytes are
//!   accepted too, nothing else is);
//! * no entry points at missing bytes: every artifact listed restores completely;
//! * after settling (short `--upload-lease` and `--reconcile-interval`), `nokv admin audit`
//!   shows `unaccounted` = 0 and `violations` = 0, and health shows `unresolved_uploads` = 0.
//!   (This found a real bug: an unknown writer's guard — kill -9 mid-PutBlock, or a lost PUT
//!   response — held its expired upload unresolved for ever; the reconciler now resolves the
//!   upload after the guard's first successful delete, while the guard stays.)
//!
//! Kill points: after the n-th finished operation (small writes and commits in flight), or
//! once the n-th block of a chosen publish is acknowledged (mid-publish; mid-commit when it
//! is the last block), and optionally again right after the first restart (mid-reconcile:
//! the start-up pass). The schedule is a pure function of its seed; the instant a kill lands
//! relative to the daemon's work is not, so a seed replays the same plan, not always the
//! same interleaving.
//!
//! CI runs [`CI_RUNS`] schedules from [`CI_SEED`]. `scripts/chaos.sh --runs N --seed S` runs
//! more, one schedule per process, through `NOKV_CHAOS_RUNS` and `NOKV_CHAOS_SEED`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nokv_client::Client;
use nokv_client::publish::PublishOptions;
use nokv_client::sdk::LostResponses;
use nokv_proto::v1 as pb;
use nokv_tests::{Daemon, SplitMix64, pseudo_random_bytes};

/// Schedules run by `cargo test` (CI): well under a minute on 2 cores.
const CI_RUNS: u64 = 20;
/// First seed of the CI schedules; schedule `i` uses seed `CI_SEED + i`.
const CI_SEED: u64 = 1;
/// The server's block size.
const BLOCK: usize = 4 << 20;
/// Short lease and pass interval, so abandoned uploads are reclaimed within seconds.
const LEASE: &str = "2s";
const DAEMON_ARGS: &[&str] = &[
    "--upload-lease",
    LEASE,
    "--reconcile-interval",
    "1s",
    "--retired-grace",
    "0s",
];
/// How long the store may take to settle after the last restart (faults included).
const SETTLE_DEADLINE: Duration = Duration::from_secs(90);
const WS: &str = "chaos";

/// One generator per schedule.
type Rng = SplitMix64;

/// One client operation of a schedule.
#[derive(Debug, Clone)]
enum Op {
    /// An inline small write of `len` bytes.
    Write { path: String, seed: u64, len: usize },
    /// A publish of an artifact of `len` bytes.
    Publish { path: String, seed: u64, len: usize },
}

/// When the daemon is killed with SIGKILL.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// Never during the workload.
    None,
    /// Once `n` operations have finished, with the rest (publishes, commits, small writes)
    /// in flight.
    AfterOps(usize),
    /// Once `blocks` blocks of worker `worker`'s operation `op` (a publish) are acknowledged:
    /// mid-publish, or mid-commit when `blocks` is all of them.
    AtBlock {
        worker: usize,
        op: usize,
        blocks: u64,
    },
}

/// Everything one schedule does, drawn from its seed.
#[derive(Debug)]
struct Schedule {
    seed: u64,
    /// The daemon's `NOKV_TEST_FAULTS`.
    faults: String,
    /// Responses the SDK drops after the server executed the call, per method.
    lost: Vec<(&'static str, u32)>,
    /// Two concurrent clients' operation lists.
    workers: [Vec<Op>; 2],
    kill: Kill,
    /// Kill the first restarted daemon as soon as it listens, while its start-up
    /// reconciler pass is running.
    kill_mid_reconcile: bool,
}

impl Schedule {
    fn draw(seed: u64) -> Schedule {
        let mut r: Rng = SplitMix64(seed);
        let mut faults = format!("seed={seed}");
        if r.chance(60) {
            faults += &format!(",refuse={}", r.range(5, 20));
        }
        if r.chance(60) {
            faults += &format!(",lose={}", r.range(5, 20));
        }
        if r.chance(50) {
            // Held one second past the lease, then it lands.
            faults += &format!(",hold={}:3s", r.range(5, 15));
        }
        if r.chance(50) {
            faults += &format!(",delete_outage={}s", r.range(1, 4));
        }
        if r.chance(50) {
            faults += &format!(",slow_get={}:{}ms", r.range(10, 40), r.range(20, 300));
        }
        let mut lost = Vec::new();
        for method in ["write", "begin_upload", "put_block", "commit_upload"] {
            let n = r.range(0, 2) as u32;
            if n > 0 {
                lost.push((method, n));
            }
        }
        let op = |r: &mut Rng| {
            let seed = r.next_u64();
            if r.chance(50) {
                Op::Write {
                    path: format!("small/{}", r.range(0, 3)),
                    seed,
                    len: r.range(1, 4000) as usize,
                }
            } else {
                Op::Publish {
                    path: format!("art/{}", r.range(0, 2)),
                    seed,
                    len: r.range(1, 2 * BLOCK as u64 + 4096) as usize,
                }
            }
        };
        let workers = [
            (0..r.range(2, 5)).map(|_| op(&mut r)).collect::<Vec<_>>(),
            (0..r.range(2, 5)).map(|_| op(&mut r)).collect::<Vec<_>>(),
        ];
        let total = workers.iter().map(Vec::len).sum::<usize>() as u64;
        let publishes: Vec<(usize, usize, u64)> = workers
            .iter()
            .enumerate()
            .flat_map(|(w, ops)| {
                ops.iter().enumerate().filter_map(move |(i, op)| match op {
                    Op::Publish { len, .. } => Some((w, i, len.div_ceil(BLOCK) as u64)),
                    Op::Write { .. } => None,
                })
            })
            .collect();
        let roll = r.range(0, 99);
        let kill = if roll < 55 && !publishes.is_empty() {
            let (worker, op, blocks) = publishes[r.range(0, publishes.len() as u64 - 1) as usize];
            Kill::AtBlock {
                worker,
                op,
                blocks: r.range(1, blocks),
            }
        } else if roll < 80 {
            Kill::AfterOps(r.range(0, total - 1) as usize)
        } else {
            Kill::None
        };
        let kill_mid_reconcile = r.chance(50);
        Schedule {
            seed,
            faults,
            lost,
            workers,
            kill,
            kill_mid_reconcile,
        }
    }
}

/// One write as the clients saw it: its bytes, when it was sent and when (if ever) it was
/// acknowledged, on one logical clock shared by all workers.
struct Write {
    bytes: Vec<u8>,
    sent: u64,
    acked: Option<u64>,
}

/// What the clients did, per path, and the logical clock of send and acknowledgement events.
#[derive(Default)]
struct History {
    paths: BTreeMap<String, Vec<Write>>,
    clock: u64,
}

impl History {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The contents the path may hold now (`None` standing for "absent"). A write is ruled
    /// out only if another write to the path was *sent after it was acknowledged* and was
    /// acknowledged itself: that one definitely replaced it. Concurrent writes may land in
    /// either order, and an unacknowledged write may or may not have happened (it cannot
    /// happen after the kill: its client is gone). Absent is allowed only if no write to
    /// the path was acknowledged.
    fn allowed(&self, path: &str) -> Vec<Option<&[u8]>> {
        let writes = &self.paths[path];
        let replaced = |w: &Write| {
            let done = w.acked.unwrap_or(u64::MAX);
            writes
                .iter()
                .any(|later| later.acked.is_some() && later.sent > done)
        };
        let mut out: Vec<Option<&[u8]>> = writes
            .iter()
            .filter(|w| !replaced(w))
            .map(|w| Some(&w.bytes[..]))
            .collect();
        if writes.iter().all(|w| w.acked.is_none()) {
            out.push(None);
        }
        out
    }

    fn counts(&self) -> (usize, usize) {
        let all = self.paths.values().flatten();
        let acked = all.clone().filter(|w| w.acked.is_some()).count();
        (acked, all.count())
    }
}

/// Runs one worker's operations in order, recording each in `history` before it is sent
/// (unacknowledged) and marking it acknowledged when the call succeeded.
async fn run_worker(
    client: Client,
    ops: Vec<Op>,
    dir: std::path::PathBuf,
    history: Arc<Mutex<History>>,
    done: Arc<tokio::sync::watch::Sender<usize>>,
    // (operation index, blocks) at which to raise `kill`.
    kill_at: Option<(usize, u64)>,
    kill: Arc<tokio::sync::watch::Sender<bool>>,
) {
    for (op_index, op) in ops.into_iter().enumerate() {
        let (path, data) = match &op {
            Op::Write { path, seed, len } | Op::Publish { path, seed, len } => {
                (path.clone(), pseudo_random_bytes(*seed, *len))
            }
        };
        let index = {
            let mut h = history.lock().unwrap();
            let sent = h.tick();
            let writes = h.paths.entry(path.clone()).or_default();
            writes.push(Write {
                bytes: data.clone(),
                sent,
                acked: None,
            });
            writes.len() - 1
        };
        let acked = match op {
            Op::Write { .. } => client
                .write(pb::WriteRequest {
                    workspace: WS.into(),
                    path: path.clone(),
                    data: data.clone().into(),
                    ..Default::default()
                })
                .await
                .is_ok(),
            Op::Publish { seed, .. } => {
                let src = dir.join(format!("src-{seed}"));
                std::fs::write(&src, &data).unwrap();
                let mut opts = PublishOptions::default();
                if let Some((_, blocks)) = kill_at.filter(|(i, _)| *i == op_index) {
                    let acked_blocks = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let kill = kill.clone();
                    opts.progress = Some(Arc::new(move |_bytes| {
                        let n = acked_blocks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if n + 1 >= blocks {
                            kill.send_replace(true);
                        }
                    }));
                }
                let ok = client.publish_file(WS, &path, &src, opts).await.is_ok();
                let _ = std::fs::remove_file(&src);
                ok
            }
        };
        if acked {
            let mut h = history.lock().unwrap();
            let at = h.tick();
            h.paths.get_mut(&path).unwrap()[index].acked = Some(at);
        }
        done.send_modify(|n| *n += 1);
    }
}

/// Every entry of the workspace, all pages.
async fn all_entries(client: &Client) -> Vec<pb::Entry> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = client.list(WS, "", 1000, &cursor).await.expect("list");
        out.extend(page.entries);
        if page.next_cursor.is_empty() {
            return out;
        }
        cursor = page.next_cursor;
    }
}

/// The bytes at `path` now, or `None` if it does not exist; artifacts are restored in full
/// (which fails if any block is missing or corrupt).
async fn current(client: &Client, path: &str, dir: &Path) -> Option<Vec<u8>> {
    let entry = match client.stat(WS, path).await {
        Ok(e) => e,
        Err(e) if e.message.contains("not found") || e.code == Some(tonic::Code::NotFound) => {
            return None;
        }
        Err(e) => panic!("stat {path}: {e:?}"),
    };
    if entry.kind == pb::EntryKind::Artifact as i32 {
        let dest = dir.join(format!("restored-{}", path.replace('/', "_")));
        let _ = std::fs::remove_file(&dest);
        client
            .restore(WS, path, &dest, 4, None)
            .await
            .unwrap_or_else(|e| panic!("restore {path} ({entry:?}): {e:?}"));
        let bytes = std::fs::read(&dest).unwrap();
        std::fs::remove_file(&dest).unwrap();
        Some(bytes)
    } else {
        let r = client
            .read(WS, path)
            .await
            .unwrap_or_else(|e| panic!("read {path}: {e:?}"));
        Some(r.data.to_vec())
    }
}

/// Polls (bounded) until health and audit show the store settled.
async fn wait_settled(client: &Client) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let h = client
            .health()
            .await
            .map_err(|e| format!("health: {e:?}"))?;
        let a = client.audit().await.map_err(|e| format!("audit: {e:?}"))?;
        if a.violations != 0 {
            return Err(format!(
                "audit violations (live bytes queued for deletion): {a:?}"
            ));
        }
        if a.unaccounted == 0 && h.unresolved_uploads == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not settled after {SETTLE_DEADLINE:?}: unresolved_uploads {}, unknown guards \
                 {}, audit {a:?}",
                h.unresolved_uploads, h.unknown_guards
            ));
        }
        // Nothing signals the end of a reconciler pass from outside: poll its effect.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs one schedule; `Err` says which invariant broke.
async fn run_schedule(s: &Schedule) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let env = [("NOKV_TEST_FAULTS", s.faults.as_str())];
    let start = || Daemon::start_in_with_env(&data_dir, DAEMON_ARGS, &env);

    let d = start();
    let lost = LostResponses::default();
    for (method, n) in &s.lost {
        lost.lose(method, *n);
    }
    let client = d.sdk().await.with_lost_responses(lost);
    let history = Arc::new(Mutex::new(History::default()));
    let (tx, mut rx) = tokio::sync::watch::channel(0usize);
    let tx = Arc::new(tx);
    let (kill_tx, mut kill_rx) = tokio::sync::watch::channel(false);
    let kill_tx = Arc::new(kill_tx);
    let mut tasks = Vec::new();
    for (w, ops) in s.workers.iter().enumerate() {
        let kill_at = match s.kill {
            Kill::AtBlock { worker, op, blocks } if worker == w => Some((op, blocks)),
            _ => None,
        };
        tasks.push(tokio::spawn(run_worker(
            client.clone(),
            ops.clone(),
            dir.path().to_path_buf(),
            history.clone(),
            tx.clone(),
            kill_at,
            kill_tx.clone(),
        )));
    }
    let total: usize = s.workers.iter().map(Vec::len).sum();
    let kill_after = match s.kill {
        Kill::AfterOps(n) => Some(n),
        // The chosen publish may fail before its block is acknowledged: then the kill
        // comes once every operation has finished.
        Kill::AtBlock { .. } => Some(total),
        Kill::None => None,
    };
    let d = match kill_after {
        Some(n) => {
            tokio::select! {
                r = rx.wait_for(|done| *done >= n) => { r.unwrap(); }
                r = kill_rx.wait_for(|fire| *fire) => { r.unwrap(); }
            }
            d.kill9();
            for t in &tasks {
                t.abort();
            }
            None
        }
        None => Some(d),
    };
    for t in tasks {
        let _ = t.await;
    }
    assert!(*rx.borrow() <= total);
    drop(d); // SIGKILL too if still running: the workload is over, a crash is as good as a stop.

    if s.kill_mid_reconcile {
        let d = start();
        d.kill9();
    }
    let d = start();
    let client = d.sdk().await;
    let history = std::mem::take(&mut *history.lock().unwrap());
    let checked = check(&client, &history, dir.path()).await;
    match checked {
        Ok(()) => {
            let (acked, sent) = history.counts();
            eprintln!(
                "chaos seed {}: {acked} of {sent} writes acknowledged, {total} planned; settled",
                s.seed
            );
            Ok(())
        }
        Err(problem) => {
            // Keep the evidence: the data dir, the shards' health and the daemon's last words.
            let health = client.health().await;
            let stderr = d.stderr();
            let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
            drop(d);
            let kept = dir.keep();
            Err(format!(
                "{problem}\nhealth: {health:?}\ndata dir kept: {}\ndaemon stderr (last lines, newest first):\n{}",
                kept.display(),
                tail.join("\n")
            ))
        }
    }
}

/// The invariants, on a freshly restarted daemon.
async fn check(client: &Client, history: &History, dir: &Path) -> Result<(), String> {
    // Byte-identical reads of everything acknowledged.
    for path in history.paths.keys() {
        let now = current(client, path, dir).await;
        let allowed = history.allowed(path);
        if !allowed.contains(&now.as_deref()) {
            return Err(format!(
                "{path}: holds {} but acknowledged history allows only {:?}",
                describe(now.as_deref()),
                allowed.iter().map(|b| describe(*b)).collect::<Vec<_>>()
            ));
        }
    }
    // No entry points at missing bytes (each was restored or read above), and no entry
    // appeared that no client wrote.
    for entry in all_entries(client).await {
        if !history.paths.contains_key(&entry.path) {
            return Err(format!("an entry nobody wrote: {entry:?}"));
        }
    }
    wait_settled(client).await
}

fn describe(b: Option<&[u8]>) -> String {
    match b {
        None => "nothing".into(),
        Some(b) => format!("{} bytes {:02x?}..", b.len(), &b[..b.len().min(4)]),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

/// Every acknowledged write survives random kill -9s, provider faults and lost responses, no
/// entry points at missing bytes, and the store settles with nothing unaccounted or
/// unresolved.
#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_random_crashes_and_faults_and_the_store_settles_accounted() {
    let runs = env_u64("NOKV_CHAOS_RUNS").unwrap_or(CI_RUNS);
    let first = env_u64("NOKV_CHAOS_SEED").unwrap_or(CI_SEED);
    for seed in first..first + runs {
        let s = Schedule::draw(seed);
        eprintln!("chaos schedule {seed}: {s:?}");
        if let Err(problem) = run_schedule(&s).await {
            panic!(
                "chaos seed {seed} failed: {problem}\nschedule: {s:?}\nreplay: \
                 NOKV_CHAOS_SEED={seed} NOKV_CHAOS_RUNS=1 \
                 cargo test -p nokv-tests --test chaos -- acknowledged_writes --nocapture"
            );
        }
    }
}

/// The fault layer is real and loud: with `NOKV_TEST_FAULTS` refusing every provider write,
/// a publish fails while small files (no provider) still work, and the daemon warns that
/// test faults are on. Without the layer wired into the daemon the publish would succeed.
#[tokio::test(flavor = "multi_thread")]
async fn test_faults_from_the_environment_reach_the_provider_and_the_daemon_warns_about_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in_with_env(
        dir.path(),
        &[],
        &[("NOKV_TEST_FAULTS", "seed=1,refuse=100")],
    );
    let client = d.sdk().await.with_retry(nokv_client::sdk::RetryPolicy {
        attempts: 1,
        first_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let src = dir.path().join("a.bin");
    std::fs::write(&src, pseudo_random_bytes(1, BLOCK + 1)).unwrap();
    let err = client
        .publish_file(WS, "a.bin", &src, PublishOptions::default())
        .await
        .expect_err("every provider write is refused");
    assert!(
        client.stat(WS, "a.bin").await.is_err(),
        "{err:?}: nothing published"
    );
    client
        .write(pb::WriteRequest {
            workspace: WS.into(),
            path: "small".into(),
            data: b"still served".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("small files need no provider");
    assert!(d.stderr().contains("TEST FAULTS ARE ON"), "{}", d.stderr());
}
