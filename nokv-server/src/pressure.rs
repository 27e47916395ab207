//! Interactive pressure: how many interactive requests (the Workspace small-file RPCs `Stat`,
//! `List`, `Read`, `Write`, `Delete`, and the agent operations `Edit`, `Append`, `Find`,
//! `Grep`) this node is serving right now, and when the last one ended. Bulk work (see [`crate::bulk`]) reads it to decide whether to run at full speed or
//! yield.
//!
//! Counted by one tower layer ([`PressureLayer`], installed in `server.rs`), so no handler
//! changes: a request counts from the moment its headers reach the service stack until its
//! response headers are ready, which includes every wait it has (committer queue, CPU). The
//! count is carried by a guard inside the response future, so a cancelled request (client gone,
//! deadline) stops counting when tonic drops its future: the count can never leak upward.
//! Artifact RPCs (BeginUpload, PutBlock, ReadBlock, ...) and Admin are not interactive: they
//! are what yields.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// How long after the last interactive request ended the node still counts as pressured. A tool
/// loop's next request follows its previous one within well under a millisecond, so a gap
/// shorter than this is the same burst of interactive work, not a quiet node.
pub const QUIET: Duration = Duration::from_millis(20);

/// The node's interactive pressure. Lock-free: entering and leaving cost an atomic each.
#[derive(Debug)]
pub struct Pressure {
    in_flight: AtomicUsize,
    /// When the last interactive request ended, as nanoseconds since `epoch` (+1, so that 0
    /// means "never").
    last_end: AtomicU64,
    epoch: Instant,
    /// How long the node stays pressured after the last request ended ([`QUIET`]).
    quiet: Duration,
    /// Woken whenever the in-flight count drops to zero.
    idle: tokio::sync::Notify,
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure {
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: Instant::now(),
            quiet: QUIET,
            idle: tokio::sync::Notify::new(),
        }
    }
}

/// One interactive request in flight; leaving (drop) records its end.
#[must_use = "the request counts only while the guard lives"]
#[derive(Debug)]
pub struct InteractiveGuard(Arc<Pressure>);

impl Drop for InteractiveGuard {
    fn drop(&mut self) {
        let p = &self.0;
        // The end is stored before the count drops, so whoever sees the count at zero also
        // sees this end (SeqCst on both).
        let since = p.epoch.elapsed().as_nanos() as u64 + 1;
        p.last_end.fetch_max(since, Ordering::SeqCst);
        if p.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            p.idle.notify_waiters();
        }
    }
}

impl Pressure {
    pub fn new() -> Arc<Pressure> {
        Arc::new(Pressure::default())
    }

    /// A pressure signal with another quiet window (tests).
    pub fn with_quiet(quiet: Duration) -> Arc<Pressure> {
        Arc::new(Pressure {
            quiet,
            ..Pressure::default()
        })
    }

    /// Counts one interactive request until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> InteractiveGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InteractiveGuard(self.clone())
    }

    /// Interactive requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The interactive queue depth bulk work must yield to now: the requests in flight, or 1
    /// within [`QUIET`] of the last one ending; 0 when the node is quiet.
    pub fn depth(&self) -> usize {
        self.depth_at(Instant::now())
    }

    /// [`Pressure::depth`] as of `now`.
    pub fn depth_at(&self, now: Instant) -> usize {
        match self.in_flight() {
            0 => match self.quiet_at() {
                Some(at) if at > now => 1,
                _ => 0,
            },
            n => n,
        }
    }

    /// When the node becomes quiet if nothing new arrives (`None`: never busy).
    fn quiet_at(&self) -> Option<Instant> {
        match self.last_end.load(Ordering::SeqCst) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns - 1) + self.quiet),
        }
    }

    /// Returns once no interactive request is in flight and none ended within the quiet window.
    pub async fn quiet(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            // Registered before the check: a drop to zero after it still wakes us.
            notified.as_mut().enable();
            if self.in_flight() > 0 {
                notified.await;
                continue;
            }
            match self.quiet_at() {
                Some(at) if at > Instant::now() => tokio::time::sleep_until(at).await,
                _ => return,
            }
        }
    }
}

/// Whether a gRPC path is an interactive (small-file) request.
pub fn is_interactive(path: &str) -> bool {
    matches!(
        path,
        "/nokv.v1.Workspace/Stat"
            | "/nokv.v1.Workspace/List"
            | "/nokv.v1.Workspace/Read"
            | "/nokv.v1.Workspace/Write"
            | "/nokv.v1.Workspace/Delete"
            | "/nokv.v1.Workspace/Edit"
            | "/nokv.v1.Workspace/Append"
            | "/nokv.v1.Workspace/Find"
            | "/nokv.v1.Workspace/Grep"
    )
}

