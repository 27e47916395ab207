//! The pieces of a bench cluster, shared by `nokv bench cluster`, its failover measurement and
//! the provider-durability node of the put benchmarks: the cluster TLS directory, a node
//! started with it, and waiting for the cluster view to settle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nokv_client::config::ResolvedConfig;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;

use super::harness::{Daemon, Etcd, Result, Scratch, free_port};
use super::load::BenchEnv;

/// Cluster name of the bench cluster.
pub(super) const CLUSTER: &str = "bench";
/// Bucket of the cluster (the embedded daemon uses moto's default bucket).
pub(super) const CLUSTER_BUCKET: &str = "nokv-bench-cluster";
/// Bound on waiting for a cluster state (joining, balancing through checkpoints).
const SETTLE_DEADLINE: Duration = Duration::from_secs(180);
/// Pause between two reads of the cluster view while waiting.
const VIEW_POLL: Duration = Duration::from_millis(100);

pub(super) fn local(msg: impl Into<String>) -> ClientError {
    ClientError::local(msg)
}

/// The shared pieces of a bench cluster: the TLS directory every daemon uses.
pub(super) struct ClusterDir {
    pub(super) dir: PathBuf,
}

impl ClusterDir {
    /// `nokv-server cluster init --dir DIR --host 127.0.0.1`.
    pub(super) fn init(server_bin: &Path, dir: PathBuf) -> Result<ClusterDir> {
        let out = Command::new(server_bin)
            .args(["cluster", "init", "--dir"])
            .arg(&dir)
            .args(["--host", "127.0.0.1"])
            .output()
            .map_err(|e| local(format!("{}: {e}", server_bin.display())))?;
        if !out.status.success() {
            return Err(local(format!(
                "nokv-server cluster init: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(ClusterDir { dir })
    }

    /// A client of `endpoints` (comma-separated) with the cluster's admin token.
    pub(super) async fn admin(&self, endpoints: &str) -> Result<Client> {
        let token = std::fs::read_to_string(self.dir.join("admin.token"))
            .map_err(|e| local(format!("admin.token: {e}")))?;
        Client::connect(&ResolvedConfig {
            endpoint: endpoints.to_string(),
            ca: self.dir.join("ca.pem"),
            token: Some(token.trim().to_string()),
        })
        .await
    }
}

/// Starts one daemon on a fixed loopback port with the cluster directory's identity; with
/// `etcd`, as node `id` of the bench cluster, else embedded (the only difference).
pub(super) fn start_daemon(
    env: &BenchEnv,
    scratch: &Scratch,
    c: &ClusterDir,
    id: &str,
    provider: Vec<String>,
    etcd: Option<&Etcd>,
) -> Result<Daemon> {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<String> = vec![
        "--advertise".into(),
        addr.clone(),
        "--node-id".into(),
        id.into(),
        "--tls-dir".into(),
        c.dir.display().to_string(),
    ];
    args.extend(provider);
    if let Some(etcd) = etcd {
        args.extend([
            "--etcd".into(),
            etcd.endpoint.clone(),
            "--cluster".into(),
            CLUSTER.into(),
        ]);
    }
    let data_dir = scratch.0.join(id);
    Ok(Daemon::start_on(&env.server_bin, &data_dir, &addr, &args)?.with_secret_dir(&c.dir))
}

/// Polls the cluster view until `ok` holds; fails with the last view's summary after
/// [`SETTLE_DEADLINE`]. Errors while polling (a node between states) are retried.
pub(super) async fn wait_view(
    admin: &Client,
    what: &str,
    ok: impl Fn(&pb::ClusterResponse) -> bool,
) -> Result<pb::ClusterResponse> {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    loop {
        let last = match admin.cluster().await {
            Ok(view) if ok(&view) => return Ok(view),
            Ok(view) => describe(&view),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(local(format!("the cluster did not reach {what}: {last}")));
        }
        tokio::time::sleep(VIEW_POLL).await;
    }
}

/// `owner:count` per owner and the shards not serving under a live owner (for errors).
fn describe(view: &pb::ClusterResponse) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unsettled = Vec::new();
    for s in &view.shards {
        *counts.entry(s.owner.as_str()).or_default() += 1;
        if s.state != "serving" || !s.owner_alive {
            unsettled.push(format!("{}:{}", s.shard, s.state));
        }
    }
    format!("owners {counts:?}, unsettled {unsettled:?}")
}

/// Every shard serving under a live owner among `nodes`, every node holding
/// floor or ceil of shards/nodes, and no other node alive.
pub(super) fn settled(view: &pb::ClusterResponse, nodes: &[&str]) -> bool {
    let alive: Vec<&str> = view
        .nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| n.id.as_str())
        .collect();
    if alive.len() != nodes.len() || !nodes.iter().all(|n| alive.contains(n)) {
        return false;
    }
    let shards = view.shards.len();
    let (floor, ceil) = (shards / nodes.len(), shards.div_ceil(nodes.len()));
    let all_serving = view
        .shards
        .iter()
        .all(|s| s.state == "serving" && s.owner_alive && nodes.contains(&s.owner.as_str()));
    all_serving
        && nodes.iter().all(|n| {
            let held = view.shards.iter().filter(|s| s.owner == *n).count();
            (floor..=ceil).contains(&held)
        })
}
