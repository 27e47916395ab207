//! A storage outage of the committer's store, and the recovery from it.
//!
//! **Storage failures.** A failed *fsync* ends the process (see [`crate::meta::fatal`]): after
//! one the page cache no longer says what the disk holds, so nothing below is attempted. When a
//! commit, a flush or a log append fails at the storage level otherwise (a full disk: nothing
//! reached the disk), the handle refuses every later write — and the log every later
//! append — until the file is reopened (for every shard in it). The committer owns the
//! store, so it is the one that recovers: it answers the batch (nobody in it is acknowledged;
//! the failed sessions answer `Unavailable`, retryable with the same request id), takes the
//! store out of service (reads and writes answer `Unavailable` too), waits for in-flight reads
//! to release the old handle, and reopens the file — retrying with a capped back-off, because
//! nothing signals that space came back. Reopening lets redb recover to the last durable
//! commit and replays the log's complete records after it: together they hold every
//! acknowledged mutation.
//!
//! The shard reports itself not serving from a failure until a commit succeeds again — a
//! reopened store on a still full disk is not healthy. While it is failing and no session
//! arrives, the committer probes with a tiny commit of its own (same back-off), so an idle
//! shard recovers too. The incident is logged at ERROR once when it starts (later failures at
//! DEBUG) and at INFO when a caller's session commits again: a disk that takes the probe's few
//! bytes but not real writes stays one incident instead of a stream of errors.
//!
//! Invariants: the store is taken out of service ([`Slot::set`]`(None)`) before anyone hears
//! of a failure; the failed handle is dropped only after every reader released it, and the
//! file is reopened — replaying its log — before any session runs again; only a successful
//! commit ends the outage ([`Outage::end`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::jobs::Job;
use super::visibility::Slot;
use crate::meta::MetaStore;

/// Back-off between attempts to reopen a failed store: doubling from the first to the cap.
const REOPEN_FIRST: Duration = Duration::from_millis(10);
const REOPEN_CAP: Duration = Duration::from_secs(1);

/// The committer's view of a storage outage (see the module doc).
#[derive(Default)]
pub(super) struct Outage {
    /// When the current incident started; it ends (for logging) only when a caller's session
    /// commits, so a disk that takes the probe's few bytes but not real writes is still one
    /// incident, logged once.
    since: Option<std::time::Instant>,
    /// The last commit attempt failed: the shard reports not serving and probes while idle.
    failing: bool,
    delay: Duration,
}

impl Outage {
    pub(super) fn failing(&self) -> bool {
        self.failing
    }

    pub(super) fn begin(&mut self, slot: &Slot, name: &str, reason: &str) {
        slot.serving.send_replace(false);
        if !self.failing {
            self.delay = Duration::ZERO;
        }
        self.failing = true;
        if self.since.is_none() {
            self.since = Some(std::time::Instant::now());
            tracing::error!(
                store = name,
                error = reason,
                "metadata store failed; its shards answer Unavailable, the store is reopened and \
                 they report not serving until a commit succeeds again"
            );
        } else {
            tracing::debug!(store = name, error = reason, "metadata store still failing");
        }
    }

    /// A commit succeeded: the shard serves again. `by_caller` ends the incident.
    pub(super) fn end(&mut self, slot: &Slot, name: &str, by_caller: bool) {
        if self.failing {
            self.failing = false;
            slot.serving.send_replace(true);
            tracing::debug!(store = name, "metadata store commits again");
        }
        if by_caller && let Some(since) = self.since.take() {
            tracing::info!(store = name, after = ?since.elapsed(), "metadata store recovered");
        }
    }

    /// The capped, doubling back-off between attempts.
    pub(super) fn next_delay(&mut self) -> Duration {
        self.delay = (self.delay * 2).clamp(REOPEN_FIRST, REOPEN_CAP);
        self.delay
    }
}

/// Reopens a failed store: waits for readers (and the acknowledger) to release it, then opens
/// the file again — which replays its log — until that succeeds, refusing queued sessions
/// meanwhile. Returns `None` if the queue closed (the gate is being dropped) before the store
/// came back. The outage stays open: only a successful commit ends it.
pub(super) fn recover(
    slot: &Slot,
    name: &str,
    mut failed: Arc<MetaStore>,
    jobs: &mut mpsc::UnboundedReceiver<Job>,
    outage: &mut Outage,
) -> Option<Arc<MetaStore>> {
    slot.set(None);
    let reopen = failed.reopener();
    let refuse_queued = |jobs: &mut mpsc::UnboundedReceiver<Job>| loop {
        match jobs.try_recv() {
            Ok(job) => job.refuse()(&Ok(())),
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    };
    // Reads hold a clone only for the length of one synchronous closure.
    loop {
        match Arc::try_unwrap(failed) {
            Ok(store) => break drop(store),
            Err(still_shared) => {
                failed = still_shared;
                if !refuse_queued(jobs) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    loop {
        if !refuse_queued(jobs) {
            return None;
        }
        match reopen.open() {
            Ok(store) => {
                let store = Arc::new(store);
                slot.set(Some(store.clone()));
                tracing::debug!(store = name, "metadata store reopened");
                return Some(store);
            }
            Err(e) => tracing::debug!(store = name, error = %e, "reopen failed"),
        }
        std::thread::sleep(outage.next_delay());
    }
}
