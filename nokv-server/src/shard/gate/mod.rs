//! The command gate of a shard: write sessions are exclusive, reads never wait for them.
//!
//! **Write sessions** run one at a time on the committer thread of the store that holds the
//! shard's tables — the single writer is the gate, so exclusivity holds by construction. A
//! session is a synchronous closure over a [`WriteView`]; it cannot await anything, so no
//! provider I/O can ever happen while the gate is held. Callers that need provider I/O (the
//! upload sequencer) split their work into two sessions with the I/O between them.
//!
//! **Group commit.** The committer takes every session queued at that moment as one batch and
//! runs them all in **one redb transaction**. Each session still runs as if alone: a session
//! that fails has its writes undone inside the transaction before the next one runs (every
//! insert and remove records how to put the row back, see [`crate::meta`]'s `undo`), so it
//! changes nothing and fails alone.
//!
//! **Durable through a redo log, answered by a second thread.** The transaction is committed
//! *without* fsync — and not after every batch: it is held open across up to 64 batches (or
//! 1 MiB of rows) and committed once, readers seeing the held batches through the memtable
//! (see [`crate::meta`]'s `overlay`) — and the rows the batch's sessions wrote (captured by
//! the same wrapper that records the undo steps) go to the store's redo log as one record (see
//! [`crate::meta`]'s `durability` for the format and the crash rule). The [`acknowledger`]
//! thread appends the records of every batch queued at that moment with one write and one fsync, and
//! only then answers their callers and shows their state to readers — while the committer
//! already runs the next batch. Every second (or sooner, once the log holds an eighth of the free disk space, 2-64
//! MiB) the committer makes the file itself durable with a durable commit that begins a new
//! round of the log (`MetaStore::checkpoint`; the acknowledger then writes the round's marker
//! after every record of the old round); opening a store checks the log against the file and
//! replays it. Nobody is answered before the fsync that
//! covers their batch, so every acknowledged mutation is durable. A *lone* batch — no session
//! queued behind it and nothing left with the acknowledger — gets the same append, fsync and
//! answers from the committer itself ([`handoff::hand_over`]): with no next batch to overlap the fsync
//! with, the hand-off would only cost a thread wake-up per put (once a session arrives during
//! such an fsync, writes come too fast for it, and the next batches are handed over). A
//! mutation that depends on another one's outcome is submitted after it was answered, hence
//! lands in a later batch: a crash can never keep a dependent mutation and lose what it
//! depended on. Work on a whole namespace (a checkpoint's copy, a load's import) runs alone
//! between batches ([`Committer::exclusive`]).
//!
//! **One committer and one fsync for every shard of a node.** A node keeps all the shards it
//! holds in one redb file, each in its own namespace of tables ([`crate::meta::Tables`]), and
//! runs one [`Committer`] for that file; each shard's [`Gate`] is its namespace, its fence and
//! a handle on that committer. A batch therefore mixes sessions of any shards, and one durable
//! commit makes all of them durable: eight agents writing to eight workspaces on eight shards
//! pay one fsync, not eight. Why this design rather than the alternatives:
//! * a node-level committer over per-shard files would still owe one fsync per file touched
//!   (redb makes a file durable only with its own commit), so the count would not drop;
//! * one file with a namespace per shard changes no session code. A shard stays separable: its state is exactly its namespace's tables, so a
//!   checkpoint exports them alone and a load imports them alone (in one transaction, see
//!   [`crate::meta`]); its fence is its own and checked inside each of its sessions, and its
//!   ownership epoch lives in its namespace.
//!
//! The costs, accepted: one writer thread serves the node (sessions are short synchronous
//! closures with no I/O; the fsync, which dominates, is what is shared); a storage failure
//! takes every shard of the node out of service together (they share the disk anyway); the
//! tables of a shard handed off stay in the file (as its file stayed before) until the shard
//! is loaded again, when an import replaces them.
//!
//! Why the redo log on top (issue 12, measured with `nokv-server store-bench`): with a durable
//! redb commit per batch the committer spent most of each batch waiting for redb to write
//! back 5–6 scattered pages per small write and fsync them, and could run nothing meanwhile —
//! at 64 writers a quarter of the two cores idled. An appended record is one sequential
//! write, and its fsync overlaps the next batch's sessions: the store alone went from ~6,000
//! to ~11,000–14,000 writes/s at 64 writers and from ~4,500 to ~10,000–12,000 at 8. The price
//! is a second durability mechanism, kept small: the log holds only row effects of batches
//! (every other write is a durable redb commit), and the rule of what a crash leaves is one
//! sentence (see [`crate::meta`]'s `durability`).
//!
//! **Stats and reads**: the gate counts batches, sessions and acknowledgements ([`GateStats`]);
//! reads use the state right after the last batch known durable and never wait for write
//! sessions — see [`visibility`] for the rules. **Storage failures** take the store out of
//! service until the committer has reopened it (a failed *fsync* ends the process instead):
//! see [`outage`]. **Panics** in a session or a job are caught per session and answered
//! `Internal` to that caller alone: see [`jobs`].
//!
//! One concept a file: [`jobs`] what the committer runs and how callers are answered,
//! [`visibility`] what readers see and whether the shards serve, [`commit_loop`] the
//! committer's loop of batches, [`handoff`] the lone-batch hand-off, [`acknowledger`] the
//! thread that makes batches durable and answers them, [`checkpoint_cadence`] when the file
//! itself is made durable, and [`outage`] a storage failure and the recovery from it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{Error, Result};
use crate::meta::{MetaStore, Namespace, ReadView, Tables, WriteView};
use crate::provider_log::LogWriter;
use crate::shard::fence::Fence;

