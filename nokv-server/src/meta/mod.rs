//! The durable metadata store: the only durable truth of a shard. A node keeps all its shards
//! in one redb file, each in its own namespace of tables ([`Tables`]); a standalone file
//! holds one shard (a checkpoint, a test's store). This is the only module that touches redb.
//!
//! Callers get a [`ReadView`] (an MVCC snapshot) or a [`WriteView`] (the single writer) and
//! speak in typed records; a write view commits with `Durability::Immediate` (fsync) when
//! its closure returns `Ok`, and aborts — changing nothing — when it returns `Err`. A
//! [`Batch`] of sessions is the exception: it commits without fsync — or stays in a
//! transaction held open for the next batches, shown to readers through the memtable
//! ([`overlay`]) — and is made durable by its record in the store's redo log
//! ([`durability`]), which opening the store replays. Sessions
//! are plain synchronous closures: the [`crate::shard::gate`] runs them, and a synchronous
//! closure cannot await provider I/O while the gate is held.
//!
//! One concept a file: `store` opens the file and runs one-off sessions, [`durability`] is
//! everything that orders the redo log against the file (a store's `Journal` — sequence,
//! append, checkpoint — the replay at open, the failure latch, the committer's `Batch`, the
//! log's format, and `salvage`, which starts again from a damaged log when the operator accepts
//! the loss), `read` and `write` are the two views' typed reads and writes (`ledger`, `usage`
//! and `inventory` the parts that keep their own counters and indexes), `read_snapshot` the
//! snapshot readers share, `undo` rolls a failed session back, `overlay` shows readers the
//! batches a held transaction has not committed yet, `snapshot` copies a shard out and in,
//! `tables` names a shard's tables, `open` keeps redb's panics on a damaged file at the
//! boundary, `quick_repair` keeps the restart after a crash from walking the whole file,
//! `fault` injects storage faults in tests, `disk` is where the two files live (and `powercut`
//! the simulated disk tests cut power on), `fatal` ends the process after a failed fsync, and
//! `records` are the stored types.

#[cfg(test)]
mod dice;
mod disk;
mod durability;
pub mod fatal;
pub mod fault;
/// The inventory's scan record and quarantine observations.
mod inventory;
mod ledger;
mod log_file;
mod open;
mod overlay;
#[cfg(test)]
mod powercut;
pub mod quick_repair;
mod read;
mod read_snapshot;
pub mod records;
mod snapshot;
mod store;
mod tables;
mod undo;
mod usage;
mod write;

use std::path::PathBuf;

use prost::Message;

pub use disk::Synced;
pub use durability::{Batch, Logged, Redo, Salvage};
pub use fault::StoreFaults;
pub use read::ReadView;
pub use read_snapshot::Snapshot;
pub use records::*;
pub use store::{MetaStore, Reopen};
pub use tables::{Namespace, Tables};
pub use usage::{UsageDelta, UsageRecount, UsageTotals};
pub use write::WriteView;

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
    /// The redo log does not fit the node file (see `durability`'s `scan`): starting would serve
    /// fewer acknowledged writes than were made.
    #[error(
        "{detail}. Refusing to start: {path} holds acknowledged writes that {store} does not. \
         Restore the data dir from a backup (`nokv-server restore-backup`), or run \
         `nokv-server recover --data-dir <the data dir> --accept-loss`, which keeps what is \
         valid, reports exactly which batches it drops and moves the log aside"
    )]
    Log {
        path: PathBuf,
        store: PathBuf,
        detail: String,
    },
    /// Opening the store could not write its log (a full disk, say): nothing was lost, the
    /// open can be retried once the cause is gone.
    #[error(
        "cannot write {path} while opening the store ({detail}); free space or fix the disk and start again"
    )]
    Unwritable { path: PathBuf, detail: String },
    /// An fsync failed: the process does not go on (see [`fatal`]).
    #[error("fsync of {file} failed ({detail}); the process must restart to replay from disk")]
    Fatal { file: PathBuf, detail: String },
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

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests;
