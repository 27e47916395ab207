//! The serve settings as given: [`ServeArgs`], read from flags and `NOKV_*` environment
//! variables (clap) and from the TOML file (serde), and the layering of the two.
//!
//! Invariants: every field is an `Option` meaning "not set at this layer"; precedence is flag >
//! environment > TOML file > default, and the first two are clap's, the file layer is
//! [`ServeArgs::layer_file`]'s. The TOML keys are the field names (`deny_unknown_fields`: a
//! misspelt key is refused). Nothing here applies a default or validates a value: defaults
//! and checks live in [`ServeArgs::resolve`] and the files it calls (`limits.rs`,
//! `provider.rs`, `cluster.rs`), each setting in exactly one place.

use std::path::PathBuf;

use clap::Args;
use serde::Deserialize;

use super::error::ConfigError;

/// Every serve setting. The same struct is read from flags/env (clap) and from the TOML file
/// (serde); `None` means "not set at this layer".
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "NOKV_SERVER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./nokv-data].
    #[arg(long, env = "NOKV_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Listen address; port 0 picks a free port [default: 127.0.0.1:7878].
    #[arg(long, env = "NOKV_LISTEN")]
    pub listen: Option<String>,
    /// HOST or HOST:PORT clients and other nodes use to reach this node (a cluster node
    /// advertises HOST:PORT; without a port the bound port is used). With development material
    /// HOST is added to the certificate's names; with --tls-dir it chooses the node's
    /// certificate (nodes/HOST.pem).
    #[arg(long, env = "NOKV_ADVERTISE")]
    pub advertise: Option<String>,
    /// Number of shards [default: 16].
    #[arg(long, env = "NOKV_SHARDS")]
    pub shards: Option<u32>,
    /// Largest small file stored inline, in bytes [default: 262144].
    #[arg(long, env = "NOKV_INLINE_MAX")]
    pub inline_max: Option<usize>,
    /// How long request-id replay records are kept at least [default: 24h]. Records of the
    /// SDK's request ids, which carry their own time, are pruned up to 20 minutes after that.
    #[arg(long, env = "NOKV_REPLAY_TTL")]
    pub replay_ttl: Option<String>,
    /// How long a replaced or deleted artifact's revision stays readable (so a restore that
    /// started before the overwrite completes) before its blocks are collected [default: 10m].
    #[arg(long, env = "NOKV_RETIRED_GRACE")]
    pub retired_grace: Option<String>,
    /// Time between reconciler passes; the first pass runs at start-up [default: 20s].
    #[arg(long, env = "NOKV_RECONCILE_INTERVAL")]
    pub reconcile_interval: Option<String>,
    /// Time budget of each kind of reconciler scan in one pass (expired-upload claims,
    /// collectable deletes, guard sweep), so a slow one cannot eat the others' turn
    /// [default: 5s].
    #[arg(long, env = "NOKV_SCAN_BUDGET")]
    pub scan_budget: Option<String>,
    /// Failed provider deletes after which a delete operation becomes a dead letter: it leaves
    /// the automatic queue (record and accounting stay) until `nokv admin retry` [default: 8].
    #[arg(long, env = "NOKV_DELETE_ATTEMPTS")]
    pub delete_attempts: Option<u32>,
    /// How long history is kept: terminal operations (committed uploads, finished deletes)
    /// stay in the operations ledger this long (never less than --replay-ttl), and quarantine
    /// observations not seen for this long are pruned [default: 30d].
    #[arg(long, env = "NOKV_HISTORY_RETENTION")]
    pub history_retention: Option<String>,
    /// An upload's lease; clients renew at a third of it [default: 60s].
    #[arg(long, env = "NOKV_UPLOAD_LEASE")]
    pub upload_lease: Option<String>,
    /// Artifact blocks hashed and written at once on this node (bulk admission) [default: 2].
    #[arg(long, env = "NOKV_BULK_PARALLEL")]
    pub bulk_parallel: Option<usize>,
    /// Optional hard cap on the node's artifact-block bandwidth in MiB/s. Without it bulk work
    /// runs at full speed on a quiet node and yields to interactive requests on a busy one
    /// (see the README); 0 = no cap [default: no cap].
    #[arg(long, env = "NOKV_BULK_MIB_PER_S")]
    pub bulk_mib_per_s: Option<f64>,
    /// Node-wide budget of artifact-block bytes held in memory by ReadBlock and PutBlock, e.g.
    /// 256MiB or 1GiB; work past it waits, then is refused with ResourceExhausted; at least
    /// one block [default: 256MiB].
    #[arg(long, env = "NOKV_BLOCK_MEMORY")]
    pub block_memory: Option<String>,
    /// How long a block read or write waits for block memory before it is refused with
    /// ResourceExhausted [default: 10s].
    #[arg(long, env = "NOKV_BLOCK_MEMORY_WAIT")]
    pub block_memory_wait: Option<String>,
    /// Async worker threads serving requests [default: one per CPU].
    #[arg(long, env = "NOKV_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Serve Prometheus metrics over plain HTTP at http://ADDR/metrics, e.g. 127.0.0.1:9464
    /// (bind to loopback or a monitoring network: no TLS, no auth; metrics carry no secrets)
    /// [default: off].
    #[arg(long, env = "NOKV_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Object provider: local | s3 | memory [default: local, under DATA_DIR/objects].
    #[arg(long, env = "NOKV_PROVIDER")]
    pub provider: Option<String>,
    /// S3 endpoint URL (omit for AWS).
    #[arg(long, env = "NOKV_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 bucket.
    #[arg(long, env = "NOKV_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// Key prefix inside the bucket (or local directory) [default: nokv].
    #[arg(long, env = "NOKV_S3_PREFIX")]
    pub s3_prefix: Option<String>,
    /// S3 region [default: us-east-1].
    #[arg(long, env = "NOKV_S3_REGION")]
    pub s3_region: Option<String>,
    /// Allow plain http to a non-loopback S3 endpoint (loopback is always allowed).
    #[arg(long, env = "NOKV_S3_ALLOW_HTTP")]
    pub s3_allow_http: Option<bool>,
    /// S3 access key id (TOML only; otherwise AWS_ACCESS_KEY_ID).
    #[arg(skip)]
    pub s3_access_key_id: Option<String>,
    /// S3 secret key (TOML only; otherwise AWS_SECRET_ACCESS_KEY).
    #[arg(skip)]
    pub s3_secret_access_key: Option<String>,
    /// Cluster TLS directory (from `nokv-server cluster init`): the node serves with its CA,
    /// its own certificate C/nodes/HOST.pem (HOST = the --advertise host, else --node-id) and
    /// the cluster's token secret, instead of development material in the data dir.
    #[arg(long, env = "NOKV_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// etcd endpoints, comma-separated (e.g. https://10.0.0.1:2379,https://10.0.0.2:2379);
    /// turns on cluster mode. Needs --tls-dir, --cluster, --node-id and --advertise.
    /// https:// URLs need --etcd-ca; http:// sends ownership records in the clear to anyone on
    /// the network.
    #[arg(long, env = "NOKV_ETCD")]
    pub etcd: Option<String>,
    /// CA file (PEM) etcd's serving certificate must be signed by; the only CA trusted for
    /// etcd (no system roots). Needed by, and only valid with, https:// --etcd URLs.
    #[arg(long, env = "NOKV_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// This node's client certificate (PEM) for an etcd started with --client-cert-auth;
    /// with --etcd-key and --etcd-ca.
    #[arg(long, env = "NOKV_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// The private key (PEM) of --etcd-cert.
    #[arg(long, env = "NOKV_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user to authenticate as (etcd's auth enabled); with --etcd-password-file.
    #[arg(long, env = "NOKV_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding only the --etcd-user's password (one trailing line break is ignored);
    /// keep it 0600. Read once at start-up; the password is never logged or shown.
    #[arg(long, env = "NOKV_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// Cluster name: the nodes of one cluster share it (etcd keys live under /nokv/NAME/).
    #[arg(long, env = "NOKV_CLUSTER")]
    pub cluster: Option<String>,
    /// This node's id in the cluster (letters, digits, '.', '_', '-'); also chooses its
    /// certificate in --tls-dir when --advertise does not.
    #[arg(long, env = "NOKV_NODE_ID")]
    pub node_id: Option<String>,
    /// TTL of the node's etcd lease, whole seconds; keep-alive runs at a third of it
    /// [default: 10s].
    #[arg(long, env = "NOKV_NODE_TTL")]
    pub node_ttl: Option<String>,
    /// Where a write must be durable before it is acknowledged: local (this node's redo log)
    /// or provider (also the node's log stream in the object provider, so another node can
    /// take its shards over after a crash, even with its disk lost)
    /// [default: local; provider with --etcd].
    #[arg(long, env = "NOKV_METADATA_DURABILITY")]
    pub metadata_durability: Option<String>,
    /// Provider durability: how long batches are gathered into one log segment before it is
    /// sent; 0 sends as soon as the previous segment is sent. A positive value means fewer
    /// PUTs (each costs money on S3) for that much latency per write [default: 0].
    #[arg(long, env = "NOKV_LOG_FLUSH_INTERVAL")]
    pub log_flush_interval: Option<String>,
    /// Provider durability: log segments a node sends at once. More helps a provider with
    /// high latency and parallel capacity (S3); 1 gives the largest segments, best for one
    /// that is bound by its request rate [default: 1].
    #[arg(long, env = "NOKV_LOG_SEGMENTS_IN_FLIGHT")]
    pub log_segments_in_flight: Option<usize>,
    /// Provider durability: the longest time between two checkpoints of a shard that
    /// changed (a shard is also checkpointed once its log outgrows its last checkpoint)
    /// [default: 10m].
    #[arg(long, env = "NOKV_CHECKPOINT_INTERVAL")]
    pub checkpoint_interval: Option<String>,
    /// Provider durability: log bytes after which a shard is checkpointed, instead of its
    /// last checkpoint's size (at least 64KiB); tests set it small.
    #[arg(long, env = "NOKV_CHECKPOINT_LOG_BYTES", hide = true)]
    pub checkpoint_log_bytes: Option<String>,
    /// Log filter, e.g. info or nokv_server=debug [default: info].
    #[arg(long, env = "NOKV_LOG")]
    pub log: Option<String>,
    /// Log line format on stderr: text (coloured only on a terminal) or json (one object per
    /// line: timestamp, level, target, fields, spans) [default: text].
    #[arg(long, env = "NOKV_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Time between inventory scans of each shard (a paged listing of the provider prefix
    /// that quarantines objects no record accounts for, never deleting them); `off` or `0`
    /// disables periodic scans (`nokv admin inventory start` still runs one) [default: 1h].
    #[arg(long, env = "NOKV_INVENTORY_INTERVAL")]
    pub inventory_interval: Option<String>,
    /// Objects listed per inventory page (tests set it small) [default: 1000].
    #[arg(long, env = "NOKV_INVENTORY_PAGE_SIZE", hide = true)]
    pub inventory_page_size: Option<usize>,
    /// Admission cap: unresolved uploads (open, or claimed after expiry and not yet settled)
    /// of all shards this node holds; a BeginUpload past it is refused with
    /// AdmissionCapReached (gRPC RESOURCE_EXHAUSTED) [default: 8000].
    #[arg(long, env = "NOKV_MAX_UNRESOLVED_UPLOADS")]
    pub max_unresolved_uploads: Option<u64>,
    /// Admission cap: unresolved uploads of one workspace; a BeginUpload past it is refused
    /// with AdmissionCapReached (gRPC RESOURCE_EXHAUSTED) [default: 800].
    #[arg(long, env = "NOKV_MAX_UNRESOLVED_UPLOADS_PER_WORKSPACE")]
    pub max_unresolved_uploads_per_workspace: Option<u64>,
}

