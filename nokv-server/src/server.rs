//! Composition of a serving node: TLS, the nokv services, the standard health service and
//! server reflection, background maintenance, and graceful shutdown.
//!
//! Shutdown order matters for durability: stop accepting, let in-flight requests finish
//! (each mutation's session commits or aborts as a whole), stop maintenance tasks, and only
//! then drop the shards so every redb file is closed cleanly. Nothing acknowledged depends on
//! this order — each acknowledged mutation was already fsynced — it just avoids a recovery
//! pass on the next start.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nokv_proto::MAX_MESSAGE;
use nokv_proto::v1 as pb;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::bootstrap;
use crate::cluster::{Cluster, ClusterRoutes};
use crate::config::{DurabilityMode, Settings};
use crate::control::ControlError;
use crate::control::access::EtcdAccess;
use crate::control::etcd::{ClusterConfig, EtcdControl, EtcdSettings};
use crate::fair_read::FairRead;
use crate::memory::BlockMemory;
use crate::node::{Node, NodeParts};
use crate::object::ObjectProvider;
use crate::object::ProviderConfig;
use crate::provider_log::LogWriter;
use crate::route::LocalRoutes;
use crate::service::admin::AdminService;
use crate::service::body_admission::BodyAdmission;
use crate::service::workspace::WorkspaceService;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Lock(#[from] crate::dir_lock::LockError),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Provider(#[from] crate::object::ObjectError),
    #[error("{0}")]
    Node(#[from] crate::error::Error),
    #[error("server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(
        "TLS identity ({key} with {cert}) is unusable: {source}; restore them, or delete both to have new ones issued"
    )]
    Identity {
        key: std::path::PathBuf,
        cert: std::path::PathBuf,
        source: tonic::transport::Error,
    },
    #[error("{0}")]
    Control(#[from] crate::control::ControlError),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// HTTP/2 streams (concurrent calls) one connection may have open; a client that opens more
/// waits for a slot on its side. Together with the windows below this bounds the transport
/// memory one connection can make the server hold outside the block-memory budget: request
/// bodies not yet admitted are at most one connection window (`4 * MAX_MESSAGE`, whatever the
/// number of streams), and response bytes already encoded are at most hyper's per-stream send
/// buffer (400 KiB) plus one 1 MiB `ReadBlock` chunk per stream, i.e. ~45 MiB per connection.
/// 32 leaves room for the CLI's parallel blocks (4 by default) many times over.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;

/// Serves until SIGINT/SIGTERM.
pub async fn run(settings: Settings) -> Result<(), ServeError> {
    // First, before anything in the data dir is written: a second daemon on the same
    // directory must be refused before it can touch the running one's files.
    let before = crate::dir_lock::Before::of(&settings.data_dir);
    let _lock = crate::dir_lock::DirLock::acquire(&settings.data_dir)?;
    // Declared after the lock, so dropped (on a failed start) while the lock is still held.
    let fresh = crate::dir_lock::FreshDir::new(&settings.data_dir, before, &_lock);
    let material = match &settings.tls_dir {
        Some(dir) => crate::cluster_tls::load(
            dir,
            &crate::cluster_tls::cert_candidates(
                settings.advertise.as_deref(),
                settings.node_id.as_deref(),
            ),
        )?,
        None => bootstrap::ensure(&settings.data_dir, settings.advertise.as_deref())?,
    };
    let provider = ObjectProvider::open(&settings.provider, &settings.prefix)?;
    // Test-only: black-box fault schedules (never a flag; see object::fault).
    let provider = match crate::object::fault::Schedule::from_env()
        .map_err(|e| crate::object::ObjectError::Config(e.to_string()))?
    {
        Some(schedule) => {
            tracing::warn!(
                ?schedule,
                "TEST FAULTS ARE ON ({}): the object provider will fail on purpose",
                crate::object::fault::SCHEDULE_ENV
            );
            provider.with_fault_schedule(schedule)
        }
        None => provider,
    };
    // A provider outage at start-up must not take the small-file API down with it: the node
    // serves, artifact calls fail with the provider's error meanwhile, and the reconciler's
    // periodic passes retry until the provider is back — no restart needed.
    if let Err(e) = provider.check().await {
        tracing::error!(error = %e, "object provider unreachable at start-up; serving small files, retrying artifact work");
        eprintln!(
            "nokv-server: warning: object provider unreachable at start-up ({e}); serving anyway"
        );
    }

    let (listener, local) = bind(&settings.listen).await?;
    let endpoint = advertised_endpoint(settings.advertise.as_deref(), local);
    let client_config = bootstrap::write_client_config(&settings.data_dir, &endpoint, &material)?;

    // Provider durability: the node's log stream writer, shared by the committer (which
    // sends every batch through it) and the cluster runtime (which names its stream).
    let replica = (settings.durability.mode == DurabilityMode::Provider).then(|| {
        Arc::new(LogWriter::with_in_flight(
            provider.clone(),
            tokio::runtime::Handle::current(),
            settings.durability.log_flush_interval,
            settings.durability.log_segments_in_flight,
        ))
    });
    let parts = |name: String| NodeParts {
        shard_count: settings.shards,
        cfg: settings.shard.clone(),
        bulk: (settings.bulk_parallel, settings.bulk_mib_per_s),
        memory: BlockMemory::new(settings.block_memory, settings.block_memory_wait),
        provider: provider.clone(),
        signer: material.signer.clone(),
        name,
        replica: replica.clone(),
    };
    let (node, cluster, standalone) = match &settings.cluster {
        None if replica.is_some() => {
            // A single node whose writes are in the bucket: a new data dir is rebuilt from it
            // first, then the node checkpoints every shard and names its new stream before
            // it serves (see `standalone`).
            let name = settings.advertise.clone().unwrap_or_else(|| "local".into());
            let new = Node::is_new_data_dir(&settings.data_dir)?;
            let rebuild = crate::standalone::prepare(
                &provider,
                &name,
                new,
                &settings.data_dir.join("shards"),
            )
            .await?;
            let restore = rebuild.map(|r| r.shards).unwrap_or_default();
            let node = Node::open_restoring(&settings.data_dir, parts(name.clone()), restore)?
                .with_routes(Box::new(LocalRoutes::new(endpoint.clone())));
            let standalone = crate::standalone::start(&node).await?;
            (Arc::new(node), None, Some(standalone))
        }
        None => {
            let name = settings.advertise.clone().unwrap_or_else(|| "local".into());
            let node = Node::open(&settings.data_dir, parts(name))?
                .with_routes(Box::new(LocalRoutes::new(endpoint.clone())));
            (Arc::new(node), None, None)
        }
        Some(c) => {
            let etcd = EtcdSettings::new(
                c.etcd.clone(),
                c.cluster.clone(),
                c.node_id.clone(),
                endpoint.clone(),
                ClusterConfig {
                    shards: settings.shards,
                    bucket: provider_identity(&settings.provider),
                    prefix: settings.prefix.clone(),
                },
            )
            .with_node_ttl(c.node_ttl)
            // Read once here: a node that rejoins later uses the same material, and a missing
            // or malformed file is refused before the node serves anything.
            .with_access(EtcdAccess::load(&c.etcd_access).map_err(ControlError::from)?);
            // Joining checks the cluster record first: a node whose shard count, bucket or
            // prefix disagree refuses to start before it serves anything.
            let (control, outcome) = EtcdControl::join(etcd.clone()).await?;
            tracing::info!(cluster = %c.cluster, node = %c.node_id, ?outcome, "cluster mode");
            let routes = ClusterRoutes::new(endpoint.clone(), settings.shards);
            let node = Arc::new(
                Node::open_cluster(&settings.data_dir, parts(c.node_id.clone()))?
                    .with_routes(Box::new(routes.clone())),
            );
            let cluster = Cluster::new(node.clone(), etcd, control, routes, settings.durability);
            (node, Some(cluster), None)
        }
    };

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<pb::admin_server::AdminServer<AdminService>>()
        .await;
    // The workspace service, and the server as a whole (service "", what probes ask by
    // default), follow the node's committer: NOT_SERVING while no write can succeed (a storage
    // outage, or a committer that stopped), as admin health reports it per shard (see
    // `shard::gate`). Set once before the listener opens, then on each change.
    let mut serving = node.committer().watch_serving();
    let workspace_health = |reporter: tonic_health::server::HealthReporter, serving: bool| async move {
        type Ws = pb::workspace_server::WorkspaceServer<WorkspaceService>;
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        reporter.set_service_status("", status).await;
        reporter
            .set_service_status(<Ws as tonic::server::NamedService>::NAME, status)
            .await;
    };
    let now = *serving.borrow_and_update();
    workspace_health(health_reporter.clone(), now).await;
    let reporter = health_reporter.clone();
    tokio::spawn(async move {
        while serving.changed().await.is_ok() {
            let now = *serving.borrow_and_update();
            workspace_health(reporter.clone(), now).await;
        }
    });
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // v1 for current tools, v1alpha for older grpcurl builds.
    let (reflection, reflection_alpha) = (reflection().build_v1()?, reflection().build_v1alpha()?);

    let workspace = pb::workspace_server::WorkspaceServer::new(WorkspaceService::new(node.clone()))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    // PutBlock bodies are admitted to the block-memory budget before tonic decodes them.
    let workspace = BodyAdmission::new(workspace, node.memory.clone(), node.signer.clone());
    let admin = pb::admin_server::AdminServer::new(AdminService::new(node.clone()));

    // Built before the banner: a bad TLS identity is a start-up failure, never a daemon that
    // announced itself and then exits.
    let router = transport(
        Server::builder()
            // Per-RPC counts and latencies (see crate::metrics); cheap whether or not scraped.
            .layer(crate::metrics::RpcMetricsLayer)
            // Interactive requests in flight: bulk work yields to them (see crate::bulk).
            .layer(crate::pressure::PressureLayer(node.pressure())),
        &material,
    )?
    .add_service(health_service)
    .add_service(reflection)
    .add_service(reflection_alpha)
    .add_service(workspace)
    .add_service(admin);

    let (stop_tx, stop_rx) = watch::channel(false);
    if let Some(standalone) = standalone {
        tokio::spawn(standalone.compact_loop(node.clone(), settings.durability, stop_rx.clone()));
    }
    let balancing = cluster
        .clone()
        .map(|c| tokio::spawn(c.run(stop_rx.clone())));
    let metrics = match &settings.metrics_listen {
        Some(addr) => {
            let (listener, bound) = bind(addr).await?;
            Some((
                bound,
                tokio::spawn(crate::metrics::serve(
                    listener,
                    node.clone(),
                    stop_rx.clone(),
                )),
            ))
        }
        None => None,
    };
    let maintenance = tokio::spawn(maintain(
        node.clone(),
        settings.reconcile_interval,
        stop_rx.clone(),
    ));
    let inventory = tokio::spawn(crate::inventory::run(
        node.clone(),
        settings.inventory.clone(),
        stop_rx.clone(),
    ));

    // Before anything says it listens (see `shutdown_signal`).
    let signalled = shutdown_signal();
    tracing::info!(
        %endpoint,
        shards = settings.shards,
        provider = node.provider.kind(),
        block_memory_mib = settings.block_memory / (1024 * 1024),
        worker_threads = settings.worker_threads,
        "serving"
    );
    // Before the listening line, which tools wait for: by then this line is out too.
    if let Some((bound, _)) = &metrics {
        println!("nokv-server metrics on http://{bound}/metrics");
    }
    // Started: a data dir this start created is the node's now.
    if let Some(fresh) = fresh {
        fresh.keep();
    }
    println!("nokv-server listening on {endpoint}");
    println!(
        "  data dir {} · {} shards · provider {}\n  \
         point the CLI at it:\n    export NOKV_CONFIG={}\n    nokv admin health",
        settings.data_dir.display(),
        settings.shards,
        node.provider.kind(),
        client_config.display()
    );

    tokio::spawn(self_check(endpoint.clone(), material.ca_path.clone()));

    let handoff = cluster.clone();
    let balance_stop = stop_tx.clone();
    let shutdown = async move {
        signalled.await;
        // Cluster mode: hand every shard off while still serving, so requests in flight
        // finish and new ones are pointed at the next owners; only then stop accepting.
        if let Some(cluster) = handoff {
            let _ = balance_stop.send(true);
            cluster.shutdown().await;
        }
        tracing::info!("shutdown requested: draining in-flight requests");
    };
    router
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;

    let _ = stop_tx.send(true);
    let _ = maintenance.await;
    if let Some((_, metrics)) = metrics {
        let _ = metrics.await;
    }
    let _ = inventory.await;
    if let Some(balancing) = balancing {
        let _ = balancing.await;
    }
    drop(cluster);
    // A segment still retried against an unreachable provider must not hold the exit: its
    // batches are answered Unavailable (nothing behind it was acknowledged).
    if let Some(replica) = node.committer().replica() {
        replica.close();
    }
    drop(node);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The daemon's transport on `builder`: HTTP/2 windows and stream limit, and TLS with the
/// node's identity. `rpc-floor` serves on the same (see [`crate::instruments::rpc_floor`]).
pub(crate) fn transport<L>(
    builder: Server<L>,
    material: &bootstrap::Material,
) -> Result<Server<L>, ServeError> {
    builder
        // HTTP/2 flow control: the 64 KiB default window would stall every 4 MiB block on
        // round trips. One block per stream and a few blocks per connection bound the memory
        // a connection can make the server buffer (see MAX_STREAMS_PER_CONNECTION).
        .initial_stream_window_size(Some(MAX_MESSAGE as u32))
        .initial_connection_window_size(Some(4 * MAX_MESSAGE as u32))
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .tls_config(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(&material.cert_pem, &material.key_pem)),
        )
        .map_err(|source| ServeError::Identity {
            key: material.key_path.clone(),
            cert: material.cert_path.clone(),
            source,
        })
}

/// Listens on `addr` (port 0 picks a free one) and says which address it got.
pub(crate) async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listen = |source| ServeError::Listen {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    Ok((listener, local))
}

/// Connections accepted on `listener`, with `TCP_NODELAY`: small unary calls must not wait
/// for Nagle + delayed ACK (a 40 ms tail); each read through [`FairRead`], so a busy
/// connection's receive work takes turns with the serving runtime's other tasks.
pub(crate) fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<FairRead<tokio::net::TcpStream>>> {
    use futures::StreamExt;
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .map(|accepted| accepted.map(FairRead::new))
}

/// `https://HOST:PORT` clients reach this node at: `--advertise` as given when it names a
/// port (`HOST:PORT`, the form a cluster node advertises), else its host with the bound port.
pub(crate) fn advertised_endpoint(advertise: Option<&str>, local: SocketAddr) -> String {
    let names_port = |a: &str| match a.strip_prefix('[') {
        Some(inner) => inner.contains("]:"),
        None => a
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok()),
    };
    match (advertise, local.ip()) {
        (Some(a), _) if names_port(a) => format!("https://{a}"),
        (Some(h), _) => format!("https://{h}:{}", local.port()),
        (None, ip) if ip.is_unspecified() => format!("https://127.0.0.1:{}", local.port()),
        (None, std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:{}", local.port()),
        (None, ip) => format!("https://{ip}:{}", local.port()),
    }
}

/// The provider as the cluster record names it: every node must write to the same place.
fn provider_identity(provider: &ProviderConfig) -> String {
    match provider {
        ProviderConfig::S3 { bucket, .. } => bucket.clone(),
        ProviderConfig::Local { root } => format!("local:{}", root.display()),
        ProviderConfig::Memory => "memory".into(),
    }
}

/// Proves the freshly started daemon answers over TLS the way a client will reach it: one
/// standard health check through the advertised endpoint, trusting only the data dir's CA.
/// One gRPC health check of the whole server at `endpoint` over TLS, trusting `ca`: the status
/// name it answered (`SERVING`, `NOT_SERVING`, ...), or why there was no answer. Used by the
/// start-up self-check and by `nokv-server probe`.
/// `server_name`, when given, is the name the certificate must have instead of the endpoint's
/// host.
pub async fn health_status(
    endpoint: String,
    server_name: Option<String>,
    ca: std::path::PathBuf,
) -> Result<String, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let pem = std::fs::read(&ca).map_err(|e| format!("{}: {e}", ca.display()))?;
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
    if let Some(name) = server_name {
        tls = tls.domain_name(name);
    }
    let channel = Endpoint::from_shared(endpoint)
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|e| e.message().to_string())?;
    let status = resp.into_inner().status;
    Ok(
        tonic_health::pb::health_check_response::ServingStatus::try_from(status)
            .map_or_else(|_| status.to_string(), |s| s.as_str_name().to_string()),
    )
}

