//! The store handle: opening a metadata file, one-off write sessions, snapshots for readers,
//! the redo log's appending end, and the failure latch that stops every write after a storage
//! error.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};

use super::disk::Synced;
use super::redo::{AppendError, Log, Round};
use super::{
    Batch, Commit, MetaError, MetaResult, Namespace, ReadView, Redo, Snapshot, StoreFaults, Tables,
    WriteView,
};
use super::{fatal, open, redo};

pub struct MetaStore {
    pub(super) db: Database,
    path: PathBuf,
    faults: StoreFaults,
    /// The namespace [`MetaStore::read`] and [`MetaStore::write`] use: the canonical one for a
    /// standalone file. A node file has no home: its callers name a shard's namespace.
    home: Option<Namespace>,
    /// Durable commits (each one fsync) made through this handle: tests prove with it that
    /// sessions of many shards share one.
    durable_commits: std::sync::atomic::AtomicU64,
    /// Commits of any kind through this handle: tests prove with it that the committer holds
    /// its transaction across batches.
    commits: std::sync::atomic::AtomicU64,
    /// Why a write failed at the storage level, once one did. Like redb after an I/O error,
    /// the handle then refuses every write: only dropping it and opening the file again
    /// (which lets redb recover to the last durable commit) brings the store back.
    failure: parking_lot::Mutex<Option<String>>,
    /// The redo log's appending end (see [`redo`]); `None` for a plain file (a checkpoint's
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
    pub(super) last_seq: std::sync::atomic::AtomicU64,
}

impl MetaStore {
    /// Creates a standalone single-shard file (a test's store, a checkpoint being written), or
    /// opens it if a first start was interrupted after creating it.
    pub fn create(path: &Path) -> MetaResult<MetaStore> {
        Self::create_as(path, Some(Tables::canonical()), Logged::Yes)
    }

    /// Creates a standalone file that never runs batches and has no redo log (a checkpoint's
    /// copy, see [`MetaStore::export`]): every write to it is a durable commit.
    pub(super) fn create_plain(path: &Path) -> MetaResult<MetaStore> {
        Self::create_as(path, Some(Tables::canonical()), Logged::No)
    }

    /// Opens a file [`MetaStore::create_plain`] made, ignoring any redo log beside it.
    pub fn open_plain(path: &Path) -> MetaResult<MetaStore> {
        Self::open_as(
            path,
            StoreFaults::default(),
            Some(Tables::canonical()),
            Logged::No,
        )
    }

    /// Opens an existing standalone single-shard file; refuses, naming the file, one that is
    /// missing, empty or damaged (never creates or reinitialises it, and never panics on a
    /// corrupt file).
    pub fn open(path: &Path) -> MetaResult<MetaStore> {
        Self::open_as(
            path,
            StoreFaults::default(),
            Some(Tables::canonical()),
            Logged::Yes,
        )
    }

    /// Creates the node file of a brand-new data directory: it holds every shard the node
    /// holds, each in its own namespace ([`MetaStore::prepare`] makes a shard's tables).
    pub fn create_node(path: &Path) -> MetaResult<MetaStore> {
        // The same fault hook as `open_node`: a test's injected fsync fault must hold from a
        // brand-new data dir's first start too, not only from its second.
        Self::create_in(path, StoreFaults::from_env(), None, Logged::Yes)
    }

    /// [`MetaStore::create_node`] for a file that is filled by imports and renamed into place
    /// before it is opened to serve (it gets its log then).
    pub fn create_node_plain(path: &Path) -> MetaResult<MetaStore> {
        Self::create_as(path, None, Logged::No)
    }

    /// Opens an existing node file (refusing a missing, empty or damaged one like
    /// [`MetaStore::open`]).
    pub fn open_node(path: &Path) -> MetaResult<MetaStore> {
        Self::open_as(path, StoreFaults::from_env(), None, Logged::Yes)
    }

    /// How to open this store's file again, with the same kind and fault hook, once this
    /// handle is dropped (after a storage failure).
    pub fn reopener(&self) -> Reopen {
        Reopen {
            path: self.path.clone(),
            faults: self.faults.clone(),
            home: self.home,
        }
    }

