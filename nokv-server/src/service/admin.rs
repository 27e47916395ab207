//! `nokv.v1.Admin`: operator calls, admin token only. Summaries carry counts and names,
//! never secrets or tokens; only the audit names object keys (the unaccounted ones: naming
//! them is its purpose).
//!
//! Admin calls are node-wide: a shard holds many workspaces, so its counts cannot be split
//! by workspace without scanning. They therefore need an admin token scoped to every
//! workspace (`*`); an admin token scoped to some workspaces (e.g. `team-*`) administers
//! those workspaces' data through the Workspace API and is refused here with
//! `PermissionDenied` rather than shown figures about other tenants.
//!
//! `Cluster` and `MoveShard` are the operator surface of cluster mode. The cluster view names
//! nodes, endpoints, epochs and checkpoint sizes/ages only: the checkpoint's provider key and
//! digest stay inside the control plane.
//!
//! `Backup` streams the node's metadata (see [`crate::backup`]); the file carries no secret.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nokv_proto::v1 as pb;
use pb::admin_server::Admin;
use tonic::{Request, Response, Status};

use crate::auth::{authenticate, authenticate_with_id};
use crate::control::etcd::{ClusterView, ShardState};
use crate::error::{Error, Result};
use crate::events::{self, Action, Who};
use crate::meta::{LedgerRow, OpState};
use crate::node::Node;
use crate::shard::operations;
use crate::token::Role;

pub struct AdminService {
    node: Arc<Node>,
}

impl AdminService {
    pub fn new(node: Arc<Node>) -> Self {
        AdminService { node }
    }

    fn admit<T>(&self, req: &Request<T>) -> Result<()> {
        let claims = authenticate(&self.node.signer, req)?;
        // A refusal says what the token does cover (as workspace refusals do, never the token
        // itself), so the operator knows which token is in use and which one is needed.
        if claims.role < Role::Admin {
            return Err(Error::PermissionDenied(format!(
                "admin calls need an admin token: this one covers {}",
                claims.coverage()
            )));
        }
        if !claims.workspaces.iter().any(|w| w == "*") {
            return Err(Error::PermissionDenied(format!(
                "admin calls are node-wide and need an admin token scoped to every workspace \
                 (`*`): this one covers {}",
                claims.coverage()
            )));
        }
        Ok(())
    }

    /// [`AdminService::admit`], returning who was admitted (for the audit event).
    fn admit_who<T>(&self, req: &Request<T>) -> Result<Who> {
        self.admit(req)?;
        let (claims, token_id) = authenticate_with_id(&self.node.signer, req)?;
        Ok(Who::caller(&claims, token_id))
    }

