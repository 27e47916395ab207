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

use super::disk::Synced;

/// Shared switches; clone freely.
#[derive(Debug, Clone, Default)]
pub struct StoreFaults {
    disk_full: Arc<AtomicBool>,
    log_fails: Arc<AtomicBool>,
    log_pause: Arc<Pause>,
    show_pause: Arc<Pause>,
    undo_fails: Arc<AtomicBool>,
    sync: Arc<SyncFaults>,
    /// The disk the store's files are on (a test may put them on a simulated one).
    pub(super) disk: super::disk::Disk,
}

/// Injected fsync failures, the latch of a real one, and what a failure does.
#[derive(Debug, Default)]
struct SyncFaults {
    /// Per file (indexed by [`Synced`]): 0 = no fault; n + 1 = n more fsyncs succeed, then
    /// every later one fails.
    budget: [std::sync::atomic::AtomicU64; 2],
    /// The first fsync that failed: its file and error.
    failed: parking_lot::Mutex<Option<(Synced, String)>>,
    /// Tests only: a failed fsync fails the store for good instead of ending the process.
    caught: AtomicBool,
    /// The failure has been reported: its one ERROR is written and the process is ending.
    reported: AtomicBool,
}

fn index(of: Synced) -> usize {
    match of {
        Synced::Log => 0,
        Synced::Store => 1,
    }
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
    /// A hook with no fault switched on (production), or — for black-box tests of the daemon
    /// — the fsync fault named by `NOKV_TEST_FAIL_FSYNC`: `log:N` or `store:N` lets N fsyncs
    /// of the redo log (or the node file) succeed and fails every later one with EIO.
    pub fn from_env() -> StoreFaults {
        let faults = StoreFaults::default();
        if let Ok(spec) = std::env::var("NOKV_TEST_FAIL_FSYNC")
            && let Some((file, n)) = spec.split_once(':')
            && let Ok(n) = n.parse::<u64>()
        {
            match file {
                "log" => faults.fail_sync_after(Synced::Log, n),
                "store" => faults.fail_sync_after(Synced::Store, n),
                _ => tracing::warn!(spec, "NOKV_TEST_FAIL_FSYNC: expected log:N or store:N"),
            }
        }
        faults
    }

    /// Tests only: the store's files live on the simulated disk `disk`, which can lose power.
    #[cfg(test)]
    pub(crate) fn on_simulated_disk(disk: std::sync::Arc<super::powercut::SimDisk>) -> StoreFaults {
        StoreFaults {
            disk: super::disk::Disk::Simulated(disk),
            ..StoreFaults::default()
        }
    }

    /// Lets `n` more fsyncs of `file` succeed, then fails every later one with EIO (after
    /// the data was written: the case where the page cache and the disk disagree).
    pub fn fail_sync_after(&self, file: Synced, n: u64) {
        self.sync.budget[index(file)].store(n + 1, Ordering::SeqCst);
    }

    /// Tests only: a failed fsync fails the store for good (every later write and every
    /// reopen refused) instead of ending the process, so the test can look at what happened.
    pub fn catch_fatal(&self) {
        self.sync.caught.store(true, Ordering::SeqCst);
    }

    /// The first fsync that failed, if one did.
    pub fn failed_sync(&self) -> Option<(Synced, String)> {
        self.sync.failed.lock().clone()
    }

    pub(super) fn fatal_is_caught(&self) -> bool {
        self.sync.caught.load(Ordering::SeqCst)
    }

    /// The error an fsync of `file` meets right now, if an injected fault fails it.
    pub(super) fn check_sync(&self, file: Synced) -> std::io::Result<()> {
        let budget = &self.sync.budget[index(file)];
        let left = budget.load(Ordering::SeqCst);
        if left == 0 {
            return Ok(());
        }
        if left == 1 {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        budget.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// True for the one caller that reports the failed fsync (see [`super::fatal`]); every
    /// other thread that meets it later leaves the reporting, and the exit, to that one.
    pub(super) fn claim_report(&self) -> bool {
        !self.sync.reported.swap(true, Ordering::SeqCst)
    }

    /// Latches the first failed fsync (see [`super::fatal`]) — and, unless a test catches
    /// fatal failures, the process's [`crate::fsync_latch`], before the failure can reach
    /// any caller.
    pub(super) fn sync_failed(&self, file: Synced, error: String) {
        if !self.fatal_is_caught() {
            crate::fsync_latch::set();
        }
        self.sync.failed.lock().get_or_insert((file, error));
    }

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
