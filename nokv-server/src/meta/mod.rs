//! The durable metadata store: the only durable truth of a shard. A node keeps all its shards
//! in one redb file, each in its own namespace of tables ([`Tables`]); a standalone file
//! holds one shard (a checkpoint, a test's store). This is the only module that touches redb.
//!
//! Callers get a [`ReadView`] (an MVCC snapshot) or a [`WriteView`] (the single writer) and
//! speak in typed records; a write view commits with `Durability::Immediate` (fsync) when
//! its closure returns `Ok`, and aborts — changing nothing — when it returns `Err`. A
//! [`Batch`] of sessions is the exception: it commits without fsync and is made durable by its
//! record in the store's redo log ([`redo`]), which opening the store replays. Sessions
//! are plain synchronous closures: the [`crate::shard::gate`] runs them, and a synchronous
//! closure cannot await provider I/O while the gate is held.

pub mod fault;
/// The inventory's scan record and quarantine observations.
mod inventory;
mod open;
pub mod records;
mod redo;
mod snapshot;
mod tables;
mod undo;
mod usage;

use std::ops::Bound;
use std::path::{Path, PathBuf};

use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

pub use fault::StoreFaults;
pub use records::*;
pub use redo::Redo;
pub use tables::{Namespace, Tables};
pub use usage::{UsageDelta, UsageRecount, UsageTotals};

/// Errors of the metadata layer. They are never the caller's fault, so they surface as
/// `Internal`, `Unavailable` (the store failed and is being reopened) or `DataCorrupted`.
/// The open-time variants name the file and say what to do: they end start-up.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Store(#[from] redb::Error),
    #[error("metadata record is corrupt: {0}")]
    Corrupt(#[from] prost::DecodeError),
    /// A commit (or the start of a write) failed at the storage level, e.g. disk full. The
    /// handle accepts no more writes; its owner reopens the file.
    #[error("metadata store failed ({0}); the shard is reopening it, retry")]
    Failed(String),
    #[error(
        "metadata file {0} is missing: this data dir was created with it and nokv never recreates it (its entries would be lost silently); restore it from a backup"
    )]
    Missing(PathBuf),
    #[error(
        "metadata file {0} is empty: its entries are gone; restore it from a backup (nokv never reinitialises an existing metadata file)"
    )]
    Empty(PathBuf),
    #[error("metadata file {path} cannot be opened ({detail}); restore it from a backup")]
    Damaged { path: PathBuf, detail: String },
    /// An attempt to record an ownership epoch below the stored one.
    #[error("shard is owned at epoch {current}; refusing to record the older epoch {epoch}")]
    EpochRegression { current: u64, epoch: u64 },
    /// Copying a shard out for a checkpoint failed (see [`MetaStore::export`]); the store
    /// itself is unaffected.
    #[error("copying the shard to {dest}: {detail}")]
    Copy { dest: PathBuf, detail: String },
}

macro_rules! store_err {
    ($($t:ty),*) => {$(
        impl From<$t> for MetaError {
            fn from(e: $t) -> Self { MetaError::Store(e.into()) }
        }
    )*};
}
store_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl From<MetaError> for crate::error::Error {
    fn from(e: MetaError) -> Self {
        use crate::error::Error;
        match e {
            MetaError::Failed(_) => Error::Unavailable(e.to_string()),
            MetaError::Corrupt(_) => Error::DataCorrupted(e.to_string()),
            _ => Error::Internal(e.to_string()),
        }
    }
}

type MetaResult<T> = Result<T, MetaError>;

/// How a write session commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// fsync before returning.
    Durable,
    /// Atomic and visible, durable only after a later durable commit or flush.
    Deferred,
}
type Bytes = &'static [u8];

/// Marker in SEQUENCES: the two upload indexes above cover every upload record (data dirs
/// written before the indexes existed are indexed once, by [`WriteView::index_uploads`]).
const UPLOAD_INDEX_MARKER: &str = "upload-index-v1";
const EPOCH_KEY: &str = "epoch";
/// Sequence of operation ids (shared by uploads and deletes; never reused).
const OPERATION_SEQ: &str = "operation";
/// Marker in SEQUENCES: every upload record and collectable key has its ledger row (data dirs
/// from before the ledger are backfilled once at open, by [`WriteView::backfill_operations`]).
const OPERATIONS_MARKER: &str = "operations-v1";

/// How far a self-dated request id's time may be from the shard clock at its recording.
const SELF_DATED_SKEW_MS: i64 = 10 * 60 * 1000;

/// True if `request_id` dates itself: the SDK's form, 32 lowercase hex digits whose first 12
/// are a millisecond time, within [`SELF_DATED_SKEW_MS`] of `created_ms` (the shard clock when
/// it was recorded).
///
/// Such a record needs no row in the pruning order (`request_age`), which saves every
/// acknowledged write one table in its batch's commit: the pruning pass finds it by scanning
/// each workspace's ids below the time prefix of the cutoff minus the skew
/// ([`ReadView::self_dated_replays_before`]). Invariants: every id in that range dates itself
/// more than the skew before the cutoff, so a self-dated one was recorded before the cutoff —
/// the scan meets only records that are due (plus ids that merely sort low, which carry an age
/// row and are judged by their recorded time like every scanned record), so a pass never
/// wades through young records; and a self-dated record recorded at `c` is reached once the
/// cutoff passes `c + 2 × skew`, so it is pruned at most twice the skew later than the
/// retention says, never earlier.
fn self_dated(request_id: &str, created_ms: i64) -> bool {
    request_id.len() == 32
        && request_id
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && i64::from_str_radix(&request_id[..12], 16)
            .is_ok_and(|t| (t - created_ms).abs() <= SELF_DATED_SKEW_MS)
}

/// The 12-hex-digit time prefix of a self-dated request id at `ms` (0 below the epoch).
fn time_prefix(ms: i64) -> String {
    format!("{:012x}", ms.clamp(0, 0xffff_ffff_ffff))
}

fn decode<R: Message + Default>(bytes: &[u8]) -> MetaResult<R> {
    Ok(R::decode(bytes)?)
}

/// The ended-index time of a terminal upload (records from before `ended_ms` existed use
/// their creation time: they are old).
fn ended_at(rec: &UploadRecord) -> i64 {
    if rec.ended_ms != 0 {
        rec.ended_ms
    } else {
        rec.created_ms
    }
}

/// Counters shown by the admin health call.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub entries: u64,
    pub uploads: u64,
    pub guards: u64,
    pub collectable: u64,
    /// Upload records of every state (terminal ones until they are pruned).
    pub upload_records: u64,
    /// Guards whose writer's outcome is unknown (their bytes may still land).
    pub unknown_guards: u64,
    /// Uploads claimed after expiry whose attempts are not all settled yet.
    pub deleting_uploads: u64,
    /// Ledger operations per state, in [`OpState::ALL`] order.
    pub operations: [u64; 7],
    /// Creation time (shard clock) of the oldest unresolved operation, if any.
    pub oldest_unresolved_ms: Option<i64>,
}

