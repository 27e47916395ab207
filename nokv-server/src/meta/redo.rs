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
//! so the committer makes the file itself durable (an empty durable commit) and the log is
//! emptied.
//!
//! **Invariant (what a crash leaves):** the durable state is redb's last durable commit plus
//! every complete record of the log whose sequence number is above the `applied` sequence
//! that commit holds, applied in log order. Hence:
//! * every batch writes its own sequence number as `applied` in the transaction it runs in
//!   (held across batches or not), so a durable commit says exactly which batches it already
//!   contains (records at or below it are
//!   skipped on replay, never applied twice);
//! * records are appended in commit order and a batch is acknowledged only after its record
//!   (and every record before it) was fsynced — a crash keeps a prefix of the batches, never a
//!   later one without an earlier one;
//! * every write that is not a batch (preparing a namespace, a load's import, a checkpoint's
//!   flush) is a durable redb commit, so the log never needs to describe it;
//! * after a failed append nothing more is appended to that log: the handle is failed and
//!   reopening replays what is complete.
//!
//! A record is `magic, payload length, sequence, checksum` then the payload; records follow
//! each other with consecutive sequence numbers. A torn or partial record at the tail (a crash
//! mid-append: never acknowledged), zeros, or a record out of sequence (left from before the
//! log was started over) ends the log. Opening a store replays the log in one durable commit;
//! the next record then starts the log over.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::overlay::Layer;
use super::{MetaError, MetaResult, Tables};

/// "applied" -> the sequence number of the last batch whose effects this file holds.
const APPLIED: TableDefinition<&str, u64> = TableDefinition::new("redo_applied");
const MAGIC: u32 = 0x6e6b_7631;
/// magic, payload length, sequence, checksum.
const HEADER: usize = 4 + 4 + 8 + 8;

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

    /// Appends the framed log record of these effects as batch `seq` to `out`.
    fn frame_into(&self, seq: u64, out: &mut Vec<u8>) {
        out.reserve(HEADER + self.buf.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&(self.buf.len() as u32).to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&checksum(seq, &self.buf).to_le_bytes());
        out.extend_from_slice(&self.buf);
    }
}

/// A committed batch's redo record, not yet framed: the thread that appends frames it
/// (checksum included), so the committer spends nothing on it.
pub struct Redo {
    seq: u64,
    effects: Effects,
}

impl Redo {
    pub(super) fn new(seq: u64, effects: Effects) -> Redo {
        Redo { seq, effects }
    }

    /// Appends the framed record to `out` (records of consecutive batches are appended in
    /// order and written with one [`super::MetaStore::log`]).
    pub fn frame_into(&self, out: &mut Vec<u8>) {
        self.effects.frame_into(self.seq, out);
    }

    /// Bytes of row effects the record carries.
    pub fn len(&self) -> usize {
        self.effects.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.effects.buf.is_empty()
    }
}

/// Detects a torn or stale record (not an adversary): a multiply-xor hash over 8-byte words.
fn checksum(seq: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seq ^ (payload.len() as u64).wrapping_mul(K);
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

/// Zeros written ahead of the log's tail at a time: records are then written into blocks
/// the file already has, so an fsync flushes data only — not the file size and block map,
/// which would cost a journal commit on every append.
const GROW: u64 = 1 << 20;

/// The appending end of a store's log. Records go at `pos`; blocks beyond it hold zeros or
/// records of an earlier round (lower sequence numbers), both of which end the log.
pub(super) struct Log {
    file: File,
    pos: u64,
    /// Bytes of the file already allocated (written once).
    len: u64,
}

impl Log {
    /// Opens (creating, with its directory entry made durable) the log at `path`; the next
    /// record goes at its start (what it held is in the store already, see
    /// [`super::MetaStore::open`]).
    pub(super) fn open(path: &Path) -> std::io::Result<Log> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        if !existed && let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let len = file.metadata()?.len();
        Ok(Log { file, pos: 0, len })
    }

    /// Appends records and makes them durable.
    pub(super) fn append(&mut self, records: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let end = self.pos + records.len() as u64;
        if end > self.len {
            let grown = end.div_ceil(GROW) * GROW;
            self.file.set_len(grown)?;
            let zeros = vec![0u8; (grown - self.len) as usize];
            self.file.write_all_at(&zeros, self.len)?;
            self.len = grown;
        }
        self.file.write_all_at(records, self.pos)?;
        self.file.sync_data()?;
        self.pos = end;
        Ok(())
    }

    /// Starts the log over: everything in it is durable in the store's file. The next record
    /// overwrites the first; a crash before that finds only records the store already holds
    /// (skipped by sequence).
    pub(super) fn clear(&mut self) {
        self.pos = 0;
    }
}