    /// Runs an admitted admin action under audit: one event with its outcome (see
    /// [`crate::events`]). Every mutating admin RPC goes through here, e.g.
    /// `self.audited(self.admit_who(&req)?, Action::SetQuota, target, async { .. }).await`.
    async fn audited<R>(
        &self,
        who: Who,
        action: Action,
        target: String,
        work: impl Future<Output = Result<R>>,
    ) -> Result<Response<R>, Status> {
        events::audited(&self.node.events, who, action, target, work)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn health(
        &self,
        req: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        self.admit(&req)?;
        let mut shards = Vec::new();
        for s in self.node.shards() {
            shards.push(s.health().await?);
        }
        let all_serving = shards.iter().all(|s| s.serving);
        for s in shards.iter().filter(|s| !s.reservations_match) {
            tracing::error!(
                shard = s.shard,
                reservations = s.reservations,
                unresolved_uploads = s.unresolved_uploads,
                "MISMATCH: reservations differ from unresolved uploads"
            );
        }
        let sum = |f: fn(&pb::ShardHealth) -> u64| shards.iter().map(f).sum::<u64>();
        let unknown_guards = sum(|s| s.unknown_guards);
        let unresolved_uploads = sum(|s| s.unresolved_uploads);
        let guards_finished = sum(|s| s.guards_finished);
        let collectable = sum(|s| s.collectable);
        let quarantined = sum(|s| s.quarantined);
        let (reserved_bytes, reservations) = (sum(|s| s.reserved_bytes), sum(|s| s.reservations));
        let reservations_match = shards.iter().all(|s| s.reservations_match);
        let dead_letters = sum(|s| s.dead_letters);
        let mut operations = std::collections::HashMap::new();
        for st in OpState::ALL {
            let n = shards.iter().map(|s| s.operations[st.name()]).sum::<u64>();
            operations.insert(st.name().to_string(), n);
        }
        let oldest_unresolved_age_ms = shards
            .iter()
            .map(|s| s.oldest_unresolved_age_ms)
            .max()
            .unwrap_or(0);
        let replica = self.node.committer().replica();
        let log = replica.map(|r| r.stats()).unwrap_or_default();
        Ok(Response::new(pb::HealthResponse {
            operations,
            oldest_unresolved_age_ms,
            status: if all_serving {
                "SERVING"
            } else {
                "NOT_SERVING"
            }
            .into(),
            version: env!("CARGO_PKG_VERSION").into(),
            node: self.node.name.clone(),
            provider: self.node.provider.kind().into(),
            shard_count: shards.len() as u32,
            shards,
            uptime_ms: self.node.started.elapsed().as_millis() as i64,
            unknown_guards,
            unresolved_uploads,
            guards_finished,
            collectable,
            quarantined,
            reserved_bytes,
            reservations,
            reservations_match,
            dead_letters,
            metadata_durability: if replica.is_some() {
                "provider"
            } else {
                "local"
            }
            .into(),
            log_stream: replica
                .and_then(|r| r.stream())
                .map(|s| s.name())
                .unwrap_or_default(),
            log_segments: log.segments,
            log_puts: log.puts,
            log_bytes: log.bytes,
            log_puts_per_s: log.puts as f64 / self.node.started.elapsed().as_secs_f64().max(1e-3),
        }))
    }

    async fn audit(
        &self,
        req: Request<pb::AuditRequest>,
    ) -> Result<Response<pb::AuditResponse>, Status> {
        self.admit(&req)?;
        let r = self.node.audit().await?;
        Ok(Response::new(pb::AuditResponse {
            objects: r.objects,
            referenced: r.referenced,
            guarded: r.guarded,
            collectable: r.collectable,
            unaccounted: r.unaccounted,
            violations: r.violations,
            unaccounted_keys: r.unaccounted_keys,
            violation_keys: r.violation_keys,
            checkpoints: r.checkpoints,
            other_shards: r.other_shards,
            log_segments: r.log_segments,
            node_manifests: r.node_manifests,
        }))
    }

    async fn cluster(
        &self,
        req: Request<pb::ClusterRequest>,
    ) -> Result<Response<pb::ClusterResponse>, Status> {
        self.admit(&req)?;
        let view = self.node.cluster_view().await?;
        Ok(Response::new(cluster_response(&view, now_unix_ms())))
    }

    async fn move_shard(
        &self,
        req: Request<pb::MoveShardRequest>,
    ) -> Result<Response<pb::MoveShardResponse>, Status> {
        let who = self.admit_who(&req)?;
        let pb::MoveShardRequest { shard, node } = req.into_inner();
        let target = format!("shard {shard} to node {}", events::clip(&node));
        self.audited(
            who,
            Action::MoveShard,
            target,
            self.move_shard_to(shard, node),
        )
        .await
    }

    async fn list_events(
        &self,
        req: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        self.admit(&req)?;
        let events = self.node.events.page(req.get_ref().limit).await?;
        Ok(Response::new(pb::ListEventsResponse {
            events: events
                .into_iter()
                .map(|e| pb::AuditEvent {
                    at_unix_ms: e.at_unix_ms,
                    token_id: e.token_id,
                    role: e.role,
                    action: e.action,
                    target: e.target,
                    outcome: e.outcome,
                    reason: e.reason,
                })
                .collect(),
        }))
    }

    async fn inventory_start(
        &self,
        req: Request<pb::InventoryStartRequest>,
    ) -> Result<Response<pb::InventoryStartResponse>, Status> {
        let who = self.admit_who(&req)?;
        self.audited(
            who,
            Action::StartInventory,
            "inventory".into(),
            self.do_inventory_start(),
        )
        .await
    }

    async fn inventory_status(
        &self,
        req: Request<pb::InventoryStatusRequest>,
    ) -> Result<Response<pb::InventoryStatusResponse>, Status> {
        self.admit(&req)?;
        Ok(Response::new(self.do_inventory_status().await?))
    }

    async fn quarantine(
        &self,
        req: Request<pb::QuarantineRequest>,
    ) -> Result<Response<pb::QuarantineResponse>, Status> {
        self.admit(&req)?;
        Ok(Response::new(self.do_quarantine(req.into_inner()).await?))
    }

    async fn set_quota(
        &self,
        req: Request<pb::SetQuotaRequest>,
    ) -> Result<Response<pb::QuotaResponse>, Status> {
        let who = self.admit_who(&req)?;
        let pb::SetQuotaRequest { workspace, quota } = req.into_inner();
        let target = format!(
            "workspace {} quota {}",
            events::clip(&workspace),
            quota.map_or("none".to_string(), |q| q.to_string())
        );
        self.audited(who, Action::SetQuota, target, async move {
            crate::names::workspace(&workspace)?;
            let shard = self.node.shard_for(&workspace)?;
            let usage = shard.set_quota(&workspace, quota).await?;
            tracing::info!(workspace = %workspace, ?quota, "admin: quota set");
            Ok(quota_response(workspace, &usage))
        })
        .await
    }

    async fn get_quota(
        &self,
        req: Request<pb::GetQuotaRequest>,
    ) -> Result<Response<pb::QuotaResponse>, Status> {
        self.admit(&req)?;
        let pb::GetQuotaRequest { workspace } = req.into_inner();
        crate::names::workspace(&workspace)?;
        let usage = self.node.shard_for(&workspace)?.usage(&workspace).await?;
        Ok(Response::new(quota_response(workspace, &usage)))
    }

    async fn list_operations(
        &self,
        req: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        self.admit(&req)?;
        let r = req.into_inner();
        let q = operations::PageQuery::parse(&r.states, r.limit, &r.after)?;
        let page = operations::list(&self.node.shards(), &q).await?;
        Ok(Response::new(pb::ListOperationsResponse {
            operations: page
                .rows
                .iter()
                .map(|(shard, row)| summary(*shard, row))
                .collect(),
            next: page.next.map(|c| c.encode()).unwrap_or_default(),
        }))
    }

    async fn retry_cleanup(
        &self,
        req: Request<pb::RetryCleanupRequest>,
    ) -> Result<Response<pb::RetryCleanupResponse>, Status> {
        let who = self.admit_who(&req)?;
        let id = req.into_inner().operation_id;
        let target = format!("operation {}", events::clip(id.trim()));
        self.audited(who, Action::RetryCleanup, target, self.retry(id))
            .await
    }

    type BackupStream = BackupStream;

    /// The backup runs in a task of its own that feeds the response stream (a few chunks
    /// ahead at most, so a slow reader holds little memory). Its audit event is written when
    /// the last byte was handed over or the backup failed; a caller that goes away ends the
    /// task, which records the event with reason `Cancelled`.
    async fn backup(
        &self,
        req: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let who = self.admit_who(&req)?;
        let (tx, rx) = tokio::sync::mpsc::channel(BACKUP_AHEAD);
        let node = self.node.clone();
        tokio::spawn(async move {
            let mut sink = tx.clone();
            let work = events::audited(
                &node.events,
                who,
                Action::Backup,
                "node metadata".into(),
                async {
                    let summary = crate::backup::take(&node, &mut sink).await?;
                    tracing::info!(
                        bytes = summary.bytes,
                        shards = summary.shards.len(),
                        "admin: backup sent"
                    );
                    Ok(summary)
                },
            );
            let last = tokio::select! {
                outcome = work => match outcome {
                    Ok(s) => Ok(pb::BackupChunk {
                        data: Default::default(),
                        summary: Some(pb::BackupSummary {
                            bytes: s.bytes,
                            sha256: s.sha256,
                            shards: s.shards,
                            shard_count: s.shard_count,
                        }),
                    }),
                    Err(e) => Err(Status::from(e)),
                },
                // The caller went away: dropping `work` records the event as cancelled.
                () = tx.closed() => return,
            };
            let _ = tx.send(last).await;
        });
        Ok(Response::new(Box::pin(futures::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
        ))))
    }
}

