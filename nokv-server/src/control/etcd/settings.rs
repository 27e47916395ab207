//! What a node brings to a cluster ([`EtcdSettings`]) and the check that the cluster agrees
//! with it ([`ensure_config`]).
//!
//! Invariants:
//! * settings are validated before anything is sent to etcd: non-empty endpoints, a cluster
//!   name and node id without `/` (they are key segments), a TTL of at least 1 s and a safety
//!   margin shorter than it, at least one shard;
//! * the cluster record is created by exactly one node (a create-if-absent transaction) and
//!   never rewritten; a node whose shard count, bucket or prefix differ from it refuses to join
//!   ([`ControlError::ConfigMismatch`]) instead of overwriting it.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::records::{ClusterConfig, Keys, decode, encode};
use crate::control::ControlError;
use crate::control::access::EtcdAccess;

type Result<T, E = ControlError> = std::result::Result<T, E>;

/// Default node lease TTL (`--node-ttl`).
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);

/// What joining found at `config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigOutcome {
    /// This node created the cluster record.
    Created,
    /// The record existed and matches this node's settings.
    Joined,
}

/// How a node joins a cluster.
#[derive(Clone, Debug)]
pub struct EtcdSettings {
    /// etcd client URLs (`--etcd URL[,URL]`).
    pub endpoints: Vec<String>,
    /// Cluster name (`--cluster`): the key prefix `/nokv/<cluster>/`.
    pub cluster: String,
    /// This node's id (`--node-id`).
    pub node_id: String,
    /// Endpoint other nodes and clients reach this node at (`--advertise`).
    pub advertise: String,
    /// Lease TTL (`--node-ttl`, default 10 s); keep-alives go out every third of it.
    pub node_ttl: Duration,
    /// Subtracted from each confirmed lease life to get the acknowledge deadline.
    pub safety_margin: Duration,
    /// The settings this node expects the cluster record to hold.
    pub config: ClusterConfig,
    /// TLS and credentials for etcd ([`crate::control::access`]); plain http by default.
    pub access: EtcdAccess,
}

impl EtcdSettings {
    /// Settings with the default TTL and a safety margin of a fifth of it.
    pub fn new(
        endpoints: Vec<String>,
        cluster: impl Into<String>,
        node_id: impl Into<String>,
        advertise: impl Into<String>,
        config: ClusterConfig,
    ) -> EtcdSettings {
        EtcdSettings {
            endpoints,
            cluster: cluster.into(),
            node_id: node_id.into(),
            advertise: advertise.into(),
            node_ttl: DEFAULT_NODE_TTL,
            safety_margin: DEFAULT_NODE_TTL / 5,
            config,
            access: EtcdAccess::plain(),
        }
    }

    /// Sets how etcd is reached (TLS, client certificate, user).
    pub fn with_access(mut self, access: EtcdAccess) -> EtcdSettings {
        self.access = access;
        self
    }

    /// Sets the TTL and rescales the safety margin to a fifth of it.
    pub fn with_node_ttl(mut self, ttl: Duration) -> EtcdSettings {
        self.node_ttl = ttl;
        self.safety_margin = ttl / 5;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ControlError::InvalidArgument(m.to_string()));
        if self.endpoints.is_empty() {
            return bad("--etcd needs at least one URL");
        }
        for (name, value) in [("--cluster", &self.cluster), ("--node-id", &self.node_id)] {
            if value.is_empty() || value.contains('/') {
                return bad(&format!("{name} must be non-empty and contain no '/'"));
            }
        }
        if self.advertise.is_empty() {
            return bad("--advertise must be set in cluster mode");
        }
        if self.node_ttl < Duration::from_secs(1) {
            return bad("--node-ttl must be at least 1s");
        }
        if self.safety_margin >= self.node_ttl {
            return bad("the safety margin must be shorter than --node-ttl");
        }
        if self.config.shards == 0 {
            return bad("the shard count must be at least 1");
        }
        Ok(())
    }
}

/// Creates the cluster record if absent (one transaction), else checks it against ours.
pub(super) async fn ensure_config(
    client: &mut Client,
    keys: &Keys,
    settings: &EtcdSettings,
) -> Result<ConfigOutcome> {
    let key = keys.config();
    let ours = &settings.config;
    let response = client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), encode(ours), None)])
                .or_else([TxnOp::get(key.clone(), None)]),
        )
        .await?;
    if response.succeeded() {
        tracing::info!(cluster = %settings.cluster, "created the cluster record");
        return Ok(ConfigOutcome::Created);
    }
    let recorded: ClusterConfig = response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .map(|value| decode(&key, &value))
        .transpose()?
        .ok_or_else(|| ControlError::Corrupt {
            key: key.clone(),
            reason: "present for the compare, absent for the read".into(),
        })?;
    let mismatch = |field, recorded: String, ours: String| {
        Err(ControlError::ConfigMismatch {
            cluster: settings.cluster.clone(),
            field,
            recorded,
            ours,
        })
    };
    if recorded.shards != ours.shards {
        return mismatch(
            "shards",
            recorded.shards.to_string(),
            ours.shards.to_string(),
        );
    }
    if recorded.bucket != ours.bucket {
        return mismatch("bucket", recorded.bucket, ours.bucket.clone());
    }
    if recorded.prefix != ours.prefix {
        return mismatch("prefix", recorded.prefix, ours.prefix.clone());
    }
    Ok(ConfigOutcome::Joined)
}
