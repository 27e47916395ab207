//! The restart: opening a store brings its file up to date with its redo log and begins a new
//! round of the log, building the handle's [`Journal`].
//!
//! Invariants:
//! * the replay and the new round are made durable in one durable commit **before** anything is
//!   appended, so the log is never overwritten while it holds the only copy of a batch;
//! * only records above the file's `applied` sequence are applied, in log order; a log that
//!   does not fit the file is refused — naming the log, the offset and the sequence numbers —
//!   and nothing is changed (see [`super::scan`]);
//! * a log written before rounds existed is read once with the old rules, and what it held is
//!   made durable before its first bytes are overwritten;
//! * no handle exists yet to latch a failure on: a failed fsync is fatal as anywhere else
//!   ([`durable_commit`]), a failed write of the log refuses the open ([`append_failed`]).

use std::path::Path;

use redb::Database;

use super::super::disk::Synced;
use super::super::{MetaError, MetaResult, StoreFaults, fatal};
use super::journal::Journal;
use super::log::{AppendError, Log};
use super::record::apply;
use super::round::{self, Round};
use super::scan::{scan, scan_legacy};

impl Journal {
    /// The journal of a store with a redo log, after replaying it (see [`replay`]).
    pub(in crate::meta) fn replay(
        db: &Database,
        path: &Path,
        faults: &StoreFaults,
    ) -> MetaResult<Journal> {
        let (last, log) = replay(db, path, faults)?;
        Ok(Journal::new(last, Some(log)))
    }
}

/// Brings the file up to date with its redo log and begins a new round of it, in one
/// durable commit made before anything is appended (so the log is never overwritten
/// while it holds the only copy of a batch); returns the sequence number of the last batch
/// the file holds, and the log ready for the round's records.
///
/// Refuses — naming the log, the offset and the sequence numbers, and changing nothing — a
/// log that does not fit the file (see [`super::scan`]).
fn replay(db: &Database, path: &Path, faults: &StoreFaults) -> MetaResult<(u64, Log)> {
    let log_path = round::path_for(path);
    let disk = &faults.disk;
    let mut txn = db.begin_write()?;
    // The open's commit too: a crash right after it must not walk the whole file again.
    txn.set_quick_repair(super::super::quick_repair::on());
    let applied = round::applied(&txn)?;
    let damaged_record = |seq: u64, e: MetaError| MetaError::Damaged {
        path: log_path.clone(),
        detail: format!("record {seq}: {e}"),
    };
    let Some(round) = round::round(&txn)? else {
        // New, or written before rounds: the old log is read with the old rules, and
        // what it held is made durable before its first bytes are overwritten.
        let (last, replayed) = scan_legacy(disk, &log_path, applied, |seq, p| {
            apply(&txn, p).map_err(|e| damaged_record(seq, e))
        })?;
        if replayed > 0 {
            round::set_applied(&txn, last)?;
            durable_commit(txn, path, faults)?;
            tracing::info!(store = %path.display(), batches = replayed, "replayed the redo log");
            txn = db.begin_write()?;
            txn.set_quick_repair(super::super::quick_repair::on());
        }
        let round = Round::fresh(last, 0);
        let log = Log::create(disk, &log_path, round, faults)
            .map_err(|e| append_failed(&log_path, e, faults))?;
        round::set_round(&txn, &round)?;
        durable_commit(txn, path, faults)?;
        return Ok((last, log));
    };
    let scanned = scan(disk, &log_path, &round, applied, |seq, p| {
        apply(&txn, p).map_err(|e| damaged_record(seq, e))
    })?;
    let found = match scanned {
        Ok(found) => found,
        Err(fault) => {
            txn.abort()?;
            return Err(MetaError::Log {
                path: log_path,
                store: path.to_path_buf(),
                detail: fault.describe(&round, applied),
            });
        }
    };
    let last = applied.max(found.last);
    if found.replayed > 0 {
        round::set_applied(&txn, last)?;
    }
    let next = Round::fresh(last, found.at_zero);
    let failed = |e| append_failed(&log_path, e, faults);
    let mut log = Log::resume(disk, &log_path, found.at_zero, found.end, faults).map_err(failed)?;
    log.announce(&next).map_err(failed)?;
    round::set_round(&txn, &next)?;
    durable_commit(txn, path, faults)?;
    if found.replayed > 0 {
        tracing::info!(store = %path.display(), batches = found.replayed, "replayed the redo log");
    }
    log.begin(next);
    log.append(&[]).map_err(failed)?;
    Ok((last, log))
}

/// Commits `txn` durably during open, where no handle exists yet to latch a failure on: a
/// failed fsync is fatal as anywhere else.
fn durable_commit(
    txn: redb::WriteTransaction,
    path: &Path,
    faults: &StoreFaults,
) -> MetaResult<()> {
    faults
        .check_commit()
        .map_err(|e| MetaError::Failed(e.to_string()))?;
    txn.commit().map_err(|e| match faults.failed_sync() {
        Some((_, error)) => fatal::sync_failed(path, Synced::Store, &error, faults),
        None => MetaError::Store(e.into()),
    })
}

/// A failed write or fsync of the log while opening the store.
fn append_failed(log: &Path, e: AppendError, faults: &StoreFaults) -> MetaError {
    match e {
        AppendError::Write(e) => MetaError::Unwritable {
            path: log.to_path_buf(),
            detail: e.to_string(),
        },
        AppendError::Sync(e) => fatal::sync_failed(log, Synced::Log, &e.to_string(), faults),
    }
}