mod acknowledger;
mod checkpoint_cadence;
mod commit_loop;
mod handoff;
mod jobs;
mod outage;
mod visibility;

use commit_loop::commit_loop;
use jobs::{Answer, Job, caught, out_of_service};
pub use visibility::GateStats;
use visibility::{Slot, Visible};

/// The single writer of one store: a thread that runs the write sessions of every shard
/// whose tables live in that store, in batches (see the module doc). A node runs one for its
/// node file; a standalone store (tests) gets its own through [`Gate::new`].
pub struct Committer {
    slot: Arc<Slot>,
    /// `None` only while dropping: closing the queue ends the committer.
    queue: Option<mpsc::UnboundedSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Closed when the committer thread has ended, for whatever reason, after its
    /// [`Stopped`] guard took the shards out of service (see [`Committer::stopped`]).
    ended: watch::Receiver<()>,
}

/// Dropped last on the committer thread, however it ends (its queue closed, or a panic
/// outside any session): from then on no write can succeed, so every shard on it reports not
/// serving — for good, since only the committer ever reports serving again.
struct Stopped {
    slot: Arc<Slot>,
    name: String,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.slot.serving.send_replace(false);
        if std::thread::panicking() {
            tracing::error!(
                store = %self.name,
                "the committer panicked outside any session and stopped: every write of this \
                 node's shards fails and they report not serving; restart the node (a restart \
                 replays the redo log)"
            );
        }
    }
}