    /// [`MetaStore::open`] with a fault hook (tests).
    pub fn open_with(path: &Path, faults: StoreFaults) -> MetaResult<MetaStore> {
        Self::open_as(path, faults, Some(Tables::canonical()), Logged::Yes)
    }

    /// [`MetaStore::create`] with a fault hook (tests).
    pub fn create_with(path: &Path, faults: StoreFaults) -> MetaResult<MetaStore> {
        Self::create_in(path, faults, Some(Tables::canonical()), Logged::Yes)
    }

    fn create_as(path: &Path, home: Option<Namespace>, logged: Logged) -> MetaResult<MetaStore> {
        Self::create_in(path, StoreFaults::default(), home, logged)
    }

    fn create_in(
        path: &Path,
        faults: StoreFaults,
        home: Option<Namespace>,
        logged: Logged,
    ) -> MetaResult<MetaStore> {
        let latch = faults.clone();
        open::guarded(path, || {
            let db = Self::database(path, true, &faults)?;
            Self::init(db, path, faults, home, logged)
        })
        .map_err(|e| fatal_if_synced_failed(path, &latch, e))
    }

    fn open_as(
        path: &Path,
        faults: StoreFaults,
        home: Option<Namespace>,
        logged: Logged,
    ) -> MetaResult<MetaStore> {
        if let Some((_, error)) = faults.failed_sync() {
            // See `fatal`: never reopened in the process that saw an fsync fail.
            return Err(MetaError::Fatal {
                file: path.to_path_buf(),
                detail: error,
            });
        }
        open::require_existing(path, faults.disk.file_len(path))?;
        let latch = faults.clone();
        open::guarded(path, || {
            let db = Self::database(path, false, &faults)?;
            Self::init(db, path, faults, home, logged)
        })
        .map_err(|e| fatal_if_synced_failed(path, &latch, e))
    }

    /// Opens (or creates) the redb file at `path` on the hook's disk, its fsyncs watched.
    pub(super) fn database(
        path: &Path,
        create: bool,
        faults: &StoreFaults,
    ) -> MetaResult<Database> {
        let backend = faults
            .disk
            .store_backend(path, create, faults)
            .map_err(|e| damaged(path, e))?;
        Database::builder()
            .create_with_backend(backend)
            .map_err(|e| damaged(path, e))
    }

    /// A standalone store makes sure its tables exist, so read views never meet a missing
    /// table; a node file does that per shard ([`MetaStore::prepare`]).
    fn init(
        db: Database,
        path: &Path,
        faults: StoreFaults,
        home: Option<Namespace>,
        logged: Logged,
    ) -> MetaResult<MetaStore> {
        let (last_seq, log) = match logged {
            Logged::Yes => {
                let (last, log) = Self::replay(&db, path, &faults)?;
                (last, Some(log))
            }
            Logged::No => {
                let txn = db.begin_write()?;
                let last = redo::applied(&txn)?;
                txn.abort()?;
                (last, None)
            }
        };
        let round = log.as_ref().map_or(
            Round {
                id: 0,
                start: 0,
                prev: 0,
            },
            |l| l.round(),
        );
        let store = MetaStore {
            db,
            path: path.to_path_buf(),
            faults,
            home,
            durable_commits: Default::default(),
            commits: Default::default(),
            failure: parking_lot::Mutex::new(None),
            round: parking_lot::Mutex::new((round, log.is_some())),
            log: parking_lot::Mutex::new(log),
            next_round: parking_lot::Mutex::new(None),
            log_syncs: Default::default(),
            last_seq: last_seq.into(),
        };
        if let Some(ns) = home {
            store.prepare(ns)?;
        }
        Ok(store)
    }