/// A table added after data directories existed may be absent from a read snapshot until
/// the first write session creates it: absent reads as empty.
fn optional<T>(t: Result<T, redb::TableError>) -> MetaResult<Option<T>> {
    match t {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub struct MetaStore {
    db: Database,
    path: PathBuf,
    faults: StoreFaults,
    /// The namespace [`MetaStore::read`] and [`MetaStore::write`] use: the canonical one for a
    /// standalone file. A node file has no home: its callers name a shard's namespace.
    home: Option<Namespace>,
    /// Durable commits (each one fsync) made through this handle: tests prove with it that
    /// sessions of many shards share one.
    durable_commits: std::sync::atomic::AtomicU64,
    /// Why a write failed at the storage level, once one did. Like redb after an I/O error,
    /// the handle then refuses every write: only dropping it and opening the file again
    /// (which lets redb recover to the last durable commit) brings the store back.
    failure: parking_lot::Mutex<Option<String>>,
    /// The redo log's appending end (see [`redo`]), opened by the first batch logged.
    log: parking_lot::Mutex<Option<redo::Log>>,
    /// Appends to the redo log (each one fsync) through this handle.
    log_syncs: std::sync::atomic::AtomicU64,
    /// The sequence number of the last batch committed (its redo record may not be durable
    /// yet): every batch takes the next one.
    last_seq: std::sync::atomic::AtomicU64,
}

impl MetaStore {
    /// Creates a standalone single-shard file (a test's store, a checkpoint being written), or
    /// opens it if a first start was interrupted after creating it.
    pub fn create(path: &Path) -> MetaResult<MetaStore> {
        Self::create_as(path, Some(Tables::canonical()))
    }

    /// Opens an existing standalone single-shard file; refuses, naming the file, one that is
    /// missing, empty or damaged (never creates or reinitialises it, and never panics on a
    /// corrupt file).
    pub fn open(path: &Path) -> MetaResult<MetaStore> {
        Self::open_as(path, StoreFaults::default(), Some(Tables::canonical()))
    }

    /// Creates the node file of a brand-new data directory: it holds every shard the node
    /// holds, each in its own namespace ([`MetaStore::prepare`] makes a shard's tables).
    pub fn create_node(path: &Path) -> MetaResult<MetaStore> {
        Self::create_as(path, None)
    }

    /// Opens an existing node file (refusing a missing, empty or damaged one like
    /// [`MetaStore::open`]).
    pub fn open_node(path: &Path) -> MetaResult<MetaStore> {
        Self::open_as(path, StoreFaults::default(), None)
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
        Self::open_as(path, faults, Some(Tables::canonical()))
    }

    fn create_as(path: &Path, home: Option<Namespace>) -> MetaResult<MetaStore> {
        open::guarded(path, || {
            let db = Database::create(path).map_err(|e| damaged(path, e))?;
            Self::init(db, path, StoreFaults::default(), home)
        })
    }

    fn open_as(path: &Path, faults: StoreFaults, home: Option<Namespace>) -> MetaResult<MetaStore> {
        open::require_existing(path)?;
        open::guarded(path, || {
            let db = Database::open(path).map_err(|e| damaged(path, e))?;
            Self::init(db, path, faults, home)
        })
    }

    /// A standalone store makes sure its tables exist, so read views never meet a missing
    /// table; a node file does that per shard ([`MetaStore::prepare`]).
    fn init(
        db: Database,
        path: &Path,
        faults: StoreFaults,
        home: Option<Namespace>,
    ) -> MetaResult<MetaStore> {
        let last_seq = Self::replay(&db, path)?;
        let store = MetaStore {
            db,
            path: path.to_path_buf(),
            faults,
            home,
            durable_commits: Default::default(),
            failure: parking_lot::Mutex::new(None),
            log: parking_lot::Mutex::new(None),
            log_syncs: Default::default(),
            last_seq: last_seq.into(),
        };
        if let Some(ns) = home {
            store.prepare(ns)?;
        }
        Ok(store)
    }

    /// Brings the file up to date with its redo log (one durable commit; the log's records are
    /// then all at or below the file's `applied` sequence, and the next one logged starts the
    /// log over); returns the sequence number of the last batch the file holds.
    fn replay(db: &Database, path: &Path) -> MetaResult<u64> {
        let log = redo::path_for(path);
        let txn = db.begin_write()?;
        let (last, replayed) = redo::replay(&txn, &log)?;
        if replayed == 0 {
            // Nothing to write (no log, or nothing above the file's sequence): a reopen on a
            // full disk must not need space for an empty commit.
            txn.abort()?;
            return Ok(last);
        }
        txn.commit()?;
        tracing::info!(store = %path.display(), batches = replayed, "replayed the redo log");
        Ok(last)
    }

    /// Appends batch records to the redo log and makes them durable: the batches are durable
    /// once this returns `Ok`. After a failure the handle is failed (nothing more is ever
    /// appended through it, see [`redo`]).
    pub fn log(&self, records: &[u8]) -> MetaResult<()> {
        if let Some(reason) = self.failure() {
            return Err(MetaError::Failed(reason));
        }
        let mut log = self.log.lock();
        let appended = self.faults.check_log().and_then(|()| {
            if log.is_none() {
                *log = Some(redo::Log::open(&redo::path_for(&self.path))?);
            }
            log.as_mut().expect("opened above").append(records)
        });
        appended.map_err(|e| self.fail(redb::StorageError::Io(e)))?;
        self.log_syncs
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
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

    /// Starts the redo log over. Only after a durable commit that followed every record in it
    /// (see [`MetaStore::flush`]), by the thread that appends.
    pub fn clear_log(&self) {
        if let Some(log) = self.log.lock().as_mut() {
            log.clear();
        }
    }

    /// A snapshot of the last commit, durable or not: the committer takes one after each
    /// batch, and the gate shows it to readers once that batch's record is durable.
    pub fn snapshot(&self) -> MetaResult<Snapshot> {
        Ok(Snapshot(std::sync::Arc::new(self.db.begin_read()?)))
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
    fn fail(&self, e: impl Into<redb::Error>) -> MetaError {
        let reason = e.into().to_string();
        self.failure.lock().get_or_insert_with(|| reason.clone());
        MetaError::Failed(reason)
    }

    fn begin_write(&self) -> MetaResult<redb::WriteTransaction> {
        if self.failure.lock().is_some() {
            return Err(MetaError::Failed(
                "an earlier write of this handle failed".into(),
            ));
        }
        self.db.begin_write().map_err(|e| self.fail(e))
    }

    fn commit(&self, txn: redb::WriteTransaction) -> MetaResult<()> {
        if let Err(e) = self.faults.check_commit() {
            // Dropping the transaction aborts it: nothing is written, as with a real failure.
            drop(txn);
            return Err(self.fail(redb::StorageError::Io(e)));
        }
        txn.commit().map_err(|e| self.fail(e))
    }

    /// The namespace of a standalone file.
    fn home(&self) -> Namespace {
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

    fn count_durable(&self) {
        self.durable_commits
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Durable commits (fsyncs) made through this handle so far.
    pub fn durable_commits(&self) -> u64 {
        self.durable_commits
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Begins a batch: one transaction for many sessions (see [`Batch`]).
    pub fn batch(&self) -> MetaResult<Batch<'_>> {
        Ok(Batch {
            store: self,
            txn: self.begin_write()?,
            poisoned: None,
            effects: Default::default(),
        })
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

/// The sessions of one batch in one transaction, committed once at the end without fsync and
/// made durable by its redo record ([`Batch::commit_logged`]).
///
/// Each session runs as if alone: one that fails has its writes undone before the next runs
/// (see [`undo`]), so it changes nothing. If an undo itself fails the batch is poisoned: later
/// sessions are refused and the commit fails, so nothing of the batch is acknowledged.
pub struct Batch<'s> {
    store: &'s MetaStore,
    txn: redb::WriteTransaction,
    poisoned: Option<String>,
    /// What the sessions that succeeded wrote, for the redo log.
    effects: std::cell::RefCell<redo::Effects>,
}

/// A batch committed but not yet durable (see [`Batch::commit_logged`]).
pub struct Logged {
    /// The batch's redo record: the batch is durable once [`MetaStore::log`] wrote it.
    pub redo: Redo,
    /// The state right after the batch, to show readers once it is durable.
    pub snapshot: Snapshot,
}

/// A read snapshot that many readers share (see [`MetaStore::snapshot`]).
#[derive(Clone)]
pub struct Snapshot(std::sync::Arc<redb::ReadTransaction>);

impl Snapshot {
    /// True if `ns` has tables in this snapshot (see [`MetaStore::holds`]).
    pub fn holds(&self, ns: Namespace) -> MetaResult<bool> {
        ns.exists_in(&self.0)
    }

    /// Runs `f` on namespace `ns` of this snapshot.
    pub fn read_in<T, E: From<MetaError>>(
        &self,
        ns: Namespace,
        f: impl FnOnce(&ReadView) -> Result<T, E>,
    ) -> Result<T, E> {
        f(&ReadView {
            txn: self.0.clone(),
            t: ns,
        })
    }
}

impl Batch<'_> {
    /// Runs `f` as one session of the batch on namespace `ns`.
    pub fn session<T, E: From<MetaError>>(
        &mut self,
        ns: Namespace,
        f: impl FnOnce(&mut WriteView) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(reason) = &self.poisoned {
            return Err(MetaError::Failed(reason.clone()).into());
        }
        let mark = self.effects.borrow().mark();
        let mut view = WriteView::new(&self.txn, ns);
        view.redo = Some(&self.effects);
        let out = f(&mut view);
        if out.is_err() {
            self.effects.borrow_mut().rewind(mark);
            let steps = view.undo.into_inner();
            for step in steps.into_iter().rev() {
                if let Err(e) = step(&self.txn) {
                    self.poisoned = Some(format!("undoing a failed session: {e}"));
                    break;
                }
            }
        }
        out
    }

    /// Commits every session that succeeded, atomically and visibly to the next batch but
    /// not durably: the batch is durable once its record is in the redo log
    /// ([`MetaStore::log`]). Nobody may be answered, and no reader shown the returned
    /// snapshot, before that.
    pub fn commit_logged(mut self) -> MetaResult<Logged> {
        if let Some(reason) = self.poisoned {
            drop(self.txn);
            return Err(self
                .store
                .fail(redb::StorageError::Io(std::io::Error::other(reason))));
        }
        let seq = self
            .store
            .last_seq
            .load(std::sync::atomic::Ordering::Acquire)
            + 1;
        redo::set_applied(&self.txn, seq)?;
        self.txn
            .set_durability(redb::Durability::None)
            .map_err(|e| self.store.fail(e))?;
        self.store.commit(self.txn)?;
        self.store
            .last_seq
            .store(seq, std::sync::atomic::Ordering::Release);
        Ok(Logged {
            redo: Redo::new(seq, self.effects.into_inner()),
            snapshot: self.store.snapshot()?,
        })
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
        MetaStore::open_as(&self.path, self.faults.clone(), self.home)
    }
}

/// An open-time failure of `path`, with redb's own words.
fn damaged(path: &Path, e: redb::DatabaseError) -> MetaError {
    MetaError::Damaged {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

pub struct ReadView {
    txn: std::sync::Arc<redb::ReadTransaction>,
    t: Namespace,
}

pub struct WriteView<'a> {
    txn: &'a redb::WriteTransaction,
    t: Namespace,
    /// How to undo what this session wrote so far (see [`undo`]).
    undo: std::cell::RefCell<Vec<undo::UndoStep>>,
    /// The batch's redo effects (`None` outside a batch: such a write commits durably).
    redo: Option<&'a std::cell::RefCell<redo::Effects>>,
}

impl<'a> WriteView<'a> {
    fn new(txn: &'a redb::WriteTransaction, t: Namespace) -> Self {
        WriteView {
            txn,
            t,
            undo: Default::default(),
            redo: None,
        }
    }

    /// Opens one of the session's tables for writing: every insert and remove through it
    /// records its undo step first.
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> MetaResult<undo::UndoTable<'_, K, V>> {
        undo::UndoTable::open(self.txn, def, &self.undo, self.redo)
    }
}

/// Point reads and scans shared by both views: a write session must see its own writes, so it
/// reads through its write transaction rather than a snapshot.
macro_rules! readable {
    ($view:ty) => {
        impl $view {
            pub fn entry(&self, ws: &str, path: &str) -> MetaResult<Option<EntryRecord>> {
                let t = self.txn.open_table(self.t.entries)?;
                t.get((ws, path))?.map(|v| decode(v.value())).transpose()
            }

            pub fn inline(&self, ws: &str, path: &str) -> MetaResult<Option<Vec<u8>>> {
                let t = self.txn.open_table(self.t.inline)?;
                Ok(t.get((ws, path))?.map(|v| v.value().to_vec()))
            }

            /// Up to `limit` entries of `ws` whose path starts with `prefix`, in path order,
            /// strictly after `after` when given.
            pub fn list(
                &self,
                ws: &str,
                prefix: &str,
                after: Option<&str>,
                limit: usize,
            ) -> MetaResult<Vec<(String, EntryRecord)>> {
                let t = self.txn.open_table(self.t.entries)?;
                let start = match after {
                    Some(a) if a >= prefix => Bound::Excluded((ws, a)),
                    _ => Bound::Included((ws, prefix)),
                };
                let mut out = Vec::new();
                for item in t.range((start, Bound::Unbounded))? {
                    let (k, v) = item?;
                    let (kws, kpath) = k.value();
                    if kws != ws || !kpath.starts_with(prefix) || out.len() == limit {
                        break;
                    }
                    out.push((kpath.to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            pub fn replay(&self, ws: &str, request_id: &str) -> MetaResult<Option<ReplayRecord>> {
                let t = self.txn.open_table(self.t.requests)?;
                t.get((ws, request_id))?
                    .map(|v| decode(v.value()))
                    .transpose()
            }

            pub fn upload(&self, id: &str) -> MetaResult<Option<UploadRecord>> {
                let t = self.txn.open_table(self.t.uploads)?;
                t.get(id)?.map(|v| decode(v.value())).transpose()
            }

            pub fn receipt(&self, ws: &str, receipt: &str) -> MetaResult<Option<ReceiptRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.receipts))? else {
                    return Ok(None);
                };
                t.get((ws, receipt))?.map(|v| decode(v.value())).transpose()
            }

            pub fn block(&self, upload: &str, index: u32) -> MetaResult<Option<BlockRecord>> {
                let t = self.txn.open_table(self.t.blocks)?;
                t.get((upload, index))?
                    .map(|v| decode(v.value()))
                    .transpose()
            }

            /// Every block record of an upload, by index.
            pub fn blocks(&self, upload: &str) -> MetaResult<Vec<(u32, BlockRecord)>> {
                let t = self.txn.open_table(self.t.blocks)?;
                let mut out = Vec::new();
                for item in t.range((upload, 0u32)..=(upload, u32::MAX))? {
                    let (k, v) = item?;
                    out.push((k.value().1, decode(v.value())?));
                }
                Ok(out)
            }

            pub fn revision(&self, rev: u64) -> MetaResult<Option<RevisionRecord>> {
                let t = self.txn.open_table(self.t.revisions)?;
                t.get(rev)?.map(|v| decode(v.value())).transpose()
            }

            pub fn guard(&self, key: &str) -> MetaResult<Option<GuardRecord>> {
                let t = self.txn.open_table(self.t.guards)?;
                t.get(key)?.map(|v| decode(v.value())).transpose()
            }

            /// Up to `limit` collectable keys, in key order.
            pub fn collectable_page(&self, limit: usize) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.collectable)?;
                let mut out = Vec::new();
                for item in t.iter()?.take(limit) {
                    out.push(item?.0.value().to_string());
                }
                Ok(out)
            }

            /// Every collectable key, in key order (for accounting; the reconciler pages
            /// with [`Self::collectable_page`]).
            pub fn collectable_keys(&self) -> MetaResult<Vec<String>> {
                self.collectable_page(usize::MAX)
            }

            /// The object key of every block record. Block records exist only while their
            /// upload is open, so this follows the open uploads.
            pub fn block_keys(&self) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.blocks)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let b: BlockRecord = decode(item?.1.value())?;
                    out.push(b.key);
                }
                Ok(out)
            }

            /// The object key of every block of every revision, live or retired (a retired
            /// revision's keys stay referenced until the reconciler releases it).
            pub fn revision_keys(&self) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.revisions)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let r: RevisionRecord = decode(item?.1.value())?;
                    out.extend(r.blocks.into_iter().map(|b| b.key));
                }
                Ok(out)
            }

            /// Every guard with its record (guards are small and few: one per unsettled
            /// attempt).
            pub fn guards(&self) -> MetaResult<Vec<(String, GuardRecord)>> {
                let t = self.txn.open_table(self.t.guards)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            /// Up to `limit` open uploads whose lease ended at or before `now_ms`, soonest
            /// expired first (a range of the open-upload index: its cost does not grow with
            /// the number of ended uploads).
            pub fn expired_uploads(&self, now_ms: i64, limit: usize) -> MetaResult<Vec<String>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.open_uploads))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    let (k, _) = item?;
                    let (lease, id) = k.value();
                    if lease > now_ms || out.len() == limit {
                        break;
                    }
                    out.push(id.to_string());
                }
                Ok(out)
            }

            /// Up to `limit` terminal uploads that ended at or before `cutoff_ms`, oldest
            /// first.
            pub fn ended_uploads(&self, cutoff_ms: i64, limit: usize) -> MetaResult<Vec<String>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.ended_uploads))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    let (k, _) = item?;
                    let (ended, id) = k.value();
                    if ended > cutoff_ms || out.len() == limit {
                        break;
                    }
                    out.push(id.to_string());
                }
                Ok(out)
            }

            /// Up to `limit` retired revisions retired at or before `cutoff_ms`, oldest first.
            pub fn retired_before(
                &self,
                cutoff_ms: i64,
                limit: usize,
            ) -> MetaResult<Vec<(i64, u64)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.retired))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    let (k, _) = item?;
                    let (ms, rev) = k.value();
                    if ms > cutoff_ms || out.len() == limit {
                        break;
                    }
                    out.push((ms, rev));
                }
                Ok(out)
            }

            /// True once every upload record is covered by the upload indexes.
            pub fn uploads_indexed(&self) -> MetaResult<bool> {
                Ok(self.last_sequence(UPLOAD_INDEX_MARKER)? > 0)
            }

            /// True if some replay record was created before `cutoff_ms` (pruning has work).
            pub fn has_replays_before(&self, cutoff_ms: i64) -> MetaResult<bool> {
                let aged = match optional(self.txn.open_table(self.t.request_age))? {
                    Some(t) => t
                        .range(..(cutoff_ms.max(0) as u64, "", ""))?
                        .next()
                        .is_some(),
                    None => false,
                };
                Ok(aged || !self.self_dated_replays_before(cutoff_ms, 1)?.is_empty())
            }

            /// Up to `limit` replay records created before `cutoff_ms` that may have no
            /// pruning row (see [`self_dated`]): per workspace, the request ids that sort
            /// below the time prefix of the cutoff minus the skew, each checked against the
            /// record's own creation time. Returns (workspace, request id, created ms).
            pub fn self_dated_replays_before(
                &self,
                cutoff_ms: i64,
                limit: usize,
            ) -> MetaResult<Vec<(String, String, i64)>> {
                let Some(t) = optional(self.txn.open_table(self.t.requests))? else {
                    return Ok(Vec::new());
                };
                let bound = time_prefix(cutoff_ms.saturating_sub(SELF_DATED_SKEW_MS));
                let mut out = Vec::new();
                let mut next_ws: Option<String> = Some(String::new());
                while let Some(from) = next_ws.take() {
                    // The first workspace at or after `from`.
                    let Some(first) = t.range((from.as_str(), "")..)?.next() else {
                        break;
                    };
                    let ws = first?.0.value().0.to_string();
                    for item in t.range((ws.as_str(), "")..(ws.as_str(), bound.as_str()))? {
                        if out.len() == limit {
                            return Ok(out);
                        }
                        let (k, v) = item?;
                        let created = decode::<ReplayRecord>(v.value())?.created_ms;
                        if created < cutoff_ms {
                            out.push((ws.clone(), k.value().1.to_string(), created));
                        }
                    }
                    // Every key of `ws` sorts below `ws` followed by NUL.
                    next_ws = Some(format!("{ws}\0"));
                }
                Ok(out)
            }

            /// The fencing epoch this shard's data was last owned under (0 if never raised).
            pub fn epoch(&self) -> MetaResult<u64> {
                match optional(self.txn.open_table(self.t.ownership))? {
                    Some(t) => Ok(t.get(EPOCH_KEY)?.map(|v| v.value()).unwrap_or(0)),
                    None => Ok(0),
                }
            }

            /// The last value a named sequence issued (0 if none yet).
            pub fn last_sequence(&self, name: &str) -> MetaResult<u64> {
                let t = self.txn.open_table(self.t.sequences)?;
                Ok(t.get(name)?.map(|v| v.value()).unwrap_or(0))
            }

            /// Counters for health. Table lengths (constant cost) except the unknown-guard
            /// count: open uploads come from their index, never from the upload history.
            pub fn counts(&self) -> MetaResult<Counts> {
                let open = match optional(self.txn.open_table(self.t.open_uploads))? {
                    Some(t) => t.len()?,
                    None => 0,
                };
                // Guards are few (one per unsettled attempt): counting by kind is a short scan.
                let mut unknown_guards = 0;
                let mut guarded_uploads = std::collections::HashSet::new();
                for item in self.txn.open_table(self.t.guards)?.iter()? {
                    let g: GuardRecord = decode(item?.1.value())?;
                    unknown_guards += u64::from(g.writer == WriterState::Unknown as i32);
                    guarded_uploads.insert(g.upload_id);
                }
                // A claimed upload stays `Deleting` exactly while a guard awaiting cleanup names it (see the
                // reconciler), so the guarded uploads are the only candidates.
                let mut deleting_uploads = 0;
                let uploads = self.txn.open_table(self.t.uploads)?;
                for id in &guarded_uploads {
                    if let Some(v) = uploads.get(id.as_str())? {
                        let u: UploadRecord = decode(v.value())?;
                        deleting_uploads += u64::from(u.state == UploadState::Deleting as i32);
                    }
                }
                let mut operations = [0u64; 7];
                let mut oldest_unresolved_ms = None;
                if let Some(t) = optional(self.txn.open_table(self.t.op_states))? {
                    for (i, st) in OpState::ALL.iter().enumerate() {
                        operations[i] = t.get(st.name())?.map_or(0, |v| v.value());
                    }
                }
                if let Some(t) = optional(self.txn.open_table(self.t.unresolved_ops))?
                    && let Some(first) = t.first()?
                {
                    oldest_unresolved_ms = Some(first.0.value().0);
                }
                Ok(Counts {
                    operations,
                    oldest_unresolved_ms,
                    unknown_guards,
                    deleting_uploads,
                    entries: self.txn.open_table(self.t.entries)?.len()?,
                    uploads: open,
                    guards: self.txn.open_table(self.t.guards)?.len()?,
                    collectable: self.txn.open_table(self.t.collectable)?.len()?,
                    upload_records: self.txn.open_table(self.t.uploads)?.len()?,
                })
            }
        }
    };
}

