//! Rollback of one write session inside a transaction shared by a whole batch.
//!
//! The committer runs every session of a batch in one redb transaction, so the batch costs one
//! page write-back and one fsync instead of one transaction per session. A failing session must
//! still change nothing and fail alone, and redb has no savepoint once a table was opened; so
//! every insert and remove a session makes through [`UndoTable`] first records how to put the
//! row back (its previous value, or its absence), and a failed session's steps are replayed in
//! reverse before the next session runs.
//!
//! The same wrapper records each row's new value (or its removal) as the batch's redo effects
//! ([`super::durability`]): that record, not redb's fsync, is what makes the batch durable.
//!
//! Invariant: inside a write session, every mutation goes through an [`UndoTable`]. A mutation
//! made around it would be neither undone on failure nor replayed after a crash — nor shown to
//! readers of a held transaction, whose memtable layers are built from the redo effects. The
//! types make it so: a session (a `WriteView`) reaches the transaction only as a
//! [`SessionTxn`], whose tables are read-only ([`ReadOnly`]), and through its [`Capture`],
//! whose [`Capture::table`] is the one way to open a table that can be written. The bare
//! `redb::WriteTransaction` is used only by code that is not a session: a batch's own
//! bookkeeping (its `applied` sequence, running a failed session's undo steps) and commit,
//! the store's commit and the redo replay, and the bulk copies of a whole namespace (a
//! checkpoint's export, a load's import: `MetaStore::write_bare`), which are durable
//! transactions of their own, never part of a batch.

use std::borrow::Borrow;
use std::cell::RefCell;
use std::ops::{Deref, RangeBounds};

use redb::{Key, ReadableTable, TableDefinition, Value, WriteTransaction};

use super::MetaResult;
use super::durability::Effects;

/// Puts one row back as it was before the session touched it.
pub(super) type UndoStep = Box<dyn FnOnce(&WriteTransaction) -> MetaResult<()>>;

/// The write transaction as a session sees it: tables open read-only. Copy, so the shared
/// read macros use it as they use a snapshot. The bare transaction is private to this module.
#[derive(Clone, Copy)]
pub(super) struct SessionTxn<'a> {
    raw: &'a WriteTransaction,
}

impl<'a> SessionTxn<'a> {
    /// Opens `def` for reading. Like any open in a write transaction it creates the table,
    /// empty, if the file predates it: no row changes, so there is nothing to capture (replay
    /// creates a table the same way the first time a row of it is applied).
    pub(super) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<'static, K, V>,
    ) -> Result<ReadOnly<'a, K, V>, redb::TableError> {
        Ok(ReadOnly(self.raw.open_table(def)?))
    }
}

/// A table a session opened for reading: [`Deref`] gives `&redb::Table`, and every redb
/// mutation takes `&mut`, so only reads pass.
pub(super) struct ReadOnly<'t, K: Key + 'static, V: Value + 'static>(redb::Table<'t, K, V>);

impl<'t, K: Key + 'static, V: Value + 'static> Deref for ReadOnly<'t, K, V> {
    type Target = redb::Table<'t, K, V>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// What one write session changed so far: how to undo it, and — in a batch — the batch's
/// redo effects it adds to. It alone of what a session holds can open a writable table
/// ([`Capture::table`]), so every row a session writes is captured.
pub(super) struct Capture<'a> {
    raw: &'a WriteTransaction,
    undo: RefCell<Vec<UndoStep>>,
    /// The batch's redo effects; `None` for a one-off session (it commits durably on its own,
    /// or aborts whole: neither needs a record).
    redo: Option<&'a RefCell<Effects>>,
}

impl<'a> Capture<'a> {
    /// Starts a session on `raw`: the read side it is given, and the capture of its writes.
    pub(super) fn begin(
        raw: &'a WriteTransaction,
        redo: Option<&'a RefCell<Effects>>,
    ) -> (SessionTxn<'a>, Capture<'a>) {
        let capture = Capture {
            raw,
            undo: Default::default(),
            redo,
        };
        (SessionTxn { raw }, capture)
    }

    /// Opens one of the session's tables for writing: every insert and remove through it
    /// records its undo step and, in a batch, its redo effect.
    pub(super) fn table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<'static, K, V>,
    ) -> MetaResult<UndoTable<'_, K, V>> {
        UndoTable::open(self.raw, def, &self.undo, self.redo)
    }

    /// The session's undo steps, in the order they were recorded (a failed session's are run
    /// in reverse).
    pub(super) fn into_undo(self) -> Vec<UndoStep> {
        self.undo.into_inner()
    }
}

/// A table opened by a write session: reads pass through, writes record their undo step.
pub(super) struct UndoTable<'t, K: Key + 'static, V: Value + 'static> {
    inner: redb::Table<'t, K, V>,
    def: TableDefinition<'static, K, V>,
    log: &'t RefCell<Vec<UndoStep>>,
    /// The batch's redo effects; `None` for a write committed durably on its own.
    redo: Option<&'t RefCell<Effects>>,
}

