//! The redo log in front of the store: how a batch becomes durable without redb's fsync.
//!
//! A durable redb commit writes back every page the batch touched (5–6 scattered pages per
//! small write) and fsyncs the file, and while it does the single writer can run nothing else.
//! So the committer commits a batch with `Durability::None` (atomic and visible to later
//! sessions, not durable) — or holds the transaction open for the next batches and commits it
//! once (readers see held batches through [`super::overlay`], built from these records) — and
//! appends the batch's **row effects** — every insert and remove its
//! sessions made, in order, as captured by [`super::undo::UndoTable`] — to this log as one
//! record; a second thread appends and fsyncs records while the committer already runs the next
//! batch, and only then are the batch's sessions answered or shown to readers. Every second or
//! so the committer makes the file itself durable and starts a new **round** of the log
//! ([`super::MetaStore::checkpoint`]).
//!
//! **Invariant (what a crash leaves):** the durable state is redb's last durable commit plus
//! every record of the log's current round whose sequence number is above the `applied`
//! sequence that commit holds, applied in log order. Hence:
//! * every batch writes its own sequence number as `applied` in the transaction it runs in
//!   (held across batches or not), so a durable commit says exactly which batches it already
//!   contains (records at or below it are skipped on replay, never applied twice);
//! * records are appended in commit order and a batch is acknowledged only after its record
//!   (and every record before it) was fsynced — a crash keeps a prefix of the batches, never a
//!   later one without an earlier one;
//! * every write that is not a batch (preparing a namespace, a load's import, a checkpoint's
//!   flush) is a durable redb commit, so the log never needs to describe it;
//! * after a failed append nothing more is appended through that handle; after a failed
//!   *fsync* nothing more is done by the process at all (see [`super::fatal`]).
//!
//! **Rounds: the log is checked against the file, never trusted blindly.** Each round has a
//! random 64-bit id and starts with a durable commit that records it (with the sequence it
//! starts at and the id of the round before it) in the node file. The log of a round begins,
//! at offset 0, with a *marker* naming the round and its start, written (and fsynced) right
//! after that commit and before any record of the round; every record's checksum mixes in
//! the round id. So, at open, the file says exactly what the log must hold, and
//! [`scan`] refuses — naming the file, the offset and the sequence numbers — whatever does not
//! fit: a missing or emptied log, one from another round or another moment (a hand-made backup
//! of one of the two files), damage followed by records that were written after it. Stale
//! bytes behind the tail (earlier rounds, zeros, user file bodies) can never pass for a record
//! of this round, and the log is read in bounded memory, one record at a time.
//!
//! A record is `magic, payload length, sequence, first sequence of its append, checksum`, then
//! the payload; a marker is the same header with its own magic, no payload, and the round's
//! start as both sequences. Files written before rounds existed (no round in the node file)
//! are read once with the old rules, replayed, and moved to a fresh round.

use std::path::{Path, PathBuf};

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::overlay::Layer;
use super::{MetaError, MetaResult, Tables};

mod log;
mod scan;

pub(super) use log::{AppendError, Log};
pub(super) use scan::{Fault, scan, scan_legacy};

/// "applied" -> the sequence number of the last batch whose effects this file holds; the
/// round keys -> the log round the file expects (see [`Round`]).
const APPLIED: TableDefinition<&str, u64> = TableDefinition::new("redo_applied");
const ROUND_ID: &str = "round";
const ROUND_START: &str = "round_start";
const ROUND_PREV: &str = "round_prev";

/// A batch record.
const RECORD: u32 = 0x6e6b_7632;
/// The first bytes of a round of the log.
const MARKER: u32 = 0x6e6b_726d;
/// A round's note, written in its log before the durable commit that begins the next round,
/// of that next round's id (payload) and start (sequence): lets a crash between that commit
/// and the next round's marker be told from a log of an earlier moment.
const ANNOUNCE: u32 = 0x6e6b_7261;
/// magic, payload length, sequence, first sequence of the append, checksum.
const HEADER: usize = 4 + 4 + 8 + 8 + 8;

