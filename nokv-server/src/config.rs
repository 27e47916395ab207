//! Server configuration: a TOML file (`--config`), then `NOKV_*` environment variables, then
//! flags, in increasing order of precedence. Every setting is optional at each layer; the
//! defaults below make a bare `nokv-server` a working embedded daemon.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use nokv_proto::MAX_MESSAGE;
use serde::Deserialize;

use crate::control::access::EtcdAccessFiles;
use crate::memory::{DEFAULT_BLOCK_MEMORY, DEFAULT_WAIT, parse_size};
use crate::object::ProviderConfig;
use crate::shard::ShardConfig;
use crate::token::parse_duration;

#[derive(Debug, Parser)]
#[command(
    name = "nokv-server",
    version,
    about = "nokv: a sharded, owner-mediated block store daemon for agent workspaces",
    long_about = "nokv: a sharded, owner-mediated block store daemon for agent workspaces.\n\n\
        With no flags it serves 16 shards from ./nokv-data on 127.0.0.1:7878 over TLS, using a \
        local-filesystem object provider, and prints how to point the `nokv` CLI at it.\n\n\
        Settings come from a TOML file (--config; keys are the flag names with '_' for '-'), \
        then NOKV_* environment variables, then flags; later layers win."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create and extend a cluster TLS directory (CA, node certificates, token secret, admin
    /// token) that every node of a cluster starts with via --tls-dir.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Make a new data directory from a backup file (`nokv admin backup`). Checks every digest
    /// of FILE before it creates anything; refuses a damaged file and a DIR that is not empty.
    ///
    /// The backup holds every shard's metadata, not the artifact blocks: those stay in the
    /// object provider, so start the restored node with the same provider settings (the same S3
    /// bucket and prefix; with the local provider, move the old DATA_DIR/objects to DIR/objects
    /// first), and never beside the node it was taken from on the same provider. It holds no
    /// secret either: the first start creates a new TLS identity and admin token (copy the old
    /// cluster.secret into DIR first to keep tokens already issued valid).
    RestoreBackup {
        /// The data directory to create (missing or empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// The backup file.
        file: PathBuf,
    },
    /// Measure direct provider PUTs of blocks through the same one-attempt create path the
    /// owner uses — the baseline `nokv bench upload-vs-direct` compares publishing against.
    /// Prints one JSON line; the blocks are deleted afterwards.
    ProviderBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Number of 4 MiB blocks to write.
        #[arg(long, default_value_t = 16)]
        blocks: u32,
        /// Blocks in flight at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
    /// Measure the store alone: 4 KiB small-file writes through the shard write path and the
    /// node committer from tasks in this process (no gRPC, TLS or client), at each session
    /// count. Opens its own node under --data-dir (not a running daemon's). Prints one JSON
    /// line per session count.
    StoreBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Concurrent writers per measurement, each on its own workspace.
        #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
        sessions: Vec<usize>,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Commit without redb's quick repair (the daemon always sets it): to measure what it
        /// costs.
        #[arg(long)]
        no_quick_repair: bool,
    },
    /// Measure start-up after kill -9: fills the node file under --data-dir with --fill-files
    /// 4 KiB files through the shard write path (once; later runs reuse it), then per round kills a writer
    /// child right after a periodic durable commit and times the next open of the node file,
    /// with redb's quick repair off and on, page cache kept (warm) and dropped (cold); then
    /// times the periodic durable commit both ways. Prints one JSON line per measurement and a
    /// summary. Use a data dir of its own (not a running daemon's).
    RestartBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// New 4 KiB files the fill writes first (100,000 make a node file of about 1.1 GiB).
        #[arg(long, default_value_t = 100_000)]
        fill_files: u64,
        /// Rounds; each crashes and reopens once per mode and page-cache state.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Pairs of flush runs (quick repair off and on, alternating).
        #[arg(long, default_value_t = 5)]
        flush_rounds: usize,
        /// Durable commits timed per flush run.
        #[arg(long, default_value_t = 100)]
        flushes: usize,
        /// The writer the bench runs as a child process (internal).
        #[arg(long, value_enum, hide = true)]
        child: Option<RestartChild>,
        /// The child commits without quick repair (internal).
        #[arg(long, hide = true)]
        no_quick_repair: bool,
    },
    /// Measure the transport's floor: serve `Write` on the daemon's TLS and HTTP/2 settings
    /// doing only what no store can skip (authenticate, validate, make the body durable in a
    /// scratch file, answer). A measuring instrument for `nokv bench limits`, never a store:
    /// it answers writes it does not keep. Serves until SIGINT/SIGTERM.
    RpcFloor {
        /// A daemon's data directory: its TLS identity and token secret are used (read only).
        #[arg(long)]
        data_dir: PathBuf,
        /// Scratch file the bodies are written to (created; 16 MiB, zeroed first).
        #[arg(long)]
        scratch: PathBuf,
        /// Listen address; port 0 picks a free port.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where each body's durable write runs: `writer` (handed to one writer thread that
        /// fsyncs once for every body waiting, as the node committer does) or `inline` (on the
        /// async worker that received the call).
        #[arg(long, value_enum, default_value = "writer")]
        durable: crate::rpc_floor::Durable,
    },
    /// Start again from a damaged or missing redo log (`shards/node.redo`) that start-up
    /// refuses. Without --accept-loss it only reports what is wrong and which batches would
    /// be dropped; with it, it keeps the node file's durable state and every log record before
    /// the damage, moves the damaged log aside (`node.redo.damaged-<time>`), creates a fresh
    /// one, and reports exactly which sequence numbers it dropped. Prefer restoring from a
    /// backup (`nokv admin backup` / `nokv-server restore-backup`): the dropped batches were
    /// acknowledged. The daemon must be stopped.
    ///
    /// Example: nokv-server recover --data-dir /var/lib/nokv --accept-loss
    Recover {
        /// The data directory the daemon refuses to start on.
        #[arg(long)]
        data_dir: PathBuf,
        /// Drop what cannot be read back and start again (never the default).
        #[arg(long)]
        accept_loss: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What a `restart-bench` child process does (see [`crate::restart_bench`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartChild {
    /// Writes new files until the node file is large enough, then ends.
    Fill,
    /// Overwrites files until the bench kills it.
    Write,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a bearer token signed with the data directory's cluster secret.
    Issue {
        /// Data directory (or cluster directory from `cluster init`) holding cluster.secret.
        #[arg(long, env = "NOKV_DATA_DIR", default_value = "./nokv-data")]
        data_dir: PathBuf,
        /// Workspace name or pattern (`name`, `prefix*`, `*`); repeat for several.
        #[arg(long, required = true)]
        workspace: Vec<String>,
        /// read | write | admin
        #[arg(long, default_value = "write")]
        role: String,
        /// Lifetime, e.g. 30d, 12h, 15m, 90s.
        #[arg(long, default_value = "30d")]
        ttl: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Write a new cluster directory: one CA, a certificate per --host (C/nodes/HOST.pem and
    /// .key), the token secret, an admin token and C/client.toml; with --etcd-host, also
    /// certificates for a test/dev etcd (C/etcd/server.pem + .key) and the nodes' etcd client
    /// certificate (C/etcd/client.pem + .key). Never overwrites an existing directory.
    Init {
        /// The cluster directory to create.
        #[arg(long)]
        dir: PathBuf,
        /// A node's host name or IP address, as clients reach it; repeat for several nodes.
        #[arg(long, required = true)]
        host: Vec<String>,
        /// A name or IP address etcd is reached at; repeat for several. Writes C/etcd/server.pem
        /// (for etcd's --cert-file, with --trusted-ca-file C/ca.pem --client-cert-auth) and
        /// C/etcd/client.pem (for the nodes' --etcd-cert), both signed by the cluster CA. For
        /// a test or development etcd: such an etcd trusts every cluster-CA certificate.
        #[arg(long)]
        etcd_host: Vec<String>,
    },
    /// Add a node certificate for --host, signed by the cluster directory's CA; with
    /// --etcd-host, add the etcd certificates `cluster init --etcd-host` writes (refused when
    /// the directory has them).
    Cert {
        /// An existing cluster directory (from `cluster init`).
        #[arg(long)]
        dir: PathBuf,
        /// The new node's host name or IP address; repeat for several.
        #[arg(long, required_unless_present = "etcd_host")]
        host: Vec<String>,
        /// A name or IP address etcd is reached at; repeat for several (see `cluster init`).
        #[arg(long)]
        etcd_host: Vec<String>,
    },
}

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
    /// Log filter, e.g. info or nokv_server=debug [default: info].
    #[arg(long, env = "NOKV_LOG")]
    pub log: Option<String>,
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

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// The largest `inline_max` a `Write` can carry: the transport's message limit less the room
/// it keeps for framing and the request's other fields (path, workspace, request id).
pub const MAX_INLINE_MAX: usize = MAX_MESSAGE - 64 * 1024;

/// Default time between reconciler passes.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(20);

/// Default time between inventory scans of a shard.
pub const DEFAULT_INVENTORY_INTERVAL: Duration = Duration::from_secs(3600);

/// Default TTL of a cluster node's etcd lease.
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);

/// The refusal of `--etcd` without `--tls-dir`, one line.
pub const ETCD_NEEDS_TLS_DIR: &str = "--etcd needs --tls-dir: every node of a cluster must share one CA and token secret \
     (create them with `nokv-server cluster init`); per-node development CAs would make the cluster unusable";

/// Cluster-mode settings, present exactly when `--etcd` is given (validated: every field set).
/// The embedded default has none and never touches etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// etcd endpoint URLs (http:// or https://), at least one.
    pub etcd: Vec<String>,
    /// Cluster name (`--cluster`).
    pub cluster: String,
    /// This node's id (`--node-id`).
    pub node_id: String,
    /// Where other nodes and clients reach this node (`--advertise`).
    pub advertise: String,
    /// TTL of the node's etcd lease (whole seconds, at least 1s).
    pub node_ttl: Duration,
    /// The shared cluster TLS directory (`--tls-dir`).
    pub tls_dir: PathBuf,
    /// How etcd is reached: `--etcd-ca`, `--etcd-cert`/`--etcd-key`, `--etcd-user`/
    /// `--etcd-password-file` (paths only; read when the node joins).
    pub etcd_access: EtcdAccessFiles,
}

/// Fully resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub data_dir: PathBuf,
    pub listen: String,
    pub advertise: Option<String>,
    pub shards: u32,
    pub shard: ShardConfig,
    /// Time between reconciler passes (the first runs at start-up).
    pub reconcile_interval: Duration,
    pub bulk_parallel: usize,
    /// Async workers of the serving runtime (`--worker-threads`, else one per CPU); never 0.
    pub worker_threads: usize,
    /// `--metrics-listen`: where `GET /metrics` is served; `None` = off.
    pub metrics_listen: Option<String>,
    pub bulk_mib_per_s: Option<f64>,
    /// Bytes of the block-memory budget (see [`crate::memory`]).
    pub block_memory: u64,
    pub block_memory_wait: Duration,
    pub provider: ProviderConfig,
    pub prefix: String,
    pub log: String,
    /// Cluster TLS directory: when set, TLS and token material come from it (read-only)
    /// instead of the data dir's development material.
    pub tls_dir: Option<PathBuf>,
    /// `--node-id`, also valid without etcd (it can choose the certificate in `tls_dir`).
    pub node_id: Option<String>,
    /// Cluster mode; `None` without `--etcd`.
    pub cluster: Option<ClusterSettings>,
    /// Inventory cadence, page size and observation retention.
    pub inventory: crate::inventory::InventorySettings,
}

macro_rules! layer {
    ($cli:expr, $file:expr, $($field:ident),*) => {$(
        if $cli.$field.is_none() { $cli.$field = $file.$field.take(); }
    )*};
}

impl ServeArgs {
    /// Fills every field unset by flags/env from the TOML file, then applies defaults.
    pub fn resolve(mut self) -> Result<Settings, ConfigError> {
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
                log,
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
        let data_dir = self
            .data_dir
            .unwrap_or_else(|| PathBuf::from("./nokv-data"));
        let duration = |v: Option<String>, default: Duration| -> Result<Duration, ConfigError> {
            match v {
                None => Ok(default),
                Some(s) => parse_duration(&s).map_err(|e| ConfigError(e.to_string())),
            }
        };
        let defaults = ShardConfig::default();
        let shard = ShardConfig {
            inline_max: self.inline_max.unwrap_or(defaults.inline_max),
            block_size: defaults.block_size,
            upload_lease: duration(self.upload_lease, defaults.upload_lease)?,
            replay_ttl: duration(self.replay_ttl, defaults.replay_ttl)?,
            retired_grace: duration(self.retired_grace, defaults.retired_grace)?,
            scan_budget: duration(self.scan_budget, defaults.scan_budget)?,
            admission: crate::shard::admission::Caps {
                max_unresolved_uploads: self
                    .max_unresolved_uploads
                    .unwrap_or(defaults.admission.max_unresolved_uploads),
                max_unresolved_uploads_per_workspace: self
                    .max_unresolved_uploads_per_workspace
                    .unwrap_or(defaults.admission.max_unresolved_uploads_per_workspace),
                census: defaults.admission.census.clone(),
            },
            delete_attempts: self.delete_attempts.unwrap_or(defaults.delete_attempts),
            history_retention: duration(self.history_retention, defaults.history_retention)?,
            search: defaults.search,
        };
        if shard.delete_attempts == 0 {
            return Err(ConfigError(
                "delete_attempts must be at least 1 (a delete is tried before it can fail)".into(),
            ));
        }
        let reconcile_interval = duration(self.reconcile_interval, DEFAULT_RECONCILE_INTERVAL)?;
        if reconcile_interval.is_zero() || shard.scan_budget.is_zero() {
            return Err(ConfigError(
                "reconcile_interval and scan_budget must be greater than zero".into(),
            ));
        }
        if shard.inline_max > MAX_INLINE_MAX {
            return Err(ConfigError(format!(
                "inline_max {} is larger than one request can carry: the transport takes at most \
                 {} bytes per message, so inline_max must be at most {MAX_INLINE_MAX} (4 MiB); \
                 larger files are published as artifacts",
                shard.inline_max, MAX_MESSAGE
            )));
        }
        if shard.admission.max_unresolved_uploads == 0
            || shard.admission.max_unresolved_uploads_per_workspace == 0
        {
            return Err(ConfigError(
                "max_unresolved_uploads and max_unresolved_uploads_per_workspace must be at \
                 least 1 (a cap of 0 would refuse every upload)"
                    .into(),
            ));
        }
        if shard.upload_lease < Duration::from_secs(1) {
            return Err(ConfigError("upload lease must be at least 1s".into()));
        }
        let inventory = crate::inventory::InventorySettings {
            interval: match self.inventory_interval.as_deref().map(str::trim) {
                None => Some(DEFAULT_INVENTORY_INTERVAL),
                Some("off") => None,
                Some(s) => Some(
                    parse_duration(s)
                        .map_err(|e| ConfigError(format!("inventory_interval: {e}")))?,
                )
                .filter(|d| !d.is_zero()),
            },
            page: match self.inventory_page_size {
                None => crate::inventory::DEFAULT_PAGE,
                Some(0) => {
                    return Err(ConfigError("inventory_page_size must be at least 1".into()));
                }
                Some(n) => n,
            },
            retention: shard.history_retention,
        };
        let shards = self.shards.unwrap_or(16);
        if !(1..=4096).contains(&shards) {
            return Err(ConfigError("shards must be 1..=4096".into()));
        }
        let block_memory = match &self.block_memory {
            None => DEFAULT_BLOCK_MEMORY,
            Some(s) => parse_size(s).map_err(|e| ConfigError(format!("block_memory: {e}")))?,
        };
        // A budget smaller than one PutBlock message could never admit a block.
        if block_memory < MAX_MESSAGE as u64 {
            return Err(ConfigError(format!(
                "block_memory must be at least one block with framing ({MAX_MESSAGE} bytes)"
            )));
        }
        let block_memory_wait = duration(self.block_memory_wait.take(), DEFAULT_WAIT)?;
        let provider = match self.provider.as_deref().unwrap_or("local") {
            "local" => ProviderConfig::Local {
                root: data_dir.join("objects"),
            },
            "memory" => ProviderConfig::Memory,
            "s3" => ProviderConfig::S3 {
                endpoint: self.s3_endpoint,
                bucket: self
                    .s3_bucket
                    .ok_or_else(|| ConfigError("--provider s3 needs --s3-bucket".into()))?,
                region: self.s3_region.unwrap_or_else(|| "us-east-1".into()),
                allow_http: self.s3_allow_http.unwrap_or(false),
                access_key_id: self
                    .s3_access_key_id
                    .or_else(|| std::env::var("AWS_ACCESS_KEY_ID").ok()),
                secret_access_key: self
                    .s3_secret_access_key
                    .or_else(|| std::env::var("AWS_SECRET_ACCESS_KEY").ok()),
            },
            other => {
                return Err(ConfigError(format!(
                    "provider {other:?} is not one of local, s3, memory"
                )));
            }
        };
        let access = EtcdAccessFiles {
            ca: self.etcd_ca.take(),
            cert: self.etcd_cert.take(),
            key: self.etcd_key.take(),
            user: self.etcd_user.take(),
            password_file: self.etcd_password_file.take(),
        };
        let cluster = cluster_settings(
            self.etcd.take(),
            self.cluster.take(),
            self.node_id.clone(),
            self.advertise.clone(),
            self.node_ttl.take(),
            self.tls_dir.clone(),
            access,
        )?;
        if let Some(id) = &self.node_id {
            check_id("--node-id", id)?;
        }
        if self.tls_dir.is_some() && self.advertise.is_none() && self.node_id.is_none() {
            return Err(ConfigError(
                "--tls-dir needs --advertise HOST or --node-id ID to choose this node's certificate (C/nodes/HOST.pem)".into(),
            ));
        }
        Ok(Settings {
            data_dir,
            listen: self.listen.unwrap_or_else(|| "127.0.0.1:7878".into()),
            advertise: self.advertise,
            shards,
            shard,
            reconcile_interval,
            bulk_parallel: self.bulk_parallel.unwrap_or(2),
            worker_threads: match self.worker_threads {
                Some(0) => {
                    return Err(ConfigError(
                        "worker_threads must be at least 1 (leave it out for the default)".into(),
                    ));
                }
                Some(n) => n,
                None => std::thread::available_parallelism().map_or(1, |n| n.get()),
            },
            metrics_listen: match self.metrics_listen {
                Some(a) if a.trim().is_empty() => {
                    return Err(ConfigError(
                        "metrics_listen is empty: give HOST:PORT (e.g. 127.0.0.1:9464) or leave it out".into(),
                    ));
                }
                other => other,
            },
            bulk_mib_per_s: match self.bulk_mib_per_s {
                Some(r) if r < 0.0 || !r.is_finite() => {
                    return Err(ConfigError("bulk_mib_per_s must be >= 0".into()));
                }
                Some(r) => (r > 0.0).then_some(r),
                // No default cap: interactive-first scheduling (crate::bulk) keeps an upload
                // from slowing interactive requests without slowing a lone upload.
                None => None,
            },
            block_memory,
            block_memory_wait,
            provider,
            prefix: self.s3_prefix.unwrap_or_else(|| "nokv".into()),
            log: self.log.unwrap_or_else(|| "info".into()),
            tls_dir: self.tls_dir,
            node_id: self.node_id,
            cluster,
            inventory,
        })
    }
}

/// Validates the cluster flags: all of them or (apart from `--node-id`) none. Each refusal is
/// one line naming what is missing.
fn cluster_settings(
    etcd: Option<String>,
    cluster: Option<String>,
    node_id: Option<String>,
    advertise: Option<String>,
    node_ttl: Option<String>,
    tls_dir: Option<PathBuf>,
    access: EtcdAccessFiles,
) -> Result<Option<ClusterSettings>, ConfigError> {
    let Some(etcd) = etcd else {
        let stray: Vec<&str> = [
            ("--cluster", cluster.is_some()),
            ("--node-ttl", node_ttl.is_some()),
            ("--etcd-ca", access.ca.is_some()),
            ("--etcd-cert", access.cert.is_some()),
            ("--etcd-key", access.key.is_some()),
            ("--etcd-user", access.user.is_some()),
            ("--etcd-password-file", access.password_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if !stray.is_empty() {
            return Err(ConfigError(format!(
                "{} only apply with --etcd (cluster mode)",
                stray.join(" and ")
            )));
        }
        return Ok(None);
    };
    let Some(tls_dir) = tls_dir else {
        return Err(ConfigError(ETCD_NEEDS_TLS_DIR.into()));
    };
    let missing: Vec<&str> = [
        ("--cluster NAME", cluster.is_none()),
        ("--node-id ID", node_id.is_none()),
        ("--advertise HOST:PORT", advertise.is_none()),
    ]
    .into_iter()
    .filter_map(|(flag, absent)| absent.then_some(flag))
    .collect();
    if !missing.is_empty() {
        return Err(ConfigError(format!(
            "--etcd needs {}: a cluster node must say which cluster it joins, who it is and where it is reached",
            missing.join(", ")
        )));
    }
    let urls: Vec<String> = etcd
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect();
    if urls.is_empty() {
        return Err(ConfigError("--etcd needs at least one URL".into()));
    }
    if let Some(bad) = urls
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")) || u.len() <= 8)
    {
        return Err(ConfigError(format!(
            "--etcd {bad:?} is not an http:// or https:// URL"
        )));
    }
    check_access(&urls, &access)?;
    let (cluster, node_id) = (cluster.unwrap_or_default(), node_id.unwrap_or_default());
    check_id("--cluster", &cluster)?;
    check_id("--node-id", &node_id)?;
    let node_ttl = match node_ttl {
        None => DEFAULT_NODE_TTL,
        Some(s) => parse_duration(&s).map_err(|e| ConfigError(format!("--node-ttl: {e}")))?,
    };
    if node_ttl < Duration::from_secs(1) || node_ttl.subsec_nanos() != 0 {
        return Err(ConfigError(
            "--node-ttl must be whole seconds, at least 1s (etcd leases are granted in seconds)"
                .into(),
        ));
    }
    Ok(Some(ClusterSettings {
        etcd: urls,
        cluster,
        node_id,
        advertise: advertise.unwrap_or_default(),
        node_ttl,
        tls_dir,
        etcd_access: access,
    }))
}

/// The etcd access flags fit the URLs and each other: all URLs https:// with `--etcd-ca`, or
/// all http:// without TLS files; certificate and key together; user and password file
/// together.
fn check_access(urls: &[String], access: &EtcdAccessFiles) -> Result<(), ConfigError> {
    let https = urls.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != urls.len() {
        return Err(ConfigError(
            "--etcd mixes http:// and https:// URLs: use https:// for every endpoint".into(),
        ));
    }
    if https == 0 {
        if let Some(flag) = [
            ("--etcd-ca", access.ca.is_some()),
            ("--etcd-cert", access.cert.is_some()),
            ("--etcd-key", access.key.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, set)| set.then_some(flag))
        {
            return Err(ConfigError(format!(
                "{flag} needs https:// --etcd URLs (given: {})",
                urls.join(",")
            )));
        }
    } else if access.ca.is_none() {
        return Err(ConfigError(format!(
            "--etcd {} needs --etcd-ca FILE: the CA etcd's certificate is checked against (no \
             system roots are trusted for etcd)",
            urls.join(",")
        )));
    }
    match (&access.cert, &access.key) {
        (Some(_), None) => return Err(ConfigError("--etcd-cert needs --etcd-key".into())),
        (None, Some(_)) => return Err(ConfigError("--etcd-key needs --etcd-cert".into())),
        _ => {}
    }
    match (&access.user, &access.password_file) {
        (Some(_), None) => Err(ConfigError(
            "--etcd-user needs --etcd-password-file (a file holding only the password)".into(),
        )),
        (None, Some(_)) => Err(ConfigError(
            "--etcd-password-file needs --etcd-user (the etcd user the password is for)".into(),
        )),
        (Some(user), Some(_)) if user.trim().is_empty() || user.contains(['\n', '\r']) => Err(
            ConfigError("--etcd-user must be a non-empty user name".into()),
        ),
        _ => Ok(()),
    }
}

/// Cluster names and node ids become etcd key segments: 1-64 of letters, digits, '.', '_', '-'.
fn check_id(flag: &str, id: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{flag} {id:?} must be 1-64 letters, digits, '.', '_' or '-' (not starting with '.')"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::path::Path;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9\"\nshards = 4\nupload_lease = \"30s\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "nokv-server",
            "--config",
            file.to_str().unwrap(),
            "--shards",
            "8",
        ]);
        let s = cli.serve.resolve().unwrap();
        assert_eq!(s.shards, 8);
        assert_eq!(s.listen, "127.0.0.1:9");
        assert_eq!(s.shard.upload_lease, Duration::from_secs(30));
        assert_eq!(s.shard.inline_max, 256 * 1024);
    }

    #[test]
    fn retired_revisions_stay_readable_for_ten_minutes_unless_configured() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.shard.retired_grace, Duration::from_secs(600));
        let s = Cli::parse_from(["nokv-server", "--retired-grace", "90s"])
            .serve
            .resolve()
            .unwrap();
        assert_eq!(s.shard.retired_grace, Duration::from_secs(90));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "retired_grace = \"1h\"\n").unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        assert_eq!(
            cli.serve.resolve().unwrap().shard.retired_grace,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn metrics_are_served_only_when_metrics_listen_is_set_by_flag_or_file_and_never_on_an_empty_address()
     {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.metrics_listen, None);
        let s = Cli::parse_from(["nokv-server", "--metrics-listen", "127.0.0.1:9464"])
            .serve
            .resolve()
            .unwrap();
        assert_eq!(s.metrics_listen.as_deref(), Some("127.0.0.1:9464"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "metrics_listen = \"[::1]:9464\"\n").unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        assert_eq!(
            cli.serve.resolve().unwrap().metrics_listen.as_deref(),
            Some("[::1]:9464")
        );
        let cli = Cli::parse_from(["nokv-server", "--metrics-listen", " "]);
        assert!(cli.serve.resolve().is_err());
    }

    #[test]
    fn async_workers_default_to_one_per_cpu_and_zero_workers_is_refused() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(resolve(&[]).unwrap().worker_threads, cpus);
        assert_eq!(
            resolve(&["--worker-threads", "3"]).unwrap().worker_threads,
            3
        );
        assert!(resolve(&["--worker-threads", "0"]).is_err());
    }

    #[test]
    fn the_shipped_example_configuration_parses() {
        let example = include_str!("../../deploy/nokv-server.example.toml");
        let args: ServeArgs = toml::from_str(example).unwrap();
        assert_eq!(args.provider.as_deref(), Some("s3"));
        assert_eq!(args.bulk_parallel, Some(2));
    }

    #[test]
    fn unknown_file_keys_and_bad_providers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "listne = \"x\"\n").unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        assert!(cli.serve.resolve().is_err());
        let cli = Cli::parse_from(["nokv-server", "--provider", "ftp"]);
        assert!(cli.serve.resolve().is_err());
        let cli = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=-1"]);
        assert!(cli.serve.resolve().is_err());
    }

    #[test]
    fn bulk_bandwidth_has_no_cap_unless_one_is_asked_for() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.bulk_mib_per_s, None);
        let s = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=0"])
            .serve
            .resolve()
            .unwrap();
        assert_eq!(s.bulk_mib_per_s, None);
        let s = Cli::parse_from(["nokv-server", "--bulk-mib-per-s=48"])
            .serve
            .resolve()
            .unwrap();
        assert_eq!(s.bulk_mib_per_s, Some(48.0));
    }

    #[test]
    fn the_block_memory_budget_comes_from_flag_file_or_default_and_must_hold_one_block() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.block_memory, 256 * 1024 * 1024);
        assert_eq!(s.block_memory_wait, Duration::from_secs(10));
        let s = Cli::parse_from([
            "nokv-server",
            "--block-memory",
            "1GiB",
            "--block-memory-wait",
            "2s",
        ])
        .serve
        .resolve()
        .unwrap();
        assert_eq!(s.block_memory, 1 << 30);
        assert_eq!(s.block_memory_wait, Duration::from_secs(2));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "block_memory = \"64MiB\"\n").unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        assert_eq!(cli.serve.resolve().unwrap().block_memory, 64 << 20);
        for bad in ["1MiB", "lots", "0"] {
            let cli = Cli::parse_from(["nokv-server", "--block-memory", bad]);
            assert!(cli.serve.resolve().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_inline_max_larger_than_the_transport_carries_is_refused_at_start_up() {
        let too_big = (MAX_INLINE_MAX + 1).to_string();
        let cli = Cli::parse_from(["nokv-server", "--inline-max", too_big.as_str()]);
        let e = cli.serve.resolve().unwrap_err();
        assert!(e.0.contains("inline_max"), "{e}");
        let max = MAX_INLINE_MAX.to_string();
        let cli = Cli::parse_from(["nokv-server", "--inline-max", max.as_str()]);
        assert_eq!(
            cli.serve.resolve().unwrap().shard.inline_max,
            MAX_INLINE_MAX
        );
    }

    #[test]
    fn reconciler_cadence_and_scan_budget_come_from_flags_or_defaults_and_zero_is_refused() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.reconcile_interval, Duration::from_secs(20));
        assert_eq!(s.shard.scan_budget, Duration::from_secs(5));
        let s = Cli::parse_from([
            "nokv-server",
            "--reconcile-interval",
            "2s",
            "--scan-budget",
            "500ms",
        ])
        .serve
        .resolve()
        .unwrap();
        assert_eq!(s.reconcile_interval, Duration::from_secs(2));
        assert_eq!(s.shard.scan_budget, Duration::from_millis(500));
        for bad in [["--reconcile-interval", "0s"], ["--scan-budget", "0s"]] {
            let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
            assert!(cli.serve.resolve().is_err(), "{bad:?}");
        }
    }

    /// Mutation: drop the second `layer!` (TOML ignored) or the zero check.
    #[test]
    fn admission_caps_default_to_8000_and_800_come_from_flags_or_toml_and_zero_is_refused() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        let caps = &s.shard.admission;
        assert_eq!(
            (
                caps.max_unresolved_uploads,
                caps.max_unresolved_uploads_per_workspace
            ),
            (8000, 800)
        );
        let s = Cli::parse_from([
            "nokv-server",
            "--max-unresolved-uploads",
            "50",
            "--max-unresolved-uploads-per-workspace",
            "5",
        ])
        .serve
        .resolve()
        .unwrap();
        let caps = &s.shard.admission;
        assert_eq!(
            (
                caps.max_unresolved_uploads,
                caps.max_unresolved_uploads_per_workspace
            ),
            (50, 5)
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nokv.toml");
        std::fs::write(&file, "max_unresolved_uploads_per_workspace = 7\n").unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        let s = cli.serve.resolve().unwrap();
        assert_eq!(s.shard.admission.max_unresolved_uploads_per_workspace, 7);
        for bad in [
            ["--max-unresolved-uploads", "0"],
            ["--max-unresolved-uploads-per-workspace", "0"],
        ] {
            let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
            assert!(cli.serve.resolve().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_inventory_scans_hourly_by_default_and_off_or_zero_disables_periodic_scans() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(s.inventory.interval, Some(Duration::from_secs(3600)));
        assert_eq!(s.inventory.retention, Duration::from_secs(30 * 86400));
        assert_eq!(s.inventory.page, crate::inventory::DEFAULT_PAGE);
        for off in ["off", "0", "0s"] {
            let cli = Cli::parse_from(["nokv-server", "--inventory-interval", off]);
            assert_eq!(
                cli.serve.resolve().unwrap().inventory.interval,
                None,
                "{off}"
            );
        }
        let s = Cli::parse_from([
            "nokv-server",
            "--inventory-interval",
            "10m",
            "--history-retention",
            "7d",
            "--inventory-page-size",
            "3",
        ])
        .serve
        .resolve()
        .unwrap();
        assert_eq!(s.inventory.interval, Some(Duration::from_secs(600)));
        assert_eq!(s.inventory.retention, Duration::from_secs(7 * 86400));
        assert_eq!(s.inventory.page, 3);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nokv.toml");
        std::fs::write(
            &file,
            "inventory_interval = \"off\"\nhistory_retention = \"1d\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from(["nokv-server", "--config", file.to_str().unwrap()]);
        let s = cli.serve.resolve().unwrap();
        assert_eq!(s.inventory.interval, None);
        assert_eq!(s.inventory.retention, Duration::from_secs(86400));
        for bad in [
            ["--inventory-interval", "soon"],
            ["--inventory-page-size", "0"],
        ] {
            let cli = Cli::parse_from(["nokv-server", bad[0], bad[1]]);
            assert!(cli.serve.resolve().is_err(), "{bad:?}");
        }
    }

    fn resolve(args: &[&str]) -> Result<Settings, ConfigError> {
        Cli::parse_from(std::iter::once("nokv-server").chain(args.iter().copied()))
            .serve
            .resolve()
    }

    const FULL: [&str; 10] = [
        "--etcd",
        "http://127.0.0.1:2379, http://127.0.0.1:2479",
        "--cluster",
        "prod",
        "--node-id",
        "n1",
        "--advertise",
        "n1:7878",
        "--tls-dir",
        "/c",
    ];

    #[test]
    fn without_etcd_there_are_no_cluster_settings() {
        let s = resolve(&[]).unwrap();
        assert!(s.cluster.is_none() && s.tls_dir.is_none() && s.node_id.is_none());
        let s = resolve(&["--tls-dir", "/c", "--advertise", "n1"]).unwrap();
        assert!(s.cluster.is_none());
        assert_eq!(s.tls_dir.as_deref(), Some(std::path::Path::new("/c")));
    }

    #[test]
    fn etcd_with_every_cluster_flag_yields_cluster_settings_with_a_ten_second_node_ttl() {
        let c = resolve(&FULL).unwrap().cluster.unwrap();
        assert_eq!(
            c,
            ClusterSettings {
                etcd: vec![
                    "http://127.0.0.1:2379".into(),
                    "http://127.0.0.1:2479".into()
                ],
                cluster: "prod".into(),
                node_id: "n1".into(),
                advertise: "n1:7878".into(),
                node_ttl: Duration::from_secs(10),
                tls_dir: "/c".into(),
                etcd_access: EtcdAccessFiles::default(),
            }
        );
        let mut args = FULL.to_vec();
        args.extend(["--node-ttl", "3s"]);
        let c = resolve(&args).unwrap().cluster.unwrap();
        assert_eq!(c.node_ttl, Duration::from_secs(3));
    }

    #[test]
    fn cluster_flags_come_from_the_toml_file_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "etcd = \"http://e:2379\"\ncluster = \"k\"\nnode_id = \"n2\"\nadvertise = \"n2\"\n\
             tls_dir = \"/c\"\nnode_ttl = \"6s\"\n",
        )
        .unwrap();
        let c = resolve(&["--config", file.to_str().unwrap()])
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.etcd, ["http://e:2379"]);
        assert_eq!((c.cluster.as_str(), c.node_id.as_str()), ("k", "n2"));
        assert_eq!(c.node_ttl, Duration::from_secs(6));
    }

    #[test]
    fn etcd_without_tls_dir_is_refused_in_one_line() {
        let e = resolve(&FULL[..8]).unwrap_err();
        assert_eq!(e.0, ETCD_NEEDS_TLS_DIR);
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn etcd_without_cluster_node_id_or_advertise_is_refused_naming_what_is_missing() {
        let e = resolve(&["--etcd", "http://e:2379", "--tls-dir", "/c"]).unwrap_err();
        for flag in ["--cluster", "--node-id", "--advertise"] {
            assert!(e.0.contains(flag), "{e}");
        }
        assert!(!e.0.contains('\n'));
        let e = resolve(&[
            "--etcd",
            "http://e:2379",
            "--tls-dir",
            "/c",
            "--cluster",
            "k",
            "--advertise",
            "h",
        ])
        .unwrap_err();
        assert!(
            e.0.contains("--node-id") && !e.0.contains("--cluster NAME"),
            "{e}"
        );
    }

    #[test]
    fn bad_cluster_values_are_refused() {
        let with = |flag: &'static str, value: &'static str| {
            let mut args = FULL.to_vec();
            args.extend([flag, value]);
            args
        };
        for args in [
            with("--node-ttl", "0s"),
            with("--node-ttl", "1500ms"),
            with("--node-ttl", "soon"),
        ] {
            assert!(resolve(&args).is_err(), "{args:?}");
        }
        let mut bad_id = FULL.to_vec();
        bad_id[5] = "n/1";
        assert!(resolve(&bad_id).is_err());
        let mut bad_url = FULL.to_vec();
        bad_url[1] = "127.0.0.1:2379";
        assert!(resolve(&bad_url).is_err());
        let mut no_url = FULL.to_vec();
        no_url[1] = " , ";
        assert!(resolve(&no_url).is_err());
    }

    fn https_full() -> Vec<&'static str> {
        let mut args = FULL.to_vec();
        args[1] = "https://127.0.0.1:2379,https://127.0.0.1:2479";
        args
    }

    #[test]
    fn etcd_tls_and_credentials_come_from_flags_environment_names_and_the_toml_file() {
        let mut args = https_full();
        args.extend([
            "--etcd-ca",
            "/c/ca.pem",
            "--etcd-cert",
            "/c/etcd/client.pem",
            "--etcd-key",
            "/c/etcd/client.key",
            "--etcd-user",
            "nokv",
            "--etcd-password-file",
            "/run/pw",
        ]);
        let c = resolve(&args).unwrap().cluster.unwrap();
        assert_eq!(
            c.etcd_access,
            EtcdAccessFiles {
                ca: Some("/c/ca.pem".into()),
                cert: Some("/c/etcd/client.pem".into()),
                key: Some("/c/etcd/client.key".into()),
                user: Some("nokv".into()),
                password_file: Some("/run/pw".into()),
            }
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "etcd = \"https://e:2379\"\ncluster = \"k\"\nnode_id = \"n2\"\nadvertise = \"n2\"\n\
             tls_dir = \"/c\"\netcd_ca = \"/c/ca.pem\"\netcd_cert = \"/c/e.pem\"\n\
             etcd_key = \"/c/e.key\"\netcd_user = \"u\"\netcd_password_file = \"/pw\"\n",
        )
        .unwrap();
        let c = resolve(&["--config", file.to_str().unwrap()])
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.etcd_access.key.as_deref(), Some(Path::new("/c/e.key")));
        assert_eq!(c.etcd_access.user.as_deref(), Some("u"));
        let help = Cli::command().render_long_help().to_string();
        for env in [
            "NOKV_ETCD_CA",
            "NOKV_ETCD_CERT",
            "NOKV_ETCD_KEY",
            "NOKV_ETCD_USER",
            "NOKV_ETCD_PASSWORD_FILE",
        ] {
            assert!(help.contains(env), "{env}");
        }
    }

    #[test]
    fn etcd_access_flags_that_do_not_fit_the_urls_or_each_other_are_refused_in_one_line() {
        let with = |base: Vec<&'static str>, extra: &[&'static str]| {
            let mut args = base;
            args.extend_from_slice(extra);
            resolve(&args).map(|_| ()).map_err(|e| e.0)
        };
        let ca = ["--etcd-ca", "/ca.pem"];
        let cases: [(Vec<&'static str>, Vec<&'static str>, &str); 7] = [
            (https_full(), vec![], "needs --etcd-ca"),
            (FULL.to_vec(), ca.to_vec(), "--etcd-ca needs https://"),
            (
                https_full(),
                [&ca[..], &["--etcd-cert", "/c.pem"]].concat(),
                "--etcd-cert needs --etcd-key",
            ),
            (
                https_full(),
                [&ca[..], &["--etcd-key", "/c.key"]].concat(),
                "--etcd-key needs --etcd-cert",
            ),
            (
                FULL.to_vec(),
                vec!["--etcd-user", "u"],
                "--etcd-user needs --etcd-password-file",
            ),
            (
                FULL.to_vec(),
                vec!["--etcd-password-file", "/pw"],
                "--etcd-password-file needs --etcd-user",
            ),
            (
                {
                    let mut a = FULL.to_vec();
                    a[1] = "http://a:2379,https://b:2379";
                    a
                },
                vec![],
                "mixes",
            ),
        ];
        for (base, extra, expected) in cases {
            let e = with(base, &extra).unwrap_err();
            assert!(e.contains(expected), "{extra:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(with(https_full(), &ca).is_ok());
        let e = resolve(&["--etcd-ca", "/ca.pem"]).unwrap_err();
        assert!(e.0.contains("only apply with --etcd"), "{e}");
    }

    #[test]
    fn cluster_only_flags_without_etcd_are_refused() {
        assert!(resolve(&["--cluster", "k"]).is_err());
        assert!(resolve(&["--node-ttl", "5s"]).is_err());
    }

    #[test]
    fn tls_dir_needs_a_host_or_node_id_to_choose_its_certificate() {
        let e = resolve(&["--tls-dir", "/c"]).unwrap_err();
        assert!(e.0.contains("--advertise"), "{e}");
        assert!(resolve(&["--tls-dir", "/c", "--node-id", "n1"]).is_ok());
    }
}
