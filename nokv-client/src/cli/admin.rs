//! Operator commands (`nokv admin ...`): node health, the accounting audit, the cluster view
//! and shard moves. All need an admin token scoped to every workspace.

use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::{Value, json};

use super::output::{Output, human_bytes};

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
                   "dead_letters": s.dead_letters, "serving": s.serving,
                   "operations": operations_json(&s.operations),
                   "oldest_unresolved_age_ms": s.oldest_unresolved_age_ms})
        })
        .collect();
    out.emit(
        json!({"status": h.status, "version": h.version, "node": h.node,
               "provider": h.provider, "shard_count": h.shard_count,
               "uptime_ms": h.uptime_ms, "unknown_guards": h.unknown_guards,
               "guards_unknown": h.unknown_guards, "guards_finished": h.guards_finished,
               "collectable": h.collectable, "unresolved_uploads": h.unresolved_uploads,
               "dead_letters": h.dead_letters,
               "operations": operations_json(&h.operations),
               "oldest_unresolved_age_ms": h.oldest_unresolved_age_ms,
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
            text
        },
    );
    Ok(())
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
               "other_shards": a.other_shards}),
        || {
            let mut text = format!(
                "{} objects: {} referenced · {} guarded · {} collectable · {} unaccounted · \
                 {} live-but-collectable · {} checkpoints · {} on other nodes' shards",
                a.objects,
                a.referenced,
                a.guarded,
                a.collectable,
                a.unaccounted,
                a.violations,
                a.checkpoints,
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
                "{}: {} (state {}, {} attempts)",
                r.operation_id, r.result, r.state, r.attempts
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
