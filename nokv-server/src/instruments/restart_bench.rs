//! `nokv-server restart-bench`: how long a node takes to open its node file after a kill -9,
//! with redb's quick repair on every durable commit (the daemon's setting, see
//! [`crate::meta::quick_repair`]) and without it — and what quick repair costs the periodic
//! durable commit that makes it work.
//!
//! 1. **Fill** (once per data dir: `restart-bench.filled` records it): a child process writes
//!    `--fill-files` new 4 KiB files through the shard write path (the store-bench path: replay
//!    record, quota, entry, inline body, the committer's batches) from 64 workspaces spread
//!    over the node's shards; 100,000 make a node file of about 1.1 GiB (a 4 KiB body takes
//!    an 8 KiB page, since it does not fit in a 4 KiB one beside its key).
//! 2. **Crash and reopen**, per round, for each mode (quick repair off / on) with the page
//!    cache kept (`warm`: the files read through first, as a daemon that ran has them cached,
//!    then a kill -9 and a restart) and dropped (`cold`: the node file and log
//!    written back and evicted from the page cache, as after a power cut and reboot): a child
//!    opens the node and writes from 8 sessions, overwriting a bounded set of files; right after
//!    its second periodic durable commit it is killed with SIGKILL, so the next open finds the
//!    file of a crash whose last durable commit was that periodic one, plus a few milliseconds
//!    of batches in the redo log. The bench then times the open of the node file in its two
//!    steps: redb's open of the crashed file alone (with its repair walk if it needs one;
//!    timed without the close after it, and reporting whether redb walked: its repair
//!    callback runs only then), then the store's open (`MetaStore::open_node`), which replays
//!    the log. Modes alternate within a round and the order flips every round.
//! 3. **Flush cost**: on the same node file, after a warm-up, `--flush-rounds` pairs of runs
//!    of `--flushes` periodic-style durable commits (each after one deferred 4 KiB write),
//!    quick repair on and off alternating, timed one by one.
//!
//! Prints one JSON line per measurement, then a summary line (min / median / max per mode and
//! the ratios). The data dir must be the bench's own (the data dir lock refuses a live
//! daemon's); it is kept, so later runs skip the fill.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nokv_proto::v1 as pb;

use crate::config::{RestartChild, Settings};
use crate::meta::{Commit, MetaStore, Tables, quick_repair};

use super::store_bench::{percentile, request_id};

/// What the parent does with the measurement flags.
pub struct Options {
    pub fill_files: u64,
    pub rounds: usize,
    pub flush_rounds: usize,
    pub flushes: usize,
}

/// The file in the data dir that records how many files the fill wrote.
const FILLED: &str = "restart-bench.filled";
/// Flushes made and not counted before the flush runs.
const FLUSH_WARM_UP: usize = 50;
/// The line a writer child prints once its second periodic durable commit is made.
const CHECKPOINTED: &str = "checkpointed";
/// Periodic durable commits a writer child makes before it is killed.
const CHECKPOINTS_BEFORE_KILL: u64 = 2;
/// Concurrent writers in the fill, and in a writer child about to be killed.
const FILL_SESSIONS: usize = 64;
const WRITE_SESSIONS: usize = 8;
/// Files each writer child overwrites (per session): the file stays near its filled size.
const HOT_FILES: u64 = 256;

/// One measurement, printed as a JSON line.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Report {
    Fill {
        files: u64,
        seconds: f64,
        node_file_mib: f64,
    },
    Open {
        round: usize,
        quick_repair: bool,
        cache: &'static str,
        node_file_mib: f64,
        redo_kib: f64,
        /// redb's open of the crashed file (its repair walk, if it needed one).
        redb_ms: f64,
        /// Whether redb walked the file (its repair callback ran).
        walked: bool,
        /// The store's open that follows (the redo log's replay, on a file redb closed
        /// cleanly).
        replay_ms: f64,
        /// The two together: what a start spends opening its node file.
        open_ms: f64,
    },
    Flush {
        round: usize,
        quick_repair: bool,
        flushes: usize,
        median_ms: f64,
        p99_ms: f64,
    },
    Summary(Summary),
}

