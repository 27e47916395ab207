//! Starting again from a damaged redo log, when the operator accepts the loss: never the
//! default (start-up refuses such a log, see [`super::scan`]), always explicit
//! (`nokv-server recover --data-dir D --accept-loss`).
//!
//! It keeps exactly what an honest reading keeps — the node file's last durable commit and
//! the records of the log's round in sequence up to the first bad one — and reports which
//! sequence numbers it drops: the damaged record's and every later one it could read (each a
//! batch that was acknowledged), or, when the log is missing or from another round, that
//! every batch after the node file's last one is gone (their number unknown). The damaged log
//! is moved aside (never deleted), a fresh one is created, and one durable commit records the
//! kept batches and the fresh log's round. Without `--accept-loss` it only reports.

use std::path::{Path, PathBuf};

use super::super::{MetaError, MetaResult, MetaStore, StoreFaults};
use super::log::Log;
use super::record::apply;
use super::round::{self, Round};
use super::scan::{Fault, scan};

/// What [`MetaStore::salvage`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Salvage {
    /// The log that was read.
    pub log: PathBuf,
    /// Why it is refused at start-up (`None`: it is not; nothing to recover).
    pub problem: Option<String>,
    /// The last batch the node file holds durably.
    pub applied: u64,
    /// The last batch kept (the node file's, or the last valid record before the damage).
    pub kept_through: u64,
    /// Records of the log replayed into the node file.
    pub replayed: u64,
    /// The first sequence number dropped, if any batch is.
    pub dropped_from: Option<u64>,
    /// The last sequence number dropped, when known (records read behind the damage);
    /// `None` with `dropped_from` set: every batch after it, however many there were.
    pub dropped_through: Option<u64>,
    /// Where the damaged log was moved (only with `accept`).
    pub moved_to: Option<PathBuf>,
    /// True if the loss was accepted and the data dir changed.
    pub applied_changes: bool,
}

impl MetaStore {
    /// Reads the node file at `path` and its log; with `accept`, starts again from what is
    /// valid (see the module doc). The daemon must not be running (redb's lock refuses).
    pub fn salvage(path: &Path, accept: bool) -> MetaResult<Salvage> {
        let faults = StoreFaults::default();
        super::super::open::require_existing(path, faults.disk.file_len(path))?;
        let db = Self::database(path, false, &faults)?;
        let txn = db.begin_write()?;
        let applied = round::applied(&txn)?;
        let log_path = round::path_for(path);
        let mut report = Salvage {
            log: log_path.clone(),
            problem: None,
            applied,
            kept_through: applied,
            replayed: 0,
            dropped_from: None,
            dropped_through: None,
            moved_to: None,
            applied_changes: false,
        };
        let Some(round) = round::round(&txn)? else {
            // Written before rounds: its log is read leniently at open, never refused.
            txn.abort()?;
            return Ok(report);
        };
        let scanned = scan(&faults.disk, &log_path, &round, applied, |seq, p| {
            apply(&txn, p).map_err(|e| MetaError::Damaged {
                path: log_path.clone(),
                detail: format!("record {seq}: {e}"),
            })
        })?;
        let fault = match scanned {
            Ok(_) => {
                txn.abort()?;
                return Ok(report);
            }
            Err(fault) => fault,
        };
        report.problem = Some(fault.describe(&round, applied));
        let after = applied.max(round.start);
        match &fault {
            Fault::Damaged {
                last_good, later, ..
            } => {
                report.kept_through = applied.max(*last_good);
                report.replayed = last_good.saturating_sub(after);
                report.dropped_from = Some(last_good + 1);
                report.dropped_through = Some(later.max_seq.max(last_good + 1));
            }
            _ => report.dropped_from = Some(after + 1),
        }
        if !accept {
            txn.abort()?;
            return Ok(report);
        }
        if report.replayed > 0 {
            round::set_applied(&txn, report.kept_through)?;
        }
        if faults.disk.file_len(&log_path).ok().flatten().is_some() {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let aside = log_path.with_extension(format!("redo.damaged-{secs}"));
            faults
                .disk
                .rename(&log_path, &aside)
                .map_err(|e| MetaError::Failed(format!("moving {}: {e}", log_path.display())))?;
            report.moved_to = Some(aside);
        }
        let fresh = Round::fresh(report.kept_through, 0);
        Log::create(&faults.disk, &log_path, fresh, &faults)
            .map_err(|e| MetaError::Failed(format!("creating {}: {e:?}", log_path.display())))?;
        round::set_round(&txn, &fresh)?;
        txn.commit()?;
        report.applied_changes = true;
        tracing::warn!(
            log = %log_path.display(),
            dropped_from = report.dropped_from,
            dropped_through = report.dropped_through,
            "recovered from a damaged redo log, accepting the loss"
        );
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::meta::{MetaStore, Tables};

    // Catches: a recovery that drops more than the damage (records before it), keeps nothing
    // of the valid prefix, reports the wrong sequence numbers, changes anything without
    // `accept`, or leaves a data dir that start-up still refuses.
    #[test]
    fn recover_keeps_the_valid_prefix_reports_what_it_drops_and_moves_the_log_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let store = Arc::new(MetaStore::create(&path).unwrap());
        for i in 0..10 {
            let mut batch = store.batch().unwrap();
            let name = format!("b{i}");
            batch
                .session(Tables::canonical(), |w| w.put_inline("ws", &name, b"x"))
                .unwrap();
            store.log(&[&batch.commit_logged().unwrap().redo]).unwrap();
        }
        let crashed = dir.path().join("c.redb");
        std::fs::copy(&path, &crashed).unwrap();
        std::fs::copy(path.with_extension("redo"), crashed.with_extension("redo")).unwrap();
        drop(store);
        // Damage the 5th record's payload (records follow the 32-byte marker).
        let log = crashed.with_extension("redo");
        let mut bytes = std::fs::read(&log).unwrap();
        let mut at = 32;
        for _ in 0..4 {
            let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            at += 32 + len;
        }
        bytes[at + 34] ^= 1;
        std::fs::write(&log, &bytes).unwrap();
        assert!(MetaStore::open(&crashed).is_err(), "start-up refuses it");

        let dry = MetaStore::salvage(&crashed, false).unwrap();
        assert!(!dry.applied_changes);
        assert_eq!(
            std::fs::read(&log).unwrap(),
            bytes,
            "a dry run changes nothing"
        );
        let report = MetaStore::salvage(&crashed, true).unwrap();
        assert_eq!(dry.dropped_from, report.dropped_from);
        let first = report.dropped_from.unwrap();
        assert_eq!(
            report.dropped_through,
            Some(first + 5),
            "the damaged one and 5 after"
        );
        assert_eq!(report.kept_through, first - 1);
        assert!(report.moved_to.as_ref().unwrap().exists());

        let reopened = MetaStore::open(&crashed).unwrap();
        let has = |n: &str| reopened.read(|r| r.inline("ws", n)).unwrap().is_some();
        for i in 0..4 {
            assert!(has(&format!("b{i}")), "b{i} was before the damage");
        }
        for i in 4..10 {
            assert!(!has(&format!("b{i}")), "b{i} was dropped");
        }
    }
}