readable!(ReadView);
readable!(WriteView<'_>);

/// Reads of the workspace-deletion state, shared by both views.
macro_rules! workspace_reads {
    ($view:ty) => {
        impl $view {
            pub fn workspace(&self, ws: &str) -> MetaResult<Option<WorkspaceRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.workspaces))? else {
                    return Ok(None);
                };
                t.get(ws)?.map(|v| decode(v.value())).transpose()
            }

            /// Up to `limit` workspaces with a record (all of them being deleted), by name.
            pub fn workspace_records(
                &self,
                limit: usize,
            ) -> MetaResult<Vec<(String, WorkspaceRecord)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.workspaces))? else {
                    return Ok(out);
                };
                for item in t.iter()?.take(limit) {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            /// Up to `limit` retired revisions in (retired ms, revision) order, strictly after
            /// `after` when given.
            pub fn retired_after(
                &self,
                after: Option<(i64, u64)>,
                limit: usize,
            ) -> MetaResult<Vec<(i64, u64)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.retired))? else {
                    return Ok(out);
                };
                let start = match after {
                    Some(a) => Bound::Excluded(a),
                    None => Bound::Unbounded,
                };
                for item in t
                    .range::<(i64, u64)>((start, Bound::Unbounded))?
                    .take(limit)
                {
                    out.push(item?.0.value());
                }
                Ok(out)
            }
        }
    };
}

