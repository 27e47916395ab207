//! Prometheus metrics: one process-wide set of instruments, and `GET /metrics` on
//! `--metrics-listen` (off by default).
//!
//! **Why the `prometheus` crate** (default features off): its only dependencies (`fnv`,
//! `lazy_static`, `memchr`, `parking_lot`, `thiserror`, `cfg-if`) were already in the build, so
//! it adds one crate to compile; `metrics` + `metrics-exporter-prometheus` would add a dozen
//! (quanta, sketches, an HTTP stack of its own). The endpoint is served with the hyper that
//! tonic already builds on.
//!
//! **Plain HTTP**: metrics carry counts, durations and shard numbers — no workspace names,
//! keys, tokens or endpoints — so the endpoint has no TLS and no auth. Bind it to loopback
//! (`127.0.0.1:9464`) or a monitoring network, not to the internet.
//!
//! **Instruments** (names are stable; they are what dashboards query):
//! * `nokv_rpc_requests_total{method,code}` and `nokv_rpc_duration_seconds{method,code}`: every
//!   gRPC call, by method and status code name (`OK`, `NotFound`, ...). **The `method` label**
//!   is the call's gRPC path without its leading `/`, and for nokv's own services also without
//!   their package `nokv.v1.`: `Workspace/Write`, `Admin/Health`,
//!   `grpc.health.v1.Health/Check`, `grpc.reflection.v1.ServerReflection/ServerReflectionInfo`
//!   (one rule for every service: `<service>/<Method>`, the service fully qualified unless it is
//!   nokv's); a method the daemon does not serve is `unknown` (see [`method_label`]). **A call
//!   is measured to its end**: until the response body has ended (its trailers sent, or the
//!   body dropped), so a streaming call's duration covers the whole stream, and its code is the
//!   `grpc-status` of its trailers (a streaming call that fails after its first message counts
//!   under its error, not `OK`); a stream the client abandoned counts as `Cancelled`.
//! * `nokv_build_info{version,commit}` = 1: the crate version and the commit it was built from
//!   (`NOKV_COMMIT` at build time, e.g. `NOKV_COMMIT=$(git rev-parse --short HEAD) cargo build`;
//!   `unknown` without it, so a build never needs git).
//! * `process_*`, as Prometheus client libraries name them (read from `/proc/self` at each
//!   scrape; absent where there is no `/proc`): `process_cpu_seconds_total`,
//!   `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//!   `process_max_fds`, `process_start_time_seconds`.
//! * `nokv_gate_queue_wait_seconds`: a write session's wait from enqueue to the committer
//!   running it; `nokv_gate_batch_sessions`: sessions per committed batch (its count is the
//!   number of batches, its sum the number of sessions).
//! * `nokv_bulk_bytes_total`, `nokv_bulk_admission_wait_seconds` (yielding to interactive
//!   requests and the optional bandwidth cap, plus the wait for a bulk slot), `nokv_block_memory_wait_seconds` and
//!   `nokv_block_memory_refused_total` (the block-memory budget, see [`crate::memory`]).
//! * `nokv_provider_log_segments_total`, `nokv_provider_log_puts_total` (attempts, retries
//!   included: each is a billed request on S3) and `nokv_provider_log_bytes_total`: the
//!   metadata log of `--metadata-durability provider` (see [`crate::provider_log`]).
//! * `nokv_reconcile_duration_seconds` and `nokv_reconcile_passes_total{outcome}` (`ok` |
//!   `error`), one per shard pass.
//! * Health gauges per shard, refreshed at each scrape from the same per-shard health
//!   `nokv admin health` shows ([`crate::shard::Shard::health`]): `nokv_shard_entries`,
//!   `nokv_shard_unresolved_uploads`, `nokv_shard_guards`, `nokv_shard_unknown_guards`,
//!   `nokv_shard_collectable`, `nokv_shard_dead_letters`, `nokv_shard_serving` (1/0),
//!   `nokv_shard_operations{state}` (ledger operations per state, every state, zeros too),
//!   `nokv_shard_reserved_bytes`, `nokv_shard_reservations`, `nokv_shard_reservations_match`
//!   (1/0), `nokv_shard_quarantined` and `nokv_shard_oldest_unresolved_age_seconds`.
//!
//! **Hot path**: counters and histograms are atomics; a request costs a label lookup (a hash
//! of two `&str`s, no allocation once the pair has been seen) and one `Instant::now()`.
//!
//! **Layering**: this is a low-level registry that imports nothing of the crate above it — the
//! bulk runtime, the block-memory budget and the RPC layer count into it, so it must not know
//! them, the shards or the node. The per-shard health gauges are filled at each scrape from a
//! [`HealthCollector`] registered from above ([`serve`] takes it; the node implements it in
//! `crate::node`), which hands over each shard's id and health as the wire type
//! (`nokv_proto::v1::ShardHealth`) — the same numbers `nokv admin health` shows.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nokv_proto::v1 as pb;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder, exponential_buckets,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The source of the per-shard health gauges, asked at every scrape. Implemented above this
/// module (by the node), so that metrics imports nothing of the shards or the node (see the
/// module doc).
#[async_trait::async_trait]
pub trait HealthCollector: Send + Sync {
    /// Every shard held and served right now, in shard order: its id and its health (a shard
    /// whose health read failed: not serving, zero counts).
    async fn shard_health(&self) -> Vec<(u32, pb::ShardHealth)>;
}

