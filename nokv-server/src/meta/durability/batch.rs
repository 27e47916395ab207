//! A batch: the sessions the committer runs together in one redb transaction, each batch
//! taking the next sequence number of the store's [`super::Journal`] and ending as one redo
//! record.
//!
//! Invariants: a batch's sequence number is written as `applied` in the transaction it runs
//! in, held across batches or not ([`Batch::end`]); nobody is answered and no reader shown a
//! batch before its record is durable; a transaction holding logged batches is never dropped
//! silently — committed ([`Batch::commit`]) or given up with the store failed
//! ([`Batch::abandon`]), so a reopen replays them; a session that fails is undone before the
//! next runs, and a failed undo poisons the batch (nothing of it is acknowledged).

use std::sync::Arc;

use super::super::overlay::Overlay;
use super::super::{MetaError, MetaResult, MetaStore, Namespace, Snapshot, WriteView};
use super::record::{Effects, Redo};
use super::round;

/// Batches one transaction is held open across before it is committed: each batch after the
/// first updates in place the pages the earlier ones already copied (see
/// [`super::super::overlay`]).
/// 64 rather than 16: the commit was 5.7 % of the daemon's CPU at 8 writers, and committing a
/// quarter as often took 1-6 % (median 3 %) off the server's CPU per put, measured against the
/// bench client's own, in 8 of 8 pairs at 8 clients, while readers, who look a row up through every
/// held layer, showed no cost in the probe (issue 12, machine E; git history); [`HOLD_BYTES`]
/// still bounds what they keep.
pub(in crate::meta) const HOLD_BATCHES: usize = 64;
/// Row bytes the layers of a held transaction may reach before it is committed (bounds the
/// memory readers' views keep).
pub(in crate::meta) const HOLD_BYTES: usize = 1 << 20;

/// The sessions of one batch, run in the committer's transaction and made durable by the
/// batch's redo record. The transaction is committed (without fsync) at the end of the batch
/// ([`Batch::commit_logged`]) or held open for the next batches ([`Batch::log`]); readers see
/// held batches through the memtable ([`super::super::overlay`]).
///
/// Each session runs as if alone: one that fails has its writes undone before the next runs
/// (see [`super::super::undo`]), so it changes nothing. If an undo itself fails the batch is
/// poisoned: later sessions are refused and the commit fails, so nothing of the batch is
/// acknowledged.
pub struct Batch {
    store: Arc<MetaStore>,
    txn: redb::WriteTransaction,
    poisoned: Option<String>,
    /// What the sessions of the current batch that succeeded wrote, for the redo log.
    effects: std::cell::RefCell<Effects>,
    /// The last commit, which readers see through `overlay` (taken when the first batch is
    /// held: a batch that commits at once needs none).
    base: Option<Arc<redb::ReadTransaction>>,
    /// The layers of the batches logged in this transaction so far.
    overlay: Overlay,
}

/// A batch committed but not yet durable (see [`Batch::commit_logged`]).
pub struct Logged {
    /// The batch's redo record: the batch is durable once [`MetaStore::log`] wrote it.
    pub redo: Redo,
    /// The state right after the batch, to show readers once it is durable.
    pub snapshot: Snapshot,
}

impl MetaStore {
    /// Begins a batch: one transaction for many sessions (see [`Batch`]).
    pub fn batch(self: &std::sync::Arc<Self>) -> MetaResult<Batch> {
        Batch::begin(self)
    }
}