/// The tower layer that counts interactive requests into a [`Pressure`].
#[derive(Clone, Debug)]
pub struct PressureLayer(pub Arc<Pressure>);

impl<S> tower_layer::Layer<S> for PressureLayer {
    type Service = PressureService<S>;
    fn layer(&self, inner: S) -> PressureService<S> {
        PressureService {
            inner,
            pressure: self.0.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct PressureService<S> {
    inner: S,
    pressure: Arc<Pressure>,
}

impl<S, B> tower_service::Service<http::Request<B>> for PressureService<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = PressureFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = is_interactive(req.uri().path()).then(|| self.pressure.enter());
        PressureFuture {
            inner: self.inner.call(req),
            guard,
        }
    }
}

pin_project_lite::pin_project! {
    /// A call in flight; an interactive one holds its guard until it completes or is dropped.
    pub struct PressureFuture<F> {
        #[pin]
        inner: F,
        guard: Option<InteractiveGuard>,
    }
}

impl<F: Future> Future for PressureFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        this.guard.take();
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use tower_layer::Layer;
    use tower_service::Service;

    /// A service whose calls finish only when the semaphore gives them a permit.
    #[derive(Clone)]
    struct Held(Arc<tokio::sync::Semaphore>);

    type HeldFuture = Pin<Box<dyn Future<Output = Result<(), ()>> + Send>>;

    impl Service<http::Request<()>> for Held {
        type Response = ();
        type Error = ();
        type Future = HeldFuture;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let gate = self.0.clone();
            Box::pin(async move {
                gate.acquire().await.unwrap().forget();
                Ok(())
            })
        }
    }

    fn call(svc: &mut PressureService<Held>, path: &str) -> PressureFuture<HeldFuture> {
        svc.call(http::Request::builder().uri(path).body(()).unwrap())
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn only_the_workspace_small_file_rpcs_and_agent_operations_are_interactive() {
        for m in [
            "Stat", "List", "Read", "Write", "Delete", "Edit", "Append", "Find", "Grep",
        ] {
            assert!(is_interactive(&format!("/nokv.v1.Workspace/{m}")), "{m}");
        }
        for m in [
            "/nokv.v1.Workspace/PutBlock",
            "/nokv.v1.Workspace/ReadBlock",
            "/nokv.v1.Workspace/BeginUpload",
            "/nokv.v1.Workspace/CommitUpload",
            "/nokv.v1.Admin/Health",
            "/grpc.health.v1.Health/Check",
        ] {
            assert!(!is_interactive(m), "{m}");
        }
    }

    #[tokio::test]
    async fn an_interactive_request_counts_until_it_completes_and_a_bulk_one_never_counts() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let pressure = Pressure::with_quiet(HOUR);
        let mut svc = PressureLayer(pressure.clone()).layer(Held(gate.clone()));
        let mut write = call(&mut svc, "/nokv.v1.Workspace/Write");
        let mut block = call(&mut svc, "/nokv.v1.Workspace/PutBlock");
        assert!((&mut write).now_or_never().is_none());
        assert!((&mut block).now_or_never().is_none());
        assert_eq!(pressure.in_flight(), 1);
        assert_eq!(pressure.depth(), 1);
        gate.add_permits(2);
        write.await.unwrap();
        block.await.unwrap();
        assert_eq!(pressure.in_flight(), 0);
    }

    #[test]
    fn a_request_that_just_ended_counts_as_pressure_until_the_quiet_window_has_passed() {
        let pressure = Pressure::with_quiet(HOUR);
        assert_eq!(pressure.depth(), 0, "never busy: quiet");
        drop(pressure.enter());
        let now = Instant::now();
        assert_eq!(pressure.in_flight(), 0);
        assert_eq!(pressure.depth_at(now), 1);
        assert_eq!(pressure.depth_at(now + HOUR), 0);
    }

    #[tokio::test]
    async fn a_cancelled_interactive_request_stops_counting() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let pressure = Pressure::new();
        let mut svc = PressureLayer(pressure.clone()).layer(Held(gate));
        let stat = call(&mut svc, "/nokv.v1.Workspace/Stat");
        assert_eq!(pressure.in_flight(), 1);
        drop(stat);
        assert_eq!(pressure.in_flight(), 0);
    }

    #[tokio::test]
    async fn quiet_waits_while_a_request_is_in_flight_and_returns_once_it_ends() {
        let pressure = Pressure::with_quiet(Duration::ZERO);
        // Never busy: quiet at once.
        assert!(pressure.quiet().now_or_never().is_some());
        let guard = pressure.enter();
        let quiet = pressure.quiet();
        tokio::pin!(quiet);
        assert!(quiet.as_mut().now_or_never().is_none());
        drop(guard);
        assert!(
            quiet.now_or_never().is_some(),
            "woken by the last request ending"
        );
    }
}