/// Messages a backup produces ahead of what its caller has read.
const BACKUP_AHEAD: usize = 4;

type BackupStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// A backup's bytes become data chunks of its response stream.
impl crate::backup::Sink for tokio::sync::mpsc::Sender<Result<pb::BackupChunk, Status>> {
    async fn send(&mut self, data: bytes::Bytes) -> bool {
        let chunk = pb::BackupChunk {
            data,
            summary: None,
        };
        tokio::sync::mpsc::Sender::send(self, Ok(chunk))
            .await
            .is_ok()
    }
}

impl AdminService {
    /// `RetryCleanup` once admitted: on the shard's owner (`NotOwner` with a hint otherwise).
    async fn retry(&self, id: String) -> Result<pb::RetryCleanupResponse> {
        let (shard_id, op) = operations::parse_id(id.trim())?;
        let shard = self.node.shard(shard_id)?;
        let result = shard.retry_cleanup(op).await?;
        tracing::info!(operation = %id, result = result.name(), "admin: retry cleanup");
        let row = shard.ledger_row(op).await?;
        Ok(pb::RetryCleanupResponse {
            operation_id: id.trim().to_string(),
            result: result.name().into(),
            state: row.as_ref().map(|r| r.state.name()).unwrap_or("").into(),
            attempts: row.as_ref().map_or(0, |r| r.attempts),
            last_error: row.map(|r| r.last_error).unwrap_or_default(),
        })
    }
}

