//! `nokv.v1.Workspace`: the agent-facing API.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use nokv_proto::v1 as pb;
use pb::workspace_server::Workspace;
use tonic::{Request, Response, Status};

use crate::auth::authenticate;
use crate::error::Result;
use crate::names;
use crate::node::Node;
use crate::token::{Claims, Role};

pub struct WorkspaceService {
    node: Arc<Node>,
}

impl WorkspaceService {
    pub fn new(node: Arc<Node>) -> Self {
        WorkspaceService { node }
    }

    /// Authenticates, then authorises `role` on the request's workspace after validating it.
    fn admit<T>(&self, req: &Request<T>, ws: &str, role: Role) -> Result<Claims> {
        let claims = authenticate(&self.node.signer, req)?;
        names::workspace(ws)?;
        claims.require(ws, role)?;
        Ok(claims)
    }
}

fn reply<T>(r: Result<T>) -> Result<Response<T>, Status> {
    r.map(Response::new).map_err(Status::from)
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::ReadBlockChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Workspace for WorkspaceService {
    async fn stat(
        &self,
        req: Request<pb::StatRequest>,
    ) -> Result<Response<pb::StatResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                names::path(&r.path)?;
                let entry = self
                    .node
                    .shard_for(&r.workspace)
                    .stat(&r.workspace, &r.path)
                    .await?;
                Ok(pb::StatResponse { entry: Some(entry) })
            }
            .await,
        )
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                names::prefix(&r.prefix)?;
                self.node
                    .shard_for(&r.workspace)
                    .list(&r.workspace, &r.prefix, r.limit, &r.cursor)
                    .await
            }
            .await,
        )
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                names::path(&r.path)?;
                self.node
                    .shard_for(&r.workspace)
                    .read(&r.workspace, &r.path)
                    .await
            }
            .await,
        )
    }

    async fn write(
        &self,
        req: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Write)?;
                names::path(&r.path)?;
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace).clone();
                shard.write(req.into_inner()).await
            }
            .await,
        )
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Write)?;
                names::path(&r.path)?;
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace).clone();
                shard.delete(req.into_inner()).await
            }
            .await,
        )
    }

    async fn begin_upload(
        &self,
        _req: Request<pb::BeginUploadRequest>,
    ) -> Result<Response<pb::BeginUploadResponse>, Status> {
        Err(Status::unimplemented("BeginUpload"))
    }

    async fn put_block(
        &self,
        _req: Request<pb::PutBlockRequest>,
    ) -> Result<Response<pb::PutBlockResponse>, Status> {
        Err(Status::unimplemented("PutBlock"))
    }

    async fn renew_upload(
        &self,
        _req: Request<pb::RenewUploadRequest>,
    ) -> Result<Response<pb::RenewUploadResponse>, Status> {
        Err(Status::unimplemented("RenewUpload"))
    }

    async fn commit_upload(
        &self,
        _req: Request<pb::CommitUploadRequest>,
    ) -> Result<Response<pb::CommitUploadResponse>, Status> {
        Err(Status::unimplemented("CommitUpload"))
    }

    async fn abort_upload(
        &self,
        _req: Request<pb::AbortUploadRequest>,
    ) -> Result<Response<pb::AbortUploadResponse>, Status> {
        Err(Status::unimplemented("AbortUpload"))
    }

    async fn get_manifest(
        &self,
        _req: Request<pb::GetManifestRequest>,
    ) -> Result<Response<pb::GetManifestResponse>, Status> {
        Err(Status::unimplemented("GetManifest"))
    }

    type ReadBlockStream = ChunkStream;

    async fn read_block(
        &self,
        _req: Request<pb::ReadBlockRequest>,
    ) -> Result<Response<Self::ReadBlockStream>, Status> {
        Err(Status::unimplemented("ReadBlock"))
    }
}
