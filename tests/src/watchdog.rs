//! A deadline for a whole test binary, so a hung test fails CI in minutes with its name and
//! its daemons' last words instead of stopping the run at CI's own limit with nothing said.
//!
//! Every child process the harness spawns (daemons, services, CLI runs) is registered here
//! with the name of the test thread that spawned it (libtest names each test's thread after
//! the test). The first registration starts one watchdog thread; if the binary is still
//! running when the deadline passes, it prints which tests still own children and the tail
//! of each daemon's log, SIGKILLs every registered child (so nothing outlives the binary to
//! hold a port or a pipe) and exits the process with status 101, as a failed test would.
//!
//! The deadline is `NOKV_TEST_BINARY_DEADLINE_SECS` (default [`DEFAULT_DEADLINE`]): far above
//! the slowest binary's normal run on the 2-core CI machine, far below CI's 90 minutes.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

/// The default deadline for one test binary (the slowest, `failover`, takes ~5 minutes on 2
/// cores).
const DEFAULT_DEADLINE: Duration = Duration::from_secs(20 * 60);
/// Lines of each live daemon's log printed when the deadline passes.
const LOG_TAIL: usize = 60;

/// A registered child: what it is, which test spawned it, and its log when the harness
/// keeps one in memory.
struct Child {
    what: String,
    test: String,
    log: Option<Arc<Mutex<String>>>,
}

static CHILDREN: Mutex<BTreeMap<u32, Child>> = Mutex::new(BTreeMap::new());
static START: Once = Once::new();

/// Records a live child of the current test; starts the watchdog on first use.
pub(crate) fn register(pid: u32, what: &str, log: Option<Arc<Mutex<String>>>) {
    START.call_once(start);
    let test = thread::current().name().unwrap_or("?").to_string();
    let child = Child {
        what: what.to_string(),
        test,
        log,
    };
    lock().insert(pid, child);
}

/// Forgets a child that has been reaped (its pid may be reused from now on).
pub(crate) fn unregister(pid: u32) {
    lock().remove(&pid);
}

/// The registry survives a panicking test that held its lock.
fn lock() -> std::sync::MutexGuard<'static, BTreeMap<u32, Child>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

fn deadline() -> Duration {
    std::env::var("NOKV_TEST_BINARY_DEADLINE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_DEADLINE)
}

fn start() {
    let limit = deadline();
    let started = Instant::now();
    thread::Builder::new()
        .name("nokv-test-watchdog".into())
        .spawn(move || {
            // The deadline itself is what is waited for: nothing else can signal it.
            thread::sleep(limit.saturating_sub(started.elapsed()));
            fire(limit);
        })
        .expect("spawn the test watchdog");
}

fn fire(limit: Duration) -> ! {
    let children = std::mem::take(&mut *lock());
    let exe = std::env::current_exe().unwrap_or_default();
    let mut report = format!(
        "\nnokv test watchdog: {} still running after {limit:?} \
         (NOKV_TEST_BINARY_DEADLINE_SECS); tests with live children:\n",
        exe.display()
    );
    for (pid, child) in &children {
        report += &format!("  {} — {} (pid {pid})\n", child.test, child.what);
    }
    for (pid, child) in &children {
        if let Some(log) = &child.log {
            let log = log.lock().map(|l| l.clone()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL).collect();
            report += &format!(
                "--- last {} lines of {} (pid {pid}) ---\n",
                tail.len(),
                child.what
            );
            for line in tail.iter().rev() {
                report += line;
                report += "\n";
            }
        }
    }
    // Straight to fd 2: `eprintln!` in a thread spawned by a test is captured by libtest,
    // and a captured report would die with the process.
    let _ = std::io::stderr().lock().write_all(report.as_bytes());
    for pid in children.keys() {
        // Best effort: a child that exited meanwhile is simply gone.
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .status();
    }
    std::process::exit(101);
}
