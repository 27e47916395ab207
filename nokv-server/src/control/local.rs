//! The embedded default's ownership: this node owns every shard at epoch 0, always.
//!
//! It exists so the server runs one code path in both modes: the write path asks
//! [`crate::control::Ownership`] for an epoch and gets 0 here, without etcd, clocks or failure.

use super::Epoch;

/// "Always owner, epoch 0."
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalOwnership;

impl LocalOwnership {
    /// The epoch of every shard in the embedded default.
    pub const EPOCH: Epoch = 0;

    /// Always [`Self::EPOCH`]: the local node owns every shard.
    pub fn acknowledge_epoch(&self, _shard: u32) -> Epoch {
        Self::EPOCH
    }
}
