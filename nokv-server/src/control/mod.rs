//! Which shards this node may serve, and under which fencing epoch.
//!
//! Two forms behind one type, [`Ownership`]:
//! * [`local::LocalOwnership`] — the embedded default: this node owns every shard, epoch 0,
//!   forever. No etcd, no clock, nothing that can fail.
//! * [`etcd::EtcdControl`] — cluster mode: ownership comes from etcd through one lease per
//!   node, with a fencing epoch raised by one on every acquisition.
//!
//! The question the write path asks, [`Ownership::acknowledge_epoch`], is answered from memory
//! with no await and no etcd round trip: an owned-shard table plus a monotonic
//! [`deadline::AckDeadline`]. Everything that talks to etcd (joining, acquiring, releasing,
//! balancing) is async and lives off the request path.
//!
//! Invariants the callers rely on:
//! * a shard is reported owned at epoch `e` only after etcd committed the acquisition that set
//!   the record's epoch to `e` and attached the owner key to this node's lease;
//! * a shard stops being reported owned *before* the release transaction is sent (fail
//!   closed), and as soon as the acknowledge deadline has passed (no keep-alive confirmed the
//!   lease recently enough);
//! * epochs of one shard only grow: every acquisition is `record.epoch + 1` under a
//!   compare on the record's `mod_revision`, so two acquisitions can never produce the same epoch.
//!
//! The lease alone cannot guarantee exclusion (a paused process outlives its lease): the epoch
//! is meant to be persisted in the shard's own metadata and re-checked in every write session,
//! so storage rejects a deposed owner. That wiring belongs to the shard, not to this module.

pub mod access;
pub mod deadline;
pub mod etcd;
#[cfg(test)]
pub mod fake;
pub mod local;

use std::sync::Arc;

/// Fencing epoch of a shard's ownership. The embedded default is always epoch 0; in a cluster
/// the first acquisition of a shard yields 1.
pub type Epoch = u64;

/// Errors of the control plane. Variant names are reasons; the mapping to gRPC status happens
/// in `crate::error` once the control plane is wired into the server.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// etcd could not be reached or refused the call (retryable).
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// Joining found etcd unusable with this node's access settings (TLS files, certificate,
    /// credentials, endpoints): one line naming the cause, never the password.
    #[error(transparent)]
    Access(#[from] access::AccessError),
    /// This node's settings disagree with the cluster record created by the first node.
    #[error(
        "cluster {cluster:?} was created with {field} = {recorded}, this node has {ours}; \
         start it with the cluster's settings or use another --cluster name"
    )]
    ConfigMismatch {
        cluster: String,
        field: &'static str,
        recorded: String,
        ours: String,
    },
    /// Another live lease holds this node id (a second process, or a crash less than one
    /// lease TTL ago).
    #[error("node id {node:?} is registered by another live lease in cluster {cluster:?}")]
    NodeIdInUse { cluster: String, node: String },
    /// The node's lease expired or was revoked: it owns nothing any more and must rejoin.
    #[error("the node's etcd lease is lost")]
    LeaseLost,
    /// The shard is not owned by this node (or the acknowledge deadline has passed).
    #[error("shard {shard} is not owned by this node")]
    NotOwner { shard: u32 },
    /// A shard number outside `0..shard_count`.
    #[error("shard {shard} is out of range (cluster has {shard_count} shards)")]
    ShardOutOfRange { shard: u32, shard_count: u32 },
    /// A value under the cluster prefix that does not decode: written by something else.
    #[error("undecodable etcd value at {key}: {reason}")]
    Corrupt { key: String, reason: String },
    /// Bad settings given to the control plane (empty node id, zero TTL, ...).
    #[error("{0}")]
    InvalidArgument(String),
}

/// The ownership abstraction the server holds: local (embedded default) or etcd (cluster).
#[derive(Clone)]
pub enum Ownership {
    Local(local::LocalOwnership),
    Etcd(Arc<etcd::EtcdControl>),
    /// Unit tests of the fence only.
    #[cfg(test)]
    Fake(Arc<fake::FakeOwnership>),
}

impl Ownership {
    /// The epoch under which this node may acknowledge a write on `shard` right now, or
    /// `NotOwner`. Synchronous and free of I/O: safe to call inside a write session.
    pub fn acknowledge_epoch(&self, shard: u32) -> Result<Epoch, ControlError> {
        match self {
            Ownership::Local(local) => Ok(local.acknowledge_epoch(shard)),
            Ownership::Etcd(etcd) => etcd.acknowledge_epoch(shard),
            #[cfg(test)]
            Ownership::Fake(fake) => match fake.holding(shard)? {
                (epoch, true) => Ok(epoch),
                _ => Err(ControlError::NotOwner { shard }),
            },
        }
    }

    /// The epoch `shard` is held at, while it is owned and acknowledged, ignoring whether the
    /// ownership was marked changed yet (the loader records this epoch in the store before the
    /// first write session). Memory only.
    pub fn holding_epoch(&self, shard: u32) -> Result<Epoch, ControlError> {
        match self {
            Ownership::Local(local) => Ok(local.acknowledge_epoch(shard)),
            Ownership::Etcd(etcd) => etcd.holding(shard).map(|(epoch, _)| epoch),
            #[cfg(test)]
            Ownership::Fake(fake) => fake.holding(shard).map(|(epoch, _)| epoch),
        }
    }

    /// Makes `shard` writable under its current ownership: in a cluster, once per ownership,
    /// tells etcd the shard may now differ from its checkpoint (one guarded transaction; later
    /// calls answer from memory). The embedded default has nothing to do.
    pub async fn prepare_write(&self, shard: u32) -> Result<(), ControlError> {
        match self {
            Ownership::Local(_) => Ok(()),
            Ownership::Etcd(etcd) => etcd.mark_changed(shard).await,
            #[cfg(test)]
            Ownership::Fake(fake) => fake.mark_changed(shard),
        }
    }

    /// True for the embedded default (no etcd).
    pub fn is_local(&self) -> bool {
        matches!(self, Ownership::Local(_))
    }
}
