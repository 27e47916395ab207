//! The daemon under test and the CLI: [`Daemon`] runs `nokv-server` on its own data dir and
//! port, kills it on drop and shows its log tail when a test fails; [`CliOutput`] is one run
//! of the `nokv` binary, bounded by a deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::{
    COMMAND_DEADLINE, DAEMON_READY_DEADLINE, LOG_LINE_DEADLINE, POLL_INTERVAL, STOP_DEADLINE, bin,
    send_signal, wait_with_deadline, watchdog,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_yields_host_and_port() {
        let line = "nokv-server listening on https://127.0.0.1:43121\n";
        assert_eq!(listening_addr(line).as_deref(), Some("127.0.0.1:43121"));
        assert_eq!(listening_addr("starting\n"), None);
    }
}
