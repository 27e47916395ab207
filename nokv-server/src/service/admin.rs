//! `nokv.v1.Admin`: operator calls, admin token only. Summaries carry counts and names,
//! never secrets, tokens or object keys.

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
            let c = s.counts().await?;
            shards.push(pb::ShardHealth {
                shard: s.id,
                owned: true,
                entries: c.entries,
                open_uploads: c.uploads,
                guards: c.guards,
                unknown_guards: c.unknown_guards,
            });
        }
        let unknown_guards = shards.iter().map(|s| s.unknown_guards).sum();
        Ok(Response::new(pb::HealthResponse {
            status: "SERVING".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            node: self.node.name.clone(),
            provider: self.node.provider.kind().into(),
            shard_count: shards.len() as u32,
            shards,
            uptime_ms: self.node.started.elapsed().as_millis() as i64,
            unknown_guards,
        }))
    }
}
