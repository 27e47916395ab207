//! Metadata durability: `--metadata-durability local|provider`, `--log-flush-interval`,
//! `--checkpoint-interval` (issue 45), resolved into [`Durability`].
//!
//! Invariant: the default follows the deployment — `local` on the embedded default (no
//! external service), `provider` in cluster mode, where a node's disk must not be the only
//! copy of an acknowledged write. Each refusal is one line naming the flag at fault.

use std::time::Duration;

use super::error::ConfigError;
use super::serving::ServeArgs;
use crate::token::parse_duration;

/// Where a batch must be durable before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The local redo log (fsync) only: a node's disk holds what it acknowledged.
    Local,
    /// The local redo log and the node's log stream in the object provider: another node can
    /// take the shards over with nothing lost, and a node can be rebuilt from the bucket.
    Provider,
}

/// The resolved durability settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    pub mode: Mode,
    /// How long the acknowledger gathers batches before sending a log segment (0 = send as
    /// soon as the previous one is sent).
    pub log_flush_interval: Duration,
    /// Longest time between two checkpoints of a shard that changed (provider mode).
    pub checkpoint_interval: Duration,
    /// Log segments sent at once (1-16).
    pub log_segments_in_flight: usize,
    /// Log bytes after which a shard is checkpointed; `None`: its last checkpoint's size, at
    /// least [`MIN_CHECKPOINT_LOG_BYTES`].
    pub checkpoint_log_bytes: Option<u64>,
}

/// Log bytes a shard accumulates before a checkpoint at the least (without the hidden
/// `--checkpoint-log-bytes`).
pub const MIN_CHECKPOINT_LOG_BYTES: u64 = 64 * 1024;

/// Default `--checkpoint-interval`.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(600);

pub(super) fn durability(args: &mut ServeArgs, cluster: bool) -> Result<Durability, ConfigError> {
    let mode = match args.metadata_durability.take().as_deref() {
        None => {
            if cluster {
                Mode::Provider
            } else {
                Mode::Local
            }
        }
        Some("local") => Mode::Local,
        Some("provider") => Mode::Provider,
        Some(other) => {
            return Err(ConfigError(format!(
                "--metadata-durability must be local or provider, not {other:?}"
            )));
        }
    };
    let duration = |flag: &str, value: Option<String>, default: Duration| match value {
        None => Ok(default),
        Some(v) => parse_duration(&v).map_err(|e| ConfigError(format!("{flag}: {e}"))),
    };
    let log_flush_interval = duration(
        "--log-flush-interval",
        args.log_flush_interval.take(),
        Duration::ZERO,
    )?;
    let checkpoint_interval = duration(
        "--checkpoint-interval",
        args.checkpoint_interval.take(),
        DEFAULT_CHECKPOINT_INTERVAL,
    )?;
    if checkpoint_interval.is_zero() {
        return Err(ConfigError(
            "--checkpoint-interval must be more than 0 (e.g. 10m)".into(),
        ));
    }
    if log_flush_interval > Duration::from_secs(1) {
        return Err(ConfigError(
            "--log-flush-interval is at most 1s: every write waits for it".into(),
        ));
    }
    let checkpoint_log_bytes = args
        .checkpoint_log_bytes
        .take()
        .map(|v| {
            nokv_proto::size::parse_size(&v)
                .map_err(|e| ConfigError(format!("--checkpoint-log-bytes: {e}")))
        })
        .transpose()?;
    let log_segments_in_flight = match args.log_segments_in_flight.take() {
        None => 1,
        Some(n) if (1..=16).contains(&n) => n,
        Some(n) => {
            return Err(ConfigError(format!(
                "--log-segments-in-flight must be 1 to 16, not {n}"
            )));
        }
    };
    Ok(Durability {
        mode,
        log_segments_in_flight,
        log_flush_interval,
        checkpoint_interval,
        checkpoint_log_bytes,
    })
}