impl Drop for Committer {
    /// Closes the queue and waits for the committer to finish the sessions already queued,
    /// so the database is closed cleanly once the last gate on it is gone.
    fn drop(&mut self) {
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The command gate of one shard: its namespace in a store, the store's committer, and the
/// fence its write sessions pass.
pub struct Gate {
    committer: Arc<Committer>,
    ns: Namespace,
    /// Checked around every write session (see [`crate::shard::fence`]).
    fence: Fence,
}

impl Committer {
    /// Starts the committer thread of `meta`; it ends when the last gate on it is dropped.
    pub fn start(meta: MetaStore, name: String) -> Arc<Committer> {
        Committer::start_with(meta, name, None)
    }

    /// [`Committer::start`] with `--metadata-durability provider`: every batch is also made
    /// durable in the node's log stream through `replica` before it is shown or answered.
    pub fn start_with(
        meta: MetaStore,
        name: String,
        replica: Option<Arc<LogWriter>>,
    ) -> Arc<Committer> {
        let mut slot = Slot::new();
        slot.replica = replica;
        let slot = Arc::new(slot);
        let meta = Arc::new(meta);
        slot.set(Some(meta.clone()));
        let (queue, jobs) = mpsc::unbounded_channel();
        let wake = queue.downgrade();
        let committer_slot = slot.clone();
        let (ended_tx, ended) = watch::channel(());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                // Dropped in reverse order: the guard first, then `ended` closes.
                let _ended = ended_tx;
                let _stopped = Stopped {
                    slot: committer_slot.clone(),
                    name: name.clone(),
                };
                commit_loop(&committer_slot, &name, meta, jobs, wake)
            })
            .expect("spawn the committer");
        Arc::new(Committer {
            slot,
            queue: Some(queue),
            thread: Some(thread),
            ended,
        })
    }

    /// Resolves once the committer thread has ended (and its shards report not serving). While
    /// the committer is alive this happens only if it panicked outside a session: the node
    /// can then write nothing until it is restarted.
    pub async fn stopped(&self) {
        let mut ended = self.ended.clone();
        while ended.changed().await.is_ok() {}
    }

    /// Follows whether the shards on this committer serve (see [`Gate::serving`]).
    pub fn watch_serving(&self) -> watch::Receiver<bool> {
        self.slot.serving.subscribe()
    }

    /// Runs `f` on a snapshot of namespace `ns` as last committed.
    pub fn read<T>(&self, ns: Namespace, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        self.visible()?.snapshot.read_in(ns, f)
    }

    /// The snapshot readers see now (the lock is released at once).
    fn visible(&self) -> Result<Arc<Visible>> {
        self.slot.visible.read().clone().ok_or_else(out_of_service)
    }

    /// What the committer has done (see [`GateStats`]).
    pub fn stats(&self) -> GateStats {
        let c = &self.slot.stats;
        GateStats {
            batches: c.batches.load(Ordering::Acquire),
            sessions: c.sessions.load(Ordering::Acquire),
            acknowledged: c.acknowledged.load(Ordering::Acquire),
        }
    }

    /// Durable commits (fsyncs) of the store in service, since it was opened (a reopen
    /// after a storage failure starts again from zero).
    pub fn durable_commits(&self) -> u64 {
        self.slot
            .store
            .read()
            .as_ref()
            .map_or(0, |s| s.durable_commits())
    }

    /// Commits of any kind of the store in service, since it was opened: fewer than its
    /// batches while the committer holds its transaction across them.
    pub fn commits(&self) -> u64 {
        self.slot.store.read().as_ref().map_or(0, |s| s.commits())
    }

    /// The sequence number the next batch will take (see [`MetaStore::next_seq`]); 0 while
    /// the store is out of service.
    pub fn next_seq(&self) -> u64 {
        self.slot.store.read().as_ref().map_or(0, |s| s.next_seq())
    }

    /// The node's log stream writer, in provider durability.
    pub fn replica(&self) -> Option<&Arc<LogWriter>> {
        self.slot.replica.as_ref()
    }

    /// Appends to the redo log of the store in service (each one fsync making every batch
    /// queued behind it durable), since it was opened.
    pub fn log_syncs(&self) -> u64 {
        self.slot.store.read().as_ref().map_or(0, |s| s.log_syncs())
    }

    /// True if namespace `ns` has tables in the state readers see (see [`MetaStore::holds`]),
    /// so that a `holds` and a [`Committer::read`] after it agree.
    pub fn holds(&self, ns: Namespace) -> Result<bool> {
        Ok(self.visible()?.snapshot.holds(ns)?)
    }

    fn send(&self, job: Job) -> Result<()> {
        self.queue
            .as_ref()
            .expect("queue is open until drop")
            .send(job)
            // The queue is open until the committer is dropped: closed here means its thread
            // ended (see `Stopped`).
            .map_err(|_| {
                Error::Unavailable(
                    "the node's metadata committer has stopped (see the node's log); writes \
                     fail until the node is restarted"
                        .into(),
                )
            })
    }

