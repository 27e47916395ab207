//! The committer thread: takes every session queued at that moment as one batch, runs the
//! batch in the transaction it holds open across batches, hands the batch to be made durable
//! ([`super::handoff`]), and between batches runs exclusive jobs, checkpoints
//! ([`super::checkpoint_cadence`]) and, after a storage failure, the recovery
//! ([`super::outage`]).
//!
//! Invariants:
//! * between batches the store in service has not failed: a failure takes it out of service
//!   before anyone is answered, and it is reopened before the next session runs;
//! * a batch is at most [`MAX_BATCH`] sessions, all of them write sessions: an exclusive job
//!   met while taking a batch runs next, alone, after the held transaction is committed;
//! * the held transaction is committed ([`release`]) before the store is used for anything
//!   but a batch (a job, a checkpoint, a probe) or closed;
//! * the batch's stats are counted before any of its callers is answered.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::acknowledger::{self, Stage};
use super::checkpoint_cadence::Checkpoint;
use super::handoff::{LONE_BACKOFF, hand_over};
use super::jobs::{Job, SessionJob};
use super::outage::{Outage, recover};
use super::visibility::Slot;
use crate::meta::{Batch, Commit, MetaStore, Tables};

/// Sessions taken into one batch at most (bounds the latency of the batch's first session).
const MAX_BATCH: usize = 64;

/// Runs the committer: starts the [`acknowledger`], runs batches until the queue closes, then
/// lets the acknowledger finish and makes the file durable (every record left in the log is
/// then in the file too, and skipped at the next open).
pub(super) fn commit_loop(
    slot: &Arc<Slot>,
    name: &str,
    meta: Arc<MetaStore>,
    jobs: mpsc::UnboundedReceiver<Job>,
    wake: mpsc::WeakUnboundedSender<Job>,
) {
    let (stages, staged) = std::sync::mpsc::channel();
    let nudge = wake.clone();
    let ack_slot = slot.clone();
    let ack_name = name.to_string();
    let acknowledger = std::thread::Builder::new()
        .name(format!("{name}-ack"))
        .spawn(move || acknowledger::run(&ack_slot, &ack_name, staged, wake))
        .expect("spawn the acknowledger");
    let last = run_batches(slot, name, meta, jobs, &stages, &nudge);
    drop(stages);
    let _ = acknowledger.join();
    if let Some(meta) = last
        && meta.failure().is_none()
        && let Err(e) = meta.flush()
    {
        tracing::warn!(store = name, error = %e, "final checkpoint failed; the log is replayed at the next open");
    }
}

