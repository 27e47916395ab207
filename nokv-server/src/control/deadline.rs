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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic deadline, extended by confirmed keep-alives and read lock-free.
#[derive(Debug)]
pub struct AckDeadline {
    origin: Instant,
    /// Nanoseconds after `origin`; 0 means "already passed" (nothing confirmed yet).
    until_nanos: AtomicU64,
    /// Set by [`AckDeadline::revoke`] and never cleared: a revoked lease is gone for good, so
    /// a keep-alive confirmation racing with the revocation cannot revive it.
    revoked: AtomicBool,
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
            revoked: AtomicBool::new(false),
            moved: tokio::sync::Notify::new(),
        }
    }

    fn nanos_of(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// True while now is before the deadline and it was never revoked. Two atomic loads and a
    /// monotonic clock read.
    pub fn allows(&self) -> bool {
        !self.revoked.load(Ordering::Acquire)
            && self.nanos_of(Instant::now()) < self.until_nanos.load(Ordering::Acquire)
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

    /// Ends acknowledgement at once and for good (lease lost or revoked).
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
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
            if !self.allows() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = notified => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3600);
    const MARGIN: Duration = Duration::from_secs(60);

    #[test]
    fn nothing_is_acknowledged_before_the_first_confirmation_or_after_a_revocation() {
        let deadline = AckDeadline::new();
        assert!(!deadline.allows());
        deadline.extend(Instant::now(), TTL, MARGIN);
        assert!(deadline.allows());
        deadline.revoke();
        assert!(!deadline.allows());
        // A confirmation racing with the revocation does not revive it.
        deadline.extend(Instant::now(), TTL, MARGIN);
        assert!(!deadline.allows());
    }

    #[test]
    fn a_late_confirmation_of_an_older_keep_alive_never_moves_the_deadline_back() {
        let deadline = AckDeadline::new();
        let older = Instant::now();
        let newer = older + Duration::from_secs(5);
        deadline.extend(newer, TTL, MARGIN);
        deadline.extend(older, TTL, MARGIN);
        assert_eq!(deadline.until(), newer + TTL - MARGIN);
    }

    #[test]
    fn the_deadline_counts_from_the_send_time_minus_the_margin() {
        let deadline = AckDeadline::new();
        let sent = Instant::now();
        // A confirmed life shorter than the margin proves nothing.
        deadline.extend(sent, MARGIN, MARGIN);
        assert!(!deadline.allows());
        deadline.extend(sent, TTL, MARGIN);
        assert_eq!(deadline.until(), sent + TTL - MARGIN);
    }
}
