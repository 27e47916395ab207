//! External services on loopback, started by the tests themselves: a real etcd ([`Etcd`], from
//! Debian's `etcd-server`) and moto's S3 server ([`Moto`], from PyPI), each a child process
//! whose output goes to a log file and which is killed on drop.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use crate::{
    POLL_INTERVAL, SERVICE_READY_DEADLINE, free_port, free_ports, require_program, try_http,
    watchdog,
};

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

    /// Sends `signal` (`STOP`, `CONT`) to etcd: a stopped etcd keeps its sockets and answers
    /// nothing, as a partitioned one does (its clients' calls hang instead of failing).
    pub fn signal(&self, signal: &str) {
        let process = self.process.lock().unwrap();
        let process = process.as_ref().expect("etcd is running");
        crate::send_signal(process.child.id(), signal);
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