impl AdminService {
    /// `MoveShard` once admitted.
    async fn move_shard_to(&self, shard: u32, node: String) -> Result<pb::MoveShardResponse> {
        let count = self.node.shard_count();
        if shard >= count {
            return Err(Error::InvalidArgument(format!(
                "shard {shard} does not exist (shards are numbered 0 to {})",
                count.saturating_sub(1)
            )));
        }
        if node.trim().is_empty() {
            return Err(Error::InvalidArgument("the target node id is empty".into()));
        }
        let started = Instant::now();
        tracing::info!(shard, to = %node, "admin: moving shard");
        let epoch = self.node.move_shard(shard, &node).await?;
        let elapsed_ms = started.elapsed().as_millis() as i64;
        tracing::info!(shard, to = %node, epoch, elapsed_ms, "admin: shard moved");
        Ok(pb::MoveShardResponse {
            shard,
            node,
            epoch,
            elapsed_ms,
        })
    }
}

/// Observations `nokv admin quarantine` lists by default, and at most.
const QUARANTINE_DEFAULT: u32 = 100;
const QUARANTINE_MAX: u32 = 1000;

/// Inventory RPCs (`nokv admin inventory start|status`, `nokv admin quarantine`). Listing
/// quarantined keys is the purpose of the quarantine call; the status names none (its cursor
/// is an opaque token).
impl AdminService {
    async fn do_inventory_start(&self) -> Result<pb::InventoryStartResponse> {
        let shards = self.node.inventory_start().await?;
        let started = shards.iter().filter(|s| s.started).count() as u32;
        tracing::info!(started, "admin: inventory start");
        Ok(pb::InventoryStartResponse {
            started,
            shards: shards.iter().map(inventory_shard).collect(),
        })
    }

    async fn do_inventory_status(&self) -> Result<pb::InventoryStatusResponse> {
        let shards: Vec<_> = self
            .node
            .inventory_status()
            .await?
            .iter()
            .map(inventory_shard)
            .collect();
        let sum = |f: fn(&pb::InventoryShard) -> u64| shards.iter().map(f).sum::<u64>();
        Ok(pb::InventoryStatusResponse {
            running: shards.iter().any(|s| s.running),
            pages: sum(|s| s.pages),
            objects_seen: sum(|s| s.objects_seen),
            last_completed_ms: shards
                .iter()
                .map(|s| s.last_completed_ms)
                .min()
                .unwrap_or(0),
            quarantined: sum(|s| s.quarantined),
            shards,
        })
    }

    async fn do_quarantine(&self, req: pb::QuarantineRequest) -> Result<pb::QuarantineResponse> {
        let limit = match req.limit {
            0 => QUARANTINE_DEFAULT,
            n @ 1..=QUARANTINE_MAX => n,
            n => {
                return Err(Error::InvalidArgument(format!(
                    "limit {n} is out of range: 1 to {QUARANTINE_MAX} (default {QUARANTINE_DEFAULT})"
                )));
            }
        };
        let (observations, total) = self.node.quarantine(limit as usize).await?;
        Ok(pb::QuarantineResponse {
            observations: observations
                .into_iter()
                .map(|(shard, key, o)| pb::QuarantineObservation {
                    key,
                    size: o.size,
                    first_seen_ms: o.first_seen_ms,
                    last_seen_ms: o.last_seen_ms,
                    shard,
                })
                .collect(),
            total,
        })
    }
}