    /// Runs `f` on the committer thread between two sessions — the store's single writer,
    /// with no write session open — and answers with its outcome. For work on a whole
    /// namespace (a checkpoint's copy, a load's import); the batch's stats count it as a
    /// session that committed nothing.
    pub async fn exclusive<T: Send + 'static>(
        &self,
        f: impl FnOnce(&MetaStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        let job = Job::Exclusive(Box::new(move |store| {
            let outcome = match store {
                // Caught like a session's panic (see the module doc); a job runs outside any
                // transaction, and the transaction it opens is aborted as it unwinds.
                Some(meta) => caught("an exclusive job", || f(meta)),
                None => Err(out_of_service()),
            };
            // `f` makes what it relies on durable itself.
            let answer: Answer = Box::new(move |_| {
                let _ = tx.send(outcome);
            });
            answer
        }));
        self.send(job)?;
        rx.await
            .map_err(|_| Error::Internal("exclusive job was dropped".into()))?
    }
}

impl Gate {
    /// A gate on a standalone store with its own committer (tests, tools).
    pub fn new(meta: MetaStore, name: String, fence: Fence) -> Gate {
        Gate::on(Committer::start(meta, name), Tables::canonical(), fence)
    }

    /// Shard gate on a shared committer: the shard's sessions run in namespace `ns` of the
    /// committer's store, batched with every other shard's.
    pub fn on(committer: Arc<Committer>, ns: Namespace, fence: Fence) -> Gate {
        Gate {
            committer,
            ns,
            fence,
        }
    }

    /// False during a storage outage, and for good once the committer stopped (see the
    /// module doc): true only while writes can succeed.
    pub fn serving(&self) -> bool {
        *self.committer.slot.serving.borrow()
    }

    /// Resolves once the committer behind this gate has stopped (see [`Committer::stopped`]).
    pub async fn stopped(&self) {
        self.committer.stopped().await
    }

    /// The committer's counters (shared by every shard on it). A caller that was answered
    /// sees its own batch counted.
    pub fn stats(&self) -> GateStats {
        self.committer.stats()
    }

    /// Waits until [`Gate::serving`] equals `serving`.
    pub async fn wait_serving(&self, serving: bool) {
        let mut rx = self.committer.slot.serving.subscribe();
        let _ = rx.wait_for(|s| *s == serving).await;
    }

