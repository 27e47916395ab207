//! A batch: the sessions the committer runs together in one redb transaction, and the
//! snapshot readers are shown once the batch is durable.

use super::redo;
use super::{MetaError, MetaResult, MetaStore, Namespace, ReadView, Redo, WriteView};

/// The sessions of one batch in one transaction, committed once at the end without fsync and
/// made durable by its redo record ([`Batch::commit_logged`]).
///
/// Each session runs as if alone: one that fails has its writes undone before the next runs
/// (see [`super::undo`]), so it changes nothing. If an undo itself fails the batch is
/// poisoned: later sessions are refused and the commit fails, so nothing of the batch is
/// acknowledged.
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
pub struct Snapshot(pub(super) std::sync::Arc<redb::ReadTransaction>);

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

impl<'s> Batch<'s> {
    /// Opens the batch's transaction ([`MetaStore::batch`]); refused once the store failed.
    pub(super) fn begin(store: &'s MetaStore) -> MetaResult<Batch<'s>> {
        Ok(Batch {
            store,
            txn: store.begin_write()?,
            poisoned: None,
            effects: Default::default(),
        })
    }

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
