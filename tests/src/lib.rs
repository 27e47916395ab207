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

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub mod cluster;
pub mod linearizability;
mod watchdog;

/// How long the daemon may take to print its listening line (covers a cold debug build's
/// first start, with TLS key generation).
const DAEMON_READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long an external service may take to answer its readiness probe.
const SERVICE_READY_DEADLINE: Duration = Duration::from_secs(30);
/// How long [`Daemon::wait_for_log_line`] waits for its line (bounds a daemon that never logs
/// it, so the test fails instead of hanging).
const LOG_LINE_DEADLINE: Duration = Duration::from_secs(60);
/// How long one CLI or one-shot server command may run before it is killed and the test
/// fails (the slowest, a publish or restore of a few MiB through a failover, takes seconds).
const COMMAND_DEADLINE: Duration = Duration::from_secs(300);
/// Interval between readiness probes of an external service.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on a graceful stop, so a daemon that ignores SIGTERM fails the test instead of hanging it.
const STOP_DEADLINE: Duration = Duration::from_secs(60);

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
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(PathBuf::from("/usr/bin")))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn require_program(name: &str) -> PathBuf {
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
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Waits for `child` to exit within `deadline`; past it the child is SIGKILLed and the test
/// panics, so a hung process cannot hang the test run.
fn wait_with_deadline(mut child: Child, deadline: Duration, what: &str) -> ExitStatus {
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

// ---------------------------------------------------------------------------------------------
// nokv-server
// ---------------------------------------------------------------------------------------------

/// Output of one `nokv` CLI run.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code; -1 when the process was killed by a signal.
    pub status: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl CliOutput {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Stdout parsed as one JSON document; panics with both streams when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e})\nstdout: {}\nstderr: {}",
                self.stdout_str(),
                self.stderr
            )
        })
    }

    /// Panics, showing stderr, unless the command exited 0.
    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        if self.status != 0 {
            panic!(
                "nokv exited {}\nstderr: {}\nstdout: {}",
                self.status,
                self.stderr,
                self.stdout_str()
            );
        }
        self
    }

    /// The typed reason of a failed run: `R` from the `nokv: R: message` line on stderr.
    pub fn reason(&self) -> Option<&str> {
        let line = self.stderr.lines().find(|l| l.starts_with("nokv: "))?;
        line["nokv: ".len()..].split(':').next()
    }

    /// Panics, showing both streams, unless the command exited 1 (operation failed) with
    /// exactly one stderr line `nokv: <reason>: ...`.
    #[track_caller]
    pub fn assert_fails_with(&self, reason: &str) -> &Self {
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.is_empty()).collect();
        let one_line_with_reason =
            lines.len() == 1 && lines[0].starts_with(&format!("nokv: {reason}: "));
        if self.status != 1 || !one_line_with_reason {
            panic!(
                "expected exit 1 with one line `nokv: {reason}: ...` on stderr, got exit {}\n\
                 stderr: {}\nstdout: {}",
                self.status,
                self.stderr,
                self.stdout_str()
            );
        }
        self
    }
}

/// Resident memory of a process, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct ProcessMemory {
    /// Resident now (`VmRSS`).
    pub rss: u64,
    /// Peak resident since start or the last reset (`VmHWM`).
    pub peak: u64,
}

/// A running `nokv-server`, killed (SIGKILL) on drop unless stopped explicitly.
///
/// Invariant: both output pipes are drained by background threads for the whole life of the
/// child, so the daemon never blocks writing logs.
pub struct Daemon {
    /// `None` only after `terminate`/`kill9` took it.
    child: Option<Child>,
    /// Held so a fresh data dir lives exactly as long as the daemon; `None` for `start_in`.
    _tempdir: Option<tempfile::TempDir>,
    data_dir: PathBuf,
    /// `HOST:PORT` from the listening line; empty until the daemon is ready.
    addr: String,
    stdout_log: Arc<Mutex<String>>,
    stderr_log: Arc<Mutex<String>>,
    /// Joined only when the child has died during startup or was stopped with
    /// [`Daemon::terminate_collecting_output`], to collect all of stderr.
    stderr_drain: Option<thread::JoinHandle<()>>,
    /// Joined only by [`Daemon::terminate_collecting_output`], to collect all of stdout.
    stdout_drain: Option<thread::JoinHandle<()>>,
}

