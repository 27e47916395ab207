//! `--metadata-durability provider` for `nokv bench put-vs-etcd` and `scaling` (issue 45):
//! the same 4 KiB put loop against a node that acknowledges a batch only once its redo record
//! is also a segment in the object provider (moto, started here), beside the local-durability
//! daemon and etcd, in one run.
//!
//! Provider durability is a cluster mode (its records live in etcd), so the measured node is a
//! one-node cluster on the bench's etcd and a fresh moto bucket, with the cluster TLS
//! directory; it differs from the local daemon by that and by where its batches are durable.
//! The provider's PUTs during each measurement are read from the node's `admin health`
//! (`log_puts`) before and after, and printed as PUTs per second beside the ops/s.

use serde_json::{Value, json};

use super::cluster_dir::{CLUSTER_BUCKET, ClusterDir, settled, start_daemon, wait_view};
use super::cpu::CpuPerOp;
use super::harness::{Daemon, Etcd, Moto, Result, Scratch, Summary};
use super::load::{BenchEnv, nokv_writes};
use nokv_client::{Client, ClientError};

/// Which durabilities a put benchmark measures (`--metadata-durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// The local daemon only (the default).
    Local,
    /// The local daemon and a provider-durability node, side by side.
    Provider,
}

/// A one-node cluster with provider durability on its own moto server.
pub(super) struct ProviderNode {
    pub(super) node: Daemon,
    admin: Client,
    _moto: Moto,
    _dir: ClusterDir,
}

impl ProviderNode {
    /// Starts moto and node `p1` of a cluster on `etcd` (provider durability is the cluster
    /// default) and waits until it serves every shard.
    pub(super) async fn start(env: &BenchEnv, scratch: &Scratch, etcd: &Etcd) -> Result<Self> {
        let moto = Moto::start()?;
        moto.create_bucket(CLUSTER_BUCKET)?;
        let dir = ClusterDir::init(&env.server_bin, scratch.0.join("provider-cluster"))?;
        let mut args = moto.server_args_for(CLUSTER_BUCKET);
        args.extend(["--metadata-durability".to_string(), "provider".to_string()]);
        let node = start_daemon(env, scratch, &dir, "p1", args, Some(etcd))?;
        let admin = dir.admin(&node.endpoint).await?;
        wait_view(&admin, "p1 serving every shard", |v| settled(v, &["p1"])).await?;
        Ok(ProviderNode {
            node,
            admin,
            _moto: moto,
            _dir: dir,
        })
    }

    /// Segment PUTs the node has sent since it started.
    async fn log_puts(&self) -> Result<u64> {
        let h = self.admin.health().await?;
        if h.metadata_durability != "provider" {
            return Err(ClientError::local(format!(
                "the provider node reports metadata durability {:?}",
                h.metadata_durability
            )));
        }
        Ok(h.log_puts)
    }

    /// `n` clients writing for `seconds` (see `load::nokv_writes`), and the provider PUTs
    /// per second meanwhile.
    pub(super) async fn writes(&self, n: usize, seconds: f64) -> Result<(Summary, CpuPerOp, f64)> {
        let before = self.log_puts().await?;
        let (s, cpu) = nokv_writes(&self.node, n, seconds).await?;
        let puts = self.log_puts().await? - before;
        Ok((s, cpu, puts as f64 / seconds))
    }
}

/// The JSON fields a provider measurement adds beside the local one.
pub(super) fn provider_fields(local: &Summary, provider: &Summary, puts_per_s: f64) -> Value {
    json!({
        "provider": provider,
        "provider_puts_per_s": puts_per_s,
        "ops_ratio_provider_over_local": provider.ops_per_s / local.ops_per_s,
        "p50_ratio_provider_over_local": provider.p50_ms / local.p50_ms,
    })
}