/// Runs batches until the queue closes and returns the store in service then. Invariant:
/// between batches `meta` has not failed; a failure takes it out of service until [`recover`]
/// reopened it.
fn run_batches(
    slot: &Slot,
    name: &str,
    mut meta: Arc<MetaStore>,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    stages: &std::sync::mpsc::Sender<Stage>,
    nudge: &mpsc::WeakUnboundedSender<Job>,
) -> Option<Arc<MetaStore>> {
    let mut outage = Outage::default();
    // An exclusive job met while a batch was being taken: it runs next, alone.
    let mut carry: Option<Job> = None;
    // Batches to hand over before the committer answers a lone one itself again.
    let mut handing_over: u32 = 0;
    let mut checkpoint = Checkpoint::new(meta.log_budget());
    // The transaction held open across batches (see `meta`'s `overlay`): committed before
    // anything but a batch uses the store, given up (and the store reopened) on a failure.
    let mut held: Option<Batch> = None;
    loop {
        let first = if let Some(job) = carry.take() {
            Some(job)
        } else if outage.failing() {
            match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    release(&mut held);
                    return Some(meta);
                }
                // Idle during an outage: probe (after the back-off) instead of waiting.
                Err(mpsc::error::TryRecvError::Empty) => {
                    std::thread::sleep(outage.next_delay());
                    None
                }
            }
        } else {
            match jobs.blocking_recv() {
                Some(job) => Some(job),
                None => {
                    release(&mut held);
                    return Some(meta);
                }
            }
        };
        let Some(first) = first else {
            release(&mut held);
            // The probe's counter lives in the canonical namespace, which a node file's
            // shards never use.
            let probe = meta.write_in(Tables::canonical(), Commit::Durable, |w| {
                w.next_sequence("store-probe").map(drop)
            });
            match probe {
                Ok(()) => outage.end(slot, name, false),
                Err(e) => {
                    outage.begin(slot, name, &e.to_string());
                    meta = recover(slot, name, meta, &mut jobs, &mut outage)?;
                    // The reopen replayed the log durably: a new round begins.
                    checkpoint = Checkpoint::new(meta.log_budget());
                }
            }
            continue;
        };
        let (stage, sessions, committed) = match first {
            Job::Exclusive(job) => {
                release(&mut held);
                let answer = job(Some(&meta));
                // The job made its writes durable itself; readers may see them now.
                let visible = meta.snapshot().ok().map(|s| (meta.clone(), s));
                let stage = Stage::Known {
                    answers: vec![answer],
                    outcome: Ok(()),
                    visible,
                };
                (stage, 1, 0)
            }
            Job::Session(job) => {
                let mut batch = vec![job];
                while batch.len() < MAX_BATCH {
                    match jobs.try_recv() {
                        Ok(Job::Session(job)) => batch.push(job),
                        Ok(other) => {
                            carry = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let sessions = batch.len();
                let (stage, committed) = run_batch(&meta, batch, &mut held);
                (stage, sessions, committed)
            }
        };
        let failure = meta.failure();
        if let Some(reason) = &failure {
            // Out of service before anyone hears of the failure, so that callers (and
            // health) see a consistent state from then on.
            slot.set(None);
            outage.begin(slot, name, reason);
        } else if committed > 0 {
            outage.end(slot, name, true);
        }
        crate::metrics::metrics()
            .gate_batch_sessions
            .observe(sessions as f64);
        slot.stats.batches.fetch_add(1, Ordering::AcqRel);
        slot.stats
            .sessions
            .fetch_add(sessions as u64, Ordering::AcqRel);
        if let Stage::Logged { redo, .. } = &stage {
            checkpoint.logged(redo.len());
        }
        // Answered after the fsync that makes the batch durable. Lone: no job waits behind it
        // (neither queued nor carried over), and none came during the last fsync run here.
        let lone = carry.is_none() && jobs.is_empty() && handing_over == 0;
        handing_over = handing_over.saturating_sub(1);
        if hand_over(slot, name, stage, lone, stages, nudge) && !jobs.is_empty() {
            handing_over = LONE_BACKOFF;
        }
        if failure.is_none() && checkpoint.due() && meta.ready_for_checkpoint() {
            release(&mut held);
            match meta.checkpoint() {
                Ok(false) => {}
                Ok(true) => {
                    checkpoint = Checkpoint::new(meta.log_budget());
                    slot.handed_over.fetch_add(1, Ordering::AcqRel);
                    let _ = stages.send(Stage::Checkpoint(meta.clone()));
                    slot.staged.notify_one();
                }
                Err(e) => {
                    slot.set(None);
                    outage.begin(slot, name, &e.to_string());
                }
            }
        }
        if let Some(reason) = meta.failure() {
            // The held transaction goes with the handle: the reopen replays its batches.
            drop(held.take());
            // Also a failure the acknowledger met (a log append) after this batch was checked:
            // the outage must be open, or the shard would never report serving again.
            slot.set(None);
            outage.begin(slot, name, &reason);
            meta = recover(slot, name, meta, &mut jobs, &mut outage)?;
            checkpoint = Checkpoint::new(meta.log_budget());
        }
    }
}

/// Runs the sessions of one batch in the committer's transaction (`held`, or a new one) and,
/// if any session committed (a failed session was undone inside it, see [`Batch`]), ends the
/// batch for the acknowledger to make durable: committing the transaction without fsync once
/// it is full, holding it open for the next batch otherwise (readers see held batches through
/// the memtable, see `meta`'s `overlay`). Returns the batch's stage and how many sessions
/// committed.
fn run_batch(
    meta: &Arc<MetaStore>,
    sessions: Vec<SessionJob>,
    held: &mut Option<Batch>,
) -> (Stage, u64) {
    let batch = match held.take() {
        Some(b) => Ok(b),
        None => meta.batch(),
    };
    let mut batch = match batch {
        Ok(b) => b,
        Err(e) => {
            let answers = sessions.into_iter().map(|s| s(None).1).collect();
            let stage = Stage::Known {
                answers,
                outcome: Err(e.to_string()),
                visible: None,
            };
            return (stage, 0);
        }
    };
    let mut answers = Vec::with_capacity(sessions.len());
    let mut committed = 0;
    for session in sessions {
        let (ok, answer) = session(Some(&mut batch));
        committed += u64::from(ok);
        answers.push(answer);
    }
    if committed == 0 {
        // Nothing of this batch to keep (its sessions undid themselves). A transaction that
        // holds earlier batches stays held — unless an undo failed in it, when it is given up
        // and the store reopened; a fresh one is simply aborted.
        if batch.poisoned() {
            batch.abandon();
        } else if batch.holds_batches() {
            *held = Some(batch);
        }
        let stage = Stage::Known {
            answers,
            outcome: Ok(()),
            visible: None,
        };
        return (stage, 0);
    }
    let logged = if batch.full() {
        batch.commit_logged()
    } else {
        let logged = batch.log();
        match logged {
            Ok(_) => *held = Some(batch),
            // Never dropped while it holds batches (see `Batch::abandon`).
            Err(_) => batch.abandon(),
        }
        logged
    };
    match logged {
        Ok(logged) => {
            let stage = Stage::Logged {
                store: meta.clone(),
                redo: logged.redo,
                snapshot: logged.snapshot,
                answers,
                committed,
            };
            (stage, committed)
        }
        Err(e) => {
            let stage = Stage::Known {
                answers,
                outcome: Err(e.to_string()),
                visible: None,
            };
            (stage, committed)
        }
    }
}

/// Commits the held transaction, if any, before the store is used for anything but a batch
/// (a job, a checkpoint, a probe) or closed. A failed commit fails the store's handle, which
/// the committer then reopens: the log holds every batch the transaction did.
fn release(held: &mut Option<Batch>) {
    if let Some(batch) = held.take()
        && let Err(e) = batch.commit()
    {
        tracing::debug!(error = %e, "committing the held transaction failed");
    }
}