impl Daemon {
    /// An SDK client over TLS to this daemon with its admin token (installs the process's
    /// rustls crypto provider first, as every nokv process does).
    pub async fn sdk(&self) -> nokv_client::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cfg = nokv_client::config::ResolvedConfig {
            endpoint: self.endpoint(),
            ca: self.ca_path(),
            token: Some(self.admin_token()),
        };
        nokv_client::Client::connect(&cfg).await.expect("connect")
    }

    /// Starts a daemon on a fresh temporary data dir owned by the returned guard.
    pub fn start(extra_args: &[&str]) -> Daemon {
        Self::start_with_env(extra_args, &[])
    }

    /// Like [`Daemon::start`] with extra environment variables for the daemon process (e.g.
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` for the S3 provider).
    pub fn start_with_env(extra_args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let tempdir = tempfile::tempdir().expect("create temp data dir");
        let (mut daemon, lines) = Self::spawn(tempdir.path(), extra_args, envs);
        daemon._tempdir = Some(tempdir);
        daemon.wait_ready(lines);
        daemon
    }

    /// Starts a daemon on an existing data dir (e.g. to restart after `terminate`/`kill9`);
    /// the caller keeps ownership of `dir`.
    pub fn start_in(dir: &Path, extra_args: &[&str]) -> Daemon {
        Self::start_in_with_env(dir, extra_args, &[])
    }

    /// Like [`Daemon::start_in`] with extra environment variables for the daemon process
    /// (e.g. to restart an S3-backed daemon on its data dir with its credentials).
    pub fn start_in_with_env(dir: &Path, extra_args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let (mut daemon, lines) = Self::spawn(dir, extra_args, envs);
        daemon.wait_ready(lines);
        daemon
    }

    /// Starts `nokv-server` on `dir` expecting it to refuse to start: waits (bounded) for it to
    /// exit and returns its status with everything it printed to stdout and stderr. Panics,
    /// showing the output, if it starts listening instead.
    pub fn start_refused_in(dir: &Path, extra_args: &[&str]) -> (ExitStatus, String, String) {
        Self::start_refused_in_with_env(dir, extra_args, &[])
    }

    /// Like [`Daemon::start_refused_in`] with extra environment variables for the daemon
    /// process (e.g. S3 credentials, so the refusal is about the settings under test).
    pub fn start_refused_in_with_env(
        dir: &Path,
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> (ExitStatus, String, String) {
        let (mut daemon, lines) = Self::spawn(dir, extra_args, envs);
        let deadline = Instant::now() + DAEMON_READY_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if listening_addr(&line).is_some() => panic!(
                    "nokv-server started instead of refusing\nstdout:\n{}\nstderr:\n{}",
                    daemon.stdout(),
                    daemon.stderr()
                ),
                Ok(_) => {}
                // Stdout closed: the process is exiting.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "nokv-server neither refused nor listened within {DAEMON_READY_DEADLINE:?}"
                ),
            }
        }
        let child = daemon.child.take().expect("daemon running");
        let status = wait_with_deadline(child, STOP_DEADLINE, "refused nokv-server");
        for drain in [daemon.stdout_drain.take(), daemon.stderr_drain.take()]
            .into_iter()
            .flatten()
        {
            let _ = drain.join();
        }
        (status, daemon.stdout(), daemon.stderr())
    }

    /// Starts `nokv-server` on `dir` when the test cannot know beforehand whether it will
    /// start or refuse (a damaged data dir that must either come back whole or be refused):
    /// the running daemon, or — when it exits before listening — its exit status with
    /// everything it printed to stdout and stderr.
    pub fn try_start_in_with_env(
        dir: &Path,
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Daemon, (ExitStatus, String, String)> {
        let (mut daemon, lines) = Self::spawn(dir, extra_args, envs);
        let deadline = Instant::now() + DAEMON_READY_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = listening_addr(&line) {
                        daemon.addr = addr;
                        return Ok(daemon);
                    }
                }
                // Stdout closed: the process is exiting.
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(daemon.exit_output()),
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "nokv-server neither refused nor listened within {DAEMON_READY_DEADLINE:?}"
                ),
            }
        }
    }

    /// Waits (bounded) for a daemon that is ending by itself (e.g. after a fatal I/O error)
    /// and returns its exit status with everything it printed to stdout and stderr.
    pub fn wait_for_exit(mut self) -> (ExitStatus, String, String) {
        self.exit_output()
    }

    /// Reaps the child (bounded wait) and reads both pipes to EOF.
    fn exit_output(&mut self) -> (ExitStatus, String, String) {
        let child = self.child.take().expect("daemon running");
        let status = wait_with_deadline(child, STOP_DEADLINE, "exiting nokv-server");
        for drain in [self.stdout_drain.take(), self.stderr_drain.take()]
            .into_iter()
            .flatten()
        {
            let _ = drain.join();
        }
        (status, self.stdout(), self.stderr())
    }

    /// Spawns the child and its drain threads; the receiver gets each stdout line until the
    /// caller drops it (the drain goes on regardless).
    fn spawn(
        dir: &Path,
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> (Daemon, mpsc::Receiver<String>) {
        // A caller that chooses its own address (a cluster node advertises a fixed port)
        // passes `--listen`; a second one would be a usage error.
        let listen: &[&str] = if extra_args.contains(&"--listen") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut child = Command::new(bin("nokv-server"))
            .arg("--data-dir")
            .arg(dir)
            .args(listen)
            .args(extra_args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nokv-server");
        let stdout_log = Arc::new(Mutex::new(String::new()));
        let stderr_log = Arc::new(Mutex::new(String::new()));
        let (line_tx, line_rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout piped");
        let stderr = child.stderr.take().expect("stderr piped");
        let stdout_drain = spawn_drain(stdout, stdout_log.clone(), Some(line_tx), None);
        // NOKV_TEST_LOG_DIR: every daemon's log also goes to DIR/nokv-server-<pid>.log, whole
        // (a failing test prints only the tail; a killed node's log is otherwise gone with it).
        let copy = std::env::var_os("NOKV_TEST_LOG_DIR").and_then(|d| {
            let path = Path::new(&d).join(format!("nokv-server-{}.log", child.id()));
            std::fs::create_dir_all(&d).ok()?;
            std::fs::File::create(path).ok()
        });
        let stderr_drain = spawn_drain(stderr, stderr_log.clone(), None, copy);
        watchdog::register(
            child.id(),
            &format!("nokv-server on {}", dir.display()),
            Some(stderr_log.clone()),
        );
        // The guard exists before readiness is awaited so a panic while waiting kills the child.
        let daemon = Daemon {
            child: Some(child),
            _tempdir: None,
            data_dir: dir.to_path_buf(),
            addr: String::new(),
            stdout_log,
            stderr_log,
            stderr_drain: Some(stderr_drain),
            stdout_drain: Some(stdout_drain),
        };
        (daemon, line_rx)
    }

    /// Blocks until the listening line appears on stdout; panics with the output so far if
    /// stdout closes (the daemon died) or the deadline passes first.
    fn wait_ready(&mut self, lines: mpsc::Receiver<String>) {
        let deadline = Instant::now() + DAEMON_READY_DEADLINE;
        let problem = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(addr) = listening_addr(&line) {
                        self.addr = addr;
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    break format!("nokv-server not listening after {DAEMON_READY_DEADLINE:?}");
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Stdout closed: the process is exiting or has exited.
                    let child = self.child.take().expect("daemon running");
                    let status = wait_with_deadline(child, STOP_DEADLINE, "nokv-server");
                    // The child is gone, so stderr reaches EOF: join to show its last words.
                    if let Some(drain) = self.stderr_drain.take() {
                        let _ = drain.join();
                    }
                    break format!("nokv-server exited ({status}) before listening");
                }
            }
        };
        panic!(
            "{problem}\nstdout so far:\n{}\nstderr so far:\n{}",
            self.stdout(),
            self.stderr()
        );
    }

    /// `https://HOST:PORT` the daemon listens on.
    pub fn endpoint(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// `HOST:PORT` the daemon listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `DIR/client.toml`, written by the daemon (keys `endpoint`, `ca`, `token`).
    pub fn client_config(&self) -> PathBuf {
        self.data_dir.join("client.toml")
    }

    /// `DIR/tls/ca.pem`, the CA that signed the daemon's certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.data_dir.join("tls").join("ca.pem")
    }

    /// The admin token, as written in `client.toml`.
    pub fn admin_token(&self) -> String {
        let files = nokv_client::launch::client_files(&self.data_dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", self.client_config().display()));
        assert!(!files.token.is_empty(), "no `token` in client.toml");
        files.token
    }

    /// Everything the daemon printed to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        self.stderr_log.lock().unwrap().clone()
    }

    /// Waits (bounded) until the daemon has logged a stderr line containing `needle` and
    /// returns that line; panics with the log so far if it exits or the deadline passes first.
    ///
    /// For events the daemon reports only in its log (e.g. a reconciler pass): the log is
    /// polled, as the drain thread offers no notification.
    pub fn wait_for_log_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LOG_LINE_DEADLINE;
        loop {
            if let Some(line) = self.stderr().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited || Instant::now() >= deadline {
                panic!(
                    "nokv-server logged no line containing {needle:?} ({})\nstderr:\n{}",
                    if exited {
                        "it exited"
                    } else {
                        "deadline passed"
                    },
                    self.stderr()
                );
            }
            // Polling the log: see the doc comment.
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Everything the daemon printed to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout_log.lock().unwrap().clone()
    }

    /// OS process id of the daemon.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// The daemon's resident memory now and its peak (`VmRSS`, `VmHWM` of
    /// `/proc/PID/status`), in bytes.
    pub fn memory(&self) -> ProcessMemory {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in {path}"))
                * 1024
        };
        ProcessMemory {
            rss: field("VmRSS"),
            peak: field("VmHWM"),
        }
    }

    /// Resets the daemon's peak resident memory (`VmHWM`) to its current resident memory
    /// (Linux `clear_refs` 5), so a later [`Daemon::memory`] shows the peak of what ran since.
    pub fn reset_peak_memory(&self) {
        let path = format!("/proc/{}/clear_refs", self.pid());
        std::fs::write(&path, "5").unwrap_or_else(|e| panic!("write {path}: {e}"));
    }

    /// Sends `signal` (a `kill` name such as `STOP` or `CONT`) to the daemon without waiting:
    /// for tests that pause a node past its lease and resume it.
    pub fn signal(&self, signal: &str) {
        send_signal(self.pid(), signal);
    }

    /// Graceful stop: SIGTERM, then wait (bounded) for exit.
    pub fn terminate(mut self) -> ExitStatus {
        let child = self.child.take().expect("daemon running");
        send_signal(child.id(), "TERM");
        wait_with_deadline(child, STOP_DEADLINE, "nokv-server after SIGTERM")
    }

    /// Graceful stop like [`Daemon::terminate`], returning the exit status and *everything*
    /// the daemon printed to stdout and stderr (both pipes are read to EOF first), for tests
    /// that assert on the complete output.
    pub fn terminate_collecting_output(mut self) -> (ExitStatus, String, String) {
        let child = self.child.take().expect("daemon running");
        send_signal(child.id(), "TERM");
        let status = wait_with_deadline(child, STOP_DEADLINE, "nokv-server after SIGTERM");
        // The child is gone, so both pipes reach EOF and the drains finish.
        for drain in [self.stdout_drain.take(), self.stderr_drain.take()]
            .into_iter()
            .flatten()
        {
            let _ = drain.join();
        }
        (status, self.stdout(), self.stderr())
    }

    /// Crash stop: SIGKILL, then wait for exit.
    pub fn kill9(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        child.kill().expect("SIGKILL nokv-server");
        let status = child.wait().expect("wait for nokv-server");
        watchdog::unregister(child.id());
        status
    }

    /// Runs the `nokv` CLI against this daemon through its `client.toml`.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        self.run_cli(args, &[], None)
    }

    /// Like [`Daemon::cli`] with extra environment variables (set after the defaults, so they
    /// can override `NOKV_CONFIG` or re-add `NOKV_TOKEN` etc.).
    pub fn cli_with_env(&self, args: &[&str], envs: &[(&str, &str)]) -> CliOutput {
        self.run_cli(args, envs, None)
    }

    /// Like [`Daemon::cli`] with `stdin` fed to the process.
    pub fn cli_stdin(&self, args: &[&str], stdin: &[u8]) -> CliOutput {
        self.run_cli(args, &[], Some(stdin))
    }

    /// The `nokv` command [`Daemon::cli`] runs, not yet spawned: for tests that drive the
    /// process themselves (signals, pipes held open). Stdio is left to the caller.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("nokv"));
        cmd.args(args)
            .env("NOKV_CONFIG", self.client_config())
            .env_remove("NOKV_ENDPOINT")
            .env_remove("NOKV_CA")
            .env_remove("NOKV_TOKEN");
        cmd
    }

    fn run_cli(&self, args: &[&str], envs: &[(&str, &str)], stdin: Option<&[u8]>) -> CliOutput {
        cli_with_config(&self.client_config(), args, envs, stdin)
    }

    /// A token for `workspace` and `role` that expired a minute ago, signed with this
    /// daemon's cluster secret in the token format of `nokv-server`'s `token` module
    /// (`nokv1.<hex claims json>.<hex HMAC-SHA256>`). `token issue` refuses to issue a dead
    /// token, so a test that needs one signs it the way a holder of the secret could.
    pub fn expired_token(&self, workspace: &str, role: &str) -> String {
        let secret = std::fs::read_to_string(self.data_dir.join("cluster.secret"))
            .expect("read cluster.secret");
        let secret = hex::decode(secret.trim()).expect("cluster.secret is hex");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let claims = serde_json::json!({"w": [workspace], "r": role, "e": now - 60}).to_string();
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret);
        let mac = ring::hmac::sign(&key, claims.as_bytes());
        format!(
            "nokv1.{}.{}",
            hex::encode(claims.as_bytes()),
            hex::encode(mac.as_ref())
        )
    }

    /// Issues a token with `nokv-server token issue` on this daemon's data dir; returns it.
    pub fn token(&self, workspace: &str, role: &str, ttl: Option<&str>) -> String {
        let mut cmd = Command::new(bin("nokv-server"));
        cmd.args(["token", "issue", "--data-dir"])
            .arg(&self.data_dir)
            .args(["--workspace", workspace, "--role", role]);
        if let Some(ttl) = ttl {
            cmd.args(["--ttl", ttl]);
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .expect("run nokv-server token issue");
        assert!(
            out.status.success(),
            "nokv-server token issue failed ({})\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("token is UTF-8")
            .trim()
            .to_string()
    }
}

/// Runs the `nokv` CLI with `config` as its only source of connection settings (so a
/// developer's own environment cannot redirect tests elsewhere), e.g. the `client.toml` of a
/// daemon that has stopped.
pub fn cli_with_config(
    config: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    stdin: Option<&[u8]>,
) -> CliOutput {
    let mut cmd = Command::new(bin("nokv"));
    cmd.args(args)
        .env("NOKV_CONFIG", config)
        .env_remove("NOKV_ENDPOINT")
        .env_remove("NOKV_CA")
        .env_remove("NOKV_TOKEN")
        .envs(envs.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn nokv");
    // Stdin is written from its own thread: writing it all before reading output could
    // deadlock once the CLI fills its stdout pipe.
    let writer = stdin.map(|bytes| {
        let bytes = bytes.to_vec();
        let mut pipe = child.stdin.take().expect("stdin piped");
        thread::spawn(move || {
            // The CLI may exit without reading everything; a broken pipe is its choice.
            let _ = pipe.write_all(&bytes);
        })
    });
    let out = output_within(child, COMMAND_DEADLINE, &format!("nokv {}", args.join(" ")));
    if let Some(w) = writer {
        w.join().expect("stdin writer thread");
    }
    CliOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Collects a short-lived command's output; past `deadline` it is SIGKILLed and the test
/// panics naming it, so a hung command fails its test instead of hanging the run.
fn output_within(child: Child, deadline: Duration, what: &str) -> std::process::Output {
    let pid = child.id();
    watchdog::register(pid, what, None);
    let (done, finished) = mpsc::channel::<()>();
    let killer = thread::spawn(move || {
        let expired = finished.recv_timeout(deadline) == Err(mpsc::RecvTimeoutError::Timeout);
        if expired {
            send_signal(pid, "KILL");
        }
        expired
    });
    let out = child.wait_with_output().expect("wait for command");
    let _ = done.send(());
    let expired = killer.join().expect("command killer thread");
    watchdog::unregister(pid);
    if expired {
        panic!(
            "{what} (pid {pid}) did not finish within {deadline:?}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Runs a one-shot `nokv-server` subcommand (e.g. `cluster init`), not a daemon, to its end.
pub fn server_command(args: &[&str]) -> CliOutput {
    let child = Command::new(bin("nokv-server"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nokv-server");
    let out = output_within(
        child,
        COMMAND_DEADLINE,
        &format!("nokv-server {}", args.join(" ")),
    );
    CliOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Drop for Daemon {
    /// Kills the child; when a test is failing, prints the tail of the daemon's log first, so
    /// a failure seen only in CI carries the server's side of the story.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            watchdog::unregister(child.id());
            if thread::panicking() {
                let log = self
                    .stderr_log
                    .lock()
                    .map(|l| l.clone())
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(LOG_TAIL_ON_FAILURE).collect();
                eprintln!(
                    "--- last {} lines of the daemon at {} ---",
                    tail.len(),
                    self.addr
                );
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// How many lines of a daemon's log a failing test prints.
const LOG_TAIL_ON_FAILURE: usize = 80;

/// Copies `pipe` line by line into `log` until EOF, also sending each line to `lines` while
/// its receiver exists. Lossy UTF-8 so binary garbage cannot stop the drain.
fn spawn_drain<R: Read + Send + 'static>(
    pipe: R,
    log: Arc<Mutex<String>>,
    lines: Option<mpsc::Sender<String>>,
    mut copy: Option<std::fs::File>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    if let Some(f) = &mut copy {
                        let _ = std::io::Write::write_all(f, &buf);
                    }
                    log.lock().unwrap().push_str(&line);
                    if let Some(tx) = &lines {
                        // A dropped receiver only means nobody waits for lines any more.
                        let _ = tx.send(line);
                    }
                }
            }
        }
    })
}

/// `HOST:PORT` if `line` is the daemon's listening line (the contract lives in
/// [`nokv_client::launch`], shared with the CLI's benchmarks).
fn listening_addr(line: &str) -> Option<String> {
    nokv_client::launch::listening_endpoint(line)?
        .strip_prefix("https://")
        .map(str::to_string)
}

// ---------------------------------------------------------------------------------------------
// External services
// ---------------------------------------------------------------------------------------------

/// A child process of an external service whose stdout+stderr go to a log file, killed on drop.
struct ServiceProcess {
    name: &'static str,
    child: Child,
    log_path: PathBuf,
}

impl ServiceProcess {
    fn spawn(name: &'static str, cmd: &mut Command, log_path: PathBuf) -> ServiceProcess {
        // A file, not a pipe, so the service can never block on unread output.
        let log = File::create(&log_path).expect("create service log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        watchdog::register(child.id(), name, None);
        ServiceProcess {
            name,
            child,
            log_path,
        }
    }

    /// Polls `ready` until it returns true; panics with the service log if the process exits
    /// or the deadline passes first.
    fn wait_until(&mut self, mut ready: impl FnMut() -> bool) {
        let deadline = Instant::now() + SERVICE_READY_DEADLINE;
        loop {
            if ready() {
                return;
            }
            let problem = if let Some(status) = self.child.try_wait().expect("try_wait") {
                format!("{} exited with {status} before becoming ready", self.name)
            } else if Instant::now() >= deadline {
                format!("{} not ready after {SERVICE_READY_DEADLINE:?}", self.name)
            } else {
                // Readiness polling of an external service: it offers no ready signal.
                thread::sleep(POLL_INTERVAL);
                continue;
            };
            let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            panic!("{problem}\n{} log:\n{log}", self.name);
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        watchdog::unregister(self.child.id());
    }
}

/// A single-member etcd on loopback with its own data dir; killed on drop.
///
/// [`Etcd::kill`] and [`Etcd::restart`] stage an etcd outage: the same data dir and the same
/// client and peer ports, so every lease and key the cluster had is still there afterwards
/// (etcd refreshes the remaining life of every lease when it comes back).
pub struct Etcd {
    // Field order matters: the process is dropped (killed) before its data dir is removed.
    process: Mutex<Option<ServiceProcess>>,
    dir: tempfile::TempDir,
    endpoint: String,
    peer: String,
    /// Plain-http `/health` for a TLS etcd (its client port demands a certificate).
    metrics: String,
    tls: Option<EtcdServerTls>,
    /// Starts so far (the log of each goes to its own file).
    starts: AtomicUsize,
}

/// The TLS files of an etcd that demands client certificates ([`Etcd::start_tls`]).
#[derive(Debug, Clone)]
pub struct EtcdServerTls {
    /// `--trusted-ca-file`: client certificates must be signed by this CA.
    pub trusted_ca: PathBuf,
    /// `--cert-file`: etcd's serving certificate (must name 127.0.0.1).
    pub cert: PathBuf,
    /// `--key-file`.
    pub key: PathBuf,
}

impl Etcd {
    /// Starts etcd on two fresh ports (client, peer) and waits until `/health` reports true.
    pub fn start() -> Etcd {
        Etcd::start_with(None)
    }

    /// Starts etcd serving clients only over TLS with `--client-cert-auth` (a client without a
    /// certificate signed by `tls.trusted_ca` is refused in the handshake) on
    /// `https://127.0.0.1:PORT`; readiness is polled on a plain-http metrics port (loopback)
    /// that serves `/health` without a client certificate.
    pub fn start_tls(tls: &EtcdServerTls) -> Etcd {
        Etcd::start_with(Some(tls))
    }

    fn start_with(tls: Option<&EtcdServerTls>) -> Etcd {
        let dir = tempfile::tempdir().expect("create etcd temp dir");
        let ports = free_ports(3);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let etcd = Etcd {
            process: Mutex::new(None),
            dir,
            endpoint: format!("{scheme}://127.0.0.1:{}", ports[0]),
            peer: format!("http://127.0.0.1:{}", ports[1]),
            metrics: format!("http://127.0.0.1:{}", ports[2]),
            tls: tls.cloned(),
            starts: AtomicUsize::new(0),
        };
        etcd.restart();
        etcd
    }

    /// SIGKILL and reap: etcd is down until [`Etcd::restart`].
    pub fn kill(&self) {
        drop(self.process.lock().unwrap().take());
    }

    /// Starts etcd (again) on its data dir and ports and waits until `/health` reports true.
    pub fn restart(&self) {
        let mut process = self.process.lock().unwrap();
        assert!(process.is_none(), "etcd is already running");
        let program = require_program("etcd");
        let name = "nokv-test";
        let mut cmd = Command::new(program);
        let health = match &self.tls {
            None => format!("{}/health", self.endpoint),
            Some(tls) => {
                let metrics = &self.metrics;
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(&tls.trusted_ca)
                    .arg("--cert-file")
                    .arg(&tls.cert)
                    .arg("--key-file")
                    .arg(&tls.key)
                    .arg("--listen-metrics-urls")
                    .arg(metrics);
                format!("{metrics}/health")
            }
        };
        cmd.arg("--name")
            .arg(name)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&self.endpoint)
            .arg("--advertise-client-urls")
            .arg(&self.endpoint)
            .arg("--listen-peer-urls")
            .arg(&self.peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&self.peer)
            .arg("--initial-cluster")
            .arg(format!("{name}={}", self.peer))
            // Debian's package may ship defaults in the environment; flags must win.
            .env_remove("ETCD_DATA_DIR")
            .env_remove("ETCD_NAME");
        let n = self.starts.fetch_add(1, Ordering::Relaxed);
        let log = match n {
            0 => self.dir.path().join("etcd.log"),
            n => self.dir.path().join(format!("etcd.{n}.log")),
        };
        let mut started = ServiceProcess::spawn("etcd", &mut cmd, log);
        started.wait_until(|| match try_http("GET", &health, &[], b"") {
            Ok((200, body)) => {
                let body = String::from_utf8_lossy(&body);
                body.replace(' ', "").contains("\"health\":\"true\"")
            }
            _ => false,
        });
        *process = Some(started);
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), the client URL.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

/// moto's in-memory S3 server on loopback; killed on drop (its data goes with it).
pub struct Moto {
    _process: ServiceProcess,
    _dir: tempfile::TempDir,
    endpoint: String,
}

impl Moto {
    /// Starts `moto_server` on a fresh port and waits until it answers HTTP.
    pub fn start() -> Moto {
        let program = require_program("moto_server");
        let dir = tempfile::tempdir().expect("create moto temp dir");
        let port = free_port();
        let mut cmd = Command::new(program);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut process =
            ServiceProcess::spawn("moto_server", &mut cmd, dir.path().join("moto.log"));
        let endpoint = format!("http://127.0.0.1:{port}");
        // Ready when an authenticated ListBuckets answers as S3 does: a bare HTTP answer could
        // come from whatever else took the port between `free_port` and moto's bind.
        process.wait_until(|| {
            s3_request(&endpoint, "GET", "/", b"").is_ok_and(|(status, body)| {
                status == 200 && String::from_utf8_lossy(&body).contains("ListAllMyBucketsResult")
            })
        });
        Moto {
            _process: process,
            _dir: dir,
            endpoint,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Creates bucket `name` (path-style `PUT /name`); panics unless moto answers 200.
    /// S3 bucket names are 3-63 characters of lowercase letters, digits, `-` and `.`.
    pub fn create_bucket(&self, name: &str) {
        let (status, body) = self.s3("PUT", &format!("/{name}"), b"");
        assert_eq!(
            status,
            200,
            "create bucket {name}: {}",
            String::from_utf8_lossy(&body)
        );
    }

    /// Every key in `bucket` under `prefix`, sorted (one ListObjectsV2 page; panics if the
    /// listing is truncated, which no test bucket should reach).
    pub fn list_keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self.s3(
            "GET",
            &format!("/{bucket}?list-type=2&prefix={prefix}"),
            b"",
        );
        let listing = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, 200, "list bucket {bucket}: {listing}");
        assert!(
            listing.contains("<IsTruncated>false</IsTruncated>"),
            "truncated listing: {listing}"
        );
        let mut keys: Vec<String> = listing
            .split("<Key>")
            .skip(1)
            .map(|s| {
                s.split("</Key>")
                    .next()
                    .expect("closing </Key>")
                    .to_string()
            })
            .collect();
        keys.sort();
        keys
    }

    /// One S3 request to `path` (`/bucket/key`), as an authenticated client.
    ///
    /// moto refuses anonymous reads of objects (403) but does not verify signatures, so a
    /// syntactically valid but unsigned SigV4 `Authorization` header is enough. Plain
    /// [`http`] requests are anonymous.
    ///
    /// A request whose connection is reset before any answer is sent again (a few times):
    /// moto's threaded development server drops a connection now and then on a loaded
    /// machine, and every request the tests send this way is idempotent.
    pub fn s3(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        let mut tries = 0;
        loop {
            match s3_request(&self.endpoint, method, path, body) {
                Ok(answer) => return answer,
                Err(e) if tries < 4 && e.kind() == std::io::ErrorKind::ConnectionReset => {
                    tries += 1
                }
                Err(e) => panic!("{method} {}{path}: {e}", self.endpoint),
            }
        }
    }
}

/// One authenticated S3 request to moto at `endpoint` (see [`Moto::s3`]).
fn s3_request(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let auth = "AWS4-HMAC-SHA256 \
        Credential=testing/20260101/us-east-1/s3/aws4_request, \
        SignedHeaders=host, Signature=0";
    try_http(
        method,
        &format!("{endpoint}{path}"),
        &[("Authorization", auth)],
        body,
    )
}

// ---------------------------------------------------------------------------------------------
// Test data
// ---------------------------------------------------------------------------------------------

/// splitmix64: a small deterministic generator for test plans and data (no dependency).
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// `len` pseudo-random bytes, the same for the same `seed` (splitmix64): incompressible,
/// reproducible test data with no dependency.
pub fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------------------------
// Minimal HTTP/1.1 client
// ---------------------------------------------------------------------------------------------

/// One HTTP/1.1 request to a plain `http://host:port/path` URL; returns status and body.
/// Panics on any transport error (use in tests where the service must be up).
pub fn http(method: &str, url: &str, body: &[u8]) -> (u16, Vec<u8>) {
    http_with_headers(method, url, &[], body)
}

/// Like [`http`] with extra request headers.
pub fn http_with_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    try_http(method, url, headers, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Like [`http_with_headers`] but returns transport errors, for readiness probes.
///
/// Sends `Connection: close` and reads to EOF, so no connection reuse or response framing
/// beyond chunked decoding is needed. No `Content-Type` is sent unless given in `headers`
/// (a form type would make some servers parse the body as form fields).
pub fn try_http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let invalid = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid(format!("only http:// URLs are supported: {url}")))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = TcpStream::connect(host)?;
    // Bounds a wedged service; no test request should take this long.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;

    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("response has no header terminator".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut payload = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line in {head:?}")))?;
    let mut chunked = false;
    let mut content_length = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse::<usize>().ok();
            }
        }
    }
    if chunked {
        payload = decode_chunked(&payload).ok_or_else(|| invalid("bad chunked body".into()))?;
    } else if let Some(len) = content_length {
        payload.truncate(len);
    }
    Ok((status, payload))
}

/// Decodes a complete `Transfer-Encoding: chunked` body (trailers ignored).
fn decode_chunked(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_line = std::str::from_utf8(&data[..eol]).ok()?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_yields_host_and_port() {
        let line = "nokv-server listening on https://127.0.0.1:43121\n";
        assert_eq!(listening_addr(line).as_deref(), Some("127.0.0.1:43121"));
        assert_eq!(listening_addr("starting\n"), None);
    }

    #[test]
    fn pseudo_random_bytes_are_reproducible_and_seeded() {
        let a = pseudo_random_bytes(7, 1001);
        assert_eq!(a.len(), 1001);
        assert_eq!(a, pseudo_random_bytes(7, 1001));
        assert_eq!(&a[..100], &pseudo_random_bytes(7, 100)[..]);
        assert_ne!(a, pseudo_random_bytes(8, 1001));
        assert!(pseudo_random_bytes(7, 0).is_empty());
    }

    #[test]
    fn chunked_body_is_decoded() {
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
    }
}