/// min / median / max over the rounds, per mode and page-cache state.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub node_file_mib: f64,
    pub opens: Vec<OpenSpread>,
    /// Median open without quick repair over the median with it: warm, cold.
    pub open_ratio_warm: f64,
    pub open_ratio_cold: f64,
    /// The runs' median flush times, milliseconds.
    pub flush_off_ms: [f64; 3],
    pub flush_on_ms: [f64; 3],
    /// The runs' 99th percentile flush times, milliseconds.
    pub flush_off_p99_ms: [f64; 3],
    pub flush_on_p99_ms: [f64; 3],
}

#[derive(Debug, serde::Serialize)]
pub struct OpenSpread {
    pub quick_repair: bool,
    pub cache: &'static str,
    pub runs: usize,
    pub walked: usize,
    pub open_ms: [f64; 3],
    pub redb_ms: [f64; 3],
    pub replay_ms: [f64; 3],
}

/// One crash's open, as kept for the summary.
struct Sample {
    quick: bool,
    cache: &'static str,
    walked: bool,
    redb_ms: f64,
    replay_ms: f64,
}

fn node_file(settings: &Settings) -> PathBuf {
    crate::node::node_file(&settings.data_dir)
}

fn mib(path: &Path) -> f64 {
    std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / (1024.0 * 1024.0))
}

