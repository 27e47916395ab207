//! Server configuration: a TOML file (`--config`), then `NOKV_*` environment variables, then
//! flags, in increasing order of precedence. Every setting is optional at each layer; the
//! defaults below make a bare `nokv-server` a working embedded daemon.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::memory::{DEFAULT_BLOCK_MEMORY, DEFAULT_WAIT, parse_size};
use crate::object::ProviderConfig;
use crate::server::MAX_MESSAGE;
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
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a bearer token signed with the data directory's cluster secret.
    Issue {
        /// Data directory holding cluster.secret.
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
    /// Host name clients use to reach this node; added to the certificate's names.
    #[arg(long, env = "NOKV_ADVERTISE")]
    pub advertise: Option<String>,
    /// Number of shards [default: 16].
    #[arg(long, env = "NOKV_SHARDS")]
    pub shards: Option<u32>,
    /// Largest small file stored inline, in bytes [default: 262144].
    #[arg(long, env = "NOKV_INLINE_MAX")]
    pub inline_max: Option<usize>,
    /// How long request-id replay records are kept [default: 24h].
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
    /// An upload's lease; clients renew at a third of it [default: 60s].
    #[arg(long, env = "NOKV_UPLOAD_LEASE")]
    pub upload_lease: Option<String>,
    /// Artifact blocks hashed and written at once on this node (bulk admission) [default: 2].
    #[arg(long, env = "NOKV_BULK_PARALLEL")]
    pub bulk_parallel: Option<usize>,
    /// Cap on the node's artifact-block bandwidth in MiB/s, leaving the rest of the machine to
    /// interactive requests; 0 = no cap [default: 16 per CPU, e.g. 32 on 2 CPUs].
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
    /// Log filter, e.g. info or nokv_server=debug [default: info].
    #[arg(long, env = "NOKV_LOG")]
    pub log: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// Default bulk budget per CPU. Measured with the interference probe on a 2-CPU machine where
/// the uploading agent, the daemon and the provider share the cores: uncapped (70-120 MiB/s)
/// the other agents' small-write p50 rose 1.3-1.8x; at 48 MiB/s it sat at the 1.2x bound
/// (1.18-1.21x), at 32 MiB/s clearly inside it (1.13x).
pub const DEFAULT_BULK_MIB_PER_CPU: f64 = 16.0;

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The largest `inline_max` a `Write` can carry: the transport's message limit less the room
/// it keeps for framing and the request's other fields (path, workspace, request id).
pub const MAX_INLINE_MAX: usize = crate::server::MAX_MESSAGE - 64 * 1024;

/// Default time between reconciler passes.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(20);

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
    pub worker_threads: Option<usize>,
    pub bulk_mib_per_s: Option<f64>,
    /// Bytes of the block-memory budget (see [`crate::memory`]).
    pub block_memory: u64,
    pub block_memory_wait: Duration,
    pub provider: ProviderConfig,
    pub prefix: String,
    pub log: String,
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
                upload_lease,
                bulk_parallel,
                worker_threads,
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
                log
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
        };
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
                shard.inline_max,
                crate::server::MAX_MESSAGE
            )));
        }
        if shard.upload_lease < Duration::from_secs(1) {
            return Err(ConfigError("upload lease must be at least 1s".into()));
        }
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
        Ok(Settings {
            data_dir,
            listen: self.listen.unwrap_or_else(|| "127.0.0.1:7878".into()),
            advertise: self.advertise,
            shards,
            shard,
            reconcile_interval,
            bulk_parallel: self.bulk_parallel.unwrap_or(2),
            worker_threads: self.worker_threads,
            bulk_mib_per_s: match self.bulk_mib_per_s {
                Some(r) if r < 0.0 || !r.is_finite() => {
                    return Err(ConfigError("bulk_mib_per_s must be >= 0".into()));
                }
                Some(r) => (r > 0.0).then_some(r),
                None => Some(DEFAULT_BULK_MIB_PER_CPU * cpus() as f64),
            },
            block_memory,
            block_memory_wait,
            provider,
            prefix: self.s3_prefix.unwrap_or_else(|| "nokv".into()),
            log: self.log.unwrap_or_else(|| "info".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_bulk_budget_defaults_per_cpu_and_zero_turns_it_off() {
        let s = Cli::parse_from(["nokv-server"]).serve.resolve().unwrap();
        assert_eq!(
            s.bulk_mib_per_s,
            Some(DEFAULT_BULK_MIB_PER_CPU * cpus() as f64)
        );
        let s = Cli::parse_from(["nokv-server", "--bulk-mib-per-s", "0"])
            .serve
            .resolve()
            .unwrap();
        assert_eq!(s.bulk_mib_per_s, None);
    }
}