/// The wire form of one shard's inventory. The cursor (an object key) is shown only as a
/// short digest: it tells an operator the scan moved, and names no key.
fn inventory_shard(s: &crate::inventory::ShardInventory) -> pb::InventoryShard {
    use sha2::{Digest, Sha256};
    let r = &s.status.record;
    let cursor = if r.cursor.is_empty() {
        String::new()
    } else {
        hex::encode(&Sha256::digest(format!("{}:{}", r.scan, r.cursor))[..8])
    };
    pb::InventoryShard {
        shard: s.shard,
        running: r.running,
        pages: r.pages,
        objects_seen: r.objects,
        last_completed_ms: r.last_completed_ms,
        cursor,
        quarantined: s.status.quarantined,
        scans_completed: r.completed,
        started: s.started,
    }
}

fn quota_response(workspace: String, u: &crate::meta::UsageRecord) -> pb::QuotaResponse {
    pb::QuotaResponse {
        workspace,
        quota: u.quota,
        used_bytes: u.used_bytes,
        reserved_bytes: u.reserved_bytes,
        reservations: u.reservations,
    }
}

/// The wire summary of one ledger row: no key, token, capability, endpoint or credential
/// exists in a row to begin with (see [`LedgerRow`]).
fn summary(shard: u32, row: &LedgerRow) -> pb::OperationSummary {
    pb::OperationSummary {
        id: operations::format_id(shard, row.id),
        kind: row.kind.into(),
        state: row.state.name().into(),
        workspace: row.workspace.clone(),
        bytes: row.bytes,
        attempts: row.attempts,
        last_error: row.last_error.clone(),
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
        shard,
    }
}

