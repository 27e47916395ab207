//! The memtable: rows of batches that are durable in the redo log but not yet committed to
//! redb, shown to readers over the last commit.
//!
//! Why: a redb commit per batch — even a non-durable one — copies the leaves and the path to
//! the root of every table the batch touched, writes them into the page cache and takes a
//! fresh read snapshot; at 8 writers that page work was a quarter of the daemon's CPU per
//! small write (docs/architecture.md). So the committer keeps one redb write transaction open
//! across up to [`super::batch::HOLD_BATCHES`] batches (pages dirtied by one batch are
//! updated in place by the next) and commits it once; meanwhile each batch's row effects —
//! the very effects its redo record carries — become a [`Layer`], and readers read the last
//! commit's snapshot *through* the layers of the batches after it ([`Overlay`]).
//!
//! Invariants:
//! * **a view is exact**: a snapshot of commit C with the layers of batches C+1..N reads as the
//!   state after batch N. Each layer holds every row its batch changed, with its final value
//!   in that batch (or its removal); a read takes a row from the newest layer that changed it,
//!   else from the snapshot, and scans merge both in the table's own key order
//!   ([`redb::Key::compare`]).
//! * **nothing new to recover**: a layer is built from the batch's redo record, and a batch is
//!   shown to readers only once that record is durable (the gate's rule, unchanged). A crash
//!   loses the open transaction and the layers — both only ever held what the log holds.
//! * **bounded**: layers live until the transaction they describe is committed; the committer
//!   commits after a bounded number of batches or bytes ([`super::batch::HOLD_BYTES`]).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::iter::Peekable;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use redb::{
    AccessGuard, Key, ReadOnlyTable, ReadTransaction, ReadableTableMetadata, StorageError,
    TableDefinition, TableError, TableHandle, Value,
};

use super::{MetaResult, Tables};

/// A table's key order over encoded keys.
type Compare = fn(&[u8], &[u8]) -> Ordering;

/// A row's encoded key, ordered as its table orders keys (not bytewise: redb's tuple keys
/// carry length prefixes).
#[derive(Clone)]
pub(super) struct RowKey {
    bytes: Box<[u8]>,
    compare: Compare,
}

impl RowKey {
    fn of<K: Key + 'static>(key: &K::SelfType<'_>) -> RowKey {
        RowKey {
            bytes: K::as_bytes(key).as_ref().into(),
            compare: K::compare,
        }
    }
}

impl Ord for RowKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.compare)(&self.bytes, &other.bytes)
    }
}
impl PartialOrd for RowKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for RowKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for RowKey {}

/// One table's changed rows: the new value, or `None` for a removed row.
type Changes = BTreeMap<RowKey, Option<Box<[u8]>>>;

/// A changed row as a scan meets it: its key, and its value (`None`: removed).
type Change<'a> = (&'a RowKey, Option<&'a [u8]>);

/// The rows one batch changed, by full table name.
#[derive(Default)]
pub(super) struct Layer {
    tables: HashMap<Box<str>, Changes>,
    bytes: usize,
}

impl Layer {
    /// Records that `table`'s row `key` now holds `value` (`None`: removed); a later change
    /// of the same row in the batch replaces an earlier one. Refuses a table name no
    /// namespace has (a redo record would be refused at replay the same way).
    pub(super) fn change(
        &mut self,
        table: &str,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> MetaResult<()> {
        let compare = Tables::by_name(table)
            .and_then(|(ns, name)| ns.compare(name))
            .ok_or_else(|| super::MetaError::Failed(format!("no table is named {table}")))?;
        self.bytes += key.len() + value.map_or(0, <[u8]>::len);
        let rows = match self.tables.get_mut(table) {
            Some(rows) => rows,
            None => self.tables.entry(table.into()).or_default(),
        };
        rows.insert(
            RowKey {
                bytes: key.into(),
                compare,
            },
            value.map(Into::into),
        );
        Ok(())
    }
}

/// The layers of the batches after a snapshot's commit, oldest first (see the module doc).
/// Cloned for every read, so the layers are shared, not copied.
#[derive(Clone, Default)]
pub(super) struct Overlay {
    layers: Arc<[Arc<Layer>]>,
    bytes: usize,
}

impl Overlay {
    /// This overlay with `layer` on top.
    pub(super) fn with(&self, layer: Layer) -> Overlay {
        let bytes = self.bytes + layer.bytes;
        let layers = self
            .layers
            .iter()
            .cloned()
            .chain([Arc::new(layer)])
            .collect();
        Overlay { layers, bytes }
    }

