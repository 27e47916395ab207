//! A storage fault hook for tests, named as such: it makes the metadata store's commits fail
//! the way a full disk does (an I/O error at commit), so the recovery path of a shard can be
//! exercised without mounting a small filesystem.
//!
//! The switches are shared by every [`super::MetaStore`] opened with the same handle, so a
//! store reopened after the failure still sees the "disk" as full until it is freed — as a
//! real full disk would be. Production stores carry a handle that is never switched on; the
//! cost is one atomic load per commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Shared switches; clone freely.
#[derive(Debug, Clone, Default)]
pub struct StoreFaults {
    disk_full: Arc<AtomicBool>,
    log_fails: Arc<AtomicBool>,
}

impl StoreFaults {
    /// From now on every commit fails with `StorageFull` (nothing is written).
    pub fn fill_disk(&self) {
        self.disk_full.store(true, Ordering::SeqCst);
    }

    /// Commits succeed again.
    pub fn free_disk(&self) {
        self.disk_full.store(false, Ordering::SeqCst);
    }

    /// From now on every append to the redo log fails (the store's own commits still work):
    /// the window between a batch's commit and its durability.
    pub fn fail_log(&self) {
        self.log_fails.store(true, Ordering::SeqCst);
    }

    /// Appends to the redo log succeed again.
    pub fn heal_log(&self) {
        self.log_fails.store(false, Ordering::SeqCst);
    }

    /// The error an append to the redo log meets right now, if any (a full disk fails it
    /// too).
    pub(super) fn check_log(&self) -> std::io::Result<()> {
        if self.log_fails.load(Ordering::SeqCst) {
            return Err(std::io::Error::other(
                "redo log write failed (injected fault)",
            ));
        }
        self.check_commit()
    }

    /// The error a commit meets right now, if any.
    pub(super) fn check_commit(&self) -> std::io::Result<()> {
        if self.disk_full.load(Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "No space left on device (injected fault)",
            ));
        }
        Ok(())
    }
}
