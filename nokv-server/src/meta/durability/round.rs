//! What the node file says about its redo log: the `applied` sequence (the last batch the file
//! holds), the log's current [`Round`], where the log lives, and how long a round may grow.
//!
//! Invariants: a round is recorded in the node file by a durable commit before any record of it
//! is written, and its marker is durable before its first record; `applied` is written by every
//! batch in its own transaction, so a durable commit says exactly which batches it holds.

use std::path::{Path, PathBuf};

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::super::MetaResult;

/// "applied" -> the sequence number of the last batch whose effects this file holds; the
/// round keys -> the log round the file expects (see [`Round`]).
const APPLIED: TableDefinition<&str, u64> = TableDefinition::new("redo_applied");
const ROUND_ID: &str = "round";
const ROUND_START: &str = "round_start";
const ROUND_PREV: &str = "round_prev";

/// One round of the log, as the node file records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::meta) struct Round {
    pub(in crate::meta) id: u64,
    /// The sequence number the round starts after (the file's `applied` when it began).
    pub(in crate::meta) start: u64,
    /// The round whose marker the log held at offset 0 when this one began: until this
    /// round's marker is durable, a crash leaves that one there.
    pub(in crate::meta) prev: u64,
}

impl Round {
    /// A new round starting after `start`, its id fresh from the system's random source.
    pub(in crate::meta) fn fresh(start: u64, prev: u64) -> Round {
        let bytes: [u8; 8] = crate::ids::random_bytes(8).try_into().expect("8 bytes");
        Round {
            // Zero is "no round" on the wire of a marker's predecessor.
            id: u64::from_le_bytes(bytes).max(1),
            start,
            prev,
        }
    }
}

/// The log file beside a store's file (`node.redb` -> `node.redo`).
pub(in crate::meta) fn path_for(store: &Path) -> PathBuf {
    store.with_extension("redo")
}

/// The least and the most record bytes one round of the log may take (see [`budget`]).
const BUDGET_MIN: u64 = 2 << 20;
const BUDGET_MAX: u64 = 64 << 20;

/// How many bytes of records the log may take before the file must be made durable and the
/// log started over (a checkpoint), given `free` bytes on the store's file system (`None`:
/// unknown).
///
/// A longer round means fewer checkpoints, and a checkpoint costs the committer the write-back
/// of every page dirtied since the last one plus an fsync: pages written again and again
/// (tree interiors, counters, a rewritten file's rows) are written back once per round, not
/// once per 2 MiB. But a reopen replays the round into the file, which needs room for its
/// rows: after a full disk an operator frees a little space and the store must come back by
/// itself. So a round takes at most an eighth of the free space — as the disk fills, rounds
/// shrink to 2 MiB and a reopen needs a few MiB, whatever filled it — and at most 64 MiB (a
/// replay at start-up stays short).
pub(in crate::meta) fn budget(free: Option<u64>) -> usize {
    let room = free.map_or(BUDGET_MIN, |f| f / 8);
    room.clamp(BUDGET_MIN, BUDGET_MAX) as usize
}

/// Bytes an unprivileged writer may still allocate on the file system holding `path`.
pub(in crate::meta) fn free_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `dir` is a NUL-terminated path and `stat` a plain struct statvfs fills in.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(dir.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// The sequence number of the last batch `txn` holds (0: none yet).
pub(in crate::meta) fn applied(txn: &WriteTransaction) -> MetaResult<u64> {
    Ok(txn
        .open_table(APPLIED)?
        .get("applied")?
        .map_or(0, |g| g.value()))
}

/// Records in `txn` that it holds every batch up to `seq`.
pub(in crate::meta) fn set_applied(txn: &WriteTransaction, seq: u64) -> MetaResult<()> {
    txn.open_table(APPLIED)?.insert("applied", seq)?;
    Ok(())
}

/// The log round the file in `txn` expects (`None`: a file from before rounds, or new).
pub(in crate::meta) fn round(txn: &WriteTransaction) -> MetaResult<Option<Round>> {
    let t = txn.open_table(APPLIED)?;
    let get = |k: &str| -> MetaResult<Option<u64>> { Ok(t.get(k)?.map(|g| g.value())) };
    Ok(
        match (get(ROUND_ID)?, get(ROUND_START)?, get(ROUND_PREV)?) {
            (Some(id), Some(start), Some(prev)) => Some(Round { id, start, prev }),
            _ => None,
        },
    )
}

/// Records in `txn` that the log's round is `round` (takes effect when `txn` commits
/// durably: the caller writes the round's marker only after that).
pub(in crate::meta) fn set_round(txn: &WriteTransaction, round: &Round) -> MetaResult<()> {
    let mut t = txn.open_table(APPLIED)?;
    t.insert(ROUND_ID, round.id)?;
    t.insert(ROUND_START, round.start)?;
    t.insert(ROUND_PREV, round.prev)?;
    Ok(())
}