/// The ledger part of one shard's health: operations per state (every state, zeros
/// included) and the oldest unresolved operation's age at `now_ms` (shard clock).
fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The wire form of a cluster view at wall-clock `now_ms`. Every listed node is alive: node
/// keys exist only while their leases do. A shard without an ownership record is `unowned`
/// (its owner key, should one exist, still names who holds it).
fn cluster_response(view: &ClusterView, now_ms: u64) -> pb::ClusterResponse {
    let mut nodes: Vec<pb::ClusterNode> = view
        .nodes
        .iter()
        .map(|(id, n)| pb::ClusterNode {
            id: id.clone(),
            endpoint: n.endpoint.clone(),
            alive: true,
        })
        .collect();
    // A node's key lives only with its lease, so a crashed node is known only from the shards
    // it still holds (serving or draining, with no live owner key): listed, not alive. A node
    // that handed its shards off and left is not listed.
    let mut dead: Vec<pb::ClusterNode> = Vec::new();
    for s in &view.shards {
        let Some(r) = &s.record else { continue };
        let holding = matches!(r.state, ShardState::Serving | ShardState::Draining);
        if let Some(owner) = r.owner.as_ref().filter(|_| holding && s.owner.is_none())
            && !nodes.iter().chain(&dead).any(|n| &n.id == owner)
        {
            dead.push(pb::ClusterNode {
                id: owner.clone(),
                endpoint: r.endpoint.clone().unwrap_or_default(),
                alive: false,
            });
        }
    }
    dead.sort_by(|a, b| a.id.cmp(&b.id));
    nodes.extend(dead);
    let shards = view
        .shards
        .iter()
        .map(|s| {
            let record = s.record.as_ref();
            let checkpoint = record.and_then(|r| r.checkpoint.as_ref());
            pb::ClusterShard {
                shard: s.shard,
                owner: record
                    .and_then(|r| r.owner.clone())
                    .or_else(|| s.owner.as_ref().map(|o| o.node.clone()))
                    .unwrap_or_default(),
                endpoint: record.and_then(|r| r.endpoint.clone()).unwrap_or_default(),
                epoch: record
                    .map(|r| r.epoch)
                    .or_else(|| s.owner.as_ref().map(|o| o.epoch))
                    .unwrap_or(0),
                state: match record.map(|r| r.state) {
                    Some(ShardState::Serving) => "serving",
                    Some(ShardState::Draining) => "draining",
                    Some(ShardState::Handoff) => "handoff",
                    None => "unowned",
                }
                .into(),
                owner_alive: s.owner.is_some(),
                checkpoint_size: checkpoint.map_or(0, |c| c.size),
                checkpoint_age_ms: checkpoint
                    .map_or(0, |c| now_ms.saturating_sub(c.created_unix_ms)),
                has_checkpoint: checkpoint.is_some(),
            }
        })
        .collect();
    pb::ClusterResponse {
        // Empty for the embedded default (clients show "embedded").
        cluster: view.cluster.clone(),
        nodes,
        shards,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::etcd::{CheckpointRef, NodeRecord, OwnerKey, ShardRecord, ShardView};

    fn record(state: ShardState, owner: &str, epoch: u64) -> ShardRecord {
        ShardRecord {
            epoch,
            state,
            owner: Some(owner.into()),
            endpoint: Some(format!("https://{owner}:7878")),
            checkpoint: None,
            changed: true,
            target: None,
            log: None,
        }
    }

    fn owner(node: &str, epoch: u64) -> Option<OwnerKey> {
        Some(OwnerKey {
            node: node.into(),
            epoch,
        })
    }

    #[test]
    fn the_cluster_answer_reports_each_shards_state_owner_liveness_and_checkpoint_age() {
        let mut handed_off = record(ShardState::Handoff, "b", 4);
        handed_off.checkpoint = Some(CheckpointRef {
            key: "nokv/meta/1/ckpt/4-secret-key".into(),
            sha256: "ab".repeat(32),
            size: 12_345,
            epoch: 4,
            created_unix_ms: 10_000,
        });
        let view = ClusterView {
            cluster: "demo".into(),
            config: None,
            nodes: vec![(
                "a".into(),
                NodeRecord {
                    endpoint: "https://a:7878".into(),
                },
            )],
            shards: vec![
                ShardView {
                    shard: 0,
                    record: Some(record(ShardState::Serving, "a", 2)),
                    owner: owner("a", 2),
                },
                ShardView {
                    shard: 1,
                    record: Some(handed_off),
                    owner: None,
                },
                ShardView {
                    shard: 2,
                    record: Some(record(ShardState::Draining, "a", 3)),
                    owner: owner("a", 3),
                },
                ShardView {
                    shard: 3,
                    record: None,
                    owner: None,
                },
                // Held by a node whose lease is gone (it crashed): listed, not alive.
                ShardView {
                    shard: 4,
                    record: Some(record(ShardState::Serving, "c", 5)),
                    owner: None,
                },
            ],
        };
        let r = cluster_response(&view, 15_000);
        assert_eq!(r.cluster, "demo");
        assert_eq!(
            r.nodes,
            [
                pb::ClusterNode {
                    id: "a".into(),
                    endpoint: "https://a:7878".into(),
                    alive: true,
                },
                pb::ClusterNode {
                    id: "c".into(),
                    endpoint: "https://c:7878".into(),
                    alive: false,
                }
            ],
            "b handed its shard off and left: not listed"
        );
        let states: Vec<_> = r.shards.iter().map(|s| s.state.as_str()).collect();
        assert_eq!(
            states,
            ["serving", "handoff", "draining", "unowned", "serving"]
        );
        let s0 = &r.shards[0];
        assert_eq!(
            (s0.owner.as_str(), s0.epoch, s0.owner_alive),
            ("a", 2, true)
        );
        assert!(!s0.has_checkpoint);
        assert_eq!((s0.checkpoint_size, s0.checkpoint_age_ms), (0, 0));
        // Handoff names the last owner, whose key is gone.
        let s1 = &r.shards[1];
        assert_eq!(
            (s1.owner.as_str(), s1.epoch, s1.owner_alive),
            ("b", 4, false)
        );
        assert_eq!(s1.endpoint, "https://b:7878");
        assert!(s1.has_checkpoint);
        assert_eq!((s1.checkpoint_size, s1.checkpoint_age_ms), (12_345, 5_000));
        let s3 = &r.shards[3];
        assert_eq!(
            (s3.owner.as_str(), s3.endpoint.as_str(), s3.epoch),
            ("", "", 0)
        );
        assert!(!s3.owner_alive);
        // The checkpoint's provider key and digest stay in the control plane.
        let debug = format!("{r:?}");
        assert!(!debug.contains("secret-key") && !debug.contains(&"ab".repeat(32)));
    }

    #[test]
    fn a_checkpoint_from_the_future_reads_as_age_zero() {
        let mut r = record(ShardState::Handoff, "b", 1);
        r.checkpoint = Some(CheckpointRef {
            key: String::new(),
            sha256: String::new(),
            size: 1,
            epoch: 1,
            created_unix_ms: 20_000,
        });
        let view = ClusterView {
            cluster: "demo".into(),
            config: None,
            nodes: vec![],
            shards: vec![ShardView {
                shard: 0,
                record: Some(r),
                owner: None,
            }],
        };
        assert_eq!(
            cluster_response(&view, 10_000).shards[0].checkpoint_age_ms,
            0
        );
    }
}
