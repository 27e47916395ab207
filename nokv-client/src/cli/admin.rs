//! Operator commands (`nokv admin ...`): node health, the accounting audit, the cluster view,
//! shard moves and workspace quotas. All need an admin token scoped to every workspace.

use nokv_client::{Client, ClientError};
use nokv_proto::size::parse_size;
use nokv_proto::v1 as pb;
use serde_json::{Value, json};

use super::output::{Output, human_bytes, plural};

pub async fn health(client: &Client, out: Output) -> Result<(), ClientError> {
    let h = client.health().await?;
    let shards: Vec<_> = h
        .shards
        .iter()
        .map(|s| {
            json!({"shard": s.shard, "owned": s.owned, "entries": s.entries,
                   "open_uploads": s.open_uploads, "guards": s.guards,
                   "guards_unknown": s.unknown_guards,
                   "guards_finished": s.guards_finished, "collectable": s.collectable,
                   "unresolved_uploads": s.unresolved_uploads,
                   "dead_letters": s.dead_letters, "serving": s.serving,
                   "quarantined": s.quarantined,
                   "operations": operations_json(&s.operations),
                   "oldest_unresolved_age_ms": s.oldest_unresolved_age_ms})
        })
        .collect();
    let mut doc = json!({"status": h.status, "version": h.version, "node": h.node,
               "provider": h.provider, "shard_count": h.shard_count,
               "uptime_ms": h.uptime_ms, "guards_unknown": h.unknown_guards, "guards_finished": h.guards_finished,
               "collectable": h.collectable, "unresolved_uploads": h.unresolved_uploads,
               "dead_letters": h.dead_letters,
               "quarantined": h.quarantined,
               "operations": operations_json(&h.operations),
               "oldest_unresolved_age_ms": h.oldest_unresolved_age_ms,
               "metadata_durability": h.metadata_durability,
               "log_stream": h.log_stream, "log_segments": h.log_segments,
               "log_puts": h.log_puts, "log_bytes": h.log_bytes,
               "log_puts_per_s": h.log_puts_per_s,
               "shards": shards});
    add_reservations(&mut doc, &h);
    out.emit(
        doc,
        || {
            let entries: u64 = h.shards.iter().map(|s| s.entries).sum();
            let mut text = format!(
                "{} · nokv-server {} · node {} · provider {} · {} · {} · {} · \
                 guards {} unknown / {} finished{} · {} collectable · {} · up {}s",
                h.status,
                h.version,
                h.node,
                h.provider,
                plural(h.shard_count, "shard"),
                plural(entries, "entry"),
                plural(h.unresolved_uploads, "unresolved upload"),
                h.unknown_guards,
                h.guards_finished,
                guards_note(h.unknown_guards),
                h.collectable,
                plural(h.dead_letters, "dead letter"),
                h.uptime_ms / 1000
            );
            text.push_str(&format!(" · {} quarantined", h.quarantined));
            if h.metadata_durability == "provider" {
                text.push_str(&format!(
                    "\nmetadata durability: provider · log stream {} · {} · {} \
                     ({:.1}/s since start) · {} bytes",
                    h.log_stream,
                    plural(h.log_segments, "segment"),
                    plural(h.log_puts, "PUT"),
                    h.log_puts_per_s,
                    h.log_bytes
                ));
            } else if !h.metadata_durability.is_empty() {
                text.push_str(&format!("\nmetadata durability: {}", h.metadata_durability));
            }
            let mut states: Vec<_> = h.operations.iter().collect();
            states.sort();
            let states: Vec<_> = states.iter().map(|(k, v)| format!("{k} {v}")).collect();
            text.push_str(&format!(
                "\noperations: {} · oldest unresolved {}",
                states.join(" · "),
                human_age(h.oldest_unresolved_age_ms.max(0) as u64)
            ));
            if h.dead_letters > 0 {
                text.push_str(&format!(
                    "\n{} DEAD LETTERS: see `nokv admin ops --state dead_letter`, then `nokv admin retry OP_ID`",
                    h.dead_letters
                ));
            }
            for s in h.shards.iter().filter(|s| !s.serving) {
                text.push_str(&format!("\nshard {} is NOT SERVING (metadata store out of service; requests answer Unavailable)", s.shard));
            }
            text.push_str(&reservations_text(&h));
            text
        },
    );
    Ok(())
}