/// The parent: fills, crashes children and times the opens, times the flushes.
pub async fn run(settings: &Settings, opts: &Options) -> Result<Vec<Report>, String> {
    let path = node_file(settings);
    let mut reports = Vec::new();
    let filled = settings.data_dir.join(FILLED);
    let done: u64 = std::fs::read_to_string(&filled)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if done < opts.fill_files {
        let out = run_child(RestartChild::Fill, true, false)?;
        let line = out.last().ok_or("the fill printed nothing")?;
        let (files, seconds): (u64, f64) =
            serde_json::from_str(line).map_err(|e| format!("the fill's report {line:?}: {e}"))?;
        std::fs::write(&filled, format!("{}\n", done + files))
            .map_err(|e| format!("{}: {e}", filled.display()))?;
        reports.push(Report::Fill {
            files,
            seconds,
            node_file_mib: mib(&path),
        });
        eprintln!(
            "{}",
            serde_json::to_string(reports.last().unwrap()).unwrap()
        );
    }
    let mut opens: Vec<Sample> = Vec::new();
    for round in 0..opts.rounds {
        for cache in ["warm", "cold"] {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for quick in order {
                let redo = path.with_extension("redo");
                if cache == "warm" {
                    // A cold run before may have evicted it: a daemon that ran had it cached.
                    read_through(&path)?;
                    read_through(&redo)?;
                }
                run_child(RestartChild::Write, quick, true)?;
                if cache == "cold" {
                    evict(&path)?;
                    evict(&redo)?;
                }
                let redo_kib = std::fs::metadata(&redo).map_or(0.0, |m| m.len() as f64 / 1024.0);
                let _lock = crate::dir_lock::DirLock::acquire(&settings.data_dir)
                    .map_err(|e| e.to_string())?;
                let redb = quick_repair::open_alone(&path).map_err(|e| e.to_string())?;
                let started = Instant::now();
                let store = MetaStore::open_node(&path).map_err(|e| e.to_string())?;
                let replay_ms = started.elapsed().as_secs_f64() * 1000.0;
                drop(store);
                let redb_ms = redb.took.as_secs_f64() * 1000.0;
                opens.push(Sample {
                    quick,
                    cache,
                    walked: redb.walked,
                    redb_ms,
                    replay_ms,
                });
                reports.push(Report::Open {
                    round,
                    quick_repair: quick,
                    cache,
                    node_file_mib: mib(&path),
                    redo_kib,
                    redb_ms,
                    walked: redb.walked,
                    replay_ms,
                    open_ms: redb_ms + replay_ms,
                });
                eprintln!(
                    "{}",
                    serde_json::to_string(reports.last().unwrap()).unwrap()
                );
            }
        }
    }
    let mut flushes: Vec<(bool, f64, f64)> = Vec::new();
    {
        let _lock =
            crate::dir_lock::DirLock::acquire(&settings.data_dir).map_err(|e| e.to_string())?;
        let store = MetaStore::open_node(&path).map_err(|e| e.to_string())?;
        // Warm-up: the writeback of the crashes' pages and the first commits' page faults.
        time_flushes(&store, true, FLUSH_WARM_UP)?;
        for round in 0..opts.flush_rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for quick in order {
                let mut ms = time_flushes(&store, quick, opts.flushes)?;
                ms.sort_by(f64::total_cmp);
                let median_ms = percentile(&ms, 50.0);
                let p99_ms = percentile(&ms, 99.0);
                flushes.push((quick, median_ms, p99_ms));
                reports.push(Report::Flush {
                    round,
                    quick_repair: quick,
                    flushes: ms.len(),
                    median_ms,
                    p99_ms,
                });
                eprintln!(
                    "{}",
                    serde_json::to_string(reports.last().unwrap()).unwrap()
                );
            }
        }
        quick_repair::set_for_measurement(true);
        // The last commit records the allocator state: the data dir closes as the daemon's.
        store.flush().map_err(|e| e.to_string())?;
    }
    let opened = |quick: bool, cache: &'static str| {
        let runs: Vec<&Sample> = opens
            .iter()
            .filter(|o| o.quick == quick && o.cache == cache)
            .collect();
        OpenSpread {
            quick_repair: quick,
            cache,
            runs: runs.len(),
            walked: runs.iter().filter(|o| o.walked).count(),
            open_ms: spread(runs.iter().map(|o| o.redb_ms + o.replay_ms)),
            redb_ms: spread(runs.iter().map(|o| o.redb_ms)),
            replay_ms: spread(runs.iter().map(|o| o.replay_ms)),
        }
    };
    let flushed = |quick: bool| spread(flushes.iter().filter(|f| f.0 == quick).map(|f| f.1));
    let flushed_p99 = |quick: bool| spread(flushes.iter().filter(|f| f.0 == quick).map(|f| f.2));
    let spreads = vec![
        opened(false, "warm"),
        opened(true, "warm"),
        opened(false, "cold"),
        opened(true, "cold"),
    ];
    let ratio = |off: &OpenSpread, on: &OpenSpread| off.open_ms[1] / on.open_ms[1];
    reports.push(Report::Summary(Summary {
        node_file_mib: mib(&path),
        open_ratio_warm: ratio(&spreads[0], &spreads[1]),
        open_ratio_cold: ratio(&spreads[2], &spreads[3]),
        opens: spreads,
        flush_off_ms: flushed(false),
        flush_on_ms: flushed(true),
        flush_off_p99_ms: flushed_p99(false),
        flush_on_p99_ms: flushed_p99(true),
    }));
    Ok(reports)
}

/// min / median / max (the lower median for an even count).
fn spread(values: impl Iterator<Item = f64>) -> [f64; 3] {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    [v[0], percentile(&v, 50.0), v[v.len() - 1]]
}

/// `n` durable commits like the committer's periodic one, each after one deferred 4 KiB
/// write (in the canonical namespace, which a node file's shards never use), timed.
fn time_flushes(store: &MetaStore, quick: bool, n: usize) -> Result<Vec<f64>, String> {
    quick_repair::set_for_measurement(quick);
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        store
            .write_in(Tables::canonical(), Commit::Deferred, |w| {
                w.put_inline("restart-bench", &format!("flush-{}", i % 16), &[b'f'; 4096])
            })
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        store.flush().map_err(|e| e.to_string())?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(ms)
}

/// Reads the whole file, so the page cache holds it.
fn read_through(path: &Path) -> Result<(), String> {
    match std::fs::File::open(path) {
        Ok(mut f) => std::io::copy(&mut f, &mut std::io::sink())
            .map(drop)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes the file's dirty pages back and drops it from the page cache, so the next open
/// reads it from the disk as after a reboot.
fn evict(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    file.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: posix_fadvise takes the open descriptor and plain integers.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!("{}: posix_fadvise: errno {rc}", path.display()));
    }
    Ok(())
}