/// Every instrument of the process (see the module doc).
pub struct Metrics {
    registry: Registry,
    pub rpc_requests: IntCounterVec,
    pub rpc_duration: HistogramVec,
    pub gate_queue_wait: Histogram,
    pub gate_batch_sessions: Histogram,
    pub bulk_bytes: IntCounter,
    pub bulk_admission_wait: Histogram,
    pub block_memory_wait: Histogram,
    pub block_memory_refused: IntCounter,
    pub reconcile_duration: Histogram,
    pub reconcile_passes: IntCounterVec,
    pub provider_log_segments: IntCounter,
    pub provider_log_puts: IntCounter,
    pub provider_log_bytes: IntCounter,
    shard_entries: IntGaugeVec,
    shard_unresolved_uploads: IntGaugeVec,
    shard_guards: IntGaugeVec,
    shard_unknown_guards: IntGaugeVec,
    shard_collectable: IntGaugeVec,
    shard_dead_letters: IntGaugeVec,
    shard_serving: IntGaugeVec,
    shard_operations: IntGaugeVec,
    shard_reserved_bytes: IntGaugeVec,
    shard_reservations: IntGaugeVec,
    shard_reservations_match: IntGaugeVec,
    shard_quarantined: IntGaugeVec,
    shard_oldest_unresolved_age: GaugeVec,
}