workspace_reads!(ReadView);
workspace_reads!(WriteView<'_>);

/// Reads of the operations ledger, shared by both views.
macro_rules! ledger_reads {
    ($view:ty) => {
        impl $view {
            pub fn operation(&self, id: u64) -> MetaResult<Option<OperationRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.operations))? else {
                    return Ok(None);
                };
                t.get(id)?.map(|v| decode(v.value())).transpose()
            }

            /// The ledger row of operation `id` (an upload's row is read from its record).
            pub fn ledger_row(&self, id: u64) -> MetaResult<Option<LedgerRow>> {
                let Some(op) = self.operation(id)? else {
                    return Ok(None);
                };
                if op.is_upload() {
                    return Ok(self
                        .upload(&op.upload_id)?
                        .map(|u| LedgerRow::of_upload(id, &u)));
                }
                Ok(Some(LedgerRow::of_delete(id, &op)))
            }

            /// Up to `limit` ledger rows with an id above `after` whose state `keep`
            /// accepts, in id order, reading at most `scan` rows (a filtered page over a
            /// large history stops early; the caller resumes after the returned position).
            /// Returns the rows and the id of the last row read.
            pub fn ledger_page(
                &self,
                after: u64,
                keep: &dyn Fn(OpState) -> bool,
                limit: usize,
                scan: usize,
            ) -> MetaResult<(Vec<LedgerRow>, Option<u64>)> {
                let mut out = Vec::new();
                let mut last = None;
                let Some(t) = optional(self.txn.open_table(self.t.operations))? else {
                    return Ok((out, last));
                };
                for (read, item) in t
                    .range::<u64>((Bound::Excluded(after), Bound::Unbounded))?
                    .enumerate()
                {
                    if out.len() == limit || read == scan {
                        break;
                    }
                    let (k, v) = item?;
                    let id = k.value();
                    last = Some(id);
                    let op: OperationRecord = decode(v.value())?;
                    let row = if op.is_upload() {
                        match self.upload(&op.upload_id)? {
                            Some(u) => LedgerRow::of_upload(id, &u),
                            None => continue,
                        }
                    } else {
                        LedgerRow::of_delete(id, &op)
                    };
                    if keep(row.state) {
                        out.push(row);
                    }
                }
                Ok((out, last))
            }

            /// Up to `limit` queued deletes (collectable key, operation id), in key order.
            pub fn collectable_ops(&self, limit: usize) -> MetaResult<Vec<(String, u64)>> {
                let t = self.txn.open_table(self.t.collectable)?;
                let mut out = Vec::new();
                for item in t.iter()?.take(limit) {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), v.value()));
                }
                Ok(out)
            }

            /// The keys of every dead-lettered delete (accounting: still delete intents).
            pub fn dead_letter_keys(&self) -> MetaResult<Vec<String>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.dead_letters))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    out.push(item?.0.value().to_string());
                }
                Ok(out)
            }

            /// Up to `limit` deleted delete operations that ended at or before `cutoff_ms`,
            /// oldest first.
            pub fn deleted_ops_before(&self, cutoff_ms: i64, limit: usize) -> MetaResult<Vec<u64>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.deleted_ops))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    let (ms, id) = item?.0.value();
                    if ms > cutoff_ms || out.len() == limit {
                        break;
                    }
                    out.push(id);
                }
                Ok(out)
            }
        }
    };
}

