//! `nokv.v1.Workspace`: the agent-facing API.
//!
//! Every RPC takes one of two paths. A workspace call ([`WorkspaceService::on_shard`]) is
//! authorised on its workspace, then validated, then routed to the workspace's shard: a
//! caller learns nothing of a workspace (not even where it lives) before it may use it, and
//! a malformed call is refused alike on every node. An upload call
//! ([`WorkspaceService::on_upload_shard`]) names only an upload id: it is authenticated and
//! routed by the id, and the shard checks the workspace scope against the upload's record.
//! Either way the typed error becomes a status in one place, [`reply`].

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
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

/// A request scoped to one workspace.
trait Scoped {
    fn workspace(&self) -> &str;
}

/// A request that names one file of its workspace.
trait OnPath {
    fn path_mut(&mut self) -> &mut String;
}

/// A request that changes its workspace; the request id makes its retries idempotent.
trait Mutation: OnPath {
    fn request_id(&self) -> &str;
}

/// A request that names an upload session (and no workspace).
trait OnUpload {
    fn upload_id(&self) -> &str;
}

/// `fields!(Trait::accessor -> &str = field: Request, ...)` implements a one-field trait.
macro_rules! fields {
    ($tr:ident::$get:ident -> &str = $f:ident: $($t:ident),+) => {
        $(impl $tr for pb::$t { fn $get(&self) -> &str { &self.$f } })+
    };
    ($tr:ident::$get:ident -> &mut String = $f:ident: $($t:ident),+) => {
        $(impl $tr for pb::$t { fn $get(&mut self) -> &mut String { &mut self.$f } })+
    };
}

fields!(Scoped::workspace -> &str = workspace: RouteRequest, StatRequest, ListRequest,
    ReadRequest, WriteRequest, DeleteRequest, BeginUploadRequest, GetManifestRequest,
    ReadBlockRequest, DeleteWorkspaceRequest, EditRequest, AppendRequest, FindRequest,
    GrepRequest);
fields!(OnPath::path_mut -> &mut String = path: StatRequest, ReadRequest, GetManifestRequest,
    WriteRequest, DeleteRequest, BeginUploadRequest, EditRequest, AppendRequest);
fields!(Mutation::request_id -> &str = request_id: WriteRequest, DeleteRequest,
    BeginUploadRequest, EditRequest, AppendRequest);
fields!(OnUpload::upload_id -> &str = upload_id: PutBlockRequest, RenewUploadRequest,
    CommitUploadRequest, AbortUploadRequest);

/// Checks a name field with `norm` (one of [`crate::names`]) and keeps its normal form: the
/// shard only ever sees normalised names.
fn normalise(field: &mut String, norm: impl Fn(&str) -> Result<Cow<'_, str>>) -> Result<()> {
    let normal = norm(field)?.into_owned();
    *field = normal;
    Ok(())
}

/// For a call with no name to check before routing but its workspace (checked on admission).
fn workspace_only<R>(_: &mut R) -> Result<()> {
    Ok(())
}

fn on_path<R: OnPath>(r: &mut R) -> Result<()> {
    normalise(r.path_mut(), names::path)
}

/// A mutation's path is normalised, then its request id checked.
fn mutation<R: Mutation>(r: &mut R) -> Result<()> {
    on_path(r)?;
    names::request_id(r.request_id())?;
    Ok(())
}

impl WorkspaceService {
    pub fn new(node: Arc<Node>) -> Self {
        WorkspaceService { node }
    }

    /// Authenticates, then authorises `role` on the request's workspace after validating its
    /// name.
    fn admit<R: Scoped>(&self, req: &Request<R>, role: Role) -> Result<Claims> {
        let claims = authenticate(&self.node.signer, req)?;
        let ws = req.get_ref().workspace();
        names::workspace(ws)?;
        claims.require(ws, role)?;
        Ok(claims)
    }

    /// The path of a workspace call: admitted with `role`, then `validate`d (which may
    /// normalise the request), then routed to the workspace's shard (`NotOwner` when another
    /// node holds it) and handed to `call`. Nothing of the body is looked at before the
    /// caller is authorised, and nothing is routed before it is valid.
    async fn on_shard<R, T, F>(
        &self,
        req: Request<R>,
        role: Role,
        validate: impl FnOnce(&mut R) -> Result<()>,
        call: impl FnOnce(Arc<Shard>, R) -> F,
    ) -> Result<Response<T>, Status>
    where
        R: Scoped,
        F: Future<Output = Result<T>>,
    {
        reply(
            async {
                self.admit(&req, role)?;
                let mut r = req.into_inner();
                validate(&mut r)?;
                let shard = self.node.shard_for(r.workspace())?;
                call(shard, r).await
            }
            .await,
        )
    }

