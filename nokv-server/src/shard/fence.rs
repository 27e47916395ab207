//! The fence of a shard: who may commit a write session on it, and under which epoch.
//!
//! Leases alone cannot give exclusion — a process paused past its lease still believes it owns
//! the shard. So the epoch of the ownership is stored in the shard's own metadata (raised by
//! the loader when a node takes the shard) and every write session checks, *inside the
//! session*, that the node may still acknowledge the shard at exactly that epoch. Three checks,
//! each necessary:
//!
//! 1. [`Fence::prepare`] before the session is queued: in a cluster, the first write of an
//!    ownership first tells etcd the shard may now differ from its checkpoint (guarded by the
//!    owner key, so a deposed owner cannot); later writes answer from memory.
//! 2. [`Fence::check`] inside the session, on the committer thread: the node's ownership
//!    (memory only: owned table + lease deadline) must name the epoch the store holds. A
//!    session that runs late — queued before a pause, run after it — changes nothing.
//! 3. [`Fence::still_owner`] after the batch's fsync and before the caller is answered: a
//!    lease that lapsed during the fsync means no acknowledgement (the caller retries with the
//!    same request id and reaches the owner; the replay record answers it if the session is in
//!    the checkpoint the owner took).
//!
//! None of the checks talks to etcd except the first write of an ownership: no etcd round
//! trip on the per-request path. The embedded default is epoch 0 everywhere.

use crate::control::{ControlError, Epoch, Ownership, local::LocalOwnership};
use crate::error::{Error, Result};
use crate::meta::WriteView;

/// The fence of one shard (cheap to clone).
#[derive(Clone)]
pub struct Fence {
    shard: u32,
    ownership: Ownership,
}

impl Fence {
    pub fn new(shard: u32, ownership: Ownership) -> Fence {
        Fence { shard, ownership }
    }

    /// The embedded default's fence: epoch 0, always owner.
    pub fn local(shard: u32) -> Fence {
        Fence::new(shard, Ownership::Local(LocalOwnership))
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Check 1 (see the module doc): makes the shard writable under its current ownership.
    pub async fn prepare(&self) -> Result<()> {
        self.ownership
            .prepare_write(self.shard)
            .await
            .map_err(|e| self.lost(e))
    }

    /// Check 2: inside a write session, the stored epoch must be the one the node may
    /// acknowledge under right now.
    pub fn check(&self, w: &WriteView) -> Result<Epoch> {
        let epoch = self
            .ownership
            .acknowledge_epoch(self.shard)
            .map_err(|e| self.lost(e))?;
        let stored = w.epoch()?;
        if stored != epoch {
            return Err(Error::Unavailable(format!(
                "shard {} holds epoch {stored} but this node owns it at epoch {epoch}; \
                 nothing was changed, retry",
                self.shard
            )));
        }
        Ok(epoch)
    }

    /// Check 3: the node may still acknowledge the shard (after the fsync, before answering).
    pub fn still_owner(&self) -> Result<()> {
        self.ownership
            .acknowledge_epoch(self.shard)
            .map(drop)
            .map_err(|e| self.lost(e))
    }

    /// The epoch the loader records in the store when the node takes the shard (owned and
    /// acknowledged, not necessarily marked changed yet).
    pub fn holding_epoch(&self) -> Result<Epoch> {
        self.ownership
            .holding_epoch(self.shard)
            .map_err(|e| self.lost(e))
    }

    fn lost(&self, e: ControlError) -> Error {
        match e {
            ControlError::NotOwner { .. } | ControlError::LeaseLost => Error::Unavailable(format!(
                "shard {} is not acknowledged by this node any more (moving, or its lease \
                 lapsed); nothing was acknowledged, retry",
                self.shard
            )),
            other => other.into(),
        }
    }
}
