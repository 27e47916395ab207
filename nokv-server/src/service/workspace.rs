//! `nokv.v1.Workspace`: the agent-facing API.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use nokv_proto::v1 as pb;
use pb::workspace_server::Workspace;
use tonic::{Request, Response, Status};

use crate::auth::{authenticate, authenticate_with_id};
use crate::error::Result;
use crate::events::{self, Action, Who};
use crate::names;
use crate::node::Node;
use crate::service::body_admission::BodyReservation;
use crate::shard::Shard;
use crate::shard::sequencer::upload_shard;
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

    /// Authenticates a call that names only an upload id; the workspace scope is checked by
    /// the shard against the upload's record, inside its session.
    fn upload_call<T>(&self, req: &Request<T>, upload_id: &str) -> Result<(Claims, Arc<Shard>)> {
        let claims = authenticate(&self.node.signer, req)?;
        let shard = self.node.shard(upload_shard(upload_id)?)?;
        Ok((claims, shard))
    }
}

fn reply<T>(r: Result<T>) -> Result<Response<T>, Status> {
    r.map(Response::new).map_err(Status::from)
}

/// ReadBlock streams a block in chunks of at most 1 MiB.
const CHUNK: usize = 1024 * 1024;

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::ReadBlockChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Workspace for WorkspaceService {
    /// Answered by any node from its routes, with no shard access (authorised like a read).
    async fn route(
        &self,
        req: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        reply((|| {
            let r = req.get_ref();
            self.admit(&req, &r.workspace, Role::Read)?;
            let route = self.node.route(&r.workspace);
            Ok(pb::RouteResponse {
                shard: route.shard,
                endpoint: route.endpoint,
                epoch: route.epoch,
            })
        })())
    }

    async fn stat(
        &self,
        req: Request<pb::StatRequest>,
    ) -> Result<Response<pb::StatResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                let path = names::path(&r.path)?;
                let entry = self
                    .node
                    .shard_for(&r.workspace)?
                    .stat(&r.workspace, &path)
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
                let prefix = names::prefix(&r.prefix)?;
                self.node
                    .shard_for(&r.workspace)?
                    .list(&r.workspace, &prefix, r.limit, &r.cursor)
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
                let path = names::path(&r.path)?;
                self.node
                    .shard_for(&r.workspace)?
                    .read(&r.workspace, &path)
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
                let path = names::path(&r.path)?.into_owned();
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace)?;
                shard
                    .write(pb::WriteRequest {
                        path,
                        ..req.into_inner()
                    })
                    .await
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
                let path = names::path(&r.path)?.into_owned();
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace)?;
                shard
                    .delete(pb::DeleteRequest {
                        path,
                        ..req.into_inner()
                    })
                    .await
            }
            .await,
        )
    }

    async fn begin_upload(
        &self,
        req: Request<pb::BeginUploadRequest>,
    ) -> Result<Response<pb::BeginUploadResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Write)?;
                let path = names::path(&r.path)?.into_owned();
                names::request_id(&r.request_id)?;
                if !r.receipt.is_empty() {
                    names::receipt(&r.receipt)?;
                }
                let shard = self.node.shard_for(&r.workspace)?;
                shard
                    .begin_upload(pb::BeginUploadRequest {
                        path,
                        ..req.into_inner()
                    })
                    .await
            }
            .await,
        )
    }

    async fn put_block(
        &self,
        req: Request<pb::PutBlockRequest>,
    ) -> Result<Response<pb::PutBlockResponse>, Status> {
        reply(
            async {
                // The reservation taken before the body was decoded (see body_admission);
                // a call that did not pass through it reserves now.
                let reserved = req
                    .extensions()
                    .get::<BodyReservation>()
                    .and_then(BodyReservation::take);
                let (claims, shard) = self.upload_call(&req, &req.get_ref().upload_id)?;
                names::request_id(&req.get_ref().request_id)?;
                let mut req = req.into_inner();
                let reserved = match reserved {
                    Some(r) => r,
                    None => self.node.memory.reserve(req.data.len() as u64).await?,
                };
                // From here the body's bytes carry their share of the budget wherever they go.
                req.data = reserved.hold(std::mem::take(&mut req.data));
                shard.put_block(claims, req).await
            }
            .await,
        )
    }

    async fn renew_upload(
        &self,
        req: Request<pb::RenewUploadRequest>,
    ) -> Result<Response<pb::RenewUploadResponse>, Status> {
        reply(
            async {
                let (claims, shard) = self.upload_call(&req, &req.get_ref().upload_id)?;
                shard.renew_upload(claims, req.into_inner()).await
            }
            .await,
        )
    }

    async fn commit_upload(
        &self,
        req: Request<pb::CommitUploadRequest>,
    ) -> Result<Response<pb::CommitUploadResponse>, Status> {
        reply(
            async {
                let (claims, shard) = self.upload_call(&req, &req.get_ref().upload_id)?;
                names::request_id(&req.get_ref().request_id)?;
                shard.commit_upload(claims, req.into_inner()).await
            }
            .await,
        )
    }

    async fn abort_upload(
        &self,
        req: Request<pb::AbortUploadRequest>,
    ) -> Result<Response<pb::AbortUploadResponse>, Status> {
        reply(
            async {
                let (claims, shard) = self.upload_call(&req, &req.get_ref().upload_id)?;
                names::request_id(&req.get_ref().request_id)?;
                shard.abort_upload(claims, req.into_inner()).await
            }
            .await,
        )
    }

    async fn get_manifest(
        &self,
        req: Request<pb::GetManifestRequest>,
    ) -> Result<Response<pb::GetManifestResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                let path = names::path(&r.path)?;
                self.node
                    .shard_for(&r.workspace)?
                    .get_manifest(&r.workspace, &path)
                    .await
            }
            .await,
        )
    }

    type ReadBlockStream = ChunkStream;

    async fn read_block(
        &self,
        req: Request<pb::ReadBlockRequest>,
    ) -> Result<Response<Self::ReadBlockStream>, Status> {
        let r = req.get_ref();
        self.admit(&req, &r.workspace, Role::Read)?;
        let shard = self.node.shard_for(&r.workspace)?;
        let data = shard
            .read_block(&r.workspace, r.revision, r.index, &self.node.memory)
            .await?;
        // Chunks are slices of one shared buffer: no copies, at most one block per call. The
        // buffer holds its block-memory reservation until the last chunk has been encoded and
        // dropped (or the stream is dropped unsent).
        let chunks: Vec<Result<pb::ReadBlockChunk, Status>> = (0..data.len().div_ceil(CHUNK))
            .map(|i| {
                let end = ((i + 1) * CHUNK).min(data.len());
                Ok(pb::ReadBlockChunk {
                    data: data.slice(i * CHUNK..end),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn delete_workspace(
        &self,
        req: Request<pb::DeleteWorkspaceRequest>,
    ) -> Result<Response<pb::DeleteWorkspaceResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                // Admin tokens pass too: roles are ordered, admin above write.
                self.admit(&req, &r.workspace, Role::Write)?;
                // A call for a shard held elsewhere is redirected, not admitted here: only the
                // owner's attempt is audited (once, not once per hop).
                let shard = self.node.shard_for(&r.workspace)?;
                // Admitted: from here every outcome is an audit event (see crate::events).
                let (claims, token_id) = authenticate_with_id(&self.node.signer, &req)?;
                let target = format!("workspace {}", r.workspace);
                events::audited(
                    &self.node.events,
                    Who::caller(&claims, token_id),
                    Action::DeleteWorkspace,
                    target,
                    async {
                        names::request_id(&req.get_ref().request_id)?;
                        shard.delete_workspace(req.into_inner()).await
                    },
                )
                .await
            }
            .await,
        )
    }
    async fn edit(
        &self,
        req: Request<pb::EditRequest>,
    ) -> Result<Response<pb::EditResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Write)?;
                let path = names::path(&r.path)?.into_owned();
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace)?;
                shard
                    .edit(pb::EditRequest {
                        path,
                        ..req.into_inner()
                    })
                    .await
            }
            .await,
        )
    }

    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Write)?;
                let path = names::path(&r.path)?.into_owned();
                names::request_id(&r.request_id)?;
                let shard = self.node.shard_for(&r.workspace)?;
                shard
                    .append(pb::AppendRequest {
                        path,
                        ..req.into_inner()
                    })
                    .await
            }
            .await,
        )
    }

    async fn find(
        &self,
        req: Request<pb::FindRequest>,
    ) -> Result<Response<pb::FindResponse>, Status> {
        reply(
            async {
                let r = req.get_ref();
                self.admit(&req, &r.workspace, Role::Read)?;
                let glob = names::glob(&r.glob)?;
                self.node
                    .shard_for(&r.workspace)?
                    .find(&r.workspace, &glob, r.limit, &r.cursor)
                    .await
            }
            .await,
        )
    }

    type GrepStream = Pin<Box<dyn Stream<Item = Result<pb::GrepChunk, Status>> + Send>>;

    /// The whole search runs (bounded) before the first chunk is sent, so a client never
    /// holds the shard's snapshot open by reading slowly.
    async fn grep(
        &self,
        req: Request<pb::GrepRequest>,
    ) -> Result<Response<Self::GrepStream>, Status> {
        let r = req.get_ref();
        self.admit(&req, &r.workspace, Role::Read)?;
        let path_glob = match r.path_glob.as_str() {
            "" => String::new(),
            g => names::glob(g)?.into_owned(),
        };
        let shard = self.node.shard_for(&r.workspace)?;
        let (matches, summary) = shard
            .grep(
                pb::GrepRequest {
                    path_glob,
                    ..req.into_inner()
                },
                &self.node.memory,
            )
            .await?;
        Ok(Response::new(Box::pin(futures::stream::iter(
            grep_chunks(matches, summary).into_iter().map(Ok),
        ))))
    }
}