    /// Key and value bytes the layers hold.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Batches the overlay holds.
    pub(super) fn batches(&self) -> usize {
        self.layers.len()
    }

    fn changes(&self, table: &str) -> Vec<&Changes> {
        self.layers
            .iter()
            .filter_map(|l| l.tables.get(table))
            .collect()
    }
}

/// Opens `def` in the snapshot `txn` as seen through `overlay`. A table that the snapshot
/// lacks but the overlay changed reads as the overlay's rows alone.
pub(super) fn open<'o, K: Key + 'static, V: Value + 'static>(
    txn: &ReadTransaction,
    overlay: &'o Overlay,
    def: TableDefinition<'static, K, V>,
) -> Result<OverlaidTable<'o, K, V>, TableError> {
    let changes = overlay.changes(def.name());
    let base = match txn.open_table(def) {
        Ok(t) => Some(t),
        Err(TableError::TableDoesNotExist(_)) if !changes.is_empty() => None,
        Err(e) => return Err(e),
    };
    Ok(OverlaidTable {
        base,
        changes,
        types: PhantomData,
    })
}

/// A table of a snapshot read through an overlay: the same reads as a redb table
/// (`get`, `range`, `iter`, `first`, `len`), so both views share their typed
/// reads.
pub struct OverlaidTable<'o, K: Key + 'static, V: Value + 'static> {
    base: Option<ReadOnlyTable<K, V>>,
    /// This table's changes, oldest batch first.
    changes: Vec<&'o Changes>,
    types: PhantomData<(K, V)>,
}

/// A key or value read through an overlay: stored in the snapshot, or changed by a batch.
pub enum Row<'a, T: Value + 'static> {
    Stored(AccessGuard<'a, T>),
    Changed(&'a [u8], PhantomData<T>),
}

impl<T: Value + 'static> Row<'_, T> {
    pub fn value(&self) -> T::SelfType<'_> {
        match self {
            Row::Stored(g) => g.value(),
            Row::Changed(bytes, _) => T::from_bytes(bytes),
        }
    }
}

/// What both views' scans yield (a redb guard or a [`Row`]), for helpers shared by both.
pub(super) trait Stored<T: Value + 'static> {
    fn stored(&self) -> T::SelfType<'_>;
}

impl<T: Value + 'static> Stored<T> for AccessGuard<'_, T> {
    fn stored(&self) -> T::SelfType<'_> {
        self.value()
    }
}

impl<T: Value + 'static> Stored<T> for Row<'_, T> {
    fn stored(&self) -> T::SelfType<'_> {
        self.value()
    }
}

