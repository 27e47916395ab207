//! Multi-node harness for the cluster tests (issue 10): one etcd, one moto bucket and one
//! cluster TLS directory (`nokv-server cluster init`) shared by several `nokv-server` nodes on
//! loopback, the `nokv` CLI pointed at chosen nodes, and the `nokv admin cluster --json` view
//! the tests poll to learn who owns which shard.
//!
//! Invariants:
//! * A node listens on and advertises one fixed loopback port chosen when its [`NodeSpec`] is
//!   made, so a node restarted on the same data dir keeps the endpoint the cluster knows.
//! * The harness knows which nodes can answer (started, not stopped, not paused): status polls
//!   go only there, because a SIGSTOPped process still accepts TCP connections but never
//!   answers, which would stall the client instead of letting it try the next endpoint.
//! * Every CLI run gets its endpoints from `NOKV_ENDPOINT` and CA and admin token from one
//!   cluster client config, so a test always says exactly which nodes a client may reach.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    CliOutput, Daemon, Etcd, EtcdServerTls, Moto, cli_with_config, free_ports, server_command,
};

/// Shard count of every test cluster (the daemon's default).
pub const SHARDS: u32 = 16;
/// Node lease TTL in seconds: short, so a paused node loses its lease quickly.
pub const NODE_TTL: &str = "3";
/// Credentials moto accepts (it checks none); the S3 client needs some.
pub const S3_ENV: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
];
/// Bound on [`Cluster::wait_until`]: covers balancing 16 shards through checkpoints on a
/// loaded machine with debug builds; a cluster that never reaches the condition fails the
/// test with its last view instead of hanging it.
const VIEW_DEADLINE: Duration = Duration::from_secs(180);
/// Pause between two status polls (each one is a CLI process).
const VIEW_POLL: Duration = Duration::from_millis(200);

/// Who a node is and where it lives: enough to start it again after a stop or a crash.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `--node-id`, e.g. `n1`.
    pub id: String,
    /// The loopback port it listens on and advertises.
    pub port: u16,
    /// Its data dir, owned by the cluster's temporary root (survives the node).
    pub data_dir: PathBuf,
}

impl NodeSpec {
    /// `https://127.0.0.1:PORT`, the endpoint the node advertises.
    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

/// A running cluster node (killed on drop, like every [`Daemon`]).
pub struct Node {
    pub spec: NodeSpec,
    daemon: Daemon,
}

impl Node {
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    pub fn endpoint(&self) -> String {
        self.spec.endpoint()
    }

    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    /// Waits (bounded) for a line of the node's log containing `needle`; see
    /// [`Daemon::wait_for_log_line`].
    pub fn wait_for_log_line(&mut self, needle: &str) -> String {
        self.daemon.wait_for_log_line(needle)
    }
}

/// One test cluster: etcd, moto with the cluster's bucket, the TLS directory, and a temporary
/// root holding every node's data dir. Nodes are separate values owned by the test, started
/// and stopped through the cluster so it knows which of them can answer.
pub struct Cluster {
    // Field order: services die before the root dir is removed.
    etcd: Etcd,
    moto: Moto,
    name: String,
    bucket: String,
    tls_dir: PathBuf,
    client_config: PathBuf,
    /// The etcd access flags every node gets (`--etcd-ca`, `--etcd-cert`, `--etcd-key` when
    /// etcd runs over TLS; none otherwise).
    etcd_access: Vec<String>,
    /// Node id -> endpoint of every node that can answer right now.
    reachable: Mutex<BTreeMap<String, String>>,
    /// Flags every node of this cluster gets (see [`Cluster::with_node_flags`]).
    node_flags: Vec<String>,
    /// Environment every node gets besides the S3 credentials (see
    /// [`Cluster::with_node_env`]).
    node_env: Vec<(String, String)>,
    root: tempfile::TempDir,
}

impl Cluster {
    /// Starts etcd and moto, creates bucket `nokv-NAME` and the cluster TLS directory for host
    /// 127.0.0.1. No node runs yet.
    pub fn new(name: &str) -> Cluster {
        Cluster::build(name, false)
    }