/// Matches per GrepChunk at most, and bytes of lines per chunk at most (a line is at most
/// 1 KiB, context included 21 lines): chunks stay far below the 4 MiB message limit.
const GREP_CHUNK_MATCHES: usize = 256;
const GREP_CHUNK_BYTES: usize = 1024 * 1024;

/// The stream of a Grep: matches in bounded chunks, the summary on the last one (alone when
/// nothing matched).
fn grep_chunks(matches: Vec<pb::GrepMatch>, summary: pb::GrepSummary) -> Vec<pb::GrepChunk> {
    let mut chunks = vec![pb::GrepChunk::default()];
    let mut bytes = 0;
    for m in matches {
        let size = m.line.len()
            + m.before.iter().map(String::len).sum::<usize>()
            + m.after.iter().map(String::len).sum::<usize>();
        let last = chunks.last().expect("never empty");
        if !last.matches.is_empty()
            && (last.matches.len() == GREP_CHUNK_MATCHES || bytes + size > GREP_CHUNK_BYTES)
        {
            chunks.push(pb::GrepChunk::default());
            bytes = 0;
        }
        bytes += size;
        chunks.last_mut().expect("never empty").matches.push(m);
    }
    chunks.last_mut().expect("never empty").summary = Some(summary);
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(i: usize, line_len: usize) -> pb::GrepMatch {
        pb::GrepMatch {
            path: format!("f{i}"),
            line: "x".repeat(line_len),
            ..Default::default()
        }
    }

    // Catches: a chunker that never splits (a reply past the message limit) or that puts the
    // summary anywhere but last. (Verified red.)
    #[test]
    fn grep_chunks_keep_every_match_in_order_bounded_per_chunk_with_the_summary_last() {
        let matches: Vec<_> = (0..600).map(|i| m(i, 10)).collect();
        let chunks = grep_chunks(
            matches,
            pb::GrepSummary {
                matches: 600,
                ..Default::default()
            },
        );
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.matches.len() <= GREP_CHUNK_MATCHES));
        let paths: Vec<_> = chunks
            .iter()
            .flat_map(|c| &c.matches)
            .map(|m| m.path.clone())
            .collect();
        assert_eq!(paths, (0..600).map(|i| format!("f{i}")).collect::<Vec<_>>());
        assert!(chunks[..2].iter().all(|c| c.summary.is_none()));
        assert_eq!(chunks[2].summary.as_ref().unwrap().matches, 600);

        let big: Vec<_> = (0..3).map(|i| m(i, 600 * 1024)).collect();
        assert_eq!(
            grep_chunks(big, Default::default()).len(),
            3,
            "split by bytes"
        );

        let none = grep_chunks(Vec::new(), Default::default());
        assert_eq!(none.len(), 1);
        assert!(none[0].summary.is_some());
    }
}
