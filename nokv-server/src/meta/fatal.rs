//! A failed fsync ends the process.
//!
//! After `fdatasync` reports an error the kernel may already have dropped the dirty pages it
//! could not write (PostgreSQL's "fsyncgate"): the page cache no longer says what the disk
//! holds. Retrying the fsync can succeed without writing anything, and reopening the store in
//! the same process reads back the page cache — not the disk — and can then start the log
//! over, overwriting the only durable copy of batches a later power cut would need. So a
//! failed fsync of the redo log or of a durable redb commit is never retried or recovered
//! in-process: nothing more is acknowledged, one ERROR names the file and the errno, and the
//! process exits non-zero for its supervisor (systemd, Kubernetes) to restart it; the restart
//! replays from what the disk really holds. A failed *write* (a full disk: nothing reached
//! the disk, nothing was acknowledged) is not this case: the store recovers from it in-process.

use std::path::Path;

use super::disk::Synced;
use super::{MetaError, StoreFaults};

/// The exit status after a failed fsync (EX_IOERR).
pub const EXIT_SYNC_FAILED: i32 = 74;

/// Reports the failed fsync of `file` and ends the process — or, when a test caught fatal
/// failures ([`StoreFaults::catch_fatal`]), returns the error that fails the store for good.
pub(super) fn sync_failed(
    file: &Path,
    which: Synced,
    error: &str,
    faults: &StoreFaults,
) -> MetaError {
    faults.sync_failed(which, error.to_string());
    if !faults.claim_report() {
        // Another thread reported the failure first and is ending the process: one ERROR,
        // and nothing this thread does may look like a recoverable failure meanwhile.
        if faults.fatal_is_caught() {
            return MetaError::Fatal {
                file: file.to_path_buf(),
                detail: error.to_string(),
            };
        }
        loop {
            std::thread::park();
        }
    }
    tracing::error!(
        file = %file.display(),
        error,
        "fsync failed: the disk may not hold what was written, so nothing more is acknowledged \
         and the process exits for its supervisor to restart it (the restart replays from disk)"
    );
    if faults.fatal_is_caught() {
        return MetaError::Fatal {
            file: file.to_path_buf(),
            detail: error.to_string(),
        };
    }
    std::process::exit(EXIT_SYNC_FAILED)
}