    /// Gives every node started from now on `flags` too (before each start's own), e.g.
    /// `--metadata-durability local` for a test of local durability.
    pub fn with_node_flags(mut self, flags: &[&str]) -> Cluster {
        self.node_flags = flags.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Gives every node started from now on the environment variable `name` = `value` too,
    /// e.g. the test-only provider fault schedule `NOKV_TEST_FAULTS`.
    pub fn with_node_env(mut self, name: &str, value: &str) -> Cluster {
        self.node_env.push((name.to_string(), value.to_string()));
        self
    }

    /// SDK settings for `nodes` (every endpoint, tried in order) with the cluster's CA and
    /// admin token; installs rustls's crypto provider for the SDK's TLS.
    pub fn admin_config(&self, nodes: &[&Node]) -> nokv_client::config::ResolvedConfig {
        let _ = rustls::crypto::ring::default_provider().install_default();
        nokv_client::config::ResolvedConfig {
            endpoint: nodes
                .iter()
                .map(|n| n.endpoint())
                .collect::<Vec<_>>()
                .join(","),
            ca: self.tls_dir.join("ca.pem"),
            token: Some(
                std::fs::read_to_string(self.tls_dir.join("admin.token"))
                    .expect("the cluster's admin token")
                    .trim()
                    .to_string(),
            ),
        }
    }

    /// Like [`Cluster::new`], but etcd serves clients only over TLS and demands a client
    /// certificate signed by the cluster CA (`cluster init --etcd-host 127.0.0.1`); every node
    /// gets `--etcd-ca`, `--etcd-cert` and `--etcd-key` from the cluster directory.
    pub fn with_etcd_tls(name: &str) -> Cluster {
        Cluster::build(name, true)
    }

    fn build(name: &str, etcd_tls: bool) -> Cluster {
        let root = tempfile::tempdir().expect("create cluster root dir");
        let tls_dir = root.path().join("tls");
        let mut init = vec![
            "cluster",
            "init",
            "--dir",
            path_str(&tls_dir),
            "--host",
            "127.0.0.1",
        ];
        if etcd_tls {
            init.extend(["--etcd-host", "127.0.0.1"]);
        }
        server_command(&init).assert_ok();
        let (etcd, etcd_access) = if etcd_tls {
            let etcd = Etcd::start_tls(&EtcdServerTls {
                trusted_ca: tls_dir.join("ca.pem"),
                cert: tls_dir.join("etcd/server.pem"),
                key: tls_dir.join("etcd/server.key"),
            });
            let access = [
                ("--etcd-ca", "ca.pem"),
                ("--etcd-cert", "etcd/client.pem"),
                ("--etcd-key", "etcd/client.key"),
            ]
            .into_iter()
            .flat_map(|(flag, file)| [flag.to_string(), path_str(&tls_dir.join(file)).into()])
            .collect();
            (etcd, access)
        } else {
            (Etcd::start(), Vec::new())
        };
        let moto = Moto::start();
        let bucket = format!("nokv-{name}");
        moto.create_bucket(&bucket);
        let token = std::fs::read_to_string(tls_dir.join("admin.token")).expect("read admin.token");
        // No endpoint here: every run names its endpoints in NOKV_ENDPOINT.
        let client_config = root.path().join("client.toml");
        std::fs::write(
            &client_config,
            format!(
                "ca = {:?}\ntoken = {:?}\n",
                path_str(&tls_dir.join("ca.pem")),
                token.trim()
            ),
        )
        .expect("write cluster client config");
        Cluster {
            etcd,
            moto,
            name: name.to_string(),
            bucket,
            tls_dir,
            client_config,
            etcd_access,
            reachable: Mutex::new(BTreeMap::new()),
            node_flags: Vec::new(),
            node_env: Vec::new(),
            root,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn moto(&self) -> &Moto {
        &self.moto
    }

    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// The temporary root (for test files next to the data dirs).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// A fresh spec for node `n<i>` on a free port, data dir under the cluster root.
    pub fn spec(&self, i: usize) -> NodeSpec {
        self.specs(&[i]).remove(0)
    }

    /// Specs for nodes `n<i>` with pairwise distinct free ports.
    pub fn specs(&self, ids: &[usize]) -> Vec<NodeSpec> {
        free_ports(ids.len())
            .into_iter()
            .zip(ids)
            .map(|(port, i)| NodeSpec {
                id: format!("n{i}"),
                port,
                data_dir: self.root.path().join(format!("n{i}")),
            })
            .collect()
    }

    /// The daemon flags of `spec` in this cluster, then `extra` (which may override nothing
    /// already given: clap refuses a repeated flag, so the refusal tests add only new ones).
    pub fn node_args(&self, spec: &NodeSpec, extra: &[&str]) -> Vec<String> {
        let access: Vec<&str> = self.etcd_access.iter().map(String::as_str).collect();
        self.node_args_with_etcd_access(spec, &access, extra)
    }

    /// The cluster's TLS directory (`cluster init` output).
    pub fn tls_dir(&self) -> &Path {
        &self.tls_dir
    }

    /// Like [`Cluster::node_args`], with `access` in place of the cluster's etcd access flags
    /// (a refusal test gives none, or another CA's certificate).
    pub fn node_args_with_etcd_access(
        &self,
        spec: &NodeSpec,
        access: &[&str],
        extra: &[&str],
    ) -> Vec<String> {
        let addr = format!("127.0.0.1:{}", spec.port);
        let mut args: Vec<String> = [
            "--listen",
            &addr,
            "--advertise",
            &addr,
            "--node-id",
            &spec.id,
            "--tls-dir",
            path_str(&self.tls_dir),
            "--etcd",
            &self.etcd.endpoint(),
            "--cluster",
            &self.name,
            "--node-ttl",
            NODE_TTL,
            "--provider",
            "s3",
            "--s3-endpoint",
            &self.moto.endpoint(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !extra.contains(&"--s3-bucket") {
            args.extend(["--s3-bucket".to_string(), self.bucket.clone()]);
        }
        args.extend(access.iter().map(|s| s.to_string()));
        args.extend(self.node_flags.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Starts a node on its data dir (creating it) and waits until it listens.
    pub fn start(&self, spec: NodeSpec) -> Node {
        self.start_with(spec, &[])
    }

    /// Like [`Cluster::start`] with extra daemon flags.
    pub fn start_with(&self, spec: NodeSpec, extra: &[&str]) -> Node {
        self.start_with_env(spec, extra, &[])
    }

    /// Like [`Cluster::start_with`], with environment for this node only (e.g. a provider
    /// fault schedule one node of several runs with).
    pub fn start_with_env(&self, spec: NodeSpec, extra: &[&str], own_env: &[(&str, &str)]) -> Node {
        std::fs::create_dir_all(&spec.data_dir).expect("create node data dir");
        let args = self.node_args(&spec, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env: Vec<(&str, &str)> = S3_ENV.to_vec();
        env.extend(self.node_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        env.extend_from_slice(own_env);
        let daemon = Daemon::start_in_with_env(&spec.data_dir, &args, &env);
        self.reachable
            .lock()
            .unwrap()
            .insert(spec.id.clone(), spec.endpoint());
        Node { spec, daemon }
    }

    /// Starts nodes `n1..=n<count>` one after the other.
    pub fn start_nodes(&self, count: usize) -> Vec<Node> {
        let ids: Vec<usize> = (1..=count).collect();
        self.specs(&ids)
            .into_iter()
            .map(|spec| self.start(spec))
            .collect()
    }

    /// Starts a node expected to refuse: returns its exit status and stderr (panics if it
    /// listens instead).
    pub fn start_refused(&self, spec: &NodeSpec, extra: &[&str]) -> (ExitStatus, String) {
        let access: Vec<&str> = self.etcd_access.iter().map(String::as_str).collect();
        self.start_refused_with_etcd_access(spec, &access, extra)
    }

    /// Like [`Cluster::start_refused`], with `access` in place of the cluster's etcd access
    /// flags.
    pub fn start_refused_with_etcd_access(
        &self,
        spec: &NodeSpec,
        access: &[&str],
        extra: &[&str],
    ) -> (ExitStatus, String) {
        std::fs::create_dir_all(&spec.data_dir).expect("create node data dir");
        let args = self.node_args_with_etcd_access(spec, access, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, _stdout, stderr) =
            Daemon::start_refused_in_with_env(&spec.data_dir, &args, &S3_ENV);
        (status, stderr)
    }

    /// SIGTERM and wait for exit: returns the exit status, the spec (to restart it) and all
    /// the node logged.
    pub fn terminate(&self, node: Node) -> (ExitStatus, NodeSpec, String) {
        self.reachable.lock().unwrap().remove(&node.spec.id);
        let (status, _stdout, stderr) = node.daemon.terminate_collecting_output();
        (status, node.spec, stderr)
    }

    /// SIGKILL (a crash): returns the spec, to restart it on the same data dir.
    pub fn kill9(&self, node: Node) -> NodeSpec {
        self.reachable.lock().unwrap().remove(&node.spec.id);
        node.daemon.kill9();
        node.spec
    }

    /// SIGSTOP: the node keeps its sockets but runs nothing (not even its lease keep-alive).
    pub fn pause(&self, node: &Node) {
        self.reachable.lock().unwrap().remove(&node.spec.id);
        node.daemon.signal("STOP");
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, node: &Node) {
        node.daemon.signal("CONT");
        self.reachable
            .lock()
            .unwrap()
            .insert(node.spec.id.clone(), node.spec.endpoint());
    }

    /// Endpoints of every node that can answer now, in node-id order.
    pub fn reachable_endpoints(&self) -> Vec<String> {
        self.reachable.lock().unwrap().values().cloned().collect()
    }

    /// Runs the `nokv` CLI with the admin token against exactly `endpoints` (in order).
    pub fn cli(&self, endpoints: &[String], args: &[&str]) -> CliOutput {
        self.cli_stdin(endpoints, args, None)
    }

    /// Like [`Cluster::cli`] with `stdin` fed to the process.
    pub fn cli_stdin(
        &self,
        endpoints: &[String],
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> CliOutput {
        let endpoints = endpoints.join(",");
        cli_with_config(
            &self.client_config,
            args,
            &[("NOKV_ENDPOINT", &endpoints)],
            stdin,
        )
    }

    /// Runs the CLI against `node` alone.
    pub fn cli_via(&self, node: &Node, args: &[&str]) -> CliOutput {
        self.cli(&[node.endpoint()], args)
    }

    /// `nokv admin health --json` answered by `node` alone.
    pub fn health(&self, node: &Node) -> Value {
        self.cli_via(node, &["--json", "admin", "health"])
            .assert_ok()
            .json()
    }

    /// One `nokv admin cluster --json` through every reachable node; `Err` carries what went
    /// wrong (a node may be between states), for the caller to retry or report.
    pub fn view(&self) -> Result<ClusterView, String> {
        let endpoints = self.reachable_endpoints();
        if endpoints.is_empty() {
            return Err("no reachable node".into());
        }
        let out = self.cli(&endpoints, &["--json", "admin", "cluster"]);
        if out.status != 0 {
            return Err(format!(
                "nokv admin cluster exited {}: {}",
                out.status,
                out.stderr.trim()
            ));
        }
        let json: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("not JSON ({e}): {}", out.stdout_str()))?;
        ClusterView::parse(json)
    }

    /// Polls the cluster view until `condition` holds and returns that view; panics with the
    /// last view (or the last error) once [`VIEW_DEADLINE`] passes. Polling a status command
    /// is the only way a test learns about ownership changes: the cluster emits no event.
    #[track_caller]
    pub fn wait_until(
        &self,
        what: &str,
        condition: impl FnMut(&ClusterView) -> bool,
    ) -> ClusterView {
        poll(what, || self.view(), condition)
    }

    /// Polls `node`'s `nokv admin health --json` (answered by it alone) until `condition`
    /// holds, like [`Cluster::wait_until`]: what a node has loaded can trail what the
    /// cluster records say about it.
    #[track_caller]
    pub fn wait_until_health(
        &self,
        node: &Node,
        what: &str,
        condition: impl FnMut(&Value) -> bool,
    ) -> Value {
        let fetch = || {
            let out = self.cli_via(node, &["--json", "admin", "health"]);
            if out.status != 0 {
                return Err(format!(
                    "nokv admin health exited {}: {}",
                    out.status,
                    out.stderr.trim()
                ));
            }
            serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("not JSON ({e}): {}", out.stdout_str()))
        };
        poll(
            &format!("{what} (health of {})", node.id()),
            fetch,
            condition,
        )
    }

    /// Waits until each of `nodes` has loaded every shard the cluster's records say it serves
    /// (its `admin health` lists them as owned), reading the records afresh each time (a
    /// balance step may move a shard meanwhile). The records say "serving" from the
    /// acquisition on; a taker first replays the old owner's log, and a node loads its shards
    /// one after another, so a read can meet "moving between nodes" for longer than the SDK
    /// retries.
    #[track_caller]
    pub fn wait_loaded(&self, nodes: &[&Node]) {
        let fetch = || {
            let view = self.view()?;
            let mut missing = Vec::new();
            for node in nodes {
                let out = self.cli_via(node, &["--json", "admin", "health"]);
                if out.status != 0 {
                    return Err(format!(
                        "nokv admin health of {} exited {}: {}",
                        node.id(),
                        out.status,
                        out.stderr.trim()
                    ));
                }
                let health: Value = serde_json::from_slice(&out.stdout)
                    .map_err(|e| format!("not JSON ({e}): {}", out.stdout_str()))?;
                let owned: Vec<u64> = health["shards"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| s["owned"].as_bool() == Some(true))
                    .filter_map(|s| s["shard"].as_u64())
                    .collect();
                missing.extend(
                    view.shards
                        .iter()
                        .filter(|s| s.served_by(node.id()) && !owned.contains(&u64::from(s.shard)))
                        .map(|s| format!("{} has not loaded shard {}", node.id(), s.shard)),
                );
            }
            Ok(NotLoaded(missing))
        };
        poll(
            "every node loaded the shards it serves",
            fetch,
            |m: &NotLoaded| m.0.is_empty(),
        );
    }

    /// Waits until the shards are spread over exactly `nodes`, each serving between
    /// `SHARDS / n` and its ceiling (5 or 6 for three nodes), every owner alive.
    #[track_caller]
    pub fn wait_balanced(&self, nodes: &[&Node]) -> ClusterView {
        let ids: Vec<&str> = nodes.iter().map(|n| n.id()).collect();
        self.wait_until(&format!("{SHARDS} shards balanced over {ids:?}"), |v| {
            v.balanced_over(&ids)
        })
    }

    /// The shard of each workspace, as `Route` answers through `via` (the placement is the
    /// server's business; the test only asks).
    pub fn shards_of(&self, via: &Node, workspaces: &[String]) -> Vec<u32> {
        let cfg = nokv_client::config::ResolvedConfig {
            endpoint: via.endpoint(),
            ca: self.tls_dir.join("ca.pem"),
            token: Some(
                std::fs::read_to_string(self.tls_dir.join("admin.token"))
                    .expect("read admin.token")
                    .trim()
                    .to_string(),
            ),
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async {
            let client = nokv_client::Client::connect(&cfg).await.expect("connect");
            let mut shards = Vec::with_capacity(workspaces.len());
            for ws in workspaces {
                let route = client
                    .route(ws)
                    .await
                    .unwrap_or_else(|e| panic!("route {ws}: {e:?}"));
                shards.push(route.shard);
            }
            shards
        })
    }

    /// `count` workspace names (`PREFIX-<k>`) whose shard is `shard`.
    pub fn workspaces_in_shard(
        &self,
        via: &Node,
        prefix: &str,
        shard: u32,
        count: usize,
    ) -> Vec<String> {
        self.workspaces_in_shards(via, prefix, &[shard], count)
    }

    /// `per_shard` workspace names (`PREFIX-<k>`) for each of `shards`, grouped by shard in
    /// the order given.
    pub fn workspaces_in_shards(
        &self,
        via: &Node,
        prefix: &str,
        shards: &[u32],
        per_shard: usize,
    ) -> Vec<String> {
        let mut found: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        let enough = |found: &BTreeMap<u32, Vec<String>>| {
            shards
                .iter()
                .all(|s| found.get(s).map_or(0, Vec::len) >= per_shard)
        };
        let mut k = 0;
        while !enough(&found) {
            // Batches keep the number of connections small.
            let batch: Vec<String> = (k..k + 64).map(|i| format!("{prefix}-{i}")).collect();
            k += 64;
            assert!(k <= 64 * 64, "shards {shards:?} not all hit by {k} names");
            for (ws, s) in batch.iter().zip(self.shards_of(via, &batch)) {
                let list = found.entry(s).or_default();
                if shards.contains(&s) && list.len() < per_shard {
                    list.push(ws.clone());
                }
            }
        }
        shards
            .iter()
            .flat_map(|s| found.remove(s).unwrap_or_default())
            .collect()
    }
}

/// Calls `fetch` until its answer satisfies `condition` and returns that answer; panics with
/// the last answer (or error) once [`VIEW_DEADLINE`] passes.
#[track_caller]
fn poll<T: fmt::Display>(
    what: &str,
    mut fetch: impl FnMut() -> Result<T, String>,
    mut condition: impl FnMut(&T) -> bool,
) -> T {
    let deadline = Instant::now() + VIEW_DEADLINE;
    loop {
        let last = match fetch() {
            Ok(answer) if condition(&answer) => return answer,
            Ok(answer) => answer.to_string(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("never reached: {what} (within {VIEW_DEADLINE:?})\nlast answer:\n{last}");
        }
        // Status polling: see `Cluster::wait_until`.
        thread::sleep(VIEW_POLL);
    }
}

/// What [`Cluster::wait_loaded`] still waits for.
struct NotLoaded(Vec<String>);

impl fmt::Display for NotLoaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

/// The UTF-8 form of a test path (temp dirs are always UTF-8 here).
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// One node as `nokv admin cluster --json` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub id: String,
    pub endpoint: String,
    pub alive: bool,
}

/// One shard as `nokv admin cluster --json` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardView {
    pub shard: u32,
    pub owner: Option<String>,
    pub endpoint: Option<String>,
    pub epoch: u64,
    /// serving | draining | handoff | unowned
    pub state: String,
    pub owner_alive: bool,
    pub checkpoint_size: Option<u64>,
    pub checkpoint_age_ms: Option<u64>,
}

impl ShardView {
    /// Owned by `id`, whose lease is alive, and serving.
    pub fn served_by(&self, id: &str) -> bool {
        self.owner.as_deref() == Some(id) && self.state == "serving" && self.owner_alive
    }
}

/// The answer of `nokv admin cluster --json`, parsed (the field names are the issue's
/// contract, so a renamed field fails here, loudly).
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub cluster: Option<String>,
    pub nodes: Vec<NodeView>,
    pub shards: Vec<ShardView>,
}

impl ClusterView {
    pub fn parse(json: Value) -> Result<ClusterView, String> {
        let field = |v: &Value, k: &str| -> Result<Value, String> {
            v.get(k)
                .cloned()
                .ok_or_else(|| format!("no field {k:?} in {v}"))
        };
        let opt_str = |v: Value| v.as_str().map(String::from);
        let nodes = field(&json, "nodes")?
            .as_array()
            .ok_or("nodes is not an array")?
            .iter()
            .map(|n| {
                Ok(NodeView {
                    id: opt_str(field(n, "id")?).ok_or("node id not a string")?,
                    endpoint: opt_str(field(n, "endpoint")?).ok_or("endpoint not a string")?,
                    alive: field(n, "alive")?.as_bool().ok_or("alive not a bool")?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let shards = field(&json, "shards")?
            .as_array()
            .ok_or("shards is not an array")?
            .iter()
            .map(|s| {
                Ok(ShardView {
                    shard: field(s, "shard")?.as_u64().ok_or("shard not a number")? as u32,
                    owner: opt_str(field(s, "owner")?),
                    endpoint: opt_str(field(s, "endpoint")?),
                    epoch: field(s, "epoch")?.as_u64().ok_or("epoch not a number")?,
                    state: opt_str(field(s, "state")?).ok_or("state not a string")?,
                    owner_alive: field(s, "owner_alive")?
                        .as_bool()
                        .ok_or("owner_alive not a bool")?,
                    checkpoint_size: field(s, "checkpoint_size")?.as_u64(),
                    checkpoint_age_ms: field(s, "checkpoint_age_ms")?.as_u64(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(ClusterView {
            cluster: opt_str(field(&json, "cluster")?),
            nodes,
            shards,
        })
    }

    /// Shard `s`; panics if the view does not list it.
    pub fn shard(&self, s: u32) -> &ShardView {
        self.shards
            .iter()
            .find(|v| v.shard == s)
            .unwrap_or_else(|| panic!("shard {s} not in the view:\n{self}"))
    }

    /// Shards whose recorded owner is `id` (alive or not), ascending.
    pub fn owned_by(&self, id: &str) -> Vec<u32> {
        self.shards
            .iter()
            .filter(|s| s.owner.as_deref() == Some(id))
            .map(|s| s.shard)
            .collect()
    }

    /// Shards `id` owns, serves and holds a live lease for, ascending.
    pub fn served_by(&self, id: &str) -> Vec<u32> {
        self.shards
            .iter()
            .filter(|s| s.served_by(id))
            .map(|s| s.shard)
            .collect()
    }

    /// Whether node `id` is listed with a live lease.
    pub fn node_alive(&self, id: &str) -> bool {
        self.nodes.iter().any(|n| n.id == id && n.alive)
    }

    /// All [`SHARDS`] shards are served by nodes of `ids` (each alive), each node serving
    /// between `SHARDS / n` and its ceiling.
    pub fn balanced_over(&self, ids: &[&str]) -> bool {
        let n = ids.len() as u32;
        let (lo, hi) = (SHARDS / n, SHARDS.div_ceil(n));
        self.shards.len() == SHARDS as usize
            && ids.iter().all(|id| self.node_alive(id))
            && self
                .shards
                .iter()
                .all(|s| ids.iter().any(|id| s.served_by(id)))
            && ids.iter().all(|id| {
                let c = self.served_by(id).len() as u32;
                (lo..=hi).contains(&c)
            })
    }

    /// Shards served per node id.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for s in self
            .shards
            .iter()
            .filter(|s| s.state == "serving" && s.owner_alive)
        {
            if let Some(owner) = &s.owner {
                *counts.entry(owner.clone()).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl fmt::Display for ClusterView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cluster {:?}", self.cluster)?;
        for n in &self.nodes {
            writeln!(f, "  node {} {} alive={}", n.id, n.endpoint, n.alive)?;
        }
        for s in &self.shards {
            writeln!(
                f,
                "  shard {:>2} owner={:<6} epoch={:<3} {:<8} owner_alive={} ckpt={:?}",
                s.shard,
                s.owner.as_deref().unwrap_or("-"),
                s.epoch,
                s.state,
                s.owner_alive,
                s.checkpoint_size
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_view_in_the_contract_shape_parses_and_balance_is_judged_per_node() {
        let mut shards = Vec::new();
        for s in 0..SHARDS {
            let owner = ["n1", "n2", "n3"][(s % 3) as usize];
            shards.push(serde_json::json!({
                "shard": s, "owner": owner, "endpoint": "https://127.0.0.1:1", "epoch": 2,
                "state": "serving", "owner_alive": true, "checkpoint_size": null,
                "checkpoint_age_ms": null}));
        }
        let nodes: Vec<Value> = ["n1", "n2", "n3"]
            .iter()
            .map(|id| serde_json::json!({"id": id, "endpoint": "https://127.0.0.1:1", "alive": true}))
            .collect();
        let json = serde_json::json!({"cluster": "c", "nodes": nodes, "shards": shards});
        let view = ClusterView::parse(json).unwrap();
        assert_eq!(view.served_by("n1").len(), 6);
        assert!(view.balanced_over(&["n1", "n2", "n3"]));
        assert!(
            !view.balanced_over(&["n1", "n2"]),
            "n3's shards are not n1's or n2's"
        );
        assert_eq!(view.shard(4).owner.as_deref(), Some("n2"));

        let mut unbalanced = view.clone();
        for s in unbalanced
            .shards
            .iter_mut()
            .filter(|s| s.owner.as_deref() == Some("n3"))
        {
            s.owner = Some("n1".into());
        }
        assert!(!unbalanced.balanced_over(&["n1", "n2", "n3"]));
        assert!(ClusterView::parse(serde_json::json!({"nodes": []})).is_err());
    }
}