/// What the unknown-guard count asks of the reader: nothing. A guard's writer outcome is
/// unknown while its block write is in flight or after its writer died; the reconciler
/// settles each on its own (retried with back-off), so only a count that stays up for hours
/// is worth a look (docs/operations.md).
fn guards_note(unknown: u64) -> &'static str {
    if unknown == 0 {
        ""
    } else {
        " (writes in flight or being cleaned up; settled automatically, no action needed)"
    }
}

/// Operations per state as a JSON object with sorted keys.
fn operations_json(ops: &std::collections::HashMap<String, u64>) -> Value {
    let sorted: std::collections::BTreeMap<_, _> = ops.iter().collect();
    json!(sorted)
}

pub async fn audit(client: &Client, out: Output) -> Result<(), ClientError> {
    let a = client.audit().await?;
    out.emit(
        json!({"objects": a.objects, "referenced": a.referenced, "guarded": a.guarded,
               "collectable": a.collectable, "unaccounted": a.unaccounted,
               "violations": a.violations, "unaccounted_keys": a.unaccounted_keys,
               "violation_keys": a.violation_keys, "checkpoints": a.checkpoints,
               "other_shards": a.other_shards, "log_segments": a.log_segments,
               "node_manifests": a.node_manifests}),
        || {
            let mut text = format!(
                "{}: {} referenced · {} guarded · {} collectable · {} unaccounted · \
                 {} live-but-collectable · {} · {} · {} on other nodes' shards",
                plural(a.objects, "object"),
                a.referenced,
                a.guarded,
                a.collectable,
                a.unaccounted,
                a.violations,
                plural(a.checkpoints, "checkpoint"),
                plural(a.log_segments, "log segment"),
                a.other_shards
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

/// `nokv admin cluster`. JSON: `cluster`, `owner`, `endpoint`, `checkpoint_size` and
/// `checkpoint_age_ms` are null when absent (embedded, unowned, no checkpoint) rather than
/// empty or 0, so a script cannot mistake "none" for a value.
pub async fn cluster(client: &Client, out: Output) -> Result<(), ClientError> {
    let c = client.cluster().await?;
    out.emit(cluster_json(&c), || cluster_text(&c));
    Ok(())
}

fn non_empty(s: &str) -> Value {
    if s.is_empty() { Value::Null } else { json!(s) }
}

fn cluster_json(c: &pb::ClusterResponse) -> Value {
    let nodes: Vec<_> = c
        .nodes
        .iter()
        .map(|n| json!({"id": n.id, "endpoint": n.endpoint, "alive": n.alive}))
        .collect();
    let shards: Vec<_> = c
        .shards
        .iter()
        .map(|s| {
            let (size, age) = if s.has_checkpoint {
                (json!(s.checkpoint_size), json!(s.checkpoint_age_ms))
            } else {
                (Value::Null, Value::Null)
            };
            json!({"shard": s.shard, "owner": non_empty(&s.owner),
                   "endpoint": non_empty(&s.endpoint), "epoch": s.epoch, "state": s.state,
                   "owner_alive": s.owner_alive, "checkpoint_size": size,
                   "checkpoint_age_ms": age})
        })
        .collect();
    json!({"cluster": non_empty(&c.cluster), "nodes": nodes, "shards": shards})
}

fn cluster_text(c: &pb::ClusterResponse) -> String {
    let title = if c.cluster.is_empty() {
        "embedded node (no cluster)".to_string()
    } else {
        format!("cluster {}", c.cluster)
    };
    let mut rows = vec![vec![
        "NODE".to_string(),
        "ENDPOINT".to_string(),
        "ALIVE".to_string(),
    ]];
    for n in &c.nodes {
        rows.push(vec![
            n.id.clone(),
            n.endpoint.clone(),
            if n.alive { "yes" } else { "no" }.to_string(),
        ]);
    }
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut text = format!(
        "{title} · {} · {}\n\n{}",
        plural(c.nodes.len(), "node"),
        plural(c.shards.len(), "shard"),
        table(&rows)
    );
    let mut rows = vec![
        ["SHARD", "OWNER", "EPOCH", "STATE", "CHECKPOINT"]
            .map(String::from)
            .to_vec(),
    ];
    for s in &c.shards {
        let owner = match (s.owner.as_str(), s.owner_alive) {
            ("", _) => "-".to_string(),
            (o, true) => o.to_string(),
            // A serving record without an owner key: its owner crashed (or its lease lapsed).
            (o, false) => format!("{o} (lease gone)"),
        };
        let checkpoint = if s.has_checkpoint {
            format!(
                "{}, {} ago",
                human_bytes(s.checkpoint_size),
                human_age(s.checkpoint_age_ms)
            )
        } else {
            "-".to_string()
        };
        rows.push(vec![
            s.shard.to_string(),
            owner,
            s.epoch.to_string(),
            s.state.clone(),
            checkpoint,
        ]);
    }
    text.push_str("\n\n");
    text.push_str(&table(&rows));
    text
}

/// Left-aligned columns two spaces apart; no trailing spaces.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|r| {
            let line: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            line.join("  ").trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn human_age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// `nokv admin shard move S NODE`: JSON `{"shard","node","epoch","elapsed_ms"}`.
pub async fn move_shard(
    client: &Client,
    out: Output,
    shard: u32,
    node: &str,
) -> Result<(), ClientError> {
    let m = client.move_shard(shard, node).await?;
    out.emit(
        json!({"shard": m.shard, "node": m.node, "epoch": m.epoch, "elapsed_ms": m.elapsed_ms}),
        || {
            let epoch = if m.epoch == 0 {
                String::new()
            } else {
                format!(" at epoch {}", m.epoch)
            };
            format!(
                "shard {} moved to {}{epoch} in {} ms",
                m.shard, m.node, m.elapsed_ms
            )
        },
    );
    Ok(())
}

/// `nokv admin events`. JSON: `{"events": [{at_unix_ms, token_id, role, action, target,
/// outcome, reason}]}`, newest first.
pub async fn events(client: &Client, out: Output, limit: u32) -> Result<(), ClientError> {
    let r = client.list_events(limit).await?;
    out.emit(events_json(&r), || events_text(&r));
    Ok(())
}

fn events_json(r: &pb::ListEventsResponse) -> Value {
    let events: Vec<_> = r
        .events
        .iter()
        .map(|e| {
            json!({"at_unix_ms": e.at_unix_ms, "token_id": e.token_id, "role": e.role,
                   "action": e.action, "target": e.target, "outcome": e.outcome,
                   "reason": e.reason})
        })
        .collect();
    json!({ "events": events })
}

fn events_text(r: &pb::ListEventsResponse) -> String {
    if r.events.is_empty() {
        return "no audit events".into();
    }
    r.events
        .iter()
        .map(|e| {
            let who = if e.token_id.is_empty() {
                e.role.clone()
            } else {
                format!("{} token {}", e.role, e.token_id)
            };
            let outcome = if e.reason.is_empty() {
                e.outcome.clone()
            } else {
                format!("{} ({})", e.outcome, e.reason)
            };
            format!(
                "{} · {} · {} · by {} · {}",
                super::output::format_ms(i64::try_from(e.at_unix_ms).unwrap_or(i64::MAX)),
                e.action,
                e.target,
                who,
                outcome
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn inventory_shard_json(s: &pb::InventoryShard) -> Value {
    json!({"shard": s.shard, "state": if s.running { "running" } else { "idle" },
           "running": s.running, "pages": s.pages, "objects_seen": s.objects_seen,
           "last_completed_ms": (s.last_completed_ms != 0).then_some(s.last_completed_ms),
           "cursor": non_empty(&s.cursor), "quarantined": s.quarantined,
           "scans_completed": s.scans_completed})
}

fn inventory_rows(shards: &[pb::InventoryShard]) -> String {
    let mut rows = vec![
        [
            "SHARD",
            "STATE",
            "PAGES",
            "OBJECTS",
            "QUARANTINED",
            "LAST COMPLETED",
            "CURSOR",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in shards {
        rows.push(vec![
            s.shard.to_string(),
            if s.running { "running" } else { "idle" }.to_string(),
            s.pages.to_string(),
            s.objects_seen.to_string(),
            s.quarantined.to_string(),
            completed_at(s.last_completed_ms),
            if s.cursor.is_empty() {
                "-".to_string()
            } else {
                s.cursor.clone()
            },
        ]);
    }
    table(&rows)
}

/// How long ago a unix-ms time was, or `never` for 0.
fn completed_at(ms: i64) -> String {
    if ms == 0 {
        return "never".into();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    format!("{} ago", human_age(now.saturating_sub(ms).max(0) as u64))
}

/// `nokv admin inventory start`. JSON: `{"started", "shards": [...]}` (each shard as in
/// `status`, plus `started`).
pub async fn inventory_start(client: &Client, out: Output) -> Result<(), ClientError> {
    let r = client.inventory_start().await?;
    let shards: Vec<_> = r
        .shards
        .iter()
        .map(|s| {
            let mut v = inventory_shard_json(s);
            v["started"] = json!(s.started);
            v
        })
        .collect();
    out.emit(json!({"started": r.started, "shards": shards}), || {
        format!(
            "inventory started on {} of {} (the others were already scanning)\n\n{}",
            r.started,
            plural(r.shards.len() as u64, "shard"),
            inventory_rows(&r.shards)
        )
    });
    Ok(())
}

/// `nokv admin inventory status`. JSON: overall `state` (`running` while any shard scans),
/// `pages`, `objects_seen`, `last_completed_ms` (the oldest shard's; null until every shard
/// completed one), `quarantined`, and `shards` with the same fields plus `cursor` (an opaque
/// token, null at the start) and `scans_completed`.
pub async fn inventory_status(client: &Client, out: Output) -> Result<(), ClientError> {
    let r = client.inventory_status().await?;
    let shards: Vec<_> = r.shards.iter().map(inventory_shard_json).collect();
    out.emit(
        json!({"state": if r.running { "running" } else { "idle" }, "running": r.running,
               "pages": r.pages, "objects_seen": r.objects_seen,
               "last_completed_ms": (r.last_completed_ms != 0).then_some(r.last_completed_ms),
               "quarantined": r.quarantined, "shards": shards}),
        || {
            format!(
                "inventory {} · {} · {} seen · {} quarantined · oldest completed scan {}\n\n{}",
                if r.running { "running" } else { "idle" },
                plural(r.pages, "page"),
                plural(r.objects_seen, "object"),
                r.quarantined,
                completed_at(r.last_completed_ms),
                inventory_rows(&r.shards)
            )
        },
    );
    Ok(())
}

/// `nokv admin quarantine [--limit N]`. JSON: `{"total", "observations": [{"key", "size",
/// "first_seen_ms", "last_seen_ms", "shard"}]}`. Naming keys is this command's purpose.
pub async fn quarantine(client: &Client, out: Output, limit: u32) -> Result<(), ClientError> {
    let r = client.quarantine(limit).await?;
    let observations: Vec<_> = r
        .observations
        .iter()
        .map(|o| {
            json!({"key": o.key, "size": o.size, "first_seen_ms": o.first_seen_ms,
                   "last_seen_ms": o.last_seen_ms, "shard": o.shard})
        })
        .collect();
    out.emit(
        json!({"total": r.total, "observations": observations}),
        || {
            let mut rows = vec![
                ["SHARD", "SIZE", "FIRST SEEN", "LAST SEEN", "KEY"]
                    .map(String::from)
                    .to_vec(),
            ];
            for o in &r.observations {
                rows.push(vec![
                    o.shard.to_string(),
                    human_bytes(o.size),
                    completed_at(o.first_seen_ms),
                    completed_at(o.last_seen_ms),
                    o.key.clone(),
                ]);
            }
            format!(
                "{} quarantined (showing {}; the inventory never deletes them)\n\n{}",
                r.total,
                r.observations.len(),
                table(&rows)
            )
        },
    );
    Ok(())
}

/// `nokv admin ops`: JSON `{"operations": [{id, kind, state, workspace, bytes, attempts,
/// last_error, created_ms, updated_ms, shard}], "next": cursor|null}`.
pub async fn ops(
    client: &Client,
    out: Output,
    states: &[String],
    limit: Option<u32>,
    after: &str,
) -> Result<(), ClientError> {
    let page = client.list_operations(states, limit, after).await?;
    let ops: Vec<_> = page
        .operations
        .iter()
        .map(|o| {
            json!({"id": o.id, "kind": o.kind, "state": o.state, "workspace": o.workspace,
                   "bytes": o.bytes, "attempts": o.attempts, "last_error": o.last_error,
                   "created_ms": o.created_ms, "updated_ms": o.updated_ms, "shard": o.shard})
        })
        .collect();
    out.emit(
        json!({"operations": ops, "next": non_empty(&page.next)}),
        || {
            let mut rows = vec![
                [
                    "ID",
                    "KIND",
                    "STATE",
                    "WORKSPACE",
                    "BYTES",
                    "ATTEMPTS",
                    "LAST ERROR",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for o in &page.operations {
                rows.push(vec![
                    o.id.clone(),
                    o.kind.clone(),
                    o.state.clone(),
                    if o.workspace.is_empty() {
                        "-".into()
                    } else {
                        o.workspace.clone()
                    },
                    human_bytes(o.bytes),
                    o.attempts.to_string(),
                    o.last_error.clone(),
                ]);
            }
            let mut text = table(&rows);
            if !page.next.is_empty() {
                text.push_str(&format!("\nmore: --after {}", page.next));
            }
            text
        },
    );
    Ok(())
}

/// `nokv admin retry OP_ID`: JSON `{"operation_id", "result", "state", "attempts",
/// "last_error"}`.
pub async fn retry(client: &Client, out: Output, operation_id: &str) -> Result<(), ClientError> {
    let r = client.retry_cleanup(operation_id).await?;
    out.emit(
        json!({"operation_id": r.operation_id, "result": r.result, "state": r.state,
               "attempts": r.attempts, "last_error": r.last_error}),
        || {
            let mut text = format!(
                "{}: {} (state {}, {})",
                r.operation_id,
                r.result,
                r.state,
                plural(r.attempts, "attempt")
            );
            if !r.last_error.is_empty() {
                text.push_str(&format!("; last error: {}", r.last_error));
            }
            text
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_json_uses_null_for_absent_names_and_checkpoints() {
        let c = pb::ClusterResponse {
            cluster: String::new(),
            nodes: vec![pb::ClusterNode {
                id: "n1".into(),
                endpoint: "https://a:1".into(),
                alive: true,
            }],
            shards: vec![
                pb::ClusterShard {
                    shard: 0,
                    state: "unowned".into(),
                    ..Default::default()
                },
                pb::ClusterShard {
                    shard: 1,
                    owner: "n1".into(),
                    endpoint: "https://a:1".into(),
                    epoch: 3,
                    state: "handoff".into(),
                    owner_alive: false,
                    checkpoint_size: 0,
                    checkpoint_age_ms: 0,
                    has_checkpoint: true,
                },
            ],
        };
        assert_eq!(
            cluster_json(&c),
            json!({"cluster": null,
                   "nodes": [{"id": "n1", "endpoint": "https://a:1", "alive": true}],
                   "shards": [
                       {"shard": 0, "owner": null, "endpoint": null, "epoch": 0,
                        "state": "unowned", "owner_alive": false, "checkpoint_size": null,
                        "checkpoint_age_ms": null},
                       {"shard": 1, "owner": "n1", "endpoint": "https://a:1", "epoch": 3,
                        "state": "handoff", "owner_alive": false, "checkpoint_size": 0,
                        "checkpoint_age_ms": 0}]})
        );
        let text = cluster_text(&c);
        assert!(text.contains("n1 (lease gone)"), "{text}");
        assert!(text.contains("0 B, 0s ago"), "{text}");
    }

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let rows = vec![
            vec!["A".to_string(), "LONG HEADER".to_string()],
            vec!["wide cell".to_string(), "x".to_string()],
        ];
        assert_eq!(table(&rows), "A          LONG HEADER\nwide cell  x");
    }

    #[test]
    fn ages_read_in_the_largest_useful_unit() {
        assert_eq!(human_age(59_999), "59s");
        assert_eq!(human_age(61_000), "1m01s");
        assert_eq!(human_age(7_260_000), "2h01m");
        assert_eq!(human_age(90_000_000), "1d01h");
    }
}

/// Adds the quota accounting to the health document: `reserved_bytes`, `reservations` and
/// `reservations_match` in total and per shard (same order as `h.shards`).
fn add_reservations(doc: &mut Value, h: &pb::HealthResponse) {
    let fields = |reserved: u64, reservations: u64, matched: bool| {
        [
            ("reserved_bytes", json!(reserved)),
            ("reservations", json!(reservations)),
            ("reservations_match", json!(matched)),
        ]
    };
    if let Some(top) = doc.as_object_mut() {
        top.extend(
            fields(h.reserved_bytes, h.reservations, h.reservations_match)
                .map(|(k, v)| (k.to_string(), v)),
        );
    }
    if let Some(shards) = doc.get_mut("shards").and_then(Value::as_array_mut) {
        for (j, s) in shards.iter_mut().zip(&h.shards) {
            if let Some(o) = j.as_object_mut() {
                o.extend(
                    fields(s.reserved_bytes, s.reservations, s.reservations_match)
                        .map(|(k, v)| (k.to_string(), v)),
                );
            }
        }
    }
}

/// The health text's reservation line, then one line starting `MISMATCH` per shard whose
/// reservations differ from its unresolved uploads (they must be equal).
fn reservations_text(h: &pb::HealthResponse) -> String {
    let mut text = format!(
        "\nreserved {} by {} ({})",
        human_bytes(h.reserved_bytes),
        plural(h.reservations, "reservation"),
        plural(h.unresolved_uploads, "unresolved upload")
    );
    for s in h.shards.iter().filter(|s| !s.reservations_match) {
        text.push_str(&format!(
            "\nMISMATCH shard {}: {} but {}; investigate, do not fix by hand",
            s.shard,
            plural(s.reservations, "reservation"),
            plural(s.unresolved_uploads, "unresolved upload")
        ));
    }
    text
}

/// `nokv admin quota ...`.
#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Set workspace WS's byte quota, or remove it with `none`. BeginUpload reserves an
    /// artifact's bytes against it and small-file writes count against it; past it they are
    /// refused with QuotaExceeded. A quota below current usage removes nothing (a warning
    /// says so on stderr).
    #[command(after_help = "Examples:\n  nokv admin quota set demo 10GiB\n  \
        nokv admin quota set demo none")]
    Set {
        /// The workspace.
        workspace: String,
        /// The quota: bytes, with an optional unit as the server's size flags take it (B,
        /// K/KiB, M/MiB, G/GiB, T/TiB: binary multiples, case-insensitive; e.g. 10GiB,
        /// 512MiB, 1048576), or `none` for no quota.
        #[arg(value_parser = parse_quota, value_name = "SIZE|none")]
        bytes: QuotaValue,
    },
    /// Show workspace WS's quota, used bytes and reserved bytes.
    #[command(after_help = "Examples:\n  nokv admin quota get demo")]
    Get {
        /// The workspace.
        workspace: String,
    },
}

/// A quota argument: bytes, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaValue(pub Option<u64>);

fn parse_quota(s: &str) -> Result<QuotaValue, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(QuotaValue(None));
    }
    parse_size(s)
        .map(|b| QuotaValue(Some(b)))
        .map_err(|e| format!("{e}; or `none` for no quota"))
}

/// `nokv admin quota set|get`: JSON `{"workspace","quota" (null = none),"used_bytes",
/// "reserved_bytes","reservations"}`. `set` warns on stderr when the new quota is already
/// below what the workspace uses.
pub async fn quota(client: &Client, out: Output, cmd: QuotaCommand) -> Result<(), ClientError> {
    let q = match cmd {
        QuotaCommand::Set { workspace, bytes } => {
            let q = client.set_quota(&workspace, bytes.0).await?;
            if let Some(warning) = below_usage(&q) {
                eprintln!("nokv: warning: {warning}");
            }
            q
        }
        QuotaCommand::Get { workspace } => client.get_quota(&workspace).await?,
    };
    out.emit(quota_json(&q), || quota_text(&q));
    Ok(())
}

/// The warning for a quota already below the workspace's usage (used plus reserved bytes).
fn below_usage(q: &pb::QuotaResponse) -> Option<String> {
    let quota = q.quota?;
    let usage = q.used_bytes.saturating_add(q.reserved_bytes);
    (quota < usage).then(|| {
        format!(
            "the new quota of workspace {} ({}) is below what it already uses ({} used + {} \
             reserved by open uploads): nothing is removed, but every write that adds bytes \
             is refused with QuotaExceeded until usage drops below the quota",
            q.workspace,
            human_bytes(quota),
            human_bytes(q.used_bytes),
            human_bytes(q.reserved_bytes)
        )
    })
}

fn quota_json(q: &pb::QuotaResponse) -> Value {
    json!({"workspace": q.workspace, "quota": q.quota, "used_bytes": q.used_bytes,
           "reserved_bytes": q.reserved_bytes, "reservations": q.reservations})
}

fn quota_text(q: &pb::QuotaResponse) -> String {
    let quota = q.quota.map_or("none".to_string(), |b| {
        format!("{} ({b} bytes)", human_bytes(b))
    });
    format!(
        "workspace {} · quota {quota} · used {} · reserved {} by {}",
        q.workspace,
        human_bytes(q.used_bytes),
        human_bytes(q.reserved_bytes),
        plural(q.reservations, "upload")
    )
}

#[cfg(test)]
mod quota_tests {
    use super::*;

    #[test]
    fn a_quota_argument_is_a_size_with_the_servers_units_or_none_and_anything_else_is_refused() {
        assert_eq!(parse_quota("1048576"), Ok(QuotaValue(Some(1048576))));
        assert_eq!(parse_quota("none"), Ok(QuotaValue(None)));
        assert_eq!(parse_quota("10MiB"), Ok(QuotaValue(Some(10 << 20))));
        assert_eq!(parse_quota("10GiB"), Ok(QuotaValue(Some(10 << 30))));
        assert_eq!(parse_quota("1g"), Ok(QuotaValue(Some(1 << 30))));
        assert_eq!(parse_quota("2 TiB"), Ok(QuotaValue(Some(2 << 40))));
        assert_eq!(parse_quota("512K"), Ok(QuotaValue(Some(512 << 10))));
        assert_eq!(parse_quota("7B"), Ok(QuotaValue(Some(7))));
        for bad in ["-1", "10MB", "1.5GiB", "GiB", "", "lots", "99999999999TiB"] {
            assert!(parse_quota(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_quota_below_used_plus_reserved_bytes_is_warned_about_and_none_never_is() {
        let q = |quota: Option<u64>, used, reserved| pb::QuotaResponse {
            workspace: "demo".into(),
            quota,
            used_bytes: used,
            reserved_bytes: reserved,
            ..Default::default()
        };
        let w = below_usage(&q(Some(10), 8, 4)).expect("10 < 8 + 4");
        assert!(w.contains("demo") && w.contains("QuotaExceeded"), "{w}");
        assert!(
            below_usage(&q(Some(12), 8, 4)).is_none(),
            "equal is not below"
        );
        assert!(below_usage(&q(None, 8, 4)).is_none());
    }

    #[test]
    fn unknown_guards_say_that_nobody_needs_to_act() {
        assert_eq!(guards_note(0), "");
        assert!(guards_note(1).contains("no action needed"));
    }

    #[test]
    fn health_shows_a_reservation_mismatch_loudly_in_text_and_json() {
        let shard = |id, reservations, unresolved| pb::ShardHealth {
            shard: id,
            reservations,
            unresolved_uploads: unresolved,
            reservations_match: reservations == unresolved,
            ..Default::default()
        };
        let h = pb::HealthResponse {
            shards: vec![shard(0, 2, 2), shard(1, 1, 3)],
            reservations: 3,
            unresolved_uploads: 5,
            reservations_match: false,
            ..Default::default()
        };
        let text = reservations_text(&h);
        let mismatches: Vec<_> = text.lines().filter(|l| l.starts_with("MISMATCH")).collect();
        assert_eq!(mismatches.len(), 1, "{text}");
        assert!(mismatches[0].contains("shard 1"), "{text}");
        let mut doc = json!({"shards": [{}, {}]});
        add_reservations(&mut doc, &h);
        assert_eq!(doc["reservations_match"], json!(false));
        assert_eq!(doc["shards"][0]["reservations_match"], json!(true));
        assert_eq!(doc["shards"][1]["reservations_match"], json!(false));
        assert_eq!(doc["shards"][1]["reservations"], json!(1));
    }
}