impl<'o, K: Key + 'static, V: Value + 'static> OverlaidTable<'o, K, V> {
    pub fn get<'k>(
        &self,
        key: impl Borrow<K::SelfType<'k>>,
    ) -> Result<Option<Row<'_, V>>, StorageError> {
        if !self.changes.is_empty() {
            let probe = RowKey::of::<K>(key.borrow());
            if let Some(change) = self.changes.iter().rev().find_map(|c| c.get(&probe)) {
                return Ok(change.as_deref().map(|v| Row::Changed(v, PhantomData)));
            }
        }
        match &self.base {
            Some(t) => Ok(t.get(key)?.map(Row::Stored)),
            None => Ok(None),
        }
    }

    pub fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Rows<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let bound = |b: Bound<&KR>| b.map(|k| RowKey::of::<K>(k.borrow()));
        let changed = self.merged(bound(range.start_bound()), bound(range.end_bound()));
        let base = match &self.base {
            Some(t) => Some(t.range(range)?),
            None => None,
        };
        Ok(Rows::new(base, changed))
    }

    pub fn iter(&self) -> Result<Rows<'_, K, V>, StorageError> {
        let changed = self.merged(Bound::Unbounded, Bound::Unbounded);
        let base = match &self.base {
            Some(t) => Some(redb::ReadableTable::iter(t)?),
            None => None,
        };
        Ok(Rows::new(base, changed))
    }

    #[allow(clippy::type_complexity)]
    pub fn first(&self) -> Result<Option<(Row<'_, K>, Row<'_, V>)>, StorageError> {
        self.iter()?.next().transpose()
    }

    pub fn len(&self) -> Result<u64, StorageError> {
        let mut len = match &self.base {
            Some(t) => t.len()?,
            None => 0,
        };
        for (key, change) in self.merged(Bound::Unbounded, Bound::Unbounded) {
            let stored = match &self.base {
                Some(t) => t.get(K::from_bytes(&key.bytes))?.is_some(),
                None => false,
            };
            match (stored, change.is_some()) {
                (false, true) => len += 1,
                (true, false) => len -= 1,
                _ => {}
            }
        }
        Ok(len)
    }

    /// Every change in `(start, end)`, newest batch's winning, in key order.
    fn merged(&self, start: Bound<RowKey>, end: Bound<RowKey>) -> Vec<Change<'_>> {
        if self.changes.is_empty() || empty_range(&start, &end) {
            return Vec::new();
        }
        let mut out: BTreeMap<&RowKey, Option<&[u8]>> = BTreeMap::new();
        for changes in &self.changes {
            for (k, v) in changes.range((start.clone(), end.clone())) {
                out.insert(k, v.as_deref());
            }
        }
        out.into_iter().collect()
    }
}

/// True for bounds no key lies between (`BTreeMap::range` panics on them; redb yields nothing).
fn empty_range(start: &Bound<RowKey>, end: &Bound<RowKey>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
        _ => false,
    }
}

#[allow(clippy::type_complexity)]
fn stored_row<'a, K: Key + 'static, V: Value + 'static>(
    (k, v): (AccessGuard<'a, K>, AccessGuard<'a, V>),
) -> (Row<'a, K>, Row<'a, V>) {
    (Row::Stored(k), Row::Stored(v))
}

/// A scan through an overlay: the snapshot's rows and the changed rows merged in key order,
/// a changed row replacing (or, removed, hiding) the stored one.
pub struct Rows<'a, K: Key + 'static, V: Value + 'static> {
    base: Option<Peekable<redb::Range<'a, K, V>>>,
    changed: Peekable<std::vec::IntoIter<Change<'a>>>,
}

impl<'a, K: Key + 'static, V: Value + 'static> Rows<'a, K, V> {
    fn new(base: Option<redb::Range<'a, K, V>>, changed: Vec<Change<'a>>) -> Self {
        Rows {
            base: base.map(Iterator::peekable),
            changed: changed.into_iter().peekable(),
        }
    }
}