/// The complete records of the log at `path`, in order, up to the first torn one or the
/// first whose sequence does not follow its predecessor's (a record of an earlier round).
fn read(path: &Path) -> std::io::Result<Vec<(u64, Vec<u8>)>> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes)?,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut records = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= HEADER {
        let word = |at: usize, n: usize| &rest[at..at + n];
        let magic = u32::from_le_bytes(word(0, 4).try_into().expect("4"));
        let len = u32::from_le_bytes(word(4, 4).try_into().expect("4")) as usize;
        let seq = u64::from_le_bytes(word(8, 8).try_into().expect("8"));
        let sum = u64::from_le_bytes(word(16, 8).try_into().expect("8"));
        if magic != MAGIC || rest.len() < HEADER + len {
            break;
        }
        let payload = &rest[HEADER..HEADER + len];
        if checksum(seq, payload) != sum || records.last().is_some_and(|(prev, _)| seq != prev + 1)
        {
            break;
        }
        records.push((seq, payload.to_vec()));
        rest = &rest[HEADER + len..];
    }
    Ok(records)
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

/// Applies, in `txn`, every complete record of the log at `path` above the sequence `txn`
/// already holds, and returns the last sequence it holds afterwards. The caller commits
/// durably and then empties the log.
pub(super) fn replay(txn: &WriteTransaction, path: &Path) -> MetaResult<(u64, usize)> {
    let damaged = |detail: String| MetaError::Damaged {
        path: path.to_path_buf(),
        detail,
    };
    let records = read(path).map_err(|e| damaged(e.to_string()))?;
    let mut last = applied(txn)?;
    let mut replayed = 0;
    for (seq, payload) in records {
        if seq <= last {
            continue;
        }
        apply(txn, &payload).map_err(|e| damaged(format!("record {seq}: {e}")))?;
        last = seq;
        replayed += 1;
    }
    if replayed > 0 {
        set_applied(txn, last)?;
    }
    Ok((last, replayed))
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
fn apply(txn: &WriteTransaction, payload: &[u8]) -> MetaResult<()> {
    rows(payload, |table, key, value| {
        let (ns, name) = Tables::by_name(table).ok_or_else(malformed)?;
        if !ns.apply(txn, name, key, value)? {
            return Err(malformed());
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Catches: a round sized without regard to free space (a reopen after a full disk would
    // need more room than an operator freed), and an unbounded round (replay at start-up).
    #[test]
    fn a_round_of_the_log_shrinks_to_2_mib_as_the_disk_fills_and_never_exceeds_64_mib() {
        const MIB: u64 = 1 << 20;
        assert_eq!(budget(Some(0)), 2 << 20, "full disk");
        assert_eq!(budget(Some(10 * MIB)), 2 << 20, "little room");
        assert_eq!(budget(Some(80 * MIB)), 10 << 20, "an eighth of the room");
        assert_eq!(budget(Some(100 << 30)), 64 << 20, "lots of room");
        assert_eq!(budget(None), 2 << 20, "unknown room");
    }

    fn effects(n: u8) -> Effects {
        let mut e = Effects::default();
        e.record("s0001/inline", b"k", Some(&[n; 100]));
        e
    }

    impl Effects {
        fn into_record(self, seq: u64) -> Vec<u8> {
            let mut out = Vec::new();
            self.frame_into(seq, &mut out);
            out
        }
    }

    // Catches: a reader that accepts a record whose bytes were torn (no or a weak checksum),
    // or one that skips over a bad record instead of ending the log there.
    #[test]
    fn the_log_ends_at_the_first_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.redo");
        let mut log = Log::open(&path).unwrap();
        for seq in 1..=3u64 {
            log.append(&effects(seq as u8).into_record(seq)).unwrap();
        }
        assert_eq!(read(&path).unwrap().len(), 3);
        // Started over: a new round's record overwrites the first; the older ones behind it
        // (sequence 2 and 3) are not part of the log.
        log.clear();
        log.append(&effects(9).into_record(9)).unwrap();
        let seqs: Vec<u64> = read(&path).unwrap().iter().map(|r| r.0).collect();
        assert_eq!(seqs, vec![9], "stale records after the tail are ignored");
        log.clear();
        for seq in 1..=3u64 {
            log.append(&effects(seq as u8).into_record(seq)).unwrap();
        }
        let record = effects(1).into_record(1).len();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[record + HEADER + 10] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let seqs: Vec<u64> = read(&path).unwrap().iter().map(|r| r.0).collect();
        assert_eq!(seqs, vec![1], "stops at the damaged second record");
        bytes.truncate(record + 5);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            read(&path).unwrap().len(),
            1,
            "a partial header ends the log"
        );
    }
}

#[cfg(test)]
mod replay_tests {
    use std::path::Path;

    use crate::meta::{Batch, Logged, MetaError, MetaStore, Tables};

    /// Runs a session writing `name` and removing `gone` in `batch`.
    fn write_and_remove(batch: &mut Batch, name: &str, gone: &str) {
        batch
            .session(Tables::canonical(), |w| {
                w.put_inline("ws", name, name.as_bytes())?;
                w.remove_inline("ws", gone)
            })
            .unwrap();
    }

    /// Appends an ended batch's record to the log, as the acknowledger does.
    fn append(store: &MetaStore, logged: &Logged) {
        let mut record = Vec::new();
        logged.redo.frame_into(&mut record);
        store.log(&record).unwrap();
    }

    /// Logs one batch writing `name` (and removing `gone`), as the committer does: committed
    /// without fsync, its record appended to the log.
    fn logged_batch(store: &std::sync::Arc<MetaStore>, name: &str, gone: &str) {
        let mut batch = store.batch().unwrap();
        write_and_remove(&mut batch, name, gone);
        let failed = batch.session(Tables::canonical(), |w| {
            w.put_inline("ws", "undone", b"x")?;
            Err::<(), _>(MetaError::Failed("this session fails".into()))
        });
        assert!(failed.is_err());
        append(store, &batch.commit_logged().unwrap());
    }

    /// What a crash would leave of an open store: its file and (if `with_log`) its log.
    fn crash_copy(from: &Path, to: &Path, with_log: bool) {
        std::fs::copy(from, to).unwrap();
        if with_log {
            std::fs::copy(from.with_extension("redo"), to.with_extension("redo")).unwrap();
        }
    }

    fn inline(store: &MetaStore, name: &str) -> Option<Vec<u8>> {
        store.read(|r| r.inline("ws", name)).unwrap()
    }

    // Catches: a replay that is skipped, applies a failed session's rows, applies a record the
    // file already holds (the removal of "kept" would win over its later rewrite), or leaves
    // the sequence behind so that later batches are taken for stale ones.
    #[test]
    fn batches_only_in_the_redo_log_are_replayed_when_the_store_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let store = std::sync::Arc::new(MetaStore::create(&path).unwrap());
        store.write(|w| w.put_inline("ws", "old", b"old")).unwrap();
        logged_batch(&store, "first", "old");
        store.flush().unwrap(); // a checkpoint: "first" is now in the file itself
        logged_batch(&store, "kept", "nothing");
        logged_batch(&store, "second", "kept");
        logged_batch(&store, "kept", "first");

        let without_log = dir.path().join("file-only.redb");
        crash_copy(&path, &without_log, false);
        let file_only = MetaStore::open(&without_log).unwrap();
        assert_eq!(inline(&file_only, "first"), Some(b"first".to_vec()));
        assert_eq!(
            inline(&file_only, "second"),
            None,
            "not in the file: the log carries it"
        );

        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed, true);
        let reopened = std::sync::Arc::new(MetaStore::open(&crashed).unwrap());
        assert_eq!(inline(&reopened, "old"), None);
        assert_eq!(
            inline(&reopened, "first"),
            None,
            "removed by the last batch"
        );
        assert_eq!(inline(&reopened, "second"), Some(b"second".to_vec()));
        assert_eq!(inline(&reopened, "kept"), Some(b"kept".to_vec()));
        assert_eq!(
            inline(&reopened, "undone"),
            None,
            "the failed session left nothing"
        );

        // Batches after the replay follow on; a second crash replays them, not the old ones.
        logged_batch(&reopened, "third", "second");
        let again = dir.path().join("again.redb");
        crash_copy(&crashed, &again, true);
        let twice = MetaStore::open(&again).unwrap();
        assert_eq!(inline(&twice, "third"), Some(b"third".to_vec()));
        assert_eq!(inline(&twice, "second"), None);
        assert_eq!(inline(&twice, "kept"), Some(b"kept".to_vec()));
    }

    // Catches: held batches whose records share or skip sequence numbers (the replay would
    // stop at the first repeat and lose the rest) or that are missing from the log — after a
    // crash with the transaction still open, the log alone must bring every batch back.
    #[test]
    fn batches_held_in_an_open_transaction_come_back_from_the_log_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let store = std::sync::Arc::new(MetaStore::create(&path).unwrap());
        store.write(|w| w.put_inline("ws", "old", b"old")).unwrap();
        let mut batch = store.batch().unwrap();
        for (name, gone) in [("first", "old"), ("kept", "nothing"), ("second", "first")] {
            write_and_remove(&mut batch, name, gone);
            append(&store, &batch.log().unwrap());
        }
        assert!(batch.holds_batches());

        let file_only = dir.path().join("file-only.redb");
        crash_copy(&path, &file_only, false);
        let file_only = MetaStore::open(&file_only).unwrap();
        assert_eq!(inline(&file_only, "old"), Some(b"old".to_vec()));
        assert_eq!(
            inline(&file_only, "kept"),
            None,
            "held: only the log has it"
        );

        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed, true);
        drop(batch);
        let reopened = MetaStore::open(&crashed).unwrap();
        assert_eq!(inline(&reopened, "old"), None);
        assert_eq!(
            inline(&reopened, "first"),
            None,
            "removed by the third batch"
        );
        assert_eq!(inline(&reopened, "kept"), Some(b"kept".to_vec()));
        assert_eq!(inline(&reopened, "second"), Some(b"second".to_vec()));
    }

    // Catches: a replay that trusts a torn tail (the half-written batch was never
    // acknowledged) or gives up on the complete records before it.
    #[test]
    fn a_torn_last_record_is_not_replayed_and_the_ones_before_it_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let store = std::sync::Arc::new(MetaStore::create(&path).unwrap());
        logged_batch(&store, "whole", "nothing");
        logged_batch(&store, "torn", "nothing");
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed, true);
        let log = crashed.with_extension("redo");
        let mut bytes = std::fs::read(&log).unwrap();
        let first = super::read(&log).unwrap()[0].1.len() + super::HEADER;
        let second = super::read(&log).unwrap()[1].1.len() + super::HEADER;
        bytes.truncate(first + second - 1);
        std::fs::write(&log, &bytes).unwrap();
        let reopened = std::sync::Arc::new(MetaStore::open(&crashed).unwrap());
        assert_eq!(inline(&reopened, "whole"), Some(b"whole".to_vec()));
        assert_eq!(inline(&reopened, "torn"), None);
    }
}

// ---- Test accessors for the overlay's model test (`super::model`), kept apart from the log
// format above: they expose a record's payload through the functions replay itself uses.
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
