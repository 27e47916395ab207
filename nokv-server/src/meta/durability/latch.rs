//! The failure latch of a store handle: once a write fails at the storage level, the handle
//! refuses every later write and every later append, until it is dropped and the file opened
//! again (which lets redb recover to the last durable commit and replays the log).
//!
//! Invariants:
//! * the first reason is kept ([`MetaStore::fail`]);
//! * a failed *fsync* is never a failure to recover from in-process: it is reported first (and,
//!   outside tests, ends the process, see [`super::super::fatal`]) before the handle is marked
//!   failed, so no other thread sees the handle failed and starts a recovery meanwhile — and
//!   whatever redb call reports it afterwards turns into the same fatal error
//!   ([`MetaStore::fatal`]).

use std::path::Path;

use super::super::disk::Synced;
use super::super::{MetaError, MetaStore, StoreFaults, fatal};
use super::round;

impl MetaStore {
    /// Why a write of this handle failed at the storage level, if one did: the handle must
    /// then be replaced.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Marks the handle failed (keeping the first reason) and describes why.
    pub(in crate::meta) fn fail(&self, e: impl Into<redb::Error>) -> MetaError {
        let reason = e.into().to_string();
        // A failed fsync is reported first (outside tests the process ends there), so no other
        // thread sees this handle failed and starts an in-process recovery meanwhile.
        let fatal = self.fatal();
        self.failure.lock().get_or_insert_with(|| reason.clone());
        fatal.unwrap_or(MetaError::Failed(reason))
    }

    /// The fatal error, if an fsync of this store's files has failed (see [`fatal`]): then
    /// whatever redb call reports the failure — the commit that met it, a later transaction
    /// refused with "previous I/O error", a commit that returned `Ok` regardless — ends the
    /// process instead of entering the in-process recovery meant for a full disk.
    pub(in crate::meta) fn fatal(&self) -> Option<MetaError> {
        let (which, error) = self.faults.failed_sync()?;
        let file = match which {
            Synced::Log => round::path_for(&self.path),
            Synced::Store => self.path.clone(),
        };
        let fatal = fatal::sync_failed(&file, which, &error, &self.faults);
        self.failure.lock().get_or_insert(error);
        Some(fatal)
    }
}

/// `e`, unless an fsync failed while opening (then the open's error is that, and fatal).
pub(in crate::meta) fn fatal_if_synced_failed(
    path: &Path,
    faults: &StoreFaults,
    e: MetaError,
) -> MetaError {
    match faults.failed_sync() {
        Some((which, error)) if !matches!(e, MetaError::Fatal { .. }) => {
            let file = match which {
                Synced::Log => round::path_for(path),
                Synced::Store => path.to_path_buf(),
            };
            fatal::sync_failed(&file, which, &error, faults)
        }
        _ => e,
    }
}
