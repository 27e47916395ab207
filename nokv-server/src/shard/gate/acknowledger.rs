//! The second stage of the committer: makes batches durable and answers them, in order.
//!
//! The committer commits each batch with no fsync and hands its redo record (see
//! [`crate::meta`]'s `durability`), the snapshot that shows it, and its answers to this thread;
//! then it runs the next batch at once. This thread takes every stage queued at that moment,
//! appends their records with one write and one fsync, and only then shows readers the newest
//! snapshot and answers the callers — so one fsync serves every batch that queued behind it,
//! and the committer never waits for the disk while others wait for it. The one exception is a
//! lone batch (nothing queued behind it, nothing left here): the committer runs [`handle`] for
//! it itself, which saves a thread wake-up per put when writes come one at a time
//! (`handoff::hand_over`). The invariants below hold for both, because the committer does so only
//! when this thread has finished every stage it was handed.
//!
//! Invariants:
//! * **acknowledged ⇒ durable, and visible ⇒ durable**: a batch's answers go out, and its
//!   snapshot is shown, only after the fsync that covers its record (or a durable commit of the
//!   store that followed it);
//! * **acknowledged ⇒ visible (or refused)**: the newest snapshot is shown *before* the
//!   answers go out; if the store failed meanwhile, readers are shown nothing instead (they
//!   answer `Unavailable` until the reopened store replays the batch), never the older
//!   snapshot without it — so a caller answered OK cannot then read a state missing its own
//!   write (see `Slot::show`). The callers are still answered OK: their batch is durable, and
//!   answering `Unavailable` would make them retry a write that is already kept;
//! * **in order**: stages are handled in the order the committer sent them, so a caller is
//!   never answered before a caller of an earlier batch, and a snapshot shown always contains
//!   every batch answered before (sessions refused while a failed store is being reopened are
//!   answered by the committer at once: they changed nothing);
//! * **nothing after a failure**: once an append fails, the store's handle is failed, every
//!   later record of that handle is refused (answered `Unavailable`, never written), and the
//!   store is taken out of service until the committer reopened it — a crash or a reopen can
//!   then only keep a prefix of the batches.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::jobs::{Answer, ExclusiveJob, Job};
use super::visibility::Slot;
use crate::meta::{MetaStore, Redo, Snapshot};

/// What the committer hands over, in its order.
pub(super) enum Stage {
    /// A batch committed without fsync: durable once `record` is in the log.
    Logged {
        store: Arc<MetaStore>,
        redo: Redo,
        snapshot: Snapshot,
        answers: Vec<Answer>,
        /// Sessions of the batch that committed (acknowledged if the append succeeds).
        committed: u64,
    },
    /// Answers whose outcome is already known (a failed batch, a job between batches); the
    /// snapshot, if any, shows that job's durable writes.
    Known {
        answers: Vec<Answer>,
        outcome: Result<(), String>,
        visible: Option<(Arc<MetaStore>, Snapshot)>,
    },
    /// The store's file was made durable after every record handed over so far: the log may
    /// be emptied, and records queued before this need no append.
    Checkpoint(Arc<MetaStore>),
}

/// Runs until the committer drops its sender. `wake` lets a failed append get the committer
/// to notice the failure and reopen the store even if no session arrives.
pub(super) fn run(
    slot: &Slot,
    name: &str,
    stages: std::sync::mpsc::Receiver<Stage>,
    wake: mpsc::WeakUnboundedSender<Job>,
) {
    if let Some(replica) = slot.replica.clone() {
        return run_replicated(slot, name, stages, wake, &replica);
    }
    while let Ok(first) = stages.recv() {
        let mut round = vec![first];
        round.extend(stages.try_iter());
        let handled = round.len();
        handle(slot, name, round, &wake);
        // Only now may the committer answer a lone batch itself (see `handoff::hand_over`).
        slot.handed_over.fetch_sub(handled, Ordering::AcqRel);
    }
}

/// A round whose records are durable locally and whose segment may still be in flight.
struct InFlight {
    round: Vec<Stage>,
    /// Stages of the round (for `handed_over`).
    handled: usize,
    sent: Sent,
}

enum Sent {
    /// Known already: nothing to send, or the writer refused it (fenced, closed).
    Done(Result<(), String>),
    /// The local append failed: the store's handle is failed and must be reopened.
    LocalFailed(String),
    /// The segment's send, on the writer's runtime.
    Pending(tokio::task::JoinHandle<Result<(), String>>),
}

