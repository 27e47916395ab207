//! Test support for the black-box tests: runs the real `nokv-server` and `nokv` binaries and
//! external services on loopback, each owned by a guard that kills its process on drop so a
//! failing test never leaks a process.
//!
//! What the tests run against: the daemon in its embedded mode (local ownership), with the
//! local-filesystem provider or moto's S3 server ([`Moto`]), and in cluster mode: several
//! nodes sharing one [`Etcd`], one moto bucket and one cluster TLS directory, driven by the
//! [`cluster`] harness. `control_etcd.rs` also drives the control module
//! (`nokv_server::control`) directly against etcd.
//!
//! Only std is used for process control and HTTP so the support code has no moving parts of
//! its own to debug when a test fails.
//!
//! A file per concept: `daemon.rs` (the daemon and the CLI), `services.rs` (etcd, moto),
//! `cluster.rs` (several nodes), `http.rs`, `test_data.rs`, `linearizability.rs` (the history
//! checker), `watchdog.rs` (no process outlives the test run); this file holds what they
//! share: deadlines, binaries, ports, signals.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

pub mod cluster;
mod daemon;
mod http;
pub mod linearizability;
mod services;
mod test_data;
mod watchdog;

pub use daemon::{CliOutput, Daemon, ProcessMemory, cli_with_config, server_command};
pub use http::{http, http_with_headers, try_http};
pub use services::{Etcd, EtcdServerTls, Moto};
pub use test_data::{SplitMix64, pseudo_random_bytes};

/// How long the daemon may take to print its listening line (covers a cold debug build's
/// first start, with TLS key generation).
pub(crate) const DAEMON_READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long an external service may take to answer its readiness probe.
pub(crate) const SERVICE_READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long [`Daemon::wait_for_log_line`] waits for its line (bounds a daemon that never logs
/// it, so the test fails instead of hanging).
pub(crate) const LOG_LINE_DEADLINE: Duration = Duration::from_secs(60);
/// How long one CLI or one-shot server command may run before it is killed and the test
/// fails (the slowest, a publish or restore of a few MiB through a failover, takes seconds).
pub(crate) const COMMAND_DEADLINE: Duration = Duration::from_secs(300);
/// Interval between readiness probes of an external service.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on a graceful stop, so a daemon that ignores SIGTERM fails the test instead of hanging it.
pub(crate) const STOP_DEADLINE: Duration = Duration::from_secs(60);

/// Path of a workspace binary (`nokv-server`, `nokv`) built in the same cargo target dir and
/// profile as the running test.
///
/// Test executables live in `target/<profile>/deps/`, binaries in `target/<profile>/`.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("test exe has a parent dir")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.is_file() {
        panic!(
            "binary {} not found: run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    path
}

/// A loopback TCP port that was free a moment ago.
///
/// There is a small window in which another process may take it; tests accept that race.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct free loopback ports (all listeners are held until every port is chosen, so
/// the same port is never returned twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local_addr").port())
        .collect()
}

/// Finds an executable on PATH, falling back to `/usr/bin` (Debian's install location) for
/// environments that run tests with a trimmed PATH.
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(PathBuf::from("/usr/bin")))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub(crate) fn require_program(name: &str) -> PathBuf {
    find_program(name).unwrap_or_else(|| panic!("{name} not installed: run scripts/test.sh"))
}

/// Sets its flag when dropped — also while a panic unwinds — so a loop a `thread::scope`
/// must join stops, and a failing test fails instead of waiting for that loop forever.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Sends SIGTERM (or another signal) by pid via the `kill` utility, keeping the crate libc-free.
pub(crate) fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Waits for `child` to exit within `deadline`; past it the child is SIGKILLed and the test
/// panics, so a hung process cannot hang the test run.
pub(crate) fn wait_with_deadline(mut child: Child, deadline: Duration, what: &str) -> ExitStatus {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(deadline) {
        Ok(status) => {
            watchdog::unregister(pid);
            status.expect("wait for child")
        }
        Err(_) => {
            send_signal(pid, "KILL");
            panic!("{what} (pid {pid}) did not exit within {deadline:?}");
        }
    }
}

/// Every regular file under `dir`, recursively, sorted by path (e.g. the blocks a local
/// provider holds under `DATA_DIR/objects`).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