/// The process's instruments.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// Latency buckets from 100 µs to ~52 s (×2 each).
fn seconds() -> Vec<f64> {
    exponential_buckets(0.0001, 2.0, 20).expect("valid buckets")
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        fn reg<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
            r.register(Box::new(c.clone())).expect("unique metric name");
            c
        }
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            reg(
                &registry,
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                    .expect("valid histogram"),
            )
        };
        let gauge = |name: &str, help: &str| {
            reg(
                &registry,
                IntGaugeVec::new(Opts::new(name, help), &["shard"]).expect("valid gauge"),
            )
        };
        Metrics {
            rpc_requests: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "nokv_rpc_requests_total",
                        "gRPC calls by method and status code",
                    ),
                    &["method", "code"],
                )
                .expect("valid counter"),
            ),
            rpc_duration: reg(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "nokv_rpc_duration_seconds",
                        "gRPC call latency to the response headers, by method and status code",
                    )
                    .buckets(seconds()),
                    &["method", "code"],
                )
                .expect("valid histogram"),
            ),
            gate_queue_wait: histogram(
                "nokv_gate_queue_wait_seconds",
                "Write session wait from enqueue to the committer running it",
                seconds(),
            ),
            gate_batch_sessions: histogram(
                "nokv_gate_batch_sessions",
                "Write sessions per committer batch (one fsync)",
                exponential_buckets(1.0, 2.0, 10).expect("valid buckets"),
            ),
            bulk_bytes: reg(
                &registry,
                IntCounter::new(
                    "nokv_bulk_bytes_total",
                    "Artifact block bytes admitted to bulk work",
                )
                .expect("valid counter"),
            ),
            provider_log_segments: reg(
                &registry,
                IntCounter::new(
                    "nokv_provider_log_segments_total",
                    "Metadata log segments created in the object provider (provider durability)",
                )
                .expect("valid counter"),
            ),
            provider_log_puts: reg(
                &registry,
                IntCounter::new(
                    "nokv_provider_log_puts_total",
                    "PUT attempts of metadata log segments, retries included (each billed on S3)",
                )
                .expect("valid counter"),
            ),
            provider_log_bytes: reg(
                &registry,
                IntCounter::new(
                    "nokv_provider_log_bytes_total",
                    "Bytes of the metadata log segments created in the object provider",
                )
                .expect("valid counter"),
            ),
            bulk_admission_wait: histogram(
                "nokv_bulk_admission_wait_seconds",
                "Wait for bulk bandwidth pacing or a bulk slot",
                seconds(),
            ),
            block_memory_wait: histogram(
                "nokv_block_memory_wait_seconds",
                "Wait for a share of the block-memory budget (granted requests)",
                seconds(),
            ),
            block_memory_refused: reg(
                &registry,
                IntCounter::new(
                    "nokv_block_memory_refused_total",
                    "Requests refused because the block-memory budget stayed in use",
                )
                .expect("valid counter"),
            ),
            reconcile_duration: histogram(
                "nokv_reconcile_duration_seconds",
                "Duration of one shard's reconciler pass",
                seconds(),
            ),
            reconcile_passes: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "nokv_reconcile_passes_total",
                        "Shard reconciler passes by outcome",
                    ),
                    &["outcome"],
                )
                .expect("valid counter"),
            ),
            shard_entries: gauge(
                "nokv_shard_entries",
                "Entries (files and artifacts) of the shard",
            ),
            shard_unresolved_uploads: gauge(
                "nokv_shard_unresolved_uploads",
                "Uploads neither committed nor fully cleaned up",
            ),
            shard_guards: gauge("nokv_shard_guards", "Cleanup guards of the shard"),
            shard_unknown_guards: gauge(
                "nokv_shard_unknown_guards",
                "Guards whose writer's outcome is unknown",
            ),
            shard_collectable: gauge("nokv_shard_collectable", "Block keys queued for deletion"),
            shard_dead_letters: gauge(
                "nokv_shard_dead_letters",
                "Deletes that failed too often and wait for an operator",
            ),
            shard_serving: gauge(
                "nokv_shard_serving",
                "1 while the shard's metadata store is in service",
            ),
            shard_operations: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "nokv_shard_operations",
                        "Ledger operations of the shard by state",
                    ),
                    &["shard", "state"],
                )
                .expect("valid gauge"),
            ),
            shard_reserved_bytes: gauge(
                "nokv_shard_reserved_bytes",
                "Bytes reserved against quotas by unresolved uploads",
            ),
            shard_reservations: gauge(
                "nokv_shard_reservations",
                "Quota reservations held (one per unresolved upload)",
            ),
            shard_reservations_match: gauge(
                "nokv_shard_reservations_match",
                "1 while reservations equal unresolved uploads",
            ),
            shard_quarantined: gauge(
                "nokv_shard_quarantined",
                "Provider objects the inventory found unaccounted for",
            ),
            shard_oldest_unresolved_age: reg(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "nokv_shard_oldest_unresolved_age_seconds",
                        "Age of the shard's oldest unresolved operation (0 when none)",
                    ),
                    &["shard"],
                )
                .expect("valid gauge"),
            ),
            registry,
        }
        .with_process_and_build_info()
    }

    /// Registers `nokv_build_info` (set to 1 once) and the `process_*` collector.
    fn with_process_and_build_info(self) -> Metrics {
        let build = IntGaugeVec::new(
            Opts::new(
                "nokv_build_info",
                "Always 1; the labels name the version and commit of this build",
            ),
            &["version", "commit"],
        )
        .expect("valid gauge");
        build
            .with_label_values(&[env!("CARGO_PKG_VERSION"), BUILD_COMMIT])
            .set(1);
        self.registry
            .register(Box::new(build))
            .expect("unique metric name");
        self.registry
            .register(Box::new(ProcessCollector::new()))
            .expect("unique metric names");
        self
    }

    /// Counts one finished gRPC call.
    pub fn rpc(&self, method: &str, code: &str, elapsed: Duration) {
        let labels = [method, code];
        self.rpc_requests.with_label_values(&labels).inc();
        self.rpc_duration
            .with_label_values(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Refreshes the health gauges from `collector`'s shards (cheap MVCC reads, no write
    /// session).
    pub async fn refresh_health(&self, collector: &dyn HealthCollector) {
        self.set_health(&collector.shard_health().await);
    }

    /// Sets the health gauges to `shards` (id and health of every shard held); a shard not
    /// among them disappears from the scrape.
    fn set_health(&self, shards: &[(u32, pb::ShardHealth)]) {
        let gauges = [
            &self.shard_entries,
            &self.shard_unresolved_uploads,
            &self.shard_guards,
            &self.shard_unknown_guards,
            &self.shard_collectable,
            &self.shard_dead_letters,
            &self.shard_serving,
            &self.shard_operations,
            &self.shard_reserved_bytes,
            &self.shard_reservations,
            &self.shard_reservations_match,
            &self.shard_quarantined,
        ];
        // A shard this node no longer holds disappears from the scrape.
        for g in gauges {
            g.reset();
        }
        self.shard_oldest_unresolved_age.reset();
        for (shard, h) in shards {
            let id = shard.to_string();
            let label = [id.as_str()];
            let set = |g: &IntGaugeVec, v: u64| {
                g.with_label_values(&label)
                    .set(i64::try_from(v).unwrap_or(i64::MAX))
            };
            set(&self.shard_entries, h.entries);
            set(&self.shard_unresolved_uploads, h.unresolved_uploads);
            set(&self.shard_guards, h.guards);
            set(&self.shard_unknown_guards, h.unknown_guards);
            set(&self.shard_collectable, h.collectable);
            set(&self.shard_dead_letters, h.dead_letters);
            set(&self.shard_serving, u64::from(h.serving));
            for (state, n) in &h.operations {
                self.shard_operations
                    .with_label_values(&[id.as_str(), state.as_str()])
                    .set(i64::try_from(*n).unwrap_or(i64::MAX));
            }
            set(&self.shard_reserved_bytes, h.reserved_bytes);
            set(&self.shard_reservations, h.reservations);
            set(
                &self.shard_reservations_match,
                u64::from(h.reservations_match),
            );
            set(&self.shard_quarantined, h.quarantined);
            self.shard_oldest_unresolved_age
                .with_label_values(&label)
                .set(h.oldest_unresolved_age_ms as f64 / 1000.0);
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of gathered metrics");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// Serves `GET /metrics` on `listener` (plain HTTP/1.1) until `stop` flips; `collector`
/// fills the per-shard health gauges at each scrape.
pub async fn serve(
    listener: TcpListener,
    collector: Arc<dyn HealthCollector>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let collector = collector.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let collector = collector.clone();
                async move { Ok::<_, Infallible>(respond(&*collector, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

async fn respond<B>(
    collector: &dyn HealthCollector,
    req: http::Request<B>,
) -> http::Response<http_body_util::Full<Bytes>> {
    let reply = |status: u16, content_type: &str, body: String| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(http_body_util::Full::new(Bytes::from(body)))
            .expect("valid response")
    };
    if req.uri().path() != "/metrics" {
        return reply(404, "text/plain", "not found: try /metrics\n".into());
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return reply(405, "text/plain", "only GET /metrics\n".into());
    }
    let m = metrics();
    m.refresh_health(collector).await;
    reply(200, "text/plain; version=0.0.4", m.render())
}

/// The tower layer that counts every gRPC call (installed on the server in `server.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcMetricsLayer;

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    R: http_body::Body,
{
    type Response = http::Response<TimedBody<R>>;
    type Error = S::Error;
    type Future = RpcFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // A `&'static str` from the closed list: no allocation per call.
        let method = method_label(req.uri().path());
        RpcFuture {
            inner: self.inner.call(req),
            method,
            started: Instant::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// A call in flight until its response headers: then its body carries the measurement on.
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        method: &'static str,
        started: Instant,
    }
}

impl<F, R, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
    R: http_body::Body,
{
    type Output = Result<http::Response<TimedBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match std::task::ready!(this.inner.poll(cx)) {
            Ok(resp) => {
                // A trailers-only response (every unary error) has its status in the headers.
                let code = resp.headers().get("grpc-status").and_then(grpc_status_name);
                let call = Call {
                    method: this.method,
                    started: *this.started,
                    code,
                };
                // Such a call has ended already: count it before the client can see it.
                let call = if code.is_some() && resp.body().is_end_stream() {
                    call.finish(true);
                    None
                } else {
                    Some(call)
                };
                Poll::Ready(Ok(resp.map(|inner| TimedBody { inner, call })))
            }
            Err(e) => {
                metrics().rpc(this.method, "Unavailable", this.started.elapsed());
                Poll::Ready(Err(e))
            }
        }
    }
}

/// What is known of a call until it is counted.
struct Call {
    method: &'static str,
    started: Instant,
    /// The status seen so far (headers or trailers); `None` until one is.
    code: Option<&'static str>,
}

impl Call {
    /// Counts the call: with the status seen, else `OK` when the body ended normally and
    /// `Cancelled` when it was cut short.
    fn finish(self, ended: bool) {
        let code = self.code.unwrap_or(if ended { "OK" } else { "Cancelled" });
        metrics().rpc(self.method, code, self.started.elapsed());
    }
}

fn grpc_status_name(value: &http::HeaderValue) -> Option<&'static str> {
    let code = value.to_str().ok()?.parse::<i32>().ok()?;
    Some(code_name(code))
}

pin_project_lite::pin_project! {
    /// A response body that counts its call when it ends: at its trailers (gRPC sends its
    /// status there), at its end, at an error, or when it is dropped unfinished (the client
    /// went away: `Cancelled` unless a status was already seen).
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for TimedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(call) = this.call.take() {
                call.finish(false);
            }
        }
    }
}

impl<B: http_body::Body> http_body::Body for TimedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(trailers) = f.trailers_ref()
                    && let Some(mut call) = this.call.take()
                {
                    if let Some(code) = trailers.get("grpc-status").and_then(grpc_status_name) {
                        call.code = Some(code);
                    }
                    call.finish(true);
                }
            }
            Some(Err(_)) => {
                if let Some(mut call) = this.call.take() {
                    call.code.get_or_insert("Internal");
                    call.finish(true);
                }
            }
            None => {
                if let Some(call) = this.call.take() {
                    call.finish(true);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The label of a call to `path`: the path without its leading `/`, and without `nokv.v1.` for
/// nokv's services (`/nokv.v1.Workspace/Write` → `Workspace/Write`,
/// `/grpc.health.v1.Health/Check` → `grpc.health.v1.Health/Check`); anything the daemon does
/// not serve is `unknown`.
///
/// Invariant: every label comes from a closed list — the methods of the services this daemon
/// serves, read from their own descriptors — so no caller, authenticated or not, can add a
/// series by calling a method name of its choosing (300 calls of made-up names once added
/// 7,200 series lines).
pub fn method_label(path: &str) -> &'static str {
    match served_methods().get(path) {
        Some(label) => label,
        None => UNKNOWN_METHOD,
    }
}

/// The label of every call to a method this daemon does not serve.
pub const UNKNOWN_METHOD: &str = "unknown";

/// `/package.Service/Method` → its label, for every method of nokv.v1, gRPC health and
/// reflection.
fn served_methods() -> &'static std::collections::HashMap<String, String> {
    static METHODS: std::sync::OnceLock<std::collections::HashMap<String, String>> =
        std::sync::OnceLock::new();
    METHODS.get_or_init(|| {
        use prost::Message;
        let sets = [
            nokv_proto::v1::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut methods = std::collections::HashMap::new();
        for set in sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(set) else {
                continue;
            };
            for file in set.file {
                let package = file.package();
                for service in &file.service {
                    for method in &service.method {
                        let path = format!("/{package}.{}/{}", service.name(), method.name());
                        let label = path.strip_prefix("/nokv.v1.").unwrap_or(&path[1..]);
                        methods.insert(path.clone(), label.to_string());
                    }
                }
            }
        }
        methods
    })
}

/// The commit this binary was built from: `NOKV_COMMIT` at build time, else `unknown`.
pub const BUILD_COMMIT: &str = match option_env!("NOKV_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

/// `process_*` as Prometheus client libraries export them, read from `/proc/self` at each
/// scrape (no crate: the prometheus crate's `process` feature would pull in `procfs`). Where
/// `/proc/self/stat` cannot be read, it exports nothing.
struct ProcessCollector {
    cpu: prometheus::Counter,
    resident: prometheus::IntGauge,
    virtual_memory: prometheus::IntGauge,
    open_fds: prometheus::IntGauge,
    max_fds: prometheus::IntGauge,
    start_time: prometheus::Gauge,
    /// One scrape at a time moves the CPU counter (it only goes up by deltas).
    update: parking_lot::Mutex<()>,
}

impl ProcessCollector {
    fn new() -> ProcessCollector {
        let int =
            |name: &str, help: &str| prometheus::IntGauge::new(name, help).expect("valid gauge");
        ProcessCollector {
            cpu: prometheus::Counter::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds",
            )
            .expect("valid counter"),
            resident: int(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
            ),
            virtual_memory: int(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
            ),
            open_fds: int("process_open_fds", "Number of open file descriptors"),
            max_fds: int(
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
            ),
            start_time: prometheus::Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
            )
            .expect("valid gauge"),
            update: parking_lot::Mutex::new(()),
        }
    }
}

/// What `/proc/self` says of this process.
#[derive(Debug, PartialEq)]
struct ProcStat {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
}

/// Parses `/proc/self/stat` (`proc(5)`): fields after the parenthesised command name, whose
/// `utime`, `stime` and `starttime` are in clock ticks and `rss` in pages; `boot_time` is
/// `btime` from `/proc/stat`.
fn parse_proc_stat(stat: &str, ticks: f64, page: i64, boot_time: f64) -> Option<ProcStat> {
    // The command name may hold spaces and ')': the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        cpu_seconds: (num(14)? + num(15)?) as f64 / ticks,
        virtual_bytes: i64::try_from(num(23)?).ok()?,
        resident_bytes: i64::try_from(num(24)?).ok()?.saturating_mul(page),
        start_time_seconds: boot_time + num(22)? as f64 / ticks,
    })
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

