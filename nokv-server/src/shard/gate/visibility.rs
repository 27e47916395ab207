//! What readers see, and whether the shards on a committer serve: the [`Slot`] the committer,
//! the acknowledger and every reader share.
//!
//! **Stats.** The gate counts batches, the sessions they ran and the sessions it acknowledged
//! ([`GateStats`]), so tests can prove that batches form and metrics can report the average
//! batch size; the counters are updated before the batch's callers are answered.
//!
//! **Reads** use the state right after the last batch known durable (the acknowledger shows it
//! before answering that batch): the MVCC snapshot of the last commit, read through the
//! memtable layers of the held batches after it. They run concurrently with write sessions,
//! so a stat or list never queues behind an fsync or a commit. Reads observe every acknowledged
//! mutation, and never one whose batch is not durable yet: nothing a reader saw can be lost by
//! a crash.
//!
//! Invariants (kept by [`Slot::set`] and [`Slot::show`], both under the service lock):
//! * **visible ⇒ durable**: a snapshot is shown only once the batch it shows is durable (the
//!   acknowledger shows it after the fsync), or when a store is put in service (opening it
//!   replayed its log);
//! * **acknowledged ⇒ visible or refused**: once a batch's callers are answered, every reader
//!   sees its writes or answers `Unavailable` (retryably), never an older snapshot without them;
//! * a store taken out of service is never brought back by a late snapshot: [`Slot::show`]
//!   shows nothing for a store no longer in service, and the committer waits for readers'
//!   handles to drop before it reopens the file.

use crate::provider_log::LogWriter;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::meta::{MetaStore, Snapshot};

/// The store as the committer last opened it. `None` while it is out of service after a
/// storage failure. Readers clone the handle and release the lock at once, so the committer
/// can take the store out of service without waiting for reads; it then waits for their
/// clones to drop before reopening the file.
pub(super) struct Slot {
    pub(super) store: RwLock<Option<Arc<MetaStore>>>,
    /// What readers see: the snapshot after the last batch known durable. It keeps its
    /// store's handle, so a reopen waits for it like for any reader.
    pub(super) visible: RwLock<Option<Arc<Visible>>>,
    /// False for the whole of an outage (from a storage failure until a commit succeeds
    /// again), even while a reopened store already serves reads.
    pub(super) serving: watch::Sender<bool>,
    pub(super) stats: Counters,
    /// Stages handed to the acknowledger that it has not finished handling (appended,
    /// shown, answered); see [`hand_over`].
    pub(super) handed_over: std::sync::atomic::AtomicUsize,
    /// `--metadata-durability provider`: the node's log stream in the provider, where every
    /// record goes after the local fsync and before its batch is shown or answered (see
    /// [`super::acknowledger`]). `None`: local durability.
    pub(super) replica: Option<Arc<LogWriter>>,
    /// Notified after each stage the committer hands over, so an acknowledger waiting for a
    /// segment in flight can start the next one meanwhile (see `acknowledger`).
    pub(super) staged: tokio::sync::Notify,
}

/// What the committer has done since the gate started (see [`Gate::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Batches the committer ran; each ends with one fsync, or with a failure.
    pub batches: u64,
    /// Sessions those batches ran, whatever their outcome (sessions refused without running
    /// while the store is out of service are not counted).
    pub sessions: u64,
    /// Sessions answered with success: every one was committed *and* made durable first.
    pub acknowledged: u64,
}

/// The live counters behind [`GateStats`]; written by the committer only.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) batches: AtomicU64,
    pub(super) sessions: AtomicU64,
    pub(super) acknowledged: AtomicU64,
}

/// A snapshot readers may see, and the store it was taken from.
pub(super) struct Visible {
    pub(super) snapshot: Snapshot,
    _store: Arc<MetaStore>,
}

impl Slot {
    /// A slot serving nothing yet (the committer puts its store in service at once).
    pub(super) fn new() -> Slot {
        Slot {
            store: RwLock::new(None),
            visible: RwLock::new(None),
            serving: watch::Sender::new(true),
            stats: Counters::default(),
            handed_over: Default::default(),
            replica: None,
            staged: tokio::sync::Notify::new(),
        }
    }

    /// Puts `store` in service (readers see its last commit, which is durable: a store is put
    /// in service only when opened, and opening replays its log) or takes it out.
    pub(super) fn set(&self, store: Option<Arc<MetaStore>>) {
        let mut current = self.store.write();
        *self.visible.write() = store.as_ref().and_then(|s| {
            s.snapshot().ok().map(|snapshot| {
                Arc::new(Visible {
                    snapshot,
                    _store: s.clone(),
                })
            })
        });
        *current = store;
    }

    /// Shows readers `snapshot` of `store` — unless that store was taken out of service
    /// meanwhile: a snapshot must never bring back a handle the committer is waiting to
    /// release (checked and written under the service lock, which [`Slot::set`] holds too).
    ///
    /// If `store` is still in service but has failed since (the committer's next commit
    /// failed while this batch was being appended), readers are shown *nothing*: they answer
    /// `Unavailable` until the committer has reopened the store, whose replay of the log brings
    /// this (durable) batch back. Leaving the older snapshot up instead would let a caller
    /// answered OK right after this read a state without its own write (issue 42, item 6).
    /// So once a batch's callers are answered, every reader sees its writes or is refused,
    /// retryably: acknowledged ⇒ visible-or-Unavailable, and still visible ⇒ durable.
    pub(super) fn show(&self, store: Arc<MetaStore>, snapshot: Snapshot) {
        let current = self.store.read();
        if !current.as_ref().is_some_and(|s| Arc::ptr_eq(s, &store)) {
            // Out of service (readers already see nothing), or already replaced by a reopened
            // store, which replayed every durable batch.
            return;
        }
        *self.visible.write() = match store.failure() {
            None => Some(Arc::new(Visible {
                snapshot,
                _store: store,
            })),
            Some(_) => None,
        };
    }
}