async fn self_check(endpoint: String, ca: std::path::PathBuf) {
    let started = std::time::Instant::now();
    let result = health_status(endpoint, None, ca).await;
    match result {
        Ok(status) if status == "SERVING" => {
            println!(
                "  self-check: TLS health check answered SERVING in {:.1} ms",
                started.elapsed().as_secs_f64() * 1000.0
            );
        }
        Ok(status) => tracing::warn!(status, "self-check: health check is not SERVING"),
        Err(e) => tracing::warn!(error = %e, "self-check: health check over TLS failed"),
    }
}

/// Per-shard maintenance until `stop` flips: a reconciler pass at start-up and then every
/// `interval` (`--reconcile-interval`),
/// and pruning of replay records and of the upload records they could reference. The first tick fires at once, which is the start-up scan.
async fn maintain(node: Arc<Node>, interval: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(interval);
    // A pass that overran the interval is followed by the next one, not by a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        for shard in node.shards() {
            let work = async {
                let started = std::time::Instant::now();
                let outcome = shard.reconcile().await;
                let m = crate::metrics::metrics();
                m.reconcile_duration
                    .observe(started.elapsed().as_secs_f64());
                m.reconcile_passes
                    .with_label_values(&[if outcome.is_ok() { "ok" } else { "error" }])
                    .inc();
                match outcome {
                    Ok(pass) if pass != Default::default() => {
                        tracing::info!(shard = shard.id, ?pass, "reconciled")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(shard = shard.id, error = %e, "reconcile failed; will retry")
                    }
                }
                if let Err(e) = shard.prune_replays().await {
                    tracing::warn!(shard = shard.id, error = %e, "replay pruning failed; will retry");
                }
                if let Err(e) = shard.prune_uploads().await {
                    tracing::warn!(shard = shard.id, error = %e, "upload pruning failed; will retry");
                }
                if let Err(e) = shard.prune_operations().await {
                    tracing::warn!(shard = shard.id, error = %e, "operation pruning failed; will retry");
                }
            };
            // Shutdown never waits for more than the shard being worked on.
            tokio::select! {
                _ = stop.changed() => return,
                _ = work => {}
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed by this call, not when the
/// future is first polled: a daemon that has announced it listens must stop gracefully on a
/// signal sent the next moment, not die of the signal's default action.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}