impl prometheus::core::Collector for ProcessCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.cpu.desc();
        d.extend(self.resident.desc());
        d.extend(self.virtual_memory.desc());
        d.extend(self.open_fds.desc());
        d.extend(self.max_fds.desc());
        d.extend(self.start_time.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let _one = self.update.lock();
        // SAFETY: sysconf and getrlimit only read process-wide values into the arguments given.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let (Some(stat), Some(boot)) = (stat, boot) else {
            return Vec::new();
        };
        let Some(p) = parse_proc_stat(&stat, ticks.max(1) as f64, page.max(1), boot) else {
            return Vec::new();
        };
        let past = self.cpu.get();
        if p.cpu_seconds > past {
            self.cpu.inc_by(p.cpu_seconds - past);
        }
        self.resident.set(p.resident_bytes);
        self.virtual_memory.set(p.virtual_bytes);
        self.start_time.set(p.start_time_seconds);
        let mut out = Vec::new();
        out.extend(self.cpu.collect());
        out.extend(self.resident.collect());
        out.extend(self.virtual_memory.collect());
        out.extend(self.start_time.collect());
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds
                .set(i64::try_from(fds.count()).unwrap_or(i64::MAX));
            out.extend(self.open_fds.collect());
        }
        let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            self.max_fds
                .set(i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX));
            out.extend(self.max_fds.collect());
        }
        out
    }
}

