//! `nokv.v1.Admin`: operator calls, admin token only. Summaries carry counts and names,
//! never secrets or tokens; only the audit names object keys (the unaccounted ones: naming
//! them is its purpose).
//!
//! Admin calls are node-wide: a shard holds many workspaces, so its counts cannot be split
//! by workspace without scanning. They therefore need an admin token scoped to every
//! workspace (`*`); an admin token scoped to some workspaces (e.g. `team-*`) administers
//! those workspaces' data through the Workspace API and is refused here with
//! `PermissionDenied` rather than shown figures about other tenants.

use std::sync::Arc;

use nokv_proto::v1 as pb;
use pb::admin_server::Admin;
use tonic::{Request, Response, Status};

use crate::auth::authenticate;
use crate::error::{Error, Result};
use crate::node::Node;
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
        if claims.role < Role::Admin {
            return Err(Error::PermissionDenied(
                "admin calls need an admin token".into(),
            ));
        }
        if !claims.workspaces.iter().any(|w| w == "*") {
            return Err(Error::PermissionDenied(
                "admin calls are node-wide and need an admin token scoped to every workspace (`*`)"
                    .into(),
            ));
        }
        Ok(())
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
            // A shard out of service answers Unavailable; health reports it instead of failing.
            let (serving, c) = match s.counts().await {
                Ok(c) => (s.serving(), c),
                Err(Error::Unavailable(_)) => (false, Default::default()),
                Err(e) => return Err(e.into()),
            };
            shards.push(pb::ShardHealth {
                shard: s.id,
                owned: true,
                entries: c.entries,
                open_uploads: c.uploads,
                guards: c.guards,
                serving,
                unknown_guards: c.unknown_guards,
                unresolved_uploads: c.uploads + c.deleting_uploads,
                guards_finished: c.guards - c.unknown_guards,
                collectable: c.collectable,
                dead_letters: 0,
            });
        }
        let all_serving = shards.iter().all(|s| s.serving);
        let sum = |f: fn(&pb::ShardHealth) -> u64| shards.iter().map(f).sum::<u64>();
        let unknown_guards = sum(|s| s.unknown_guards);
        let unresolved_uploads = sum(|s| s.unresolved_uploads);
        let guards_finished = sum(|s| s.guards_finished);
        let collectable = sum(|s| s.collectable);
        Ok(Response::new(pb::HealthResponse {
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
            dead_letters: 0,
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
        }))
    }
}
