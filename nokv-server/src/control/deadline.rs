//! The "may acknowledge until" deadline of a node holding an etcd lease.
//!
//! etcd expires a lease TTL seconds after it *received* the last keep-alive. The node cannot
//! know that instant, but it knows when it *sent* the request that was acknowledged, which is
//! earlier; so `sent + TTL − margin` is a lower bound of the lease's life minus a safety margin
//! (for clock-rate drift and the time between checking and acknowledging). Past it the node
//! acknowledges nothing (fail closed) until a new keep-alive is confirmed.
//!
//! The deadline is a monotonic instant stored as nanoseconds since a process-local origin in an
//! `AtomicU64`: the write path reads it with one atomic load, no lock, no await.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic deadline, extended by confirmed keep-alives and read lock-free.
#[derive(Debug)]
pub struct AckDeadline {
    origin: Instant,
    /// Nanoseconds after `origin`; 0 means "already passed" (nothing confirmed yet).
    until_nanos: AtomicU64,
    /// Wakes waiters of [`AckDeadline::passed`] when the deadline moves.
    moved: tokio::sync::Notify,
}

impl Default for AckDeadline {
    fn default() -> Self {
        Self::new()
    }
}

impl AckDeadline {
    /// A deadline that has already passed: nothing may be acknowledged until [`extend`] runs.
    ///
    /// [`extend`]: AckDeadline::extend
    pub fn new() -> AckDeadline {
        AckDeadline {
            origin: Instant::now(),
            until_nanos: AtomicU64::new(0),
            moved: tokio::sync::Notify::new(),
        }
    }

    fn nanos_of(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// True while now is before the deadline. One atomic load and a monotonic clock read.
    pub fn allows(&self) -> bool {
        self.nanos_of(Instant::now()) < self.until_nanos.load(Ordering::Acquire)
    }

    /// The current deadline (may be in the past).
    pub fn until(&self) -> Instant {
        self.origin + Duration::from_nanos(self.until_nanos.load(Ordering::Acquire))
    }

    /// A keep-alive sent at `sent` was confirmed with `ttl` left: the lease lives at least until
    /// `sent + ttl`; acknowledge until `sent + ttl − margin`. Never moves the deadline back
    /// (an older confirmation arriving late proves less than a newer one).
    pub fn extend(&self, sent: Instant, ttl: Duration, margin: Duration) {
        let until = self.nanos_of(sent + ttl.saturating_sub(margin));
        self.until_nanos.fetch_max(until, Ordering::AcqRel);
        self.moved.notify_waiters();
    }

    /// Ends acknowledgement at once (lease lost or revoked).
    pub fn revoke(&self) {
        self.until_nanos.store(0, Ordering::Release);
        self.moved.notify_waiters();
    }

    /// Resolves at the next extension or revocation (for observers; the write path reads
    /// [`allows`](AckDeadline::allows)).
    pub async fn moved(&self) {
        self.moved.notified().await
    }

    /// Resolves once the deadline has passed without being extended in time: the signal for
    /// "stop serving every shard now".
    pub async fn passed(&self) {
        loop {
            let notified = self.moved.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let until = self.until();
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = notified => {}
            }
        }
    }
}