/// The name of a gRPC status code, as `tonic::Code`'s variants spell it (`OK` for 0, as
/// the gRPC specification spells it).
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Cancelled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    type Frames =
        futures::channel::mpsc::UnboundedSender<Result<http_body::Frame<Bytes>, Infallible>>;
    type StreamBody = http_body_util::StreamBody<
        futures::channel::mpsc::UnboundedReceiver<Result<http_body::Frame<Bytes>, Infallible>>,
    >;

    /// A service answering `headers` at once, with a body the test feeds frame by frame.
    struct Streaming(Option<(http::HeaderMap, StreamBody)>);

    impl tower_service::Service<http::Request<()>> for Streaming {
        type Response = http::Response<StreamBody>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (headers, body) = self.0.take().expect("one call");
            let mut resp = http::Response::new(body);
            *resp.headers_mut() = headers;
            std::future::ready(Ok(resp))
        }
    }

    /// Calls `path` through the metrics layer; returns the response and the feed of its body.
    async fn call(
        path: &str,
        headers: http::HeaderMap,
    ) -> (http::Response<TimedBody<StreamBody>>, Frames) {
        use tower_layer::Layer;
        use tower_service::Service;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut svc = RpcMetricsLayer.layer(Streaming(Some((
            headers,
            http_body_util::StreamBody::new(rx),
        ))));
        let req = http::Request::builder().uri(path).body(()).unwrap();
        (svc.call(req).await.unwrap(), tx)
    }

    fn count(method: &str, code: &str) -> (u64, u64) {
        let m = metrics();
        (
            m.rpc_requests.with_label_values(&[method, code]).get(),
            m.rpc_duration
                .with_label_values(&[method, code])
                .get_sample_count(),
        )
    }

    fn trailers(code: i32) -> http_body::Frame<Bytes> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.to_string().parse().unwrap());
        http_body::Frame::trailers(t)
    }

    // Catches: the call counted when its headers are ready (the old `RpcFuture`), which timed
    // a stream only to its first byte and counted one failing mid-stream as `OK`.
    #[tokio::test]
    async fn a_streaming_call_is_counted_when_its_body_ends_with_the_status_of_its_trailers() {
        let method = "grpc.health.v1.Health/Watch";
        let before = count(method, "DataLoss");
        let (resp, tx) = call("/grpc.health.v1.Health/Watch", http::HeaderMap::new()).await;
        let mut body = resp.into_body();
        tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from_static(b"one"))))
            .unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        assert_eq!(
            count(method, "DataLoss"),
            before,
            "counted before the stream ended"
        );
        tx.unbounded_send(Ok(trailers(15))).unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        assert_eq!(count(method, "DataLoss"), (before.0 + 1, before.1 + 1));
        drop(tx);
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!(
            count(method, "DataLoss"),
            (before.0 + 1, before.1 + 1),
            "counted once"
        );
    }

    #[tokio::test]
    async fn a_stream_dropped_before_its_end_counts_as_cancelled_or_as_the_status_its_headers_gave()
    {
        let method = "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let cancelled = count(method, "Cancelled");
        let (resp, tx) = call(path, http::HeaderMap::new()).await;
        tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        drop(resp);
        assert_eq!(
            count(method, "Cancelled"),
            (cancelled.0 + 1, cancelled.1 + 1)
        );

        // A status in the headers with a body still open: counted when the body ends.
        let denied = count(method, "PermissionDenied");
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", "7".parse().unwrap());
        let (resp, tx) = call(path, headers).await;
        assert_eq!(count(method, "PermissionDenied"), denied);
        drop(tx);
        drop(resp);
        assert_eq!(
            count(method, "PermissionDenied"),
            (denied.0 + 1, denied.1 + 1)
        );
    }

    // A unary error is a trailers-only response (status in the headers, empty body) that
    // hyper may send before it drops the body: it is counted before the client can see it.
    #[tokio::test]
    async fn a_trailers_only_error_is_counted_when_its_headers_are_ready() {
        use tower_layer::Layer;
        use tower_service::Service;
        struct Refuse;
        impl tower_service::Service<http::Request<()>> for Refuse {
            type Response = http::Response<http_body_util::Empty<Bytes>>;
            type Error = Infallible;
            type Future = std::future::Ready<Result<Self::Response, Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                let mut resp = http::Response::new(http_body_util::Empty::new());
                resp.headers_mut()
                    .insert("grpc-status", "16".parse().unwrap());
                std::future::ready(Ok(resp))
            }
        }
        let method = "grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
        let before = count(method, "Unauthenticated");
        let req = http::Request::builder()
            .uri("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
            .body(())
            .unwrap();
        let resp = RpcMetricsLayer.layer(Refuse).call(req).await.unwrap();
        assert_eq!(
            count(method, "Unauthenticated"),
            (before.0 + 1, before.1 + 1)
        );
        drop(resp);
        assert_eq!(
            count(method, "Unauthenticated"),
            (before.0 + 1, before.1 + 1)
        );
    }

    #[test]
    fn proc_stat_gives_cpu_seconds_resident_bytes_and_start_time() {
        // A command name with a space and a ')' in it, as proc(5) allows.
        let stat = "4242 (nokv) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 7 0 \
                    1000 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let p = parse_proc_stat(stat, 100.0, 4096, 1_700_000_000.0).unwrap();
        assert_eq!(
            p,
            ProcStat {
                cpu_seconds: 4.0,
                resident_bytes: 300 * 4096,
                virtual_bytes: 123_456_789,
                start_time_seconds: 1_700_000_010.0,
            }
        );
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\nprocesses 9\n"),
            Some(1.7e9)
        );
        assert_eq!(parse_proc_stat("garbage", 100.0, 4096, 0.0), None);
    }

    #[test]
    fn the_scrape_has_build_info_and_the_process_metrics_of_this_process() {
        let text = metrics().render();
        assert!(
            text.contains(&format!(
                "nokv_build_info{{commit=\"{BUILD_COMMIT}\",version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        if std::path::Path::new("/proc/self/stat").exists() {
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_virtual_memory_bytes ",
                "process_open_fds ",
                "process_max_fds ",
                "process_start_time_seconds ",
            ] {
                assert!(
                    text.lines().any(|l| l.starts_with(name)),
                    "no {name}in:\n{text}"
                );
            }
        }
    }

    // Catches: a label taken from the request path verbatim (an unauthenticated caller adds a
    // series per made-up method name).
    #[test]
    fn a_method_the_daemon_does_not_serve_is_labelled_unknown_whatever_its_name() {
        for path in [
            "/nokv.v1.Workspace/X0d2c1f7e",
            "/nokv.v1.Nope/Write",
            "/evil.Service/Method",
            "",
            "/",
            "/nokv.v1.Workspace/Write/extra",
        ] {
            assert_eq!(method_label(path), UNKNOWN_METHOD, "{path:?}");
        }
        assert!(served_methods().len() > 20, "the served services were read");
    }

    #[test]
    fn rpc_labels_name_the_service_and_method_and_the_status_code() {
        assert_eq!(method_label("/nokv.v1.Workspace/Write"), "Workspace/Write");
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        assert_eq!(method_label("/nokv.v1.Admin/Health"), "Admin/Health");
        assert_eq!(
            method_label("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        );
        // One form for every service: `<service>/<Method>`, never a leading slash.
        for label in served_methods().values() {
            assert!(!label.starts_with('/'), "{label}");
            assert_eq!(label.matches('/').count(), 1, "{label}");
        }
        assert_eq!(code_name(0), "OK");
        for c in 1..=16 {
            assert_eq!(
                code_name(c),
                format!("{:?}", tonic::Code::from_i32(c)),
                "code {c}"
            );
        }
    }
}
