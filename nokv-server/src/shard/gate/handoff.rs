//! The lone-batch hand-off: the committer gives each batch's stage to the acknowledger, or —
//! for a lone batch — does the acknowledger's work for it itself ([`hand_over`]).
//!
//! Invariant: the committer answers a batch itself only if it is committed (`Logged`), nobody
//! waits behind it, and the acknowledger has finished every stage handed to it
//! ([`answers_here`]): records then still reach the log in batch order, and "acknowledged ⇒
//! durable, visible ⇒ durable" holds exactly as in [`super::acknowledger`].

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::acknowledger::{self, Stage};
use super::jobs::Job;
use super::visibility::Slot;

/// Batches the committer hands to the acknowledger, lone or not, after a session arrived while
/// it answered a lone batch itself (see [`hand_over`]).
pub(super) const LONE_BACKOFF: u32 = 64;

/// Gives a batch's stage to the [`acknowledger`] — or, for a lone batch, does the
/// acknowledger's work for it right here: appends its record, fsyncs, shows its snapshot and
/// answers its callers.
///
/// Why: at one client every put is a batch of its own, and handing it to the acknowledger costs
/// a thread wake-up and a sleep per put for nothing (there is no next batch to overlap the fsync
/// with); doing it here took 13 % off the daemon's CPU per lone put (docs/architecture.md).
/// But when writes come faster than one per fsync, a session that arrives during that fsync
/// waits for it instead of running its own batch meanwhile — the probe's eight agents in a
/// tool loop lost 2-14 % of their operations to it. So once a session arrived while the
/// committer answered a lone batch, it hands the next [`LONE_BACKOFF`] batches over whatever
/// they are: a lone batch is answered here again only after that many batches. Returns whether
/// the batch was answered here.
///
/// Invariant: the committer does it itself only for a committed batch (`Logged`) when no job
/// is queued (`lone`: nobody waits behind this fsync) **and** the acknowledger has finished
/// every stage handed to it. Then no earlier record can still be unwritten, so records reach the
/// log in batch order and "acknowledged ⇒ durable, visible ⇒ durable" holds exactly as in
/// [`acknowledger`]; and since only the committer hands stages over, nothing can be handed over
/// between the check and the append. Otherwise the stage is queued behind the others.
pub(super) fn hand_over(
    slot: &Slot,
    name: &str,
    stage: Stage,
    lone: bool,
    stages: &std::sync::mpsc::Sender<Stage>,
    nudge: &mpsc::WeakUnboundedSender<Job>,
) -> bool {
    let handed_over = slot.handed_over.load(Ordering::Acquire);
    // With the provider log a batch waits for a PUT: the committer never waits for it itself.
    if slot.replica.is_none() && answers_here(&stage, lone, handed_over) {
        acknowledger::handle(slot, name, vec![stage], nudge);
        true
    } else {
        slot.handed_over.fetch_add(1, Ordering::AcqRel);
        let _ = stages.send(stage);
        slot.staged.notify_one();
        false
    }
}

/// The rule of [`hand_over`]: a committed, lone batch (no job queued behind it and not backing
/// off, see `run_batches`), and nothing handed to the acknowledger that it has not finished.
pub(super) fn answers_here(stage: &Stage, lone: bool, handed_over: usize) -> bool {
    lone && handed_over == 0 && matches!(stage, Stage::Logged { .. })
}