/// The least a log file is ever long (it is created with this many bytes, holding its first
/// marker) and the unit it grows by: records are written into blocks the file already has, so
/// an fsync flushes data only — not the file size and block map, which would cost a journal
/// commit on every append. A log whose length is not a multiple of it was cut by someone else.
const GROW: u64 = 1 << 20;
/// The most bytes a log file may take: rounds end at [`BUDGET_MAX`] and an append that would
/// grow the file beyond this is refused (the store then starts a new round). A bigger file is
/// not a log nokv wrote, and is refused at open without being read.
pub(super) const LOG_MAX: u64 = 256 << 20;

/// One round of the log, as the node file records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Round {
    pub(super) id: u64,
    /// The sequence number the round starts after (the file's `applied` when it began).
    pub(super) start: u64,
    /// The round whose marker the log held at offset 0 when this one began: until this
    /// round's marker is durable, a crash leaves that one there.
    pub(super) prev: u64,
}

impl Round {
    /// A new round starting after `start`, its id fresh from the system's random source.
    pub(super) fn fresh(start: u64, prev: u64) -> Round {
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
pub(super) fn path_for(store: &Path) -> PathBuf {
    store.with_extension("redo")
}

/// The row effects of the sessions of one batch, in the order they were made.
#[derive(Default)]
pub(super) struct Effects {
    buf: Vec<u8>,
}

impl Effects {
    /// Where the effects of the session about to run begin.
    pub(super) fn mark(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the effects of a session that failed (its rows were undone).
    pub(super) fn rewind(&mut self, mark: usize) {
        self.buf.truncate(mark);
    }

    /// Records that `table`'s row `key` now holds `value` (`None`: it was removed).
    pub(super) fn record(&mut self, table: &str, key: &[u8], value: Option<&[u8]>) {
        let b = &mut self.buf;
        b.extend_from_slice(&(table.len() as u16).to_le_bytes());
        b.extend_from_slice(table.as_bytes());
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        b.extend_from_slice(key);
        match value {
            None => b.push(0),
            Some(v) => {
                b.push(1);
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                b.extend_from_slice(v);
            }
        }
    }

    /// These effects as a memtable layer (see [`super::overlay`]).
    pub(super) fn layer(&self) -> MetaResult<Layer> {
        let mut layer = Layer::default();
        rows(&self.buf, |table, key, value| {
            layer.change(table, key, value)
        })?;
        Ok(layer)
    }
}

/// A committed batch's redo record, not yet framed: the log frames it (checksum included)
/// when it appends, so the committer spends nothing on it.
pub struct Redo {
    seq: u64,
    effects: Effects,
}

impl Redo {
    pub(super) fn new(seq: u64, effects: Effects) -> Redo {
        Redo { seq, effects }
    }

    /// The batch's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes of row effects the record carries.
    pub fn len(&self) -> usize {
        self.effects.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.effects.buf.is_empty()
    }

    pub(super) fn payload(&self) -> &[u8] {
        &self.effects.buf
    }
}

/// One record's header as framed on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    magic: u32,
    len: u32,
    seq: u64,
    /// The sequence of the first record of the append this one was written in (a marker: the
    /// round's start). Tells damage from a torn last append (see [`scan`]).
    first: u64,
    sum: u64,
}

impl Header {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.sum.to_le_bytes());
    }

    fn decode(b: &[u8; HEADER]) -> Header {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        Header {
            magic: u32_at(0),
            len: u32_at(4),
            seq: u64_at(8),
            first: u64_at(16),
            sum: u64_at(24),
        }
    }

    /// True if the header and `payload` were framed in round `round` exactly like this.
    fn valid(&self, round: u64, payload: &[u8]) -> bool {
        self.sum == checksum(round, self.magic, self.seq, self.first, payload)
    }
}

/// Frames a record of `round` (or, with `MARKER`, the round's marker) into `out`.
fn frame(round: u64, magic: u32, seq: u64, first: u64, payload: &[u8], out: &mut Vec<u8>) {
    Header {
        magic,
        len: payload.len() as u32,
        seq,
        first,
        sum: checksum(round, magic, seq, first, payload),
    }
    .encode(out);
    out.extend_from_slice(payload);
}

