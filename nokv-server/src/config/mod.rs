//! Server configuration: a TOML file (`--config`), then `NOKV_*` environment variables, then
//! flags, in increasing order of precedence. Every setting is optional at each layer; the
//! defaults below make a bare `nokv-server` a working embedded daemon.
//!
//! The module splits by concern; every item is re-exported here, so `crate::config::X` is the
//! one path the rest of the crate uses:
//!
//! - `command_line.rs`: the clap tree ([`Cli`], [`Command`] and the subcommands' arguments);
//! - `serving.rs`: [`ServeArgs`], the serve settings as given (flags, env, TOML), and the file
//!   layer;
//! - `limits.rs`: shard limits, cadences, shard count and block memory, with unit parsing;
//! - `provider.rs`: the object provider and its S3 settings;
//! - `cluster.rs`: cluster mode, the etcd flags and etcd TLS/authentication;
//! - `error.rs`: [`ConfigError`], the leaf every other file returns.
//!
//! Invariants: precedence is flag > environment > TOML file > default (the S3 credentials,
//! which have no flag, come from the file, else `AWS_*`); a setting is defaulted and validated
//! in exactly one place, reached from [`ServeArgs::resolve`] (this file), which is how the
//! daemon gets its [`Settings`]. Arrows point one way: this file imports its children, they
//! never import it.

use std::path::PathBuf;
use std::time::Duration;

use crate::object::ProviderConfig;
use crate::shard::ShardConfig;

mod cluster;
mod command_line;
mod durability;
mod error;
mod limits;
mod provider;
mod serving;
#[cfg(test)]
mod tests;

pub use cluster::{ClusterSettings, DEFAULT_NODE_TTL, ETCD_NEEDS_TLS_DIR};
pub use command_line::{Cli, ClusterCommand, Command, RestartChild, TokenCommand};
pub use durability::{
    DEFAULT_CHECKPOINT_INTERVAL, Durability, MIN_CHECKPOINT_LOG_BYTES, Mode as DurabilityMode,
};
pub use error::ConfigError;
pub use limits::{DEFAULT_INVENTORY_INTERVAL, DEFAULT_RECONCILE_INTERVAL, MAX_INLINE_MAX};
pub use serving::ServeArgs;

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
    /// `--log-format`: text or json lines on stderr.
    pub log_format: crate::logging::LogFormat,
    /// Cluster TLS directory: when set, TLS and token material come from it (read-only)
    /// instead of the data dir's development material.
    pub tls_dir: Option<PathBuf>,
    /// `--node-id`, also valid without etcd (it can choose the certificate in `tls_dir`).
    pub node_id: Option<String>,
    /// Cluster mode; `None` without `--etcd`.
    pub cluster: Option<ClusterSettings>,
    /// Inventory cadence, page size and observation retention.
    pub inventory: crate::inventory::InventorySettings,
    /// `--metadata-durability` and its cadences.
    pub durability: Durability,
}

impl ServeArgs {
    /// Fills every field unset by flags/env from the TOML file, then applies defaults.
    pub fn resolve(mut self) -> Result<Settings, ConfigError> {
        self.layer_file()?;
        let data_dir = self
            .data_dir
            .take()
            .unwrap_or_else(|| PathBuf::from("./nokv-data"));
        let limits::Limits {
            shard,
            reconcile_interval,
            inventory,
            shards,
            block_memory,
            block_memory_wait,
        } = limits::limits(&mut self)?;
        let provider = provider::provider(&mut self, &data_dir)?;
        let cluster = cluster::cluster(&mut self)?;
        let durability = durability::durability(&mut self, cluster.is_some())?;
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
            log_format: match self.log_format {
                Some(f) => f.parse().map_err(ConfigError)?,
                None => crate::logging::LogFormat::Text,
            },
            tls_dir: self.tls_dir,
            node_id: self.node_id,
            cluster,
            inventory,
            durability,
        })
    }
}