impl Batch {
    /// Opens the batch's transaction ([`MetaStore::batch`]); refused once the store failed.
    pub(super) fn begin(store: &Arc<MetaStore>) -> MetaResult<Batch> {
        Ok(Batch {
            txn: store.begin_write()?,
            store: store.clone(),
            poisoned: None,
            effects: Default::default(),
            base: None,
            overlay: Overlay::default(),
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
        let mut view = WriteView::in_batch(&self.txn, ns, &self.effects);
        let out = f(&mut view);
        if out.is_err() {
            // redb syncs the file while growing it for a write, so a session's storage error
            // may be a failed fsync: that ends the process, it is not this session's refusal.
            if let Some(fatal) = self.store.fatal() {
                return Err(fatal.into());
            }
            self.effects.borrow_mut().rewind(mark);
            for step in view.into_undo().into_iter().rev() {
                let undone = match self.store.faults().check_undo() {
                    Ok(()) => step(&self.txn),
                    Err(e) => Err(MetaError::Store(redb::StorageError::Io(e).into())),
                };
                if let Err(e) = undone {
                    self.poisoned = Some(format!("undoing a failed session: {e}"));
                    break;
                }
            }
        }
        out
    }

    /// Ends the batch and commits the transaction — this batch and every batch held in it —
    /// atomically and visibly to the next batch but not durably: the batch is durable once its
    /// record is in the redo log ([`MetaStore::log`]). Nobody may be answered, and no reader
    /// shown the returned snapshot, before that.
    pub fn commit_logged(mut self) -> MetaResult<Logged> {
        let redo = match self.end() {
            Ok(redo) => redo,
            Err(e) => {
                // Never dropped while it holds batches (see `Batch::abandon`).
                self.abandon();
                return Err(e);
            }
        };
        let snapshot = self.commit()?;
        Ok(Logged { redo, snapshot })
    }

    /// Ends the batch and keeps the transaction open for the next batches: the returned
    /// snapshot shows this batch to readers through the memtable (same rule: only once its
    /// record is durable). The transaction must later be committed ([`Batch::commit`]) or its
    /// store failed ([`Batch::abandon`]) — dropping it would silently take the batches it
    /// holds out of redb while readers and the log still have them.
    pub fn log(&mut self) -> MetaResult<Logged> {
        let layer = self.effects.borrow().layer()?;
        let base = match &self.base {
            Some(base) => base.clone(),
            // No commit since the transaction began: a snapshot now is its starting state.
            None => self.base.insert(self.store.snapshot()?.txn).clone(),
        };
        let redo = self.end()?;
        self.overlay = self.overlay.with(layer);
        Ok(Logged {
            redo,
            snapshot: Snapshot {
                txn: base,
                overlay: self.overlay.clone(),
            },
        })
    }

    /// True once the held batches should be committed rather than held longer.
    pub fn full(&self) -> bool {
        self.overlay.batches() + 1 >= HOLD_BATCHES || self.overlay.bytes() >= HOLD_BYTES
    }

    /// True if an undo failed in this transaction: it must not be committed.
    pub fn poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// True if batches were logged in this transaction (dropping it would lose them from redb).
    pub fn holds_batches(&self) -> bool {
        self.overlay.batches() > 0
    }

    /// Commits the transaction without fsync (its batches are durable through their records)
    /// and returns the snapshot of the commit.
    pub fn commit(mut self) -> MetaResult<Snapshot> {
        if let Some(reason) = self.poisoned.take() {
            return Err(self.abandon_with(reason));
        }
        self.txn
            .set_durability(redb::Durability::None)
            .map_err(|e| self.store.fail(e))?;
        self.store.commit(self.txn)?;
        self.store.snapshot()
    }

    /// Gives the transaction up. If it holds logged batches the store is marked failed, so
    /// that it is reopened — replaying them from the log — before anyone writes or reads on.
    pub fn abandon(self) {
        if self.holds_batches() {
            self.abandon_with("a held transaction was given up".into());
        }
    }

    fn abandon_with(self, reason: String) -> MetaError {
        drop(self.txn);
        self.store
            .fail(redb::StorageError::Io(std::io::Error::other(reason)))
    }

    /// Ends the current batch: records its sequence number in the transaction and takes its
    /// redo record. Refused (and the store failed) if the batch is poisoned.
    fn end(&mut self) -> MetaResult<Redo> {
        if let Some(reason) = &self.poisoned {
            return Err(self
                .store
                .fail(redb::StorageError::Io(std::io::Error::other(
                    reason.clone(),
                ))));
        }
        let seq = self.store.journal.next_seq();
        round::set_applied(&self.txn, seq)?;
        self.store.journal.sequenced(seq);
        Ok(Redo::new(
            seq,
            std::mem::take(&mut *self.effects.borrow_mut()),
        ))
    }
}