ledger_reads!(ReadView);
ledger_reads!(WriteView<'_>);

/// How an operation shows in the counters and indexes: its state, creation and end time.
#[derive(Clone, Copy)]
struct Tracked {
    state: OpState,
    created_ms: i64,
    ended_ms: i64,
}

impl Tracked {
    fn upload(u: &UploadRecord) -> Tracked {
        Tracked {
            state: OpState::of_upload(u),
            created_ms: u.created_ms,
            ended_ms: ended_at(u),
        }
    }

    fn delete(d: &OperationRecord) -> Tracked {
        Tracked {
            state: d.op_state(),
            created_ms: d.created_ms,
            ended_ms: d.updated_ms,
        }
    }
}

/// Writes of the operations ledger. Every change of an operation's state goes through
/// `put_upload`/`remove_upload` or `put_operation`/`remove_operation`, which keep the per-state
/// counters, the unresolved index, the deleted index and the queues in the same session.
impl WriteView<'_> {
    /// Moves operation `id` from `old` to `new` in the counters and indexes.
    fn track(
        &mut self,
        id: u64,
        old: Option<Tracked>,
        new: Option<Tracked>,
        delete: bool,
    ) -> MetaResult<()> {
        let mut states = self.table(self.t.op_states)?;
        if let Some(o) = old {
            let n = states.get(o.state.name())?.map_or(0, |v| v.value());
            states.insert(o.state.name(), n.saturating_sub(1))?;
        }
        if let Some(n) = new {
            let c = states.get(n.state.name())?.map_or(0, |v| v.value());
            states.insert(n.state.name(), c + 1)?;
        }
        drop(states);
        let mut unresolved = self.table(self.t.unresolved_ops)?;
        if let Some(o) = old.filter(|o| o.state.unresolved()) {
            unresolved.remove((o.created_ms, id))?;
        }
        if let Some(n) = new.filter(|n| n.state.unresolved()) {
            unresolved.insert((n.created_ms, id), ())?;
        }
        drop(unresolved);
        if delete {
            let mut deleted = self.table(self.t.deleted_ops)?;
            if let Some(o) = old.filter(|o| o.state == OpState::Deleted) {
                deleted.remove((o.ended_ms, id))?;
            }
            if let Some(n) = new.filter(|n| n.state == OpState::Deleted) {
                deleted.insert((n.ended_ms, id), ())?;
            }
        }
        Ok(())
    }

    /// Assigns a fresh operation id to upload `upload_id`.
    fn new_upload_operation(&mut self, upload_id: &str) -> MetaResult<u64> {
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            upload_id: upload_id.to_string(),
            ..Default::default()
        };
        self.table(self.t.operations)?
            .insert(id, rec.encode_to_vec().as_slice())?;
        Ok(id)
    }

    /// Stores a delete operation and keeps counters, indexes and queues in step: a block
    /// delete is in the collectable queue exactly while `deleting`; any delete is in the
    /// dead-letter set exactly while `dead_letter`.
    pub fn put_operation(&mut self, id: u64, rec: &OperationRecord) -> MetaResult<()> {
        let old = self.operation(id)?;
        self.table(self.t.operations)?
            .insert(id, rec.encode_to_vec().as_slice())?;
        self.track(
            id,
            old.as_ref().map(Tracked::delete),
            Some(Tracked::delete(rec)),
            true,
        )?;
        let state = rec.op_state();
        let key = rec.key.as_str();
        if rec.kind == DeleteKind::Block as i32 {
            let mut q = self.table(self.t.collectable)?;
            if state == OpState::Deleting {
                q.insert(key, id)?;
            } else if q.get(key)?.is_some_and(|v| v.value() == id) {
                q.remove(key)?;
            }
        }
        let mut dead = self.table(self.t.dead_letters)?;
        if state == OpState::DeadLetter {
            dead.insert(key, id)?;
        } else if dead.get(key)?.is_some_and(|v| v.value() == id) {
            dead.remove(key)?;
        }
        Ok(())
    }

    /// Forgets a delete operation's row (pruning of history). Callers prune only `deleted`
    /// rows whose key no guard names.
    pub fn remove_operation(&mut self, id: u64) -> MetaResult<()> {
        if let Some(old) = self.operation(id)? {
            self.track(id, Some(Tracked::delete(&old)), None, !old.is_upload())?;
            self.table(self.t.operations)?.remove(id)?;
        }
        Ok(())
    }

    /// Queues `key` for deletion as a new `deleting` block-delete operation (or returns the
    /// operation already queued for it).
    pub fn queue_delete(
        &mut self,
        key: &str,
        workspace: &str,
        bytes: u64,
        now_ms: i64,
    ) -> MetaResult<u64> {
        if let Some(v) = self.table(self.t.collectable)?.get(key)? {
            return Ok(v.value());
        }
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            kind: DeleteKind::Block as i32,
            key: key.to_string(),
            workspace: workspace.to_string(),
            bytes,
            state: DeleteState::Deleting as i32,
            created_ms: now_ms,
            updated_ms: now_ms,
            ..Default::default()
        };
        self.put_operation(id, &rec)?;
        Ok(id)
    }

    /// The delete operation of the guard on `key`, created (`deleting`, with the guard's
    /// workspace and bytes) the first time the guard is about to be deleted. `None` if no
    /// guard names the key.
    pub fn guard_operation(&mut self, key: &str, now_ms: i64) -> MetaResult<Option<u64>> {
        let Some(mut g) = self.guard(key)? else {
            return Ok(None);
        };
        if g.operation != 0 {
            return Ok(Some(g.operation));
        }
        let workspace = self
            .upload(&g.upload_id)?
            .map(|u| u.workspace)
            .unwrap_or_default();
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            kind: DeleteKind::Attempt as i32,
            key: key.to_string(),
            workspace,
            bytes: g.bytes,
            state: DeleteState::Deleting as i32,
            created_ms: now_ms,
            updated_ms: now_ms,
            ..Default::default()
        };
        self.put_operation(id, &rec)?;
        g.operation = id;
        self.put_guard(key, &g)?;
        Ok(Some(id))
    }

    /// Gives every upload record and collectable key of a data dir written before the ledger
    /// existed its ledger row, once; a no-op afterwards (and on a new store). Returns how
    /// many rows it created.
    pub fn backfill_operations(&mut self, now_ms: i64) -> MetaResult<u64> {
        let mut seq = self.table(self.t.sequences)?;
        if seq.get(OPERATIONS_MARKER)?.is_some() {
            return Ok(0);
        }
        seq.insert(OPERATIONS_MARKER, 1)?;
        drop(seq);
        let mut uploads = Vec::new();
        for item in self.table(self.t.uploads)?.iter()? {
            let (k, v) = item?;
            uploads.push((k.value().to_string(), decode::<UploadRecord>(v.value())?));
        }
        let mut collectable = Vec::new();
        for item in self.table(self.t.collectable)?.iter()? {
            let (k, v) = item?;
            collectable.push((k.value().to_string(), v.value()));
        }
        let mut created = 0;
        for (id, rec) in uploads.iter().filter(|(_, r)| r.operation == 0) {
            self.put_upload(id, rec)?;
            created += 1;
        }
        // Values were the releasing revision (or 0) before; they become operation ids.
        for (key, rev) in &collectable {
            let (workspace, bytes) = match self.revision(*rev)? {
                Some(r) => {
                    let len = r
                        .blocks
                        .iter()
                        .find(|b| &b.key == key)
                        .map_or(0, |b| b.length);
                    (r.workspace, len)
                }
                None => (String::new(), 0),
            };
            self.table(self.t.collectable)?.remove(key.as_str())?;
            self.queue_delete(key, &workspace, bytes, now_ms)?;
            created += 1;
        }
        Ok(created)
    }
}

