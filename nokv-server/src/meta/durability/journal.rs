//! The journal of a store handle: the one owner of the redo log's ordering state — the
//! sequence number batches take, the appending end of the log, the log's round and the round a
//! checkpoint begins — and the store's two operations on it, [`MetaStore::log`] (append) and
//! [`MetaStore::checkpoint`]. The restart that builds a journal is [`super::replay`].
//!
//! Ordering rules (the crash rule they serve is in [`super`]'s doc):
//! * **sequence**: every batch takes the next number ([`Journal::next_seq`]) and writes it
//!   as `applied` in its own transaction ([`super::batch`]); records are appended in that order;
//! * **append**: one append is one write and one fsync of consecutive records; nothing is
//!   appended through a handle after a failed write (the failure latch, [`super::latch`]) and
//!   nothing at all after a failed fsync (the process ends, [`super::super::fatal`]);
//! * **checkpoint**: a new round begins only once the current round's marker is durable
//!   ([`MetaStore::ready_for_checkpoint`]); its durable commit comes after the current round
//!   announced it in the log, and the appending thread starts it in the log only after every
//!   record handed to it before the checkpoint ([`MetaStore::clear_log`]); records above the
//!   new round's start always go to the new round;
//! * **locks**: `log` is held across an append's fsync, so the round's state is kept apart;
//!   lock order: `log`, then `next_round`.

use std::path::Path;

use redb::Database;

use super::super::disk::Synced;
use super::super::fatal;
use super::super::{MetaError, MetaResult, MetaStore, Redo};
use super::log::{AppendError, Log};
use super::round::{self, Round};

/// The redo-log state of one store handle (see the module doc).
pub(in crate::meta) struct Journal {
    /// The redo log's appending end (see [`super::log`]); `None` for a plain file (a checkpoint's
    /// copy), which runs no batches.
    pub(super) log: parking_lot::Mutex<Option<Log>>,
    /// The log's round and whether its marker is durable yet (kept apart from `log`, whose
    /// lock an append holds across its fsync).
    round: parking_lot::Mutex<(Round, bool)>,
    /// The round the last checkpoint began, until the appending thread starts it in the log
    /// (see [`MetaStore::checkpoint`]).
    next_round: parking_lot::Mutex<Option<Round>>,
    /// Appends to the redo log (each one fsync) through this handle.
    log_syncs: std::sync::atomic::AtomicU64,
    /// The sequence number of the last batch committed (its redo record may not be durable
    /// yet): every batch takes the next one.
    last_seq: std::sync::atomic::AtomicU64,
}

impl Journal {
    /// The journal of a store that opened with `log` (`None`: a plain file, which runs no
    /// batches), whose file holds every batch up to `last_seq`.
    pub(super) fn new(last_seq: u64, log: Option<Log>) -> Journal {
        let round = log.as_ref().map_or(
            Round {
                id: 0,
                start: 0,
                prev: 0,
            },
            |l| l.round(),
        );
        Journal {
            round: parking_lot::Mutex::new((round, log.is_some())),
            log: parking_lot::Mutex::new(log),
            next_round: parking_lot::Mutex::new(None),
            log_syncs: Default::default(),
            last_seq: last_seq.into(),
        }
    }

    /// The journal of a file opened without its log (a checkpoint's copy, see
    /// [`MetaStore::open_plain`]): it runs no batches, and any log beside it is ignored.
    pub(in crate::meta) fn without_log(db: &Database) -> MetaResult<Journal> {
        let txn = db.begin_write()?;
        let last = round::applied(&txn)?;
        txn.abort()?;
        Ok(Journal::new(last, None))
    }

    /// The sequence number the next batch takes (see the module doc).
    pub(super) fn next_seq(&self) -> u64 {
        self.last_seq.load(std::sync::atomic::Ordering::Acquire) + 1
    }

    /// Records that the batch numbered `seq` ([`Journal::next_seq`]) wrote it as `applied` in
    /// its transaction: the next batch takes the number after it.
    pub(super) fn sequenced(&self, seq: u64) {
        self.last_seq
            .store(seq, std::sync::atomic::Ordering::Release);
    }
}

