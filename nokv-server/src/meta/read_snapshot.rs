//! The read snapshot readers share: a redb snapshot of the last commit, and the batches after
//! it that a held transaction has not committed yet, seen through the memtable
//! ([`super::overlay`]).
//!
//! Invariant: a snapshot is immutable once taken; whether readers may see it (only once every
//! batch it shows is durable) is for its taker to decide (see [`crate::shard::gate`]).

use std::sync::Arc;

use super::overlay::{self, OverlaidTable, Overlay};
use super::{MetaError, MetaResult, Namespace, ReadView};

/// A read snapshot that many readers share (see [`MetaStore::snapshot`]): a redb snapshot,
/// and the batches after it that readers see through the memtable.
#[derive(Clone)]
pub struct Snapshot {
    pub(super) txn: Arc<redb::ReadTransaction>,
    pub(super) overlay: Overlay,
}

impl Snapshot {
    pub(super) fn new(txn: Arc<redb::ReadTransaction>) -> Snapshot {
        Snapshot {
            txn,
            overlay: Overlay::default(),
        }
    }

    /// True if `ns` has tables in this snapshot (see [`MetaStore::holds`]). Namespaces are
    /// created by durable commits, never in a batch, so the redb snapshot alone answers.
    pub fn holds(&self, ns: Namespace) -> MetaResult<bool> {
        ns.exists_in(&self.txn)
    }

    /// Runs `f` on namespace `ns` of this snapshot.
    pub fn read_in<T, E: From<MetaError>>(
        &self,
        ns: Namespace,
        f: impl FnOnce(&ReadView) -> Result<T, E>,
    ) -> Result<T, E> {
        f(&ReadView {
            txn: self.clone(),
            t: ns,
        })
    }

    /// Opens a table as this snapshot shows it: the redb snapshot through the overlay.
    pub(super) fn open_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> Result<OverlaidTable<'_, K, V>, redb::TableError> {
        overlay::open(&self.txn, &self.overlay, def)
    }
}
