//! A batch's redo record: the row effects its sessions made, captured as they write (by
//! [`super::super::undo::UndoTable`]), and how replay applies them.
//!
//! Invariants: a record holds the effects of the sessions of its batch that succeeded, in the
//! order they were made (a failed session's are rewound with its writes, [`Effects::rewind`]);
//! applying a record sets every row it names to the value it recorded, so replaying it over a
//! state that already holds it changes nothing — yet replay applies only records above the
//! file's `applied` sequence (see [`super::round`]).

use redb::WriteTransaction;

use super::super::overlay::Layer;
use super::super::{MetaError, MetaResult, Tables};

/// The row effects of the sessions of one batch, in the order they were made.
#[derive(Default)]
pub(in crate::meta) struct Effects {
    buf: Vec<u8>,
}

impl Effects {
    /// Where the effects of the session about to run begin.
    pub(in crate::meta) fn mark(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the effects of a session that failed (its rows were undone).
    pub(in crate::meta) fn rewind(&mut self, mark: usize) {
        self.buf.truncate(mark);
    }

    /// Records that `table`'s row `key` now holds `value` (`None`: it was removed).
    pub(in crate::meta) fn record(&mut self, table: &str, key: &[u8], value: Option<&[u8]>) {
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
    pub(in crate::meta) fn layer(&self) -> MetaResult<Layer> {
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
    pub(in crate::meta) fn new(seq: u64, effects: Effects) -> Redo {
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

    /// The record's row effects as bytes: what the provider log carries (opaque there) and
    /// [`crate::meta::MetaStore::restore`] applies.
    pub fn payload(&self) -> &[u8] {
        &self.effects.buf
    }

    /// The shards whose tables this record's rows touch, ascending (rows of the canonical
    /// namespace name none).
    pub fn shards(&self) -> Vec<u32> {
        let mut out = Vec::new();
        // The payload was built by `Effects::record`: it parses.
        let _ = rows(&self.effects.buf, |table, _, _| {
            if let Some(shard) = Tables::shard_of(table)
                && !out.contains(&shard)
            {
                out.push(shard);
            }
            Ok(())
        });
        out.sort_unstable();
        out
    }
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
pub(in crate::meta) fn apply(txn: &WriteTransaction, payload: &[u8]) -> MetaResult<()> {
    rows(payload, |table, key, value| {
        let (ns, name) = Tables::by_name(table).ok_or_else(malformed)?;
        if !ns.apply(txn, name, key, value)? {
            return Err(malformed());
        }
        Ok(())
    })
}

/// Applies the rows of one record's payload that belong to namespace `ns`, skipping every
/// other namespace's (a node's record mixes the shards of one batch; a node taking one shard
/// over replays that shard's rows only).
pub(in crate::meta) fn apply_in(
    txn: &WriteTransaction,
    payload: &[u8],
    ns: crate::meta::Namespace,
) -> MetaResult<()> {
    rows(payload, |table, key, value| {
        let (of, name) = Tables::by_name(table).ok_or_else(malformed)?;
        if !std::ptr::eq(of, ns) {
            return Ok(());
        }
        if !ns.apply(txn, name, key, value)? {
            return Err(malformed());
        }
        Ok(())
    })
}

#[cfg(test)]
impl Redo {
    /// Applies this record's row effects in `txn`, exactly as replay applies a record read
    /// back from the log.
    pub(in crate::meta) fn apply_to(&self, txn: &WriteTransaction) -> MetaResult<()> {
        apply(txn, &self.effects.buf)
    }

    /// Calls `row` with each row effect of this record, in order: table, key, new value
    /// (`None`: removed).
    pub(in crate::meta) fn each_row(
        &self,
        row: impl FnMut(&str, &[u8], Option<&[u8]>) -> MetaResult<()>,
    ) -> MetaResult<()> {
        rows(&self.effects.buf, row)
    }
}