impl<'a, K: Key + 'static, V: Value + 'static> Iterator for Rows<'a, K, V> {
    type Item = Result<(Row<'a, K>, Row<'a, V>), StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let stored = match self.base.as_mut().and_then(Peekable::peek) {
                None => None,
                Some(Ok((k, _))) => Some(K::as_bytes(&k.value()).as_ref().to_vec()),
                Some(Err(_)) => return self.base.as_mut()?.next().map(|r| r.map(stored_row)),
            };
            let order = match (&stored, self.changed.peek()) {
                (None, None) => return None,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(s), Some((c, _))) => K::compare(s, &c.bytes),
            };
            if order == Ordering::Less {
                return self.base.as_mut()?.next().map(|r| r.map(stored_row));
            }
            if order == Ordering::Equal {
                self.base.as_mut()?.next(); // replaced or hidden by the change
            }
            let (key, change) = self.changed.next()?;
            if let Some(value) = change {
                return Some(Ok((
                    Row::Changed(&key.bytes, PhantomData),
                    Row::Changed(value, PhantomData),
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redb::ReadableTableMetadata;

    use crate::meta::{EntryRecord, MetaError, MetaStore, Tables};

    /// Workspaces whose tuple keys sort differently bytewise ("ab" is longer, so its length
    /// prefix sorts it after "b") than in the table's own order.
    const WS: [&str; 3] = ["a", "ab", "b"];
    const PATHS: [&str; 5] = ["x", "y/1", "y/2", "yy", "z"];

    /// Everything the tests compare, read the same way through either view.
    macro_rules! dump {
        ($v:expr) => {{
            let v = $v;
            let mut out = Vec::new();
            for ws in WS {
                let all = v.list(ws, "", None, 100)?;
                let under = v.list(ws, "y/", None, 100)?;
                let page = v.list(ws, "", Some("y/1"), 2)?;
                let mut rows = Vec::new();
                for p in PATHS {
                    rows.push((v.entry(ws, p)?, v.inline(ws, p)?));
                }
                out.push(format!("{ws}: {all:?} | {under:?} | {page:?} | {rows:?}"));
            }
            // (`counts` reads this length too; through a write transaction it cannot run.)
            out.push(format!(
                "entries: {}",
                v.txn.open_table(v.t.entries)?.len()?
            ));
            Ok::<_, MetaError>(out)
        }};
    }

    use crate::meta::dice::Dice;

    // Catches: a layer ordered bytewise instead of by the table's key order (pages and
    // prefixes of the "a"/"ab"/"b" workspaces come out wrong), an older layer winning over a
    // newer one, a removed row that still shows, a row count that ignores the layers, and a
    // scan that drops or repeats a row where a stored and a changed key meet; and a held
    // transaction that never fills and commits.
    #[test]
    fn held_batches_read_the_same_through_the_memtable_as_through_their_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MetaStore::create(&dir.path().join("m.redb")).unwrap());
        let ns = Tables::canonical();
        let entry = |generation| EntryRecord {
            generation,
            size: generation,
            ..Default::default()
        };
        store
            .write(|w| {
                for (i, ws) in WS.iter().enumerate() {
                    for p in ["x", "y/2", "z"] {
                        w.put_entry(ws, p, &entry(i as u64))?;
                        w.put_inline(ws, p, b"stored")?;
                    }
                }
                Ok::<_, MetaError>(())
            })
            .unwrap();
        let mut dice = Dice(7);
        let mut batch = store.batch().unwrap();
        let mut generation = 100;
        let mut commits = 0;
        // Enough rounds for the held transaction to fill and commit twice.
        for round in 0..2 * super::super::durability::HOLD_BATCHES + 8 {
            for _ in 0..3 {
                let (ws, p) = (WS[dice.roll(3)], PATHS[dice.roll(5)]);
                let (remove, fail) = (dice.roll(3) == 0, dice.roll(5) == 0);
                generation += 1;
                let _ = batch.session(ns, |w| {
                    if remove {
                        w.remove_entry(ws, p)?;
                    } else {
                        w.put_entry(ws, p, &entry(generation))?;
                        w.put_inline(ws, p, format!("{round}").as_bytes())?;
                    }
                    if fail {
                        return Err(MetaError::Failed("undone".into()));
                    }
                    Ok(())
                });
            }
            let truth = batch.session(ns, |w| dump!(w)).unwrap();
            if batch.full() {
                let shown = batch.commit_logged().unwrap().snapshot;
                assert_eq!(
                    shown.read_in(ns, |r| dump!(r)).unwrap(),
                    truth,
                    "commit {round}"
                );
                commits += 1;
                batch = store.batch().unwrap();
            } else {
                let shown = batch.log().unwrap().snapshot;
                assert!(!shown.overlay.layers.is_empty());
                assert_eq!(
                    shown.read_in(ns, |r| dump!(r)).unwrap(),
                    truth,
                    "batch {round}"
                );
            }
        }
        assert!(commits >= 2, "the held transaction never filled");
    }
}