    /// Brings the file up to date with its redo log and begins a new round of it, in one
    /// durable commit made before anything is appended (so the log is never overwritten
    /// while it holds the only copy of a batch); returns the sequence number of the last batch
    /// the file holds, and the log ready for the round's records.
    ///
    /// Refuses — naming the log, the offset and the sequence numbers, and changing nothing — a
    /// log that does not fit the file (see [`redo`]'s `scan`).
    fn replay(db: &Database, path: &Path, faults: &StoreFaults) -> MetaResult<(u64, Log)> {
        let log_path = redo::path_for(path);
        let disk = &faults.disk;
        let mut txn = db.begin_write()?;
        // The open's commit too: a crash right after it must not walk the whole file again.
        txn.set_quick_repair(super::quick_repair::on());
        let applied = redo::applied(&txn)?;
        let damaged_record = |seq: u64, e: MetaError| MetaError::Damaged {
            path: log_path.clone(),
            detail: format!("record {seq}: {e}"),
        };
        let Some(round) = redo::round(&txn)? else {
            // New, or written before rounds: the old log is read with the old rules, and
            // what it held is made durable before its first bytes are overwritten.
            let (last, replayed) = redo::scan_legacy(disk, &log_path, applied, |seq, p| {
                redo::apply(&txn, p).map_err(|e| damaged_record(seq, e))
            })?;
            if replayed > 0 {
                redo::set_applied(&txn, last)?;
                durable_commit(txn, path, faults)?;
                tracing::info!(store = %path.display(), batches = replayed, "replayed the redo log");
                txn = db.begin_write()?;
                txn.set_quick_repair(super::quick_repair::on());
            }
            let round = Round::fresh(last, 0);
            let log = Log::create(disk, &log_path, round, faults)
                .map_err(|e| append_failed(&log_path, e, faults))?;
            redo::set_round(&txn, &round)?;
            durable_commit(txn, path, faults)?;
            return Ok((last, log));
        };
        let scanned = redo::scan(disk, &log_path, &round, applied, |seq, p| {
            redo::apply(&txn, p).map_err(|e| damaged_record(seq, e))
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
            redo::set_applied(&txn, last)?;
        }
        let next = Round::fresh(last, found.at_zero);
        let failed = |e| append_failed(&log_path, e, faults);
        let mut log =
            Log::resume(disk, &log_path, found.at_zero, found.end, faults).map_err(failed)?;
        log.announce(&next).map_err(failed)?;
        redo::set_round(&txn, &next)?;
        durable_commit(txn, path, faults)?;
        if found.replayed > 0 {
            tracing::info!(store = %path.display(), batches = found.replayed, "replayed the redo log");
        }
        log.begin(next);
        log.append(&[]).map_err(failed)?;
        Ok((last, log))
    }

    /// Appends the records of `redos` (consecutive batches, in order) to the redo log and
    /// makes them durable: the batches are durable once this returns `Ok`. A failed write
    /// fails the handle (nothing more is appended through it, see [`redo`]); a failed fsync
    /// ends the process (see [`fatal`]). With no records, writes a round marker still due.
    pub fn log(&self, redos: &[&Redo]) -> MetaResult<()> {
        if let Some(fatal) = self.fatal() {
            return Err(fatal);
        }
        if let Some(reason) = self.failure() {
            return Err(MetaError::Failed(reason));
        }
        let mut log = self.log.lock();
        let Some(log) = log.as_mut() else {
            return Err(MetaError::Failed(
                "this file has no redo log (a plain copy runs no batches)".into(),
            ));
        };
        // Records above the start of a round a checkpoint began belong to that round (the
        // appending thread normally starts it first, in order; this keeps it so regardless).
        let starts_after = self.next_round.lock().map(|n| n.start);
        if let (Some(start), Some(first)) = (starts_after, redos.first())
            && first.seq() > start
        {
            self.clear_log_locked(log);
        }
        match log.append(redos) {
            Ok(()) => {
                let mut round = self.round.lock();
                if round.0.id == log.round().id {
                    round.1 = true;
                }
                if !redos.is_empty() {
                    self.log_syncs
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
        let current = self.round.lock().0;
        let txn = self.begin_write()?;
        let next = Round::fresh(redo::applied(&txn)?, current.id);
        {
            let mut log = self.log.lock();
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
        redo::set_round(&txn, &next)?;
        self.commit(txn)?;
        self.count_durable();
        *self.round.lock() = (next, false);
        *self.next_round.lock() = Some(next);
        Ok(true)
    }

    /// Record bytes the redo log may take before the next checkpoint, from the free space
    /// where the store lives now (see [`redo::budget`]).
    pub fn log_budget(&self) -> usize {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        redo::budget(redo::free_space(dir))
    }

    /// Appends to the redo log (fsyncs that made batches durable) through this handle so far.
    pub fn log_syncs(&self) -> u64 {
        self.log_syncs.load(std::sync::atomic::Ordering::Acquire)
    }

    /// True if [`MetaStore::checkpoint`] can begin a new round now: the current round's marker
    /// is durable (and the round is not still waiting to be started in the log).
    pub fn ready_for_checkpoint(&self) -> bool {
        let marked = self.round.lock().1;
        let pending = self.next_round.lock().is_some();
        marked && !pending
    }

    /// Starts the round the last [`MetaStore::checkpoint`] began: the next append writes its
    /// marker over the old round. By the thread that appends, after every record handed to it
    /// before the checkpoint (those are in the file itself now).
    pub fn clear_log(&self) {
        if let Some(log) = self.log.lock().as_mut() {
            self.clear_log_locked(log);
        }
    }

    /// [`MetaStore::clear_log`] with the log's lock held (lock order: log, then next round).
    fn clear_log_locked(&self, log: &mut Log) {
        let next = self.next_round.lock().take();
        if let Some(next) = next {
            log.begin(next);
        }
    }

    /// A snapshot of the last commit, durable or not: the committer takes one after each
    /// batch, and the gate shows it to readers once that batch's record is durable.
    pub fn snapshot(&self) -> MetaResult<Snapshot> {
        Ok(Snapshot::new(std::sync::Arc::new(self.db.begin_read()?)))
    }

    /// Makes every table of `ns` exist and brings it to the current layout (one-time
    /// backfills), durably. Idempotent; the store's single writer calls it before the shard's
    /// first session.
    pub fn prepare(&self, ns: Namespace) -> MetaResult<()> {
        self.write_in(ns, Commit::Durable, |w| {
            ns.create_all(w.txn)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            w.backfill_operations(now)?;
            Ok::<_, MetaError>(())
        })
    }

    /// True if `ns` has tables in this file (its shard was held here at some point).
    pub fn holds(&self, ns: Namespace) -> MetaResult<bool> {
        let txn = self.db.begin_read()?;
        ns.exists_in(&txn)
    }

    /// The file this store was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fault hook of this store (shared with stores reopened from it).
    pub fn faults(&self) -> &StoreFaults {
        &self.faults
    }

    /// Why a write of this handle failed at the storage level, if one did: the handle must
    /// then be replaced.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Marks the handle failed (keeping the first reason) and describes why.
    pub(super) fn fail(&self, e: impl Into<redb::Error>) -> MetaError {
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
    fn fatal(&self) -> Option<MetaError> {
        let (which, error) = self.faults.failed_sync()?;
        let file = match which {
            Synced::Log => redo::path_for(&self.path),
            Synced::Store => self.path.clone(),
        };
        let fatal = fatal::sync_failed(&file, which, &error, &self.faults);
        self.failure.lock().get_or_insert(error);
        Some(fatal)
    }

    /// Begins a write transaction. Every one records redb's allocator state when it commits
    /// durably (quick repair; a `Deferred` or batch commit ignores the flag), so the last
    /// durable commit before a kill -9 or power cut — the committer's periodic
    /// [`MetaStore::flush`], or a shard's `prepare` at open — lets the next open load that
    /// state instead of walking the whole node file. Measured (`restart-bench`, see
    /// [`super::quick_repair`]): it costs one fsync more per durable commit, 0.19 -> 0.56 ms
    /// on a quiet disk, once a second; the open after a kill -9 of a 1.06 GiB node file takes
    /// 67 ms instead of 1.2 s with the file cached, 106 ms instead of 6.5 s after a reboot.
    pub(super) fn begin_write(&self) -> MetaResult<redb::WriteTransaction> {
        if let Some(fatal) = self.fatal() {
            return Err(fatal);
        }
        if self.failure.lock().is_some() {
            return Err(MetaError::Failed(
                "an earlier write of this handle failed".into(),
            ));
        }
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        txn.set_quick_repair(super::quick_repair::on());
        Ok(txn)
    }

    pub(super) fn commit(&self, txn: redb::WriteTransaction) -> MetaResult<()> {
        if let Err(e) = self.faults.check_commit() {
            // Dropping the transaction aborts it: nothing is written, as with a real failure.
            drop(txn);
            return Err(self.fail(redb::StorageError::Io(e)));
        }
        txn.commit().map_err(|e| self.fail(e))?;
        if let Some(fatal) = self.fatal() {
            return Err(fatal);
        }
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// The namespace of a standalone file.
    pub(super) fn home(&self) -> Namespace {
        self.home
            .expect("a node file has no default namespace: name the shard's (read_in/write_in)")
    }

    /// Runs `f` on a consistent snapshot of a standalone file.
    pub fn read<T, E: From<MetaError>>(
        &self,
        f: impl FnOnce(&ReadView) -> Result<T, E>,
    ) -> Result<T, E> {
        self.read_in(self.home(), f)
    }

    /// Runs `f` on a consistent snapshot of namespace `ns`.
    pub fn read_in<T, E: From<MetaError>>(
        &self,
        ns: Namespace,
        f: impl FnOnce(&ReadView) -> Result<T, E>,
    ) -> Result<T, E> {
        self.snapshot()?.read_in(ns, f)
    }

    /// Runs `f` as the single writer of a standalone file; commits durably on `Ok`, aborts on
    /// `Err`.
    pub fn write<T, E: From<MetaError>>(
        &self,
        f: impl FnOnce(&mut WriteView) -> Result<T, E>,
    ) -> Result<T, E> {
        self.write_in(self.home(), Commit::Durable, f)
    }

    /// [`MetaStore::write_in`] on a standalone file's namespace.
    pub fn write_with<T, E: From<MetaError>>(
        &self,
        commit: Commit,
        f: impl FnOnce(&mut WriteView) -> Result<T, E>,
    ) -> Result<T, E> {
        self.write_in(self.home(), commit, f)
    }

    /// Runs `f` as the single writer on namespace `ns`. A `Deferred` commit is atomic and
    /// visible to later sessions without being durable yet: it becomes durable with the next
    /// `Durable` commit or [`MetaStore::flush`] — of any namespace, since they share the
    /// file. Used for group commit: nothing may be acknowledged before that flush.
    pub fn write_in<T, E: From<MetaError>>(
        &self,
        ns: Namespace,
        commit: Commit,
        f: impl FnOnce(&mut WriteView) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut txn = self.begin_write()?;
        if commit == Commit::Deferred {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| self.fail(e))?;
        }
        let out = f(&mut WriteView::new(&txn, ns))?;
        self.commit(txn)?;
        if commit == Commit::Durable {
            self.count_durable();
        }
        Ok(out)
    }

    pub(super) fn count_durable(&self) {
        self.durable_commits
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Commits of any kind made through this handle so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Durable commits (fsyncs) made through this handle so far.
    pub fn durable_commits(&self) -> u64 {
        self.durable_commits
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Begins a batch: one transaction for many sessions (see [`Batch`]).
    pub fn batch(self: &std::sync::Arc<Self>) -> MetaResult<Batch> {
        Batch::begin(self)
    }

    /// Makes every deferred commit durable (an empty durable commit: redb writes and fsyncs
    /// the header regardless of content).
    pub fn flush(&self) -> MetaResult<()> {
        let txn = self.begin_write()?;
        self.commit(txn)?;
        self.count_durable();
        Ok(())
    }
}

/// See [`MetaStore::reopener`].
pub struct Reopen {
    path: PathBuf,
    faults: StoreFaults,
    home: Option<Namespace>,
}

impl Reopen {
    pub fn open(&self) -> MetaResult<MetaStore> {
        MetaStore::open_as(&self.path, self.faults.clone(), self.home, Logged::Yes)
    }
}

/// Whether a store has a redo log (and so runs batches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Yes,
    No,
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

/// `e`, unless an fsync failed while opening (then the open's error is that, and fatal).
fn fatal_if_synced_failed(path: &Path, faults: &StoreFaults, e: MetaError) -> MetaError {
    match faults.failed_sync() {
        Some((which, error)) if !matches!(e, MetaError::Fatal { .. }) => {
            let file = match which {
                Synced::Log => redo::path_for(path),
                Synced::Store => path.to_path_buf(),
            };
            fatal::sync_failed(&file, which, &error, faults)
        }
        _ => e,
    }
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

/// An open-time failure of `path`, with redb's own words.
fn damaged(path: &Path, e: redb::DatabaseError) -> MetaError {
    MetaError::Damaged {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}
