//! Processes and figures for benchmarks: a nokv daemon, etcd and moto started on loopback in
//! one work directory (so every store writes to the same disk), percentiles, tables and JSON
//! reports. Everything started here is killed and its directory removed on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nokv_client::ClientError;
use nokv_client::config::ResolvedConfig;
use serde_json::Value;

pub type Result<T> = std::result::Result<T, ClientError>;

fn local(msg: impl Into<String>) -> ClientError {
    ClientError::local(msg)
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(parent: &Path, name: &str) -> Result<Scratch> {
        let dir = parent.join(format!(
            "nokv-bench-{name}-{}",
            nokv_client::sdk::new_request_id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| local(format!("{}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop.
pub struct Proc(Child);

impl Proc {
    /// The process id (for its `/proc/PID/stat` CPU clock, or to attach a profiler).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The `nokv-server` next to this `nokv` binary, unless given.
pub fn default_server_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("nokv-server")))
        .unwrap_or_else(|| PathBuf::from("nokv-server"))
}

pub struct Daemon {
    _proc: Proc,
    pub server_bin: PathBuf,
    pub data_dir: PathBuf,
    pub endpoint: String,
    pub ca: PathBuf,
    pub admin_token: String,
    /// Directory holding the token secret `token` signs with: the data dir, or the cluster
    /// directory of a daemon started with `--tls-dir`.
    pub secret_dir: PathBuf,
}

impl Daemon {
    /// Starts `nokv-server` on a free port and waits for its ready line.
    pub fn start(server_bin: &Path, data_dir: &Path, extra: &[String]) -> Result<Daemon> {
        Daemon::start_on(server_bin, data_dir, "127.0.0.1:0", extra)
    }

    /// Starts `nokv-server` listening on `listen` (a cluster node must know the port it
    /// advertises before it starts) and waits for its ready line. CA and admin token come
    /// from the `client.toml` it writes, so a daemon using a cluster directory is covered.
    pub fn start_on(
        server_bin: &Path,
        data_dir: &Path,
        listen: &str,
        extra: &[String],
    ) -> Result<Daemon> {
        let (child, endpoint) = spawn_listening(
            with_test_credentials(&mut Command::new(server_bin))
                .arg("--data-dir")
                .arg(data_dir)
                .args(["--listen", listen, "--log", "warn"])
                .args(extra),
            server_bin,
        )?;
        let files = nokv_client::launch::client_files(data_dir)?;
        Ok(Daemon {
            _proc: child,
            server_bin: server_bin.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            endpoint,
            ca: files.ca,
            admin_token: files.token,
            secret_dir: data_dir.to_path_buf(),
        })
    }

    /// `nokv-server rpc-floor` beside this daemon: `Write` on the same transport, TLS identity
    /// and token secret, doing only the checks and a durable write of the body into
    /// `scratch` (`durable`: `writer` or `inline`, see `nokv-server rpc-floor --help`). Tokens
    /// and configs of the returned handle work against it as against the daemon.
    pub fn floor(&self, scratch: &Path, durable: &str) -> Result<Daemon> {
        let (child, endpoint) = spawn_listening(
            Command::new(&self.server_bin)
                .arg("rpc-floor")
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--scratch")
                .arg(scratch)
                .args(["--durable", durable]),
            &self.server_bin,
        )?;
        Ok(Daemon {
            _proc: child,
            server_bin: self.server_bin.clone(),
            data_dir: self.data_dir.clone(),
            endpoint,
            ca: self.ca.clone(),
            admin_token: String::new(),
            secret_dir: self.secret_dir.clone(),
        })
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self._proc.pid()
    }

    /// Tokens are signed with the secret in `dir` (a cluster directory) from now on.
    pub fn with_secret_dir(mut self, dir: &Path) -> Daemon {
        self.secret_dir = dir.to_path_buf();
        self
    }

    pub fn config(&self, token: &str) -> ResolvedConfig {
        ResolvedConfig {
            endpoint: self.endpoint.clone(),
            ca: self.ca.clone(),
            token: Some(token.to_string()),
        }
    }

    /// A write token scoped to one workspace, issued by the daemon's own tool.
    pub fn token(&self, workspace: &str) -> Result<String> {
        let out = Command::new(&self.server_bin)
            .args(["token", "issue", "--data-dir"])
            .arg(&self.secret_dir)
            .args(["--workspace", workspace, "--role", "write", "--ttl", "1d"])
            .output()
            .map_err(|e| local(e.to_string()))?;
        if !out.status.success() {
            return Err(local(String::from_utf8_lossy(&out.stderr).to_string()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// Starts `cmd` (a `nokv-server` command, `bin`) and waits for its `nokv-server listening on
/// ENDPOINT` line; its stdout keeps being drained so it never blocks on a full pipe.
fn spawn_listening(cmd: &mut Command, bin: &Path) -> Result<(Proc, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| local(format!("{}: {e}", bin.display())))?;
    let stdout = child.stdout.take().expect("piped");
    let child = Proc(child);
    let mut lines = BufReader::new(stdout).lines();
    let endpoint = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(ep) = nokv_client::launch::listening_endpoint(&l) {
                    break ep.to_string();
                }
            }
            _ => return Err(local("nokv-server exited before it was ready")),
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Ok((child, endpoint))
}

/// Debian's `etcd` on free loopback ports, data under `dir`.
pub struct Etcd {
    _proc: Proc,
    pub endpoint: String,
}

impl Etcd {
    /// etcd's process id.
    pub fn pid(&self) -> u32 {
        self._proc.pid()
    }

    /// etcd serving plaintext gRPC (how the cluster mode and the put benchmarks use it).
    pub fn start(dir: &Path) -> Result<Etcd> {
        Etcd::launch(dir, None)
    }

    /// etcd serving its clients over TLS with `cert` and `key` (PEM), so a figure can put
    /// etcd behind the same transport cost nokv always pays. Health is polled on a separate
    /// plaintext metrics port.
    pub fn start_tls(dir: &Path, cert: &Path, key: &Path) -> Result<Etcd> {
        Etcd::launch(dir, Some((cert, key)))
    }

    fn launch(dir: &Path, tls: Option<(&Path, &Path)>) -> Result<Etcd> {
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        let bin = which("etcd").ok_or_else(|| {
            local("etcd is not installed (Debian package etcd-server; scripts/test.sh installs it)")
        })?;
        let url = |scheme: &str, p: u16| format!("{scheme}://127.0.0.1:{p}");
        let client_url = url(if tls.is_some() { "https" } else { "http" }, client);
        let mut cmd = Command::new(bin);
        cmd.args(["--name", "bench", "--data-dir"])
            .arg(dir.join(if tls.is_some() { "etcd-tls" } else { "etcd" }))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &url("http", peer)])
            .args(["--initial-advertise-peer-urls", &url("http", peer)])
            .args(["--initial-cluster", &format!("bench={}", url("http", peer))])
            .args(["--listen-metrics-urls", &url("http", metrics)]);
        if let Some((cert, key)) = tls {
            cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| local(format!("etcd: {e}")))?;
        let proc = Proc(child);
        wait_http(metrics, "/health", |b| b.contains("true"))?;
        Ok(Etcd {
            _proc: proc,
            endpoint: client_url,
        })
    }
}

/// moto's S3 server on a free loopback port with one bucket.
pub struct Moto {
    _proc: Proc,
    port: u16,
    pub endpoint: String,
    pub bucket: String,
}

impl Moto {
    pub fn start() -> Result<Moto> {
        let port = free_port();
        let bin = which("moto_server").ok_or_else(|| {
            local("moto_server is not installed (pip install 'moto[server]'; scripts/test.sh installs it)")
        })?;
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| local(format!("moto_server: {e}")))?;
        let proc = Proc(child);
        wait_http(port, "/", |_| true)?;
        let bucket = "nokv-bench".to_string();
        http(port, "PUT", &format!("/{bucket}"))?;
        Ok(Moto {
            _proc: proc,
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket,
        })
    }

    /// Creates another bucket on the same server.
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        http(self.port, "PUT", &format!("/{name}")).map(|_| ())
    }

    pub fn server_args(&self) -> Vec<String> {
        self.server_args_for(&self.bucket)
    }

    /// Daemon flags for the S3 provider on this server with bucket `bucket`.
    pub fn server_args_for(&self, bucket: &str) -> Vec<String> {
        [
            "--provider",
            "s3",
            "--s3-endpoint",
            &self.endpoint,
            "--s3-bucket",
            bucket,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

/// moto accepts any credentials; give the S3 client some unless the caller set real ones.
pub fn with_test_credentials(cmd: &mut Command) -> &mut Command {
    for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(key).is_none() {
            cmd.env(key, "nokv-bench");
        }
    }
    cmd
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A minimal HTTP/1.1 request on loopback; returns the response text.
fn http(port: u16, method: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| local(e.to_string()))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| local(e.to_string()))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| local(e.to_string()))?;
    Ok(out)
}

/// Polls a readiness endpoint of a service this harness started (30 s budget).
fn wait_http(port: u16, path: &str, ok: impl Fn(&str) -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(body) = http(port, "GET", path)
            && ok(&body)
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(local(format!(
        "service on port {port} did not become ready"
    )))
}

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    pub ops: usize,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

pub fn summarize(mut lat_ms: Vec<f64>, seconds: f64) -> Summary {
    lat_ms.sort_by(|a, b| a.total_cmp(b));
    Summary {
        ops: lat_ms.len(),
        ops_per_s: lat_ms.len() as f64 / seconds.max(1e-9),
        p50_ms: percentile(&lat_ms, 50.0),
        p90_ms: percentile(&lat_ms, 90.0),
        p99_ms: percentile(&lat_ms, 99.0),
    }
}

pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    print!("{}", table(title, header, rows));
}

/// A titled table with right-aligned columns, preceded by a blank line.
pub fn table(title: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:>w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = format!("\n{title}\n{}\n", line(header.to_vec()));
    for r in rows {
        out.push_str(&line(r.iter().map(|s| s.as_str()).collect()));
        out.push('\n');
    }
    out
}

/// Writes the report as JSON into `dir/NAME.json` and says where.
pub fn write_report(dir: &Path, name: &str, report: &Value) -> Result<PathBuf> {
    let path = save_report(dir, name, report)?;
    println!("\nreport written to {}", path.display());
    Ok(path)
}

/// Writes the report as JSON into `dir/NAME.json`, silently (for `--json` runs, whose stdout
/// is one document).
pub fn save_report(dir: &Path, name: &str, report: &Value) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| local(format!("{}: {e}", dir.display())))?;
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(report).expect("report serialises");
    std::fs::write(&path, text).map_err(|e| local(format!("{}: {e}", path.display())))?;
    Ok(path)
}

pub fn f2(x: f64) -> String {
    format!("{x:.2}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 90.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