/// Detects a torn record, a stale one of another round, or bytes that were never a record
/// (not an adversary): a multiply-xor hash over 8-byte words, keyed by the round's random id —
/// bytes left from another round (or a user's file body) do not check out in this one.
fn checksum(round: u64, magic: u32, seq: u64, first: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = round.wrapping_mul(K) ^ u64::from(magic);
    for w in [seq, first, payload.len() as u64] {
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    mix(h, payload)
}

/// The checksum of records written before rounds existed (read once, at the first open).
fn legacy_checksum(seq: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    mix(seq ^ (payload.len() as u64).wrapping_mul(K), payload)
}

fn mix(mut h: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut words = payload.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K).rotate_left(29);
    }
    h ^ (h >> 32)
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
pub(super) fn budget(free: Option<u64>) -> usize {
    let room = free.map_or(BUDGET_MIN, |f| f / 8);
    room.clamp(BUDGET_MIN, BUDGET_MAX) as usize
}

/// Bytes an unprivileged writer may still allocate on the file system holding `path`.
pub(super) fn free_space(path: &Path) -> Option<u64> {
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
pub(super) fn applied(txn: &WriteTransaction) -> MetaResult<u64> {
    Ok(txn
        .open_table(APPLIED)?
        .get("applied")?
        .map_or(0, |g| g.value()))
}

/// Records in `txn` that it holds every batch up to `seq`.
pub(super) fn set_applied(txn: &WriteTransaction, seq: u64) -> MetaResult<()> {
    txn.open_table(APPLIED)?.insert("applied", seq)?;
    Ok(())
}

/// The log round the file in `txn` expects (`None`: a file from before rounds, or new).
pub(super) fn round(txn: &WriteTransaction) -> MetaResult<Option<Round>> {
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
pub(super) fn set_round(txn: &WriteTransaction, round: &Round) -> MetaResult<()> {
    let mut t = txn.open_table(APPLIED)?;
    t.insert(ROUND_ID, round.id)?;
    t.insert(ROUND_START, round.start)?;
    t.insert(ROUND_PREV, round.prev)?;
    Ok(())
}

/// Reads a record's payload front to back.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> MetaResult<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn len32(&mut self) -> MetaResult<usize> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")) as usize)
    }
}

fn malformed() -> MetaError {
    MetaError::Failed("a redo record is malformed".into())
}

/// Calls `row` with each row effect of a record's payload, in order: table, key, new value
/// (`None`: removed).
fn rows(
    payload: &[u8],
    mut row: impl FnMut(&str, &[u8], Option<&[u8]>) -> MetaResult<()>,
) -> MetaResult<()> {
    let mut c = Cursor(payload);
    while !c.0.is_empty() {
        let len = u16::from_le_bytes(c.take(2)?.try_into().expect("2")) as usize;
        let table = std::str::from_utf8(c.take(len)?).map_err(|_| malformed())?;
        let klen = c.len32()?;
        let key = c.take(klen)?;
        let value = match c.take(1)? {
            [0] => None,
            [1] => {
                let vlen = c.len32()?;
                Some(c.take(vlen)?)
            }
            _ => return Err(malformed()),
        };
        row(table, key, value)?;
    }
    Ok(())
}

/// Applies one record's effects.
pub(super) fn apply(txn: &WriteTransaction, payload: &[u8]) -> MetaResult<()> {
    rows(payload, |table, key, value| {
        let (ns, name) = Tables::by_name(table).ok_or_else(malformed)?;
        if !ns.apply(txn, name, key, value)? {
            return Err(malformed());
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
impl Redo {
    /// Applies this record's row effects in `txn`, exactly as replay applies a record read
    /// back from the log.
    pub(super) fn apply_to(&self, txn: &WriteTransaction) -> MetaResult<()> {
        apply(txn, &self.effects.buf)
    }

    /// Calls `row` with each row effect of this record, in order: table, key, new value
    /// (`None`: removed).
    pub(super) fn each_row(
        &self,
        row: impl FnMut(&str, &[u8], Option<&[u8]>) -> MetaResult<()>,
    ) -> MetaResult<()> {
        rows(&self.effects.buf, row)
    }
}