/// [`run`] with provider durability: each round is appended to the local log and its segment
/// prepared (its range reserved, in order) and sent; up to `--log-segments-in-flight`
/// segments travel at once, and rounds are shown and answered strictly in order, each once its own segment and
/// every earlier one were created. A failed round fails every round in flight behind it (a
/// later segment may land beyond a fence: it is never acknowledged).
fn run_replicated(
    slot: &Slot,
    name: &str,
    stages: std::sync::mpsc::Receiver<Stage>,
    wake: mpsc::WeakUnboundedSender<Job>,
    replica: &std::sync::Arc<crate::provider_log::LogWriter>,
) {
    let gather = replica.flush_interval();
    let max_in_flight = replica.in_flight();
    let mut inflight: std::collections::VecDeque<InFlight> = Default::default();
    let mut open = true;
    while open || !inflight.is_empty() {
        let mut round = Vec::new();
        if open && inflight.is_empty() {
            match stages.recv() {
                Ok(first) => round.push(first),
                Err(_) => open = false,
            }
            // `--log-flush-interval`: fewer, larger segments (fewer PUTs) for some latency.
            let until = std::time::Instant::now() + gather;
            while let Some(left) = until.checked_duration_since(std::time::Instant::now())
                && !left.is_zero()
                && open
            {
                match stages.recv_timeout(left) {
                    Ok(stage) => round.push(stage),
                    Err(_) => break,
                }
            }
        }
        if open {
            round.extend(stages.try_iter());
        }
        if !round.is_empty() {
            let handled = round.len();
            let sent = start(&round, replica);
            inflight.push_back(InFlight {
                round,
                handled,
                sent,
            });
            if inflight.len() < max_in_flight {
                continue;
            }
        }
        let Some(mut oldest) = inflight.pop_front() else {
            continue;
        };
        let local = matches!(oldest.sent, Sent::LocalFailed(_));
        let outcome = match &mut oldest.sent {
            Sent::Done(outcome) => outcome.clone(),
            Sent::LocalFailed(e) => Err(e.clone()),
            Sent::Pending(send) => {
                // While there is room for another segment, a stage handed over meanwhile
                // starts it rather than wait for this one.
                let room = open && inflight.len() + 1 < max_in_flight;
                let done = replica.runtime().block_on(async {
                    tokio::select! {
                        r = &mut *send => Some(r),
                        _ = slot.staged.notified(), if room => None,
                    }
                });
                match done {
                    Some(r) => r.unwrap_or_else(|e| Err(format!("the segment's send ended: {e}"))),
                    None => {
                        inflight.push_front(oldest);
                        continue;
                    }
                }
            }
        };
        let failed = outcome.is_err();
        finish(slot, name, oldest.round, outcome.clone(), local, &wake);
        slot.handed_over.fetch_sub(oldest.handled, Ordering::AcqRel);
        if failed {
            // Nothing behind a failed round may be acknowledged.
            let reason = outcome.err().unwrap_or_default();
            for later in inflight.drain(..) {
                if let Sent::Pending(send) = &later.sent {
                    send.abort();
                }
                let local = matches!(later.sent, Sent::LocalFailed(_));
                finish(slot, name, later.round, Err(reason.clone()), local, &wake);
                slot.handed_over.fetch_sub(later.handled, Ordering::AcqRel);
            }
        }
    }
}

/// Appends a round's records to the local log and starts sending its segment.
fn start(round: &[Stage], replica: &std::sync::Arc<crate::provider_log::LogWriter>) -> Sent {
    if let Err(e) = append(round) {
        return Sent::LocalFailed(e);
    }
    match replica.prepare(&outgoing(round)) {
        Err(e) => Sent::Done(Err(e.to_string())),
        Ok(None) => Sent::Done(Ok(())),
        Ok(Some(segment)) => {
            let writer = replica.clone();
            Sent::Pending(
                replica
                    .runtime()
                    .spawn(async move { writer.send(segment).await.map_err(|e| e.to_string()) }),
            )
        }
    }
}

/// Handles one round of stages, in order: appends their records with one fsync, then shows the
/// newest snapshot and answers. Run by this thread, or by the committer for a lone batch when
/// this thread has nothing left (see `handoff::hand_over`).
pub(super) fn handle(
    slot: &Slot,
    name: &str,
    round: Vec<Stage>,
    wake: &mpsc::WeakUnboundedSender<Job>,
) {
    let (appended, local) = match append(&round) {
        Err(e) => (Err(e), true),
        Ok(()) => (replicate(slot, &round), false),
    };
    finish(slot, name, round, appended, local, wake);
}

