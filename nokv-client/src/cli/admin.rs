//! Operator commands (`nokv admin ...`): node health and the accounting audit. Both need an
//! admin token scoped to every workspace.

use nokv_client::{Client, ClientError};
use serde_json::json;

use super::output::Output;

pub async fn health(client: &Client, out: Output) -> Result<(), ClientError> {
    let h = client.health().await?;
    let shards: Vec<_> = h
        .shards
        .iter()
        .map(|s| {
            json!({"shard": s.shard, "owned": s.owned, "entries": s.entries,
                   "open_uploads": s.open_uploads, "guards": s.guards,
                   "unknown_guards": s.unknown_guards, "guards_unknown": s.unknown_guards,
                   "guards_finished": s.guards_finished, "collectable": s.collectable,
                   "unresolved_uploads": s.unresolved_uploads,
                   "dead_letters": s.dead_letters, "serving": s.serving})
        })
        .collect();
    out.emit(
        json!({"status": h.status, "version": h.version, "node": h.node,
               "provider": h.provider, "shard_count": h.shard_count,
               "uptime_ms": h.uptime_ms, "unknown_guards": h.unknown_guards,
               "guards_unknown": h.unknown_guards, "guards_finished": h.guards_finished,
               "collectable": h.collectable, "unresolved_uploads": h.unresolved_uploads,
               "dead_letters": h.dead_letters,
               "shards": shards}),
        || {
            let entries: u64 = h.shards.iter().map(|s| s.entries).sum();
            let mut text = format!(
                "{} · nokv-server {} · node {} · provider {} · {} shards · {} entries · \
                 {} unresolved uploads · guards {} unknown / {} finished · {} collectable · \
                 {} dead letters · up {}s",
                h.status,
                h.version,
                h.node,
                h.provider,
                h.shard_count,
                entries,
                h.unresolved_uploads,
                h.unknown_guards,
                h.guards_finished,
                h.collectable,
                h.dead_letters,
                h.uptime_ms / 1000
            );
            for s in h.shards.iter().filter(|s| !s.serving) {
                text.push_str(&format!("\nshard {} is NOT SERVING (metadata store out of service; requests answer Unavailable)", s.shard));
            }
            text
        },
    );
    Ok(())
}

pub async fn audit(client: &Client, out: Output) -> Result<(), ClientError> {
    let a = client.audit().await?;
    out.emit(
        json!({"objects": a.objects, "referenced": a.referenced, "guarded": a.guarded,
               "collectable": a.collectable, "unaccounted": a.unaccounted,
               "violations": a.violations, "unaccounted_keys": a.unaccounted_keys,
               "violation_keys": a.violation_keys, "checkpoints": a.checkpoints}),
        || {
            let mut text = format!(
                "{} objects: {} referenced · {} guarded · {} collectable · {} unaccounted · \
                 {} live-but-collectable · {} checkpoints",
                a.objects,
                a.referenced,
                a.guarded,
                a.collectable,
                a.unaccounted,
                a.violations,
                a.checkpoints
            );
            for k in &a.unaccounted_keys {
                text.push_str(&format!("\nunaccounted: {k}"));
            }
            for k in &a.violation_keys {
                text.push_str(&format!("\nLIVE KEY QUEUED FOR DELETION: {k}"));
            }
            text
        },
    );
    Ok(())
}