    /// The path of an upload call: authenticated, then routed by its upload id; `call` gets
    /// the claims, which the shard checks against the upload's record inside its session.
    async fn on_upload_shard<R, T, F>(
        &self,
        req: Request<R>,
        call: impl FnOnce(Claims, Arc<Shard>, R) -> F,
    ) -> Result<Response<T>, Status>
    where
        R: OnUpload,
        F: Future<Output = Result<T>>,
    {
        reply(
            async {
                let claims = authenticate(&self.node.signer, &req)?;
                let shard = self.node.shard(upload_shard(req.get_ref().upload_id())?)?;
                call(claims, shard, req.into_inner()).await
            }
            .await,
        )
    }
}

/// The one place a call's typed error becomes a gRPC status.
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
        reply(self.admit(&req, Role::Read).map(|_| {
            let route = self.node.route(&req.get_ref().workspace);
            pb::RouteResponse {
                shard: route.shard,
                endpoint: route.endpoint,
                epoch: route.epoch,
            }
        }))
    }

    async fn stat(
        &self,
        req: Request<pb::StatRequest>,
    ) -> Result<Response<pb::StatResponse>, Status> {
        self.on_shard(req, Role::Read, on_path, |s, r| async move {
            let entry = s.stat(&r.workspace, &r.path).await?;
            Ok(pb::StatResponse { entry: Some(entry) })
        })
        .await
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let validate = |r: &mut pb::ListRequest| normalise(&mut r.prefix, names::prefix);
        self.on_shard(req, Role::Read, validate, |s, r| async move {
            s.list(&r.workspace, &r.prefix, r.limit, &r.cursor).await
        })
        .await
    }

    async fn read(
        &self,
        req: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        self.on_shard(req, Role::Read, on_path, |s, r| async move {
            s.read(&r.workspace, &r.path).await
        })
        .await
    }

    async fn write(
        &self,
        req: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        self.on_shard(req, Role::Write, mutation, |s, r| async move {
            s.write(r).await
        })
        .await
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        self.on_shard(req, Role::Write, mutation, |s, r| async move {
            s.delete(r).await
        })
        .await
    }

    async fn begin_upload(
        &self,
        req: Request<pb::BeginUploadRequest>,
    ) -> Result<Response<pb::BeginUploadResponse>, Status> {
        let validate = |r: &mut pb::BeginUploadRequest| {
            mutation(r)?;
            if !r.receipt.is_empty() {
                names::receipt(&r.receipt)?;
            }
            Ok(())
        };
        self.on_shard(req, Role::Write, validate, |s, r| async move {
            s.begin_upload(r).await
        })
        .await
    }

    async fn put_block(
        &self,
        req: Request<pb::PutBlockRequest>,
    ) -> Result<Response<pb::PutBlockResponse>, Status> {
        // The reservation taken before the body was decoded (see body_admission); a call that
        // did not pass through it reserves now.
        let reserved = req
            .extensions()
            .get::<BodyReservation>()
            .and_then(BodyReservation::take);
        self.on_upload_shard(req, |claims, s, mut r| async move {
            names::request_id(&r.request_id)?;
            let reserved = match reserved {
                Some(r) => r,
                None => self.node.memory.reserve(r.data.len() as u64).await?,
            };
            // From here the body's bytes carry their share of the budget wherever they go.
            r.data = reserved.hold(std::mem::take(&mut r.data));
            s.put_block(claims, r).await
        })
        .await
    }

    async fn renew_upload(
        &self,
        req: Request<pb::RenewUploadRequest>,
    ) -> Result<Response<pb::RenewUploadResponse>, Status> {
        self.on_upload_shard(req, |claims, s, r| async move {
            s.renew_upload(claims, r).await
        })
        .await
    }

    async fn commit_upload(
        &self,
        req: Request<pb::CommitUploadRequest>,
    ) -> Result<Response<pb::CommitUploadResponse>, Status> {
        self.on_upload_shard(req, |claims, s, r| async move {
            names::request_id(&r.request_id)?;
            s.commit_upload(claims, r).await
        })
        .await
    }

    async fn abort_upload(
        &self,
        req: Request<pb::AbortUploadRequest>,
    ) -> Result<Response<pb::AbortUploadResponse>, Status> {
        self.on_upload_shard(req, |claims, s, r| async move {
            names::request_id(&r.request_id)?;
            s.abort_upload(claims, r).await
        })
        .await
    }

    async fn get_manifest(
        &self,
        req: Request<pb::GetManifestRequest>,
    ) -> Result<Response<pb::GetManifestResponse>, Status> {
        self.on_shard(req, Role::Read, on_path, |s, r| async move {
            s.get_manifest(&r.workspace, &r.path).await
        })
        .await
    }

    type ReadBlockStream = ChunkStream;

    async fn read_block(
        &self,
        req: Request<pb::ReadBlockRequest>,
    ) -> Result<Response<Self::ReadBlockStream>, Status> {
        self.on_shard(req, Role::Read, workspace_only, |s, r| async move {
            let data = s.read_block(&r.workspace, r.revision, r.index, &self.node.memory);
            Ok(block_chunks(data.await?))
        })
        .await
    }

    /// Admin tokens pass too: roles are ordered, admin above write. A call for a shard held
    /// elsewhere is redirected, not admitted here: only the owner's attempt is audited (once,
    /// not once per hop), and from there every outcome is an audit event (see
    /// crate::events).
    async fn delete_workspace(
        &self,
        req: Request<pb::DeleteWorkspaceRequest>,
    ) -> Result<Response<pb::DeleteWorkspaceResponse>, Status> {
        // Fails only where `on_shard`'s own authentication fails first.
        let who = authenticate_with_id(&self.node.signer, &req)
            .map(|(claims, token_id)| Who::caller(&claims, token_id));
        self.on_shard(req, Role::Write, workspace_only, |s, r| async move {
            let target = format!("workspace {}", r.workspace);
            events::audited(
                &self.node.events,
                who?,
                Action::DeleteWorkspace,
                target,
                async {
                    names::request_id(&r.request_id)?;
                    s.delete_workspace(r).await
                },
            )
            .await
        })
        .await
    }

    async fn edit(
        &self,
        req: Request<pb::EditRequest>,
    ) -> Result<Response<pb::EditResponse>, Status> {
        self.on_shard(
            req,
            Role::Write,
            mutation,
            |s, r| async move { s.edit(r).await },
        )
        .await
    }

    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        self.on_shard(req, Role::Write, mutation, |s, r| async move {
            s.append(r).await
        })
        .await
    }

    async fn find(
        &self,
        req: Request<pb::FindRequest>,
    ) -> Result<Response<pb::FindResponse>, Status> {
        let validate = |r: &mut pb::FindRequest| normalise(&mut r.glob, names::glob);
        self.on_shard(req, Role::Read, validate, |s, r| async move {
            s.find(&r.workspace, &r.glob, r.limit, &r.cursor).await
        })
        .await
    }

    type GrepStream = Pin<Box<dyn Stream<Item = Result<pb::GrepChunk, Status>> + Send>>;

    /// The whole search runs (bounded) before the first chunk is sent, so a client never
    /// holds the shard's snapshot open by reading slowly.
    async fn grep(
        &self,
        req: Request<pb::GrepRequest>,
    ) -> Result<Response<Self::GrepStream>, Status> {
        let validate = |r: &mut pb::GrepRequest| match r.path_glob.as_str() {
            "" => Ok(()),
            _ => normalise(&mut r.path_glob, names::glob),
        };
        self.on_shard(req, Role::Read, validate, |s, r| async move {
            let (matches, summary) = s.grep(r, &self.node.memory).await?;
            let chunks = grep_chunks(matches, summary).into_iter().map(Ok);
            Ok(Box::pin(futures::stream::iter(chunks)) as Self::GrepStream)
        })
        .await
    }
}

/// The stream of a ReadBlock. Chunks are slices of one shared buffer: no copies, at most one
/// block per call. The buffer holds its block-memory reservation until the last chunk has been
/// encoded and dropped (or the stream is dropped unsent).
fn block_chunks(data: Bytes) -> ChunkStream {
    let chunks: Vec<Result<pb::ReadBlockChunk, Status>> = (0..data.len().div_ceil(CHUNK))
        .map(|i| {
            let end = ((i + 1) * CHUNK).min(data.len());
            Ok(pb::ReadBlockChunk {
                data: data.slice(i * CHUNK..end),
            })
        })
        .collect();
    Box::pin(futures::stream::iter(chunks))
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