/// The second half of [`handle`]: once a round's outcome is known, shows the newest snapshot
/// (if it succeeded) and answers every stage, in order.
///
/// A failed *local* append (`local`) failed the store's handle: the store goes out of service
/// until the committer reopened it. A round the provider log did not take (the stream was
/// fenced, or the writer closed) leaves the store as it is: its callers are answered with the
/// error and its snapshot is never shown — readers keep the last state shown, which is
/// durable everywhere — and the node, deposed, drops every shard; a shard it takes again is
/// reloaded whole (import or restore), so the round's unacknowledged rows are never served.
fn finish(
    slot: &Slot,
    name: &str,
    round: Vec<Stage>,
    appended: Result<(), String>,
    local: bool,
    wake: &mpsc::WeakUnboundedSender<Job>,
) {
    match &appended {
        Err(reason) if local => out_of_service(slot, name, reason, wake),
        Err(reason) => {
            tracing::warn!(store = name, error = %reason, "batch not acknowledged: the provider log did not take it")
        }
        Ok(()) => {}
    }
    let newest = round.iter().rev().find_map(|s| match s {
        Stage::Logged {
            store, snapshot, ..
        } if appended.is_ok() => Some((store.clone(), snapshot.clone())),
        Stage::Known {
            visible: Some(v), ..
        } => Some(v.clone()),
        _ => None,
    });
    if let Some((store, snapshot)) = newest {
        store.faults().before_show();
        slot.show(store, snapshot);
    }
    for stage in round {
        match stage {
            Stage::Logged {
                answers, committed, ..
            } => {
                if appended.is_ok() {
                    slot.stats
                        .acknowledged
                        .fetch_add(committed, Ordering::AcqRel);
                }
                answers.into_iter().for_each(|a| a(&appended));
            }
            Stage::Known {
                answers, outcome, ..
            } => answers.into_iter().for_each(|a| a(&outcome)),
            Stage::Checkpoint(_) => {}
        }
    }
}

/// Appends the records of this round that no checkpoint already covers, with one fsync — and
/// after a checkpoint the new round's marker, even with no record to follow it (the next
/// checkpoint waits for it, see `MetaStore::checkpoint`).
fn append(round: &[Stage]) -> Result<(), String> {
    let mut pending: Vec<&crate::meta::Redo> = Vec::new();
    let mut store = None;
    for stage in round {
        match stage {
            Stage::Logged { store: s, redo, .. } => {
                pending.push(redo);
                store = Some(s);
            }
            Stage::Checkpoint(s) => {
                // Everything before is durable in the file itself.
                pending.clear();
                store = Some(s);
                s.clear_log();
            }
            Stage::Known { .. } => {}
        }
    }
    match store {
        Some(s) => s.log(&pending).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// `--metadata-durability provider`: makes the records of this round durable in the node's
/// log stream too — every one, including those a checkpoint already put in the local file —
/// before anything is shown or answered. Blocks while the provider does not take the segment;
/// fails only if the stream is fenced (this node was deposed) or the node is shutting down.
fn replicate(slot: &Slot, round: &[Stage]) -> Result<(), String> {
    let Some(replica) = &slot.replica else {
        return Ok(());
    };
    replica.append(&outgoing(round)).map_err(|e| e.to_string())
}

/// The records of a round for the provider log — every one, including those a checkpoint
/// already put in the local file.
fn outgoing(round: &[Stage]) -> Vec<crate::provider_log::Outgoing<'_>> {
    round
        .iter()
        .filter_map(|s| match s {
            Stage::Logged { redo, .. } if !redo.is_empty() => Some(crate::provider_log::Outgoing {
                seq: redo.seq(),
                payload: redo.payload(),
                shards: redo.shards(),
            }),
            _ => None,
        })
        .collect()
}

/// A failed append: readers and health see the store out of service before anyone is
/// answered, and the committer is woken to reopen it.
fn out_of_service(slot: &Slot, name: &str, reason: &str, wake: &mpsc::WeakUnboundedSender<Job>) {
    tracing::debug!(store = name, error = reason, "redo log append failed");
    slot.set(None);
    slot.serving.send_replace(false);
    if let Some(queue) = wake.upgrade() {
        let nudge: ExclusiveJob = Box::new(|_| Box::new(|_| {}));
        let _ = queue.send(Job::Exclusive(nudge));
    }
}