impl WriteView<'_> {
    pub fn put_entry(&mut self, ws: &str, path: &str, rec: &EntryRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.entries)?;
        t.insert((ws, path), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    /// Removes the entry and any inline body. The entry's generation moves to the
    /// generations table, so the path's next generation still exceeds it (see
    /// [`WriteView::next_generation`]).
    pub fn remove_entry(&mut self, ws: &str, path: &str) -> MetaResult<()> {
        let removed = self.entry(ws, path)?;
        self.table(self.t.entries)?.remove((ws, path))?;
        if let Some(EntryRecord { generation, .. }) = removed {
            let mut t = self.table(self.t.generations)?;
            let kept = t.get((ws, path))?.map_or(0, |v| v.value());
            if generation > kept {
                t.insert((ws, path), generation)?;
            }
        }
        self.table(self.t.inline)?.remove((ws, path))?;
        Ok(())
    }

    pub fn put_inline(&mut self, ws: &str, path: &str, data: &[u8]) -> MetaResult<()> {
        self.table(self.t.inline)?.insert((ws, path), data)?;
        Ok(())
    }

    pub fn remove_inline(&mut self, ws: &str, path: &str) -> MetaResult<()> {
        self.table(self.t.inline)?.remove((ws, path))?;
        Ok(())
    }

    /// Issues the path's next generation: strictly greater than every generation the path
    /// ever had, including deleted ones. The caller stores it in the path's entry in the
    /// same session.
    ///
    /// Invariants: a path's highest generation so far is the larger of its live entry's and
    /// its generations row — a live entry carries its own, and [`WriteView::remove_entry`]
    /// moves it to the row when the entry goes — and a live entry's generation is never below
    /// the row (an entry created after a removal starts above it; files written before this
    /// rule kept the row equal to the live entry's). So a rewrite, the common case, reads and
    /// writes no generations row; only a path without a live entry consults it.
    pub fn next_generation(&mut self, ws: &str, path: &str) -> MetaResult<u64> {
        let live = self.entry(ws, path)?;
        self.next_generation_after(ws, path, live.as_ref())
    }

    /// [`WriteView::next_generation`] for a caller that already read the path's live entry
    /// in this session (`live`: that read, `None` if there was none) and wrote no entry of the
    /// path since: the rewrite then reads nothing more. Passing an entry from elsewhere (an
    /// earlier session, a snapshot) could issue a generation the path already had.
    pub fn next_generation_after(
        &mut self,
        ws: &str,
        path: &str,
        live: Option<&EntryRecord>,
    ) -> MetaResult<u64> {
        if let Some(live) = live {
            return Ok(live.generation + 1);
        }
        let kept = self
            .table(self.t.generations)?
            .get((ws, path))?
            .map_or(0, |v| v.value());
        Ok(kept + 1)
    }

    /// Records that the shard is now owned under `epoch`. Epochs only grow: a lower one is
    /// refused (a stale owner must never lower the fence of a newer one).
    pub fn set_epoch(&mut self, epoch: u64) -> MetaResult<()> {
        let current = self.epoch()?;
        if epoch < current {
            return Err(MetaError::EpochRegression { current, epoch });
        }
        self.table(self.t.ownership)?.insert(EPOCH_KEY, epoch)?;
        Ok(())
    }

    /// Issues the next value of a named sequence (starting at 1, never reused).
    pub fn next_sequence(&mut self, name: &str) -> MetaResult<u64> {
        let mut t = self.table(self.t.sequences)?;
        let next = t.get(name)?.map(|v| v.value()).unwrap_or(0) + 1;
        t.insert(name, next)?;
        Ok(next)
    }

    /// Records a request's outcome. Its pruning row is written only when the request id does
    /// not carry its own time (see [`self_dated`]): an SDK id is found by its prefix.
    pub fn put_replay(&mut self, ws: &str, request_id: &str, rec: &ReplayRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.requests)?;
        t.insert((ws, request_id), rec.encode_to_vec().as_slice())?;
        if !self_dated(request_id, rec.created_ms) {
            let mut age = self.table(self.t.request_age)?;
            age.insert((rec.created_ms.max(0) as u64, ws, request_id), ())?;
        }
        Ok(())
    }

    /// Removes up to `limit` replay records created before `cutoff_ms`: those in the pruning
    /// order oldest first, then self-dated ones (see [`self_dated`]). Returns how many were
    /// removed; a short page means nothing older is left.
    pub fn prune_replays(&mut self, cutoff_ms: i64, limit: usize) -> MetaResult<usize> {
        let age = self.table(self.t.request_age)?;
        let mut victims = Vec::new();
        for item in age.range(..(cutoff_ms.max(0) as u64, "", ""))? {
            if victims.len() == limit {
                break;
            }
            let (k, _) = item?;
            let (ms, ws, id) = k.value();
            victims.push((ms, ws.to_string(), id.to_string()));
        }
        drop(age);
        if victims.len() < limit {
            // The scan also meets ids that have an age row (their prefix happens to sort
            // low): those found above are not counted twice.
            let aged: std::collections::HashSet<(String, String)> = victims
                .iter()
                .map(|(_, ws, id)| (ws.clone(), id.clone()))
                .collect();
            for (ws, id, ms) in self.self_dated_replays_before(cutoff_ms, limit)? {
                if victims.len() == limit {
                    break;
                }
                if !aged.contains(&(ws.clone(), id.clone())) {
                    victims.push((ms.max(0) as u64, ws, id));
                }
            }
        }
        let mut age = self.table(self.t.request_age)?;
        let mut requests = self.table(self.t.requests)?;
        for (ms, ws, id) in &victims {
            // A self-dated record has no age row; removing the absent row is a no-op.
            age.remove((*ms, ws.as_str(), id.as_str()))?;
            requests.remove((ws.as_str(), id.as_str()))?;
        }
        Ok(victims.len())
    }

    /// Stores an upload record and keeps the open and ended indexes in step with it.
    pub fn put_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        let old = self.upload(id)?;
        if let Some(old) = &old {
            self.unindex_upload(id, old)?;
        }
        // The upload's ledger operation: kept from the stored record, else a new one.
        let mut rec = rec.clone();
        let tracked_old = old
            .as_ref()
            .filter(|o| o.operation != 0)
            .map(|o| (o.operation, Tracked::upload(o)));
        if rec.operation == 0 {
            rec.operation = match tracked_old {
                Some((op, _)) => op,
                None => self.new_upload_operation(id)?,
            };
        }
        self.track(
            rec.operation,
            tracked_old.map(|(_, t)| t),
            Some(Tracked::upload(&rec)),
            false,
        )?;
        let mut t = self.table(self.t.uploads)?;
        t.insert(id, rec.encode_to_vec().as_slice())?;
        drop(t);
        self.index_upload(id, &rec)
    }

    /// Forgets a terminal upload record (pruning), and the receipt record that names it: a
    /// receipt is remembered exactly as long as its latest upload's history.
    pub fn remove_upload(&mut self, id: &str) -> MetaResult<()> {
        if let Some(old) = self.upload(id)? {
            self.unindex_upload(id, &old)?;
            if old.operation != 0 {
                self.track(old.operation, Some(Tracked::upload(&old)), None, false)?;
                self.table(self.t.operations)?.remove(old.operation)?;
            }
            self.table(self.t.uploads)?.remove(id)?;
            if !old.receipt.is_empty()
                && self
                    .receipt(&old.workspace, &old.receipt)?
                    .is_some_and(|r| r.upload_id == id)
            {
                self.table(self.t.receipts)?
                    .remove((old.workspace.as_str(), old.receipt.as_str()))?;
            }
        }
        Ok(())
    }

    /// Removes up to `limit` receipt records of workspace `ws`; returns how many.
    pub fn remove_receipts(&mut self, ws: &str, limit: usize) -> MetaResult<usize> {
        let mut t = self.table(self.t.receipts)?;
        let mut names = Vec::new();
        for item in t.range((ws, "")..)? {
            let (k, _) = item?;
            let (kws, name) = k.value();
            if kws != ws || names.len() == limit {
                break;
            }
            names.push(name.to_string());
        }
        for name in &names {
            t.remove((ws, name.as_str()))?;
        }
        Ok(names.len())
    }

    pub fn put_receipt(&mut self, ws: &str, receipt: &str, rec: &ReceiptRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.receipts)?;
        t.insert((ws, receipt), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    fn index_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        if rec.state == UploadState::Open as i32 {
            self.table(self.t.open_uploads)?
                .insert((rec.lease_expires_ms, id), ())?;
        } else if rec.is_ended() {
            self.table(self.t.ended_uploads)?
                .insert((ended_at(rec), id), ())?;
        }
        Ok(())
    }

    fn unindex_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        self.table(self.t.open_uploads)?
            .remove((rec.lease_expires_ms, id))?;
        self.table(self.t.ended_uploads)?
            .remove((ended_at(rec), id))?;
        Ok(())
    }

    /// Indexes every upload record once, for data directories written before the indexes
    /// existed; a no-op afterwards. Returns how many records were indexed.
    pub fn index_uploads(&mut self) -> MetaResult<u64> {
        let mut seq = self.table(self.t.sequences)?;
        if seq.get(UPLOAD_INDEX_MARKER)?.is_some() {
            return Ok(0);
        }
        seq.insert(UPLOAD_INDEX_MARKER, 1)?;
        drop(seq);
        let mut all = Vec::new();
        for item in self.table(self.t.uploads)?.iter()? {
            let (k, v) = item?;
            all.push((k.value().to_string(), decode::<UploadRecord>(v.value())?));
        }
        for (id, rec) in &all {
            self.index_upload(id, rec)?;
        }
        Ok(all.len() as u64)
    }

    pub fn put_block(&mut self, upload: &str, index: u32, rec: &BlockRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.blocks)?;
        t.insert((upload, index), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    /// Removes every block record of an upload (after its keys moved to a revision or to
    /// the collectable set).
    pub fn remove_blocks(&mut self, upload: &str) -> MetaResult<()> {
        let mut t = self.table(self.t.blocks)?;
        t.remove_range((upload, 0u32)..=(upload, u32::MAX))?;
        Ok(())
    }

    pub fn put_revision(&mut self, rev: u64, rec: &RevisionRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.revisions)?;
        t.insert(rev, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_revision(&mut self, rev: u64) -> MetaResult<()> {
        self.table(self.t.revisions)?.remove(rev)?;
        Ok(())
    }

    pub fn put_guard(&mut self, key: &str, rec: &GuardRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.guards)?;
        t.insert(key, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_guard(&mut self, key: &str) -> MetaResult<()> {
        self.table(self.t.guards)?.remove(key)?;
        Ok(())
    }

    /// Records that no entry points at `rev` any more (it stays stored and readable).
    pub fn retire_revision(&mut self, rev: u64, now_ms: i64) -> MetaResult<()> {
        self.table(self.t.retired)?.insert((now_ms, rev), ())?;
        Ok(())
    }

    /// Forgets a retired revision's index entry (once its keys were released).
    pub fn remove_retired(&mut self, retired_ms: i64, rev: u64) -> MetaResult<()> {
        self.table(self.t.retired)?.remove((retired_ms, rev))?;
        Ok(())
    }

    /// Marks an object key as no longer referenced, so the reconciler may delete it.
    /// Without workspace, size or time: prefer [`WriteView::queue_delete`].
    pub fn add_collectable(&mut self, key: &str, _revision: u64) -> MetaResult<()> {
        self.queue_delete(key, "", 0, 0)?;
        Ok(())
    }

    /// Settles the queued delete of `key` as deleted (its operation keeps its last update
    /// time): prefer recording the attempt through [`crate::shard::operations`].
    pub fn remove_collectable(&mut self, key: &str) -> MetaResult<()> {
        let Some(id) = self.table(self.t.collectable)?.get(key)?.map(|v| v.value()) else {
            return Ok(());
        };
        match self.operation(id)? {
            Some(mut op) if !op.is_upload() => {
                op.state = DeleteState::Deleted as i32;
                self.put_operation(id, &op)?;
            }
            _ => {
                self.table(self.t.collectable)?.remove(key)?;
            }
        }
        Ok(())
    }

    pub fn put_workspace(&mut self, ws: &str, rec: &WorkspaceRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.workspaces)?;
        t.insert(ws, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_workspace(&mut self, ws: &str) -> MetaResult<()> {
        self.table(self.t.workspaces)?.remove(ws)?;
        Ok(())
    }

    /// The ids of every open upload (of any workspace), soonest expiry first: a scan of the
    /// open-upload index, whose size follows the open uploads, not the upload history.
    pub fn open_upload_ids(&self) -> MetaResult<Vec<String>> {
        self.expired_uploads(i64::MAX, usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, MetaStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&dir.path().join("m.redb")).unwrap();
        (dir, s)
    }

    #[test]
    fn a_failed_session_changes_nothing() {
        let (_d, s) = store();
        let r: Result<(), crate::error::Error> = s.write(|w| {
            w.put_inline("ws", "a", b"x")?;
            Err(crate::error::Error::Internal("the session fails".into()))
        });
        assert!(r.is_err());
        assert_eq!(s.read(|r| r.inline("ws", "a")).unwrap(), None);
    }

    #[test]
    fn generations_survive_removal_and_never_repeat() {
        let (_d, s) = store();
        let g: Vec<u64> = s
            .write(|w| {
                let mut gens = Vec::new();
                for _ in 0..2 {
                    let generation = w.next_generation("ws", "p")?;
                    w.put_entry(
                        "ws",
                        "p",
                        &EntryRecord {
                            generation,
                            ..Default::default()
                        },
                    )?;
                    gens.push(generation);
                }
                w.remove_entry("ws", "p")?;
                gens.push(w.next_generation("ws", "p")?);
                Ok::<_, MetaError>(gens)
            })
            .unwrap();
        assert_eq!(g, vec![1, 2, 3]);
    }

    #[test]
    fn list_stays_inside_workspace_and_prefix_and_pages_after_cursor() {
        let (_d, s) = store();
        s.write(|w| {
            for (ws, p) in [
                ("a", "x/1"),
                ("a", "x/2"),
                ("a", "x/3"),
                ("a", "y"),
                ("b", "x/0"),
            ] {
                w.put_entry(ws, p, &EntryRecord::default())?;
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
        let names = |v: Vec<(String, EntryRecord)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
        let page = s.read(|r| r.list("a", "x/", None, 2)).unwrap();
        assert_eq!(names(page), ["x/1", "x/2"]);
        let page = s.read(|r| r.list("a", "x/", Some("x/2"), 2)).unwrap();
        assert_eq!(names(page), ["x/3"]);
    }

    #[test]
    fn pruning_removes_only_old_replays_in_bounded_pages() {
        let (_d, s) = store();
        s.write(|w| {
            for (i, ms) in [10i64, 20, 30, 40].iter().enumerate() {
                let rec = ReplayRecord {
                    created_ms: *ms,
                    ..Default::default()
                };
                w.put_replay("ws", &format!("r{i}"), &rec)?;
            }
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 2);
        assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 1);
        assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 0);
        assert!(s.read(|r| r.replay("ws", "r3")).unwrap().is_some());
        assert!(s.read(|r| r.replay("ws", "r0")).unwrap().is_none());
    }

    /// An SDK-style request id: `ms` as 12 hex digits, then 20 more.
    fn sdk_id(ms: i64, tail: u8) -> String {
        format!("{ms:012x}{}", format!("{tail:02x}").repeat(10))
    }

    fn age_rows(s: &MetaStore) -> usize {
        s.read(|r| Ok::<_, MetaError>(r.txn.open_table(r.t.request_age)?.len()? as usize))
            .unwrap()
    }

    #[test]
    fn self_dated_request_ids_skip_the_age_row_and_are_pruned_by_their_recorded_time() {
        let (_d, s) = store();
        let t = 1_700_000_000_000i64;
        let min = 60 * 1000;
        let (on_time, claims_later, claims_earlier, custom, far_off) = (
            sdk_id(t, 1),
            sdk_id(t + 9 * min, 2),
            sdk_id(t + 5 * min, 3),
            "my-retry-1".to_string(),
            sdk_id(t - 60 * min, 4),
        );
        s.write(|w| {
            let at = |created_ms| ReplayRecord {
                created_ms,
                ..Default::default()
            };
            w.put_replay("ws", &on_time, &at(t))?;
            w.put_replay("ws", &claims_later, &at(t))?;
            // Recorded 12 minutes after the others, its id 7 minutes earlier than that.
            w.put_replay("ws", &claims_earlier, &at(t + 12 * min))?;
            w.put_replay("other", &custom, &at(t))?;
            // Not self-dated (its id's time is an hour from the record's), and it sorts
            // below every bound used here: the scans meet it.
            w.put_replay("ws", &far_off, &at(t))?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(
            age_rows(&s),
            2,
            "only the custom id and the far-off one get an age row"
        );
        let kept = |ws: &str, id: &str| s.read(|r| r.replay(ws, id)).unwrap().is_some();

        // Nothing was recorded before t: nothing goes, although the scan meets the far-off id.
        assert!(!s.read(|r| r.has_replays_before(t)).unwrap());
        assert_eq!(s.write(|w| w.prune_replays(t, 10)).unwrap(), 0);

        // Past t: the two with age rows go at once; the self-dated ones wait for their ids to
        // be a skew (10 min) behind the cutoff.
        assert!(s.read(|r| r.has_replays_before(t + 1)).unwrap());
        assert_eq!(s.write(|w| w.prune_replays(t + 1, 10)).unwrap(), 2);
        assert!(!kept("other", &custom) && !kept("ws", &far_off));
        assert_eq!(age_rows(&s), 0);
        assert!(kept("ws", &on_time));
        assert_eq!(
            s.write(|w| w.prune_replays(t + 10 * min + 1, 10)).unwrap(),
            1
        );
        assert!(!kept("ws", &on_time));

        // Past t + 19 min: both remaining ids are a skew behind, and both were recorded
        // before the cutoff.
        assert!(kept("ws", &claims_later) && kept("ws", &claims_earlier));
        assert_eq!(
            s.write(|w| w.prune_replays(t + 19 * min + 1, 10)).unwrap(),
            2
        );
        assert!(!s.read(|r| r.has_replays_before(i64::MAX / 2)).unwrap());
    }

    #[test]
    fn uploads_recorded_before_the_upload_indexes_existed_are_indexed_once() {
        let (_d, s) = store();
        let rec = |state: UploadState, lease| UploadRecord {
            state: state as i32,
            lease_expires_ms: lease,
            created_ms: 5,
            ..Default::default()
        };
        // Written the way a data dir from before the indexes holds them: records only.
        s.write(|w| {
            let mut t = w.txn.open_table(w.t.uploads)?;
            t.insert(
                "open",
                rec(UploadState::Open, 10).encode_to_vec().as_slice(),
            )?;
            t.insert(
                "done",
                rec(UploadState::Aborted, 10).encode_to_vec().as_slice(),
            )?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(s.read(|r| r.counts()).unwrap().uploads, 0);
        assert_eq!(s.write(|w| w.index_uploads()).unwrap(), 2);
        assert_eq!(s.write(|w| w.index_uploads()).unwrap(), 0, "only once");
        assert_eq!(s.read(|r| r.counts()).unwrap().uploads, 1);
        assert_eq!(s.read(|r| r.expired_uploads(10, 10)).unwrap(), ["open"]);
        assert_eq!(s.read(|r| r.ended_uploads(5, 10)).unwrap(), ["done"]);
    }

    /// Existing data dirs open: upload records and collectable keys written before the
    /// ledger existed get their ledger rows once, with per-state counters to match.
    /// Mutation: skip the COLLECTABLE loop of `backfill_operations` (the old key would have
    /// no operation and the reconciler would read its revision number as an operation id).
    #[test]
    fn uploads_and_collectable_keys_from_before_the_ledger_are_backfilled_once() {
        let (_d, s) = store();
        s.write(|w| {
            // The layout of a data dir from before the ledger: no marker, raw rows.
            w.txn.open_table(w.t.sequences)?.remove(OPERATIONS_MARKER)?;
            let u = UploadRecord::open("ws", "p", 4, 1, 5, 10, "");
            w.txn
                .open_table(w.t.uploads)?
                .insert("u1", u.encode_to_vec().as_slice())?;
            w.txn.open_table(w.t.collectable)?.insert("old-key", 7u64)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(s.write(|w| w.backfill_operations(100)).unwrap(), 2);
        assert_eq!(s.write(|w| w.backfill_operations(100)).unwrap(), 0, "once");
        let c = s.read(|r| r.counts()).unwrap();
        assert_eq!(
            (c.operations[0], c.operations[4]),
            (1, 1),
            "open and deleting"
        );
        let queued = s.read(|r| r.collectable_ops(10)).unwrap();
        assert_eq!(queued.len(), 1);
        let op = s.read(|r| r.operation(queued[0].1)).unwrap().unwrap();
        assert_eq!(
            (op.key.as_str(), op.op_state()),
            ("old-key", OpState::Deleting)
        );
        assert_ne!(s.read(|r| r.upload("u1")).unwrap().unwrap().operation, 0);
    }
}