/// Runs this bench again as a child in `role` (same flags and environment), with quick repair
/// on or off. A `Write` child is killed (SIGKILL) once it says it made its periodic commits;
/// a `Fill` child runs to its end. Returns the lines it printed.
fn run_child(role: RestartChild, quick: bool, kill: bool) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--child")
        .arg(match role {
            RestartChild::Fill => "fill",
            RestartChild::Write => "write",
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !quick {
        cmd.arg("--no-quick-repair");
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the child: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(|e| e.to_string())?;
        if kill && line == CHECKPOINTED {
            // Child::kill sends SIGKILL: no destructor, no final commit, as after kill -9.
            child.kill().map_err(|e| e.to_string())?;
            let _ = child.wait();
            return Ok(lines);
        }
        lines.push(line);
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if kill || !status.success() {
        return Err(format!("the {role:?} child ended by itself ({status})"));
    }
    Ok(lines)
}

/// The child: opens the node under the settings' data dir and writes. `Fill` writes
/// `fill_files` new files, prints `[files, seconds]` and ends cleanly; `Write`
/// overwrites files until it is killed, printing [`CHECKPOINTED`] after its periodic commits.
pub async fn child(
    settings: &Settings,
    role: RestartChild,
    quick: bool,
    fill_files: u64,
) -> Result<(), String> {
    quick_repair::set_for_measurement(quick);
    let (_lock, node) = super::store_bench::open_node(settings, "restart-bench")?;
    let path = node_file(settings);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sessions = match role {
        RestartChild::Fill => FILL_SESSIONS,
        RestartChild::Write => WRITE_SESSIONS,
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|i| {
            let (node, done, written) = (node.clone(), done.clone(), written.clone());
            tokio::spawn(async move {
                let (ws, hot) = match role {
                    RestartChild::Fill => (format!("fill-w{i}"), None),
                    RestartChild::Write => (format!("restart-w{i}"), Some(HOT_FILES)),
                };
                let shard = node.shard_for(&ws).map_err(|e| e.to_string())?;
                let mut k = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = match hot {
                        Some(n) => format!("hot/file-{}", k % n),
                        None => format!("fill/{:03}/file-{k}", k % 512),
                    };
                    let mut data = vec![b'x'; 4096];
                    data[..8].copy_from_slice(&k.to_le_bytes());
                    let req = pb::WriteRequest {
                        workspace: ws.clone(),
                        path: name,
                        data: data.into(),
                        request_id: request_id(),
                        ..Default::default()
                    };
                    shard.write(req).await.map_err(|e| e.to_string())?;
                    written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    k += 1;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    match role {
        RestartChild::Fill => {
            let mut last_report = Instant::now();
            while written.load(std::sync::atomic::Ordering::Relaxed) < fill_files {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if last_report.elapsed() >= Duration::from_secs(10) {
                    last_report = Instant::now();
                    eprintln!(
                        "restart-bench fill: {} of {fill_files} files, node file {:.0} MiB",
                        written.load(std::sync::atomic::Ordering::Relaxed),
                        mib(&path)
                    );
                }
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            for t in tasks {
                t.await.map_err(|e| e.to_string())??;
            }
            let seconds = started.elapsed().as_secs_f64();
            let files = written.load(std::sync::atomic::Ordering::Relaxed);
            drop(node);
            println!("[{files},{seconds}]");
        }
        RestartChild::Write => {
            let committer = node.committer();
            let baseline = committer.durable_commits();
            loop {
                if committer.durable_commits() >= baseline + CHECKPOINTS_BEFORE_KILL {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{CHECKPOINTED}").map_err(|e| e.to_string())?;
                    out.flush().map_err(|e| e.to_string())?;
                    break;
                }
                if tasks.iter().any(|t| t.is_finished()) {
                    return Err("a writer stopped before the kill".into());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // Waits for the SIGKILL, writing on.
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
    Ok(())
}
