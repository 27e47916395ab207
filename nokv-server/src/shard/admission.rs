//! Admission caps on unresolved uploads (`--max-unresolved-uploads`, default 8000 per node;
//! `--max-unresolved-uploads-per-workspace`, default 800). A BeginUpload that would pass
//! either is refused with `AdmissionCapReached` (gRPC `RESOURCE_EXHAUSTED`) and changes
//! nothing. An upload counts from the BeginUpload session that reserves its bytes until the
//! session that consumes or releases the reservation (see [`super::quota`]), so the count is
//! the shard's `reservations` counter.
//!
//! **Per workspace: exact.** A workspace lives in one shard; its counter is read and raised
//! inside the admitting write session, and sessions of a shard run one at a time.
//!
//! **Per node: enforced per admit session against the counters at that moment.** The admit
//! session reads its own shard's counter exactly and adds the other shards' counters as last
//! published in the node's [`UploadCensus`]. Each session that changes a shard's counter
//! publishes the new value from inside the session (on the shard's committer thread, so a
//! shard's publications are in commit order); a session whose commit then fails leaves its
//! publication wrong until the shard's next change or its next reconciler pass, which
//! publishes the committed value again. Two shards admitting at the same moment each see the
//! other's count from before: the node can pass the cap by at most one upload per shard
//! admitting concurrently. Shards a node gives up leave the census when dropped.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The caps and the node-wide census they are checked against. Cloned into every shard of a
/// node (the census is shared).
#[derive(Debug, Clone)]
pub struct Caps {
    pub max_unresolved_uploads: u64,
    pub max_unresolved_uploads_per_workspace: u64,
    pub census: Arc<UploadCensus>,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_unresolved_uploads: 8000,
            max_unresolved_uploads_per_workspace: 800,
            census: Arc::default(),
        }
    }
}

impl Caps {
    /// Refuses one more unresolved upload of workspace `ws` in shard `shard`, which holds
    /// `in_shard` of them, `in_workspace` of which are `ws`'s. Called inside the admitting
    /// session, with counters read in it.
    pub fn admit(&self, shard: u32, ws: &str, in_workspace: u64, in_shard: u64) -> Result<()> {
        if in_workspace >= self.max_unresolved_uploads_per_workspace {
            return Err(Error::AdmissionCapReached(format!(
                "workspace {ws:?} has {in_workspace} unresolved uploads, the most a workspace \
                 may have (--max-unresolved-uploads-per-workspace); commit or abort some first"
            )));
        }
        let on_node = in_shard + self.census.others(shard);
        if on_node >= self.max_unresolved_uploads {
            return Err(Error::AdmissionCapReached(format!(
                "this node has {on_node} unresolved uploads, the most it admits \
                 (--max-unresolved-uploads); retry once some are committed or aborted"
            )));
        }
        Ok(())
    }
}

/// The unresolved-upload count of every shard of the node, as each last published it.
#[derive(Debug, Default)]
pub struct UploadCensus {
    shards: parking_lot::Mutex<HashMap<u32, u64>>,
}

impl UploadCensus {
    /// Records shard `shard`'s current count.
    pub fn publish(&self, shard: u32, unresolved: u64) {
        self.shards.lock().insert(shard, unresolved);
    }

    /// Removes a shard the node no longer holds.
    pub fn forget(&self, shard: u32) {
        self.shards.lock().remove(&shard);
    }

    /// The sum over every shard but `shard`.
    pub fn others(&self, shard: u32) -> u64 {
        let shards = self.shards.lock();
        shards
            .iter()
            .filter(|(s, _)| **s != shard)
            .map(|(_, n)| n)
            .sum()
    }

    /// The sum over every shard.
    pub fn total(&self) -> u64 {
        self.shards.lock().values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutations: `>=` → `>` in either comparison of [`Caps::admit`].
    #[test]
    fn the_caps_refuse_the_upload_that_would_pass_them_counting_other_shards_of_the_node() {
        let caps = Caps {
            max_unresolved_uploads: 10,
            max_unresolved_uploads_per_workspace: 3,
            census: Arc::default(),
        };
        assert!(caps.admit(0, "ws", 2, 2).is_ok());
        let e = caps.admit(0, "ws", 3, 3).unwrap_err();
        assert_eq!(e.reason(), "AdmissionCapReached");
        caps.census.publish(1, 6);
        caps.census.publish(0, 99); // the admitting shard's own entry is never counted
        assert!(caps.admit(0, "ws", 0, 3).is_ok());
        let e = caps.admit(0, "ws", 0, 4).unwrap_err();
        assert_eq!(e.reason(), "AdmissionCapReached");
        caps.census.forget(1);
        assert!(caps.admit(0, "ws", 0, 4).is_ok());
        assert_eq!(caps.census.total(), 99);
    }
}