impl MetaStore {
    /// Appends the records of `redos` (consecutive batches, in order) to the redo log and
    /// makes them durable: the batches are durable once this returns `Ok`. A failed write
    /// fails the handle (nothing more is appended through it, see [`super::latch`]); a failed fsync
    /// ends the process (see [`fatal`]). With no records, writes a round marker still due.
    pub fn log(&self, redos: &[&Redo]) -> MetaResult<()> {
        if let Some(fatal) = self.fatal() {
            return Err(fatal);
        }
        if let Some(reason) = self.failure() {
            return Err(MetaError::Failed(reason));
        }
        let mut log = self.journal.log.lock();
        let Some(log) = log.as_mut() else {
            return Err(MetaError::Failed(
                "this file has no redo log (a plain copy runs no batches)".into(),
            ));
        };
        // Records above the start of a round a checkpoint began belong to that round (the
        // appending thread normally starts it first, in order; this keeps it so regardless).
        let starts_after = self.journal.next_round.lock().map(|n| n.start);
        if let (Some(start), Some(first)) = (starts_after, redos.first())
            && first.seq() > start
        {
            self.clear_log_locked(log);
        }
        match log.append(redos) {
            Ok(()) => {
                let mut round = self.journal.round.lock();
                if round.0.id == log.round().id {
                    round.1 = true;
                }
                if !redos.is_empty() {
                    self.journal
                        .log_syncs
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
                Ok(())
            }
            Err(AppendError::Write(e)) => Err(self.fail(redb::StorageError::Io(e))),
            Err(AppendError::Sync(e)) => {
                // Reported (and, outside tests, the process ended) before the handle is marked
                // failed: the committer must never see this as a failure to recover from.
                let fatal =
                    fatal::sync_failed(log.path(), Synced::Log, &e.to_string(), &self.faults);
                self.fail(redb::StorageError::Io(std::io::Error::other(e.to_string())));
                Err(fatal)
            }
        }
    }

    /// Makes the file itself durable and begins a new round of the redo log: one durable
    /// commit recording the new round. Returns `false`, doing nothing, while the current
    /// round's marker is not durable yet — the round after it must be able to name the marker
    /// a crash leaves at offset 0. The appending thread starts the new round in the log
    /// ([`MetaStore::clear_log`]) after every record it was handed before.
    pub fn checkpoint(&self) -> MetaResult<bool> {
        if !self.ready_for_checkpoint() {
            return Ok(false);
        }
        let current = self.journal.round.lock().0;
        let txn = self.begin_write()?;
        let next = Round::fresh(round::applied(&txn)?, current.id);
        {
            let mut log = self.journal.log.lock();
            let Some(log) = log.as_mut().filter(|l| l.round().id == current.id) else {
                return Ok(false);
            };
            match log.announce(&next) {
                Ok(()) => {}
                Err(AppendError::Write(e)) => return Err(self.fail(redb::StorageError::Io(e))),
                Err(AppendError::Sync(e)) => {
                    return Err(fatal::sync_failed(
                        log.path(),
                        Synced::Log,
                        &e.to_string(),
                        &self.faults,
                    ));
                }
            }
        }
        round::set_round(&txn, &next)?;
        self.commit(txn)?;
        self.count_durable();
        *self.journal.round.lock() = (next, false);
        *self.journal.next_round.lock() = Some(next);
        Ok(true)
    }

    /// Record bytes the redo log may take before the next checkpoint, from the free space
    /// where the store lives now (see [`round::budget`]).
    pub fn log_budget(&self) -> usize {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        round::budget(round::free_space(dir))
    }

    /// The sequence number the next batch will take: every batch committed from now on has
    /// at least this one (where a shard's part of the provider log begins, issue 45).
    pub fn next_seq(&self) -> u64 {
        self.journal.next_seq()
    }

    /// Appends to the redo log (fsyncs that made batches durable) through this handle so far.
    pub fn log_syncs(&self) -> u64 {
        self.journal
            .log_syncs
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// True if [`MetaStore::checkpoint`] can begin a new round now: the current round's marker
    /// is durable (and the round is not still waiting to be started in the log).
    pub fn ready_for_checkpoint(&self) -> bool {
        let marked = self.journal.round.lock().1;
        let pending = self.journal.next_round.lock().is_some();
        marked && !pending
    }

    /// Starts the round the last [`MetaStore::checkpoint`] began: the next append writes its
    /// marker over the old round. By the thread that appends, after every record handed to it
    /// before the checkpoint (those are in the file itself now).
    pub fn clear_log(&self) {
        if let Some(log) = self.journal.log.lock().as_mut() {
            self.clear_log_locked(log);
        }
    }

    /// [`MetaStore::clear_log`] with the log's lock held (lock order: log, then next round).
    fn clear_log_locked(&self, log: &mut Log) {
        let next = self.journal.next_round.lock().take();
        if let Some(next) = next {
            log.begin(next);
        }
    }
}
