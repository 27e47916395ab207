//! Limits, sizes and cadences: the shard limits ([`ShardConfig`]: inline size, leases, replay
//! and history windows, admission caps), the reconciler and inventory cadence, the shard
//! count and the block-memory budget — with the parsing of their units (durations such as
//! `30s`, sizes such as `256MiB`) and their defaults.
//!
//! Invariants: each of these settings is defaulted and validated here and nowhere else, in
//! the order [`limits`] checks them (so the first refusal of a bad configuration is always the
//! same one).

use std::time::Duration;

use nokv_proto::MAX_MESSAGE;

use super::error::ConfigError;
use super::serving::ServeArgs;
use crate::inventory::InventorySettings;
use crate::memory::{DEFAULT_BLOCK_MEMORY, DEFAULT_WAIT};
use crate::shard::ShardConfig;
use crate::token::parse_duration;
use nokv_proto::size::parse_size;

/// The largest `inline_max` a `Write` can carry: the transport's message limit less the room
/// it keeps for framing and the request's other fields (path, workspace, request id).
pub const MAX_INLINE_MAX: usize = MAX_MESSAGE - 64 * 1024;

/// Default time between reconciler passes.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(20);

/// Default time between inventory scans of a shard.
pub const DEFAULT_INVENTORY_INTERVAL: Duration = Duration::from_secs(3600);

/// The resolved limits of [`limits`].
pub(super) struct Limits {
    pub shard: ShardConfig,
    pub reconcile_interval: Duration,
    pub inventory: InventorySettings,
    pub shards: u32,
    pub block_memory: u64,
    pub block_memory_wait: Duration,
}

/// A duration setting: `default` when unset, else parsed (`30s`, `10m`, `24h`, `30d`, ...).
fn duration(v: Option<String>, default: Duration) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration(&s).map_err(|e| ConfigError(e.to_string())),
    }
}

/// Takes the limit settings out of `args`, applies their defaults and validates them.
pub(super) fn limits(args: &mut ServeArgs) -> Result<Limits, ConfigError> {
    let block_memory = match &args.block_memory {
        None => DEFAULT_BLOCK_MEMORY,
        Some(s) => parse_size(s).map_err(|e| ConfigError(format!("block_memory: {e}")))?,
    };
    // A budget smaller than one PutBlock message could never admit a block.
    if block_memory < MAX_MESSAGE as u64 {
        return Err(ConfigError(format!(
            "block_memory must be at least one block with framing ({MAX_MESSAGE} bytes)"
        )));
    }
    let defaults = ShardConfig::default();
    let shard = ShardConfig {
        inline_max: args.inline_max.unwrap_or(defaults.inline_max),
        block_size: defaults.block_size,
        upload_lease: duration(args.upload_lease.take(), defaults.upload_lease)?,
        replay_ttl: duration(args.replay_ttl.take(), defaults.replay_ttl)?,
        retired_grace: duration(args.retired_grace.take(), defaults.retired_grace)?,
        scan_budget: duration(args.scan_budget.take(), defaults.scan_budget)?,
        admission: crate::shard::admission::Caps {
            max_unresolved_uploads: args
                .max_unresolved_uploads
                .unwrap_or(defaults.admission.max_unresolved_uploads),
            max_unresolved_uploads_per_workspace: args
                .max_unresolved_uploads_per_workspace
                .unwrap_or(defaults.admission.max_unresolved_uploads_per_workspace),
            census: defaults.admission.census.clone(),
        },
        delete_attempts: args.delete_attempts.unwrap_or(defaults.delete_attempts),
        history_retention: duration(args.history_retention.take(), defaults.history_retention)?,
        search: defaults.search,
        // Upload blocks held for the running digests: a quarter of the budget (see
        // `shard::upload_digest` for why a quarter cannot wedge uploads).
        held_ahead: crate::shard::upload_digest::HeldAhead::for_budget(block_memory),
    };
    if shard.delete_attempts == 0 {
        return Err(ConfigError(
            "delete_attempts must be at least 1 (a delete is tried before it can fail)".into(),
        ));
    }
    let reconcile_interval = duration(args.reconcile_interval.take(), DEFAULT_RECONCILE_INTERVAL)?;
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
        interval: match args.inventory_interval.as_deref().map(str::trim) {
            None => Some(DEFAULT_INVENTORY_INTERVAL),
            Some("off") => None,
            Some(s) => Some(
                parse_duration(s).map_err(|e| ConfigError(format!("inventory_interval: {e}")))?,
            )
            .filter(|d| !d.is_zero()),
        },
        page: match args.inventory_page_size {
            None => crate::inventory::DEFAULT_PAGE,
            Some(0) => {
                return Err(ConfigError("inventory_page_size must be at least 1".into()));
            }
            Some(n) => n,
        },
        retention: shard.history_retention,
    };
    let shards = args.shards.unwrap_or(16);
    if !(1..=4096).contains(&shards) {
        return Err(ConfigError("shards must be 1..=4096".into()));
    }
    let block_memory_wait = duration(args.block_memory_wait.take(), DEFAULT_WAIT)?;
    Ok(Limits {
        shard,
        reconcile_interval,
        inventory,
        shards,
        block_memory,
        block_memory_wait,
    })
}