    /// Runs `f` on a snapshot of the last committed state; never waits for write sessions.
    pub async fn read<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        self.read_now(f)
    }

    /// [`Gate::read`] for synchronous callers (a read never blocks on the committer).
    pub fn read_now<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        self.committer.read(self.ns, f)
    }

    /// A read whose answer goes to a client: answered only if, after its snapshot was taken
    /// and `f` ran on it, this node may still acknowledge the shard at the epoch that snapshot
    /// holds — check 3 of the writes (see [`crate::shard::fence`]), now for reads. Without it
    /// a read that took its snapshot and was then paused (a stall, SIGSTOP past the lease)
    /// could answer from the old owner's state after another node took the shard and
    /// acknowledged a newer write: a stale read. An answer of `f` that is an error (NotFound)
    /// is fenced too: it is as stale as a value. Internal readers (reconciler, inventory,
    /// health, checkpoints), which answer no client, use [`Gate::read`].
    pub async fn read_fenced<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        self.read_fenced_now(f)
    }

    /// [`Gate::read_fenced`] for synchronous callers.
    pub fn read_fenced_now<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        let (answer, epoch) = self.committer.read(self.ns, |r| Ok((f(r), r.epoch()?)))?;
        self.fence.check_read(epoch)?;
        answer
    }

    /// Runs `f` as one exclusive write session and answers once it is durable (or, when `f`
    /// fails, once it was rolled back — a failed session changes nothing). The session runs
    /// to completion even if the caller stops waiting.
    ///
    /// Fenced: the node must own the shard at the epoch the store holds, checked before,
    /// inside and after the session (see [`crate::shard::fence`]).
    pub async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriteView) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.fence.prepare().await?;
        let fence = self.fence.clone();
        self.submit(
            move |w: &mut WriteView| {
                fence.check(w)?;
                f(w)
            },
            true,
        )
        .await
    }

    /// Records the node's ownership epoch in the store when the node takes the shard: the one
    /// session without the in-session check (the store still holds the previous owner's
    /// epoch), run before any other. The epoch only grows ([`WriteView::set_epoch`]); the
    /// answer still waits for the node to hold the shard after the fsync.
    pub async fn adopt_epoch(&self) -> Result<u64> {
        let epoch = self.fence.holding_epoch()?;
        self.submit(
            move |w: &mut WriteView| {
                w.set_epoch(epoch)?;
                Ok(epoch)
            },
            false,
        )
        .await
    }

    /// Queues one session; `acknowledged_only_if_owner` is check 3 of the fence (for
    /// [`Gate::adopt_epoch`] the holding epoch is re-checked instead).
    async fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriteView) -> Result<T> + Send + 'static,
        acknowledged_only_if_owner: bool,
    ) -> Result<T> {
        let fence = self.fence.clone();
        let ns = self.ns;
        let (tx, rx) = oneshot::channel();
        let enqueued = std::time::Instant::now();
        let job = Job::Session(Box::new(move |batch| {
            crate::metrics::metrics()
                .gate_queue_wait
                .observe(enqueued.elapsed().as_secs_f64());
            let Some(batch) = batch else {
                let answer: Answer = Box::new(move |_| {
                    let _ = tx.send(Err(out_of_service()));
                });
                return (false, answer);
            };
            // A panic is caught inside the session, so the batch undoes it like a failed
            // session and the others of the batch go on (see the module doc).
            let outcome = batch.session(ns, |w| caught("a write session", || f(w)));
            let committed = outcome.is_ok();
            let answer: Answer = Box::new(move |flushed| {
                let _ = tx.send(match (outcome, flushed) {
                    (Err(e), _) => Err(e),
                    (Ok(v), Ok(())) if acknowledged_only_if_owner => {
                        fence.still_owner().map(|()| v)
                    }
                    (Ok(v), Ok(())) => fence.holding_epoch().map(|_| v),
                    (Ok(_), Err(e)) => Err(Error::Unavailable(format!(
                        "commit failed, nothing was acknowledged: {e}; retry"
                    ))),
                });
            });
            (committed, answer)
        }));
        self.committer.send(job)?;
        rx.await
            .map_err(|_| Error::Internal("write session was dropped".into()))?
    }

    /// Copies the shard's store to `dest` and returns the copy's size: a consistent snapshot
    /// holding every session acknowledged before this call (and possibly later ones).
    ///
    /// Runs as a job on the committer thread, so no write session is open while it copies;
    /// the copy first makes the commits before it in the batch durable with an empty durable
    /// commit ([`MetaStore::export`]), so the file is in the state it has between batches.
    /// Sessions queued behind it wait for the copy (a handoff takes it while the shard
    /// drains). The job commits nothing; the gate's stats count it as a session.
    pub async fn snapshot_to(&self, dest: std::path::PathBuf) -> Result<u64> {
        Ok(self.snapshot_covering(dest).await?.0)
    }

    /// [`Gate::snapshot_to`], also returning the sequence number the next batch takes at the
    /// moment of the copy: the copy holds every batch numbered below it (what a checkpoint
    /// covers of the node's provider log).
    pub async fn snapshot_covering(&self, dest: std::path::PathBuf) -> Result<(u64, u64)> {
        let ns = self.ns;
        self.committer
            .exclusive(move |meta| {
                let covers = meta.next_seq();
                Ok((meta.export(ns, &dest)?, covers))
            })
            .await
    }
}

#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod tests;