macro_rules! layer {
    ($cli:expr, $file:expr, $($field:ident),*) => {$(
        if $cli.$field.is_none() { $cli.$field = $file.$field.take(); }
    )*};
}

impl ServeArgs {
    /// With `--config`, fills every field unset by flags/env from the TOML file; without it,
    /// changes nothing.
    pub(super) fn layer_file(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
            let mut file: ServeArgs = toml::from_str(&text)
                .map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
            layer!(
                self,
                file,
                data_dir,
                listen,
                advertise,
                shards,
                inline_max,
                replay_ttl,
                retired_grace,
                reconcile_interval,
                scan_budget,
                delete_attempts,
                history_retention,
                upload_lease,
                bulk_parallel,
                worker_threads,
                metrics_listen,
                bulk_mib_per_s,
                block_memory,
                block_memory_wait,
                provider,
                s3_endpoint,
                s3_bucket,
                s3_prefix,
                s3_region,
                s3_allow_http,
                s3_access_key_id,
                s3_secret_access_key,
                tls_dir,
                etcd,
                etcd_ca,
                etcd_cert,
                etcd_key,
                etcd_user,
                etcd_password_file,
                cluster,
                node_id,
                node_ttl,
                metadata_durability,
                log_flush_interval,
                checkpoint_interval,
                checkpoint_log_bytes,
                log_segments_in_flight,
                log,
                log_format,
                inventory_interval,
                inventory_page_size
            );
            layer!(
                self,
                file,
                max_unresolved_uploads,
                max_unresolved_uploads_per_workspace
            );
        }
        Ok(())
    }
}
