//! The store handle: opening a metadata file, one-off write sessions and snapshots for readers.
//! What orders the redo log against the file — the handle's [`Journal`] (sequence, append,
//! checkpoint), the replay at open and the failure latch — lives in [`super::durability`].

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};

use super::durability::{Journal, fatal_if_synced_failed};
use super::open;
use super::{
    Commit, MetaError, MetaResult, Namespace, ReadView, Snapshot, StoreFaults, Tables, WriteView,
};

pub struct MetaStore {
    pub(super) db: Database,
    pub(super) path: PathBuf,
    pub(super) faults: StoreFaults,
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
    /// (which lets redb recover to the last durable commit) brings the store back (see
    /// [`super::durability`]'s `latch`).
    pub(super) failure: parking_lot::Mutex<Option<String>>,
    /// The redo log's ordering state (see [`Journal`]).
    pub(super) journal: Journal,
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
        let journal = match logged {
            Logged::Yes => Journal::replay(&db, path, &faults)?,
            Logged::No => Journal::without_log(&db)?,
        };
        let store = MetaStore {
            db,
            path: path.to_path_buf(),
            faults,
            home,
            durable_commits: Default::default(),
            commits: Default::default(),
            failure: parking_lot::Mutex::new(None),
            journal,
        };
        if let Some(ns) = home {
            store.prepare(ns)?;
        }
        Ok(store)
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
        let out = f(&mut WriteView::new(&txn, ns)).map_err(|e| match self.fatal() {
            // redb syncs the file while growing it for a write: a failed fsync met inside `f`
            // ends the process, it is not `f`'s refusal (see `Batch::session`).
            Some(fatal) => fatal.into(),
            None => e,
        })?;
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

/// An open-time failure of `path`, with redb's own words.
fn damaged(path: &Path, e: redb::DatabaseError) -> MetaError {
    MetaError::Damaged {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}