impl<'t, K: Key + 'static, V: Value + 'static> Deref for UndoTable<'t, K, V> {
    type Target = redb::Table<'t, K, V>;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl<'t, K: Key + 'static, V: Value + 'static> UndoTable<'t, K, V> {
    fn open(
        txn: &'t WriteTransaction,
        def: TableDefinition<'static, K, V>,
        log: &'t RefCell<Vec<UndoStep>>,
        redo: Option<&'t RefCell<Effects>>,
    ) -> MetaResult<Self> {
        Ok(UndoTable {
            inner: txn.open_table(def)?,
            def,
            log,
            redo,
        })
    }

    /// Records the row's new value (`None`: removed) as a redo effect.
    fn redo(&self, key: &K::SelfType<'_>, value: Option<&V::SelfType<'_>>) {
        if let Some(redo) = self.redo {
            let value = value.map(|v| V::as_bytes(v));
            redo.borrow_mut().record(
                redb::TableHandle::name(&self.def),
                K::as_bytes(key).as_ref(),
                value.as_ref().map(|v| v.as_ref()),
            );
        }
    }

    /// Records how to restore the row of `key` to `old`, its value before this session's
    /// mutation (`None`: it was absent). The old value comes from the mutation's own return,
    /// so undo costs no extra lookup.
    fn remember(&self, key: &K::SelfType<'_>, old: Option<Vec<u8>>) {
        let key: Vec<u8> = K::as_bytes(key).as_ref().to_vec();
        let def = self.def;
        self.log.borrow_mut().push(Box::new(move |txn| {
            let mut t = txn.open_table(def)?;
            let k = K::from_bytes(&key);
            match &old {
                Some(v) => {
                    t.insert(k, V::from_bytes(v))?;
                }
                None => {
                    t.remove(k)?;
                }
            }
            Ok(())
        }));
    }

    pub(super) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> MetaResult<()> {
        let old = self
            .inner
            .insert(key.borrow(), value.borrow())?
            .map(|g| V::as_bytes(&g.value()).as_ref().to_vec());
        self.remember(key.borrow(), old);
        self.redo(key.borrow(), Some(value.borrow()));
        Ok(())
    }

    /// Removes `key`; returns whether a row was there.
    pub(super) fn remove<'k>(&mut self, key: impl Borrow<K::SelfType<'k>>) -> MetaResult<bool> {
        let old = self
            .inner
            .remove(key.borrow())?
            .map(|g| V::as_bytes(&g.value()).as_ref().to_vec());
        let existed = old.is_some();
        if existed {
            self.remember(key.borrow(), old);
            self.redo(key.borrow(), None);
        }
        Ok(existed)
    }

    /// Removes every row whose key is in `range`.
    pub(super) fn remove_range<'a, KR>(
        &mut self,
        range: impl RangeBounds<KR> + 'a,
    ) -> MetaResult<()>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let keys: Vec<Vec<u8>> = self
            .inner
            .range(range)?
            .map(|item| item.map(|(k, _)| K::as_bytes(&k.value()).as_ref().to_vec()))
            .collect::<Result<_, _>>()?;
        for k in keys {
            self.remove(K::from_bytes(&k))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::meta::{MetaError, MetaStore};

    // Catches: an insert or remove that records no undo step, undo steps replayed in the
    // wrong order (the row written twice would keep its first new value), and a batch that
    // commits per session.
    #[test]
    fn a_failed_session_in_a_batch_is_undone_row_by_row_and_the_others_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(MetaStore::create(&dir.path().join("u.redb")).unwrap());
        store
            .write(|w| {
                w.put_inline("ws", "a", b"old")?;
                w.put_inline("ws", "b", b"keep")
            })
            .unwrap();
        let ns = crate::meta::Tables::canonical();
        let (fsyncs, syncs) = (store.durable_commits(), store.log_syncs());

        let mut batch = store.batch().unwrap();
        batch
            .session(ns, |w| w.put_inline("ws", "c", b"1"))
            .unwrap();
        let failed = batch.session(ns, |w| {
            w.put_inline("ws", "a", b"new")?;
            w.put_inline("ws", "a", b"newer")?;
            w.remove_inline("ws", "b")?;
            w.put_inline("ws", "d", b"x")?;
            Err::<(), _>(MetaError::Failed("this session fails".into()))
        });
        assert!(failed.is_err());
        batch
            .session(ns, |w| w.put_inline("ws", "e", b"2"))
            .unwrap();
        let logged = batch.commit_logged().unwrap();
        store.log(&[&logged.redo]).unwrap();

        let read = |name: &str| store.read(|r| r.inline("ws", name)).unwrap();
        assert_eq!(read("a"), Some(b"old".to_vec()), "overwrites undone");
        assert_eq!(read("b"), Some(b"keep".to_vec()), "remove undone");
        assert_eq!(read("d"), None, "insert undone");
        assert_eq!(read("c"), Some(b"1".to_vec()));
        assert_eq!(read("e"), Some(b"2".to_vec()));
        assert_eq!(
            store.durable_commits() - fsyncs + store.log_syncs() - syncs,
            1,
            "one fsync for the batch"
        );
        assert_eq!(
            store.log_syncs() - syncs,
            1,
            "the batch's record is its fsync"
        );
    }
}
