//! A storage fault hook for tests, named as such: it makes the metadata store's commits fail
//! the way a full disk does (an I/O error at commit), so the recovery path of a shard can be
//! exercised without mounting a small filesystem — and fails undo steps, or pauses the gate at
//! chosen points (a log append, the show of a durable batch), for the failure paths between.
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
    log_pause: Arc<Pause>,
    show_pause: Arc<Pause>,
    undo_fails: Arc<AtomicBool>,
}

/// Holds a step back while paused (see [`StoreFaults::pause_log`]).
#[derive(Debug, Default)]
struct Pause {
    /// (paused, steps waiting)
    state: parking_lot::Mutex<(bool, usize)>,
    changed: parking_lot::Condvar,
}

impl Pause {
    fn set(&self, paused: bool) {
        self.state.lock().0 = paused;
        self.changed.notify_all();
    }

    /// Blocks until a step waits here.
    fn wait_for_a_waiter(&self) {
        let mut state = self.state.lock();
        while state.1 == 0 {
            self.changed.wait(&mut state);
        }
    }

    /// Waits here while paused (counted as waiting meanwhile).
    fn hold(&self) {
        let mut state = self.state.lock();
        if state.0 {
            state.1 += 1;
            self.changed.notify_all();
            while state.0 {
                self.changed.wait(&mut state);
            }
            state.1 -= 1;
        }
    }
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

    /// From now on appends to the redo log wait (before writing anything) until
    /// [`StoreFaults::resume_log`]: the window in which a batch is committed but not durable.
    pub fn pause_log(&self) {
        self.log_pause.set(true);
    }

    /// Lets waiting and later appends go on.
    pub fn resume_log(&self) {
        self.log_pause.set(false);
    }

    /// Blocks until an append is waiting at the pause (its batch is committed, not durable).
    pub fn wait_for_a_paused_append(&self) {
        self.log_pause.wait_for_a_waiter();
    }

    /// From now on the gate's acknowledger, after a successful append, waits (before showing
    /// the batch to readers and answering its callers) until [`StoreFaults::resume_show`]:
    /// the window in which a batch is durable but not yet shown.
    pub fn pause_show(&self) {
        self.show_pause.set(true);
    }

    /// Lets waiting and later shows go on.
    pub fn resume_show(&self) {
        self.show_pause.set(false);
    }

    /// Blocks until a durable batch waits at the show pause.
    pub fn wait_for_a_paused_show(&self) {
        self.show_pause.wait_for_a_waiter();
    }

    /// Called by the gate between a batch's durable append and showing it: waits while
    /// shows are paused.
    pub fn before_show(&self) {
        self.show_pause.hold();
    }

    /// From now on every step undoing a failed session fails (the batch is then poisoned).
    pub fn fail_undo(&self) {
        self.undo_fails.store(true, Ordering::SeqCst);
    }

    /// Undo steps succeed again.
    pub fn heal_undo(&self) {
        self.undo_fails.store(false, Ordering::SeqCst);
    }

    /// The error an undo step meets right now, if any.
    pub(super) fn check_undo(&self) -> std::io::Result<()> {
        if self.undo_fails.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("undo step failed (injected fault)"));
        }
        Ok(())
    }

    /// The error an append to the redo log meets right now, if any (a full disk fails it
    /// too). Waits first while appends are paused.
    pub(super) fn check_log(&self) -> std::io::Result<()> {
        self.log_pause.hold();
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
