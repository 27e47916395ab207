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

mod process;
mod rpc;

pub use rpc::{RpcMetricsLayer, UNKNOWN_METHOD, code_name, method_label};

use std::convert::Infallible;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use nokv_proto::v1 as pb;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder, exponential_buckets,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

use process::ProcessCollector;

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

/// The commit this binary was built from: `NOKV_COMMIT` at build time, else `unknown`.
pub const BUILD_COMMIT: &str = match option_env!("NOKV_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

#[cfg(test)]
mod tests {
    use super::*;

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
}
