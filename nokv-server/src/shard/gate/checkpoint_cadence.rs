//! When the committer makes the file itself durable and the redo log begins a new round
//! (`MetaStore::checkpoint`).
//!
//! Invariants: a checkpoint is due only once the current round holds a record (an idle store
//! makes no durable commits); it is due after [`CHECKPOINT_EVERY`] or once the round's records
//! reach its budget (`MetaStore::log_budget`, sized from the free space when the round began),
//! whichever comes first. A new round — after a checkpoint, or after a reopen that replayed the
//! log — starts a fresh [`Checkpoint`].

use std::time::Duration;

/// How long the log may grow before the committer makes the file itself durable and the log
/// begins a new round: bounds replay at start-up and the pages redb keeps between durable commits.
/// The log's size is bounded too, by the free space (`MetaStore::log_budget`): a reopen after
/// a full disk replays the log into the file, and a few MiB freed must be enough for the
/// store to come back by itself.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// When the committer next makes the file durable (see [`CHECKPOINT_EVERY`]).
pub(super) struct Checkpoint {
    since: std::time::Instant,
    bytes: usize,
    /// Record bytes this round of the log may take, sized when it began.
    budget: usize,
}

impl Checkpoint {
    pub(super) fn new(budget: usize) -> Self {
        Checkpoint {
            since: std::time::Instant::now(),
            bytes: 0,
            budget,
        }
    }

    pub(super) fn logged(&mut self, bytes: usize) {
        self.bytes += bytes;
    }

    pub(super) fn due(&self) -> bool {
        self.bytes > 0 && (self.since.elapsed() >= CHECKPOINT_EVERY || self.bytes >= self.budget)
    }
}
