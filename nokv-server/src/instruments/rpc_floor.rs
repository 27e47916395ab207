//! `nokv-server rpc-floor`: the least a durable 4 KiB `Write` can cost on the daemon's own
//! transport, measured rather than summed (`nokv bench limits`, issue 12).
//!
//! It serves `nokv.v1.Workspace/Write` — and nothing else — on the daemon's transport
//! ([`crate::server::transport`]: the same TLS identity, HTTP/2 windows and stream limit,
//! `TCP_NODELAY`, a multi-thread runtime with one worker per CPU) and does for each call
//! exactly the work no store design can skip: authenticate the bearer token and authorise it
//! for the workspace, validate the path and request id, make the body durable (`pwrite` into
//! a preallocated file, then `fdatasync`) and answer. No table, no hash, no quota, no
//! replay record: whatever a real put costs above this is what the store costs.
//!
//! The durable write runs where `--durable` says:
//! * `writer` — on one writer thread the request is handed to (as the daemon's node committer
//!   is), which appends every body waiting for it and fsyncs once for all of them: the floor
//!   of a store with a single writer thread, at any number of clients;
//! * `inline` — on the async worker that received the request, blocking it for the fsync:
//!   no hand-off at all, the floor of any design on this transport at one client (at more,
//!   workers blocked in fsync serve nobody, so it is no floor there).
//!
//! Invariant: this is a measuring instrument, never a store. It answers `Write` as if it had
//! stored the file, so it is a separate subcommand that takes no store, only a daemon's TLS
//! identity and token secret (read, never written) and a scratch file — nothing can start it
//! in place of the daemon or point it at a store.

use std::convert::Infallible;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use nokv_proto::MAX_MESSAGE;
use nokv_proto::v1 as pb;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::bootstrap;
use crate::error::{Error, Result};
use crate::names;
use crate::server::ServeError;
use crate::token::{Role, Signer};

/// Why `rpc-floor` could not serve.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("scratch file {path}: {source}")]
    Scratch {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Bytes of the preallocated scratch file; bodies are written round it, each at a 4 KiB
/// boundary, so every measured write overwrites allocated blocks (no file-size change, no
/// metadata journal: the cheapest durable write there is).
const SCRATCH_BYTES: u64 = 16 * 1024 * 1024;
const ALIGN: u64 = 4096;

/// Where each body's durable write runs (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Durable {
    Writer,
    Inline,
}

/// The scratch file and where the next body goes in it.
struct Scratch {
    file: File,
    next: u64,
}

impl Scratch {
    /// Creates (or reuses) `path`, writes it full of zeros and makes that durable, so later
    /// writes only overwrite.
    fn prepare(path: &Path) -> std::io::Result<Scratch> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        file.write_all_at(&vec![0u8; SCRATCH_BYTES as usize], 0)?;
        file.sync_all()?;
        Ok(Scratch { file, next: 0 })
    }

    /// Writes one body at the next aligned offset (starting over at the front when it would
    /// not fit); not durable until [`Scratch::sync`].
    fn put(&mut self, body: &[u8]) -> std::io::Result<()> {
        let len = (body.len() as u64).div_ceil(ALIGN).max(1) * ALIGN;
        if self.next + len > SCRATCH_BYTES {
            self.next = 0;
        }
        self.file.write_all_at(body, self.next)?;
        self.next += len;
        Ok(())
    }

    fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
}

type Done = oneshot::Sender<std::io::Result<()>>;

/// Where bodies go: straight into the scratch file, or to the writer thread.
enum Sink {
    Inline(Mutex<Scratch>),
    Writer(mpsc::UnboundedSender<(bytes::Bytes, Done)>),
}

impl Sink {
    fn new(durable: Durable, scratch: Scratch) -> Sink {
        match durable {
            Durable::Inline => Sink::Inline(Mutex::new(scratch)),
            Durable::Writer => {
                let (tx, rx) = mpsc::unbounded_channel();
                std::thread::Builder::new()
                    .name("rpc-floor-writer".into())
                    .spawn(move || write_loop(scratch, rx))
                    .expect("spawn the writer thread");
                Sink::Writer(tx)
            }
        }
    }

    /// Returns once `body` is durable.
    async fn durable(&self, body: bytes::Bytes) -> std::io::Result<()> {
        match self {
            Sink::Inline(scratch) => {
                let mut s = scratch.lock();
                s.put(&body)?;
                s.sync()
            }
            Sink::Writer(queue) => {
                let (done, answer) = oneshot::channel();
                queue
                    .send((body, done))
                    .map_err(|_| std::io::Error::other("the writer thread stopped"))?;
                answer
                    .await
                    .map_err(|_| std::io::Error::other("the writer thread stopped"))?
            }
        }
    }
}

/// The writer thread: takes every body waiting, writes them, fsyncs once, answers them all
/// (group commit, as the node committer's log does).
fn write_loop(mut scratch: Scratch, mut jobs: mpsc::UnboundedReceiver<(bytes::Bytes, Done)>) {
    let mut group = Vec::new();
    while let Some(first) = jobs.blocking_recv() {
        group.push(first);
        while let Ok(more) = jobs.try_recv() {
            group.push(more);
        }
        let written = group
            .iter()
            .try_for_each(|(body, _)| scratch.put(body))
            .and_then(|()| scratch.sync());
        for (_, done) in group.drain(..) {
            let _ = done.send(match &written {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            });
        }
    }
}

/// What one `Write` needs: the token secret and the sink.
struct Floor {
    signer: Signer,
    sink: Sink,
}

impl Floor {
    /// The daemon's checks of a `Write` (the same functions its service calls), then the
    /// durable write.
    async fn write(&self, req: Request<pb::WriteRequest>) -> Result<pb::WriteResponse> {
        let r = req.get_ref();
        let claims = crate::auth::authenticate(&self.signer, &req)?;
        names::workspace(&r.workspace)?;
        claims.require(&r.workspace, Role::Write)?;
        let path = names::path(&r.path)?.into_owned();
        names::request_id(&r.request_id)?;
        let data = req.into_inner().data;
        let size = data.len() as u64;
        self.sink
            .durable(data)
            .await
            .map_err(|e| Error::Internal(format!("rpc-floor durable write: {e}")))?;
        Ok(pb::WriteResponse {
            entry: Some(pb::Entry {
                path,
                size,
                generation: 1,
                ..Default::default()
            }),
        })
    }
}

/// `nokv.v1.Workspace` with only `Write` answered (every other method is `Unimplemented`).
#[derive(Clone)]
struct FloorService(Arc<Floor>);

impl NamedService for FloorService {
    const NAME: &'static str = "nokv.v1.Workspace";
}

struct WriteCall(Arc<Floor>);

impl UnaryService<pb::WriteRequest> for WriteCall {
    type Response = pb::WriteResponse;
    type Future = BoxFuture<Response<pb::WriteResponse>, Status>;

    fn call(&mut self, req: Request<pb::WriteRequest>) -> Self::Future {
        let floor = self.0.clone();
        Box::pin(async move {
            floor
                .write(req)
                .await
                .map(Response::new)
                .map_err(Status::from)
        })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for FloorService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != "/nokv.v1.Workspace/Write" {
            return Box::pin(async {
                Ok(Status::unimplemented("rpc-floor answers Write only").into_http())
            });
        }
        let floor = self.0.clone();
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_MESSAGE), Some(MAX_MESSAGE));
            Ok(grpc.unary(WriteCall(floor), req).await)
        })
    }
}

/// Serves until SIGINT/SIGTERM, announcing `nokv-server listening on ENDPOINT` (the line
/// tools wait for) once it accepts calls.
pub async fn run(
    data_dir: &Path,
    scratch: &Path,
    listen: &str,
    durable: Durable,
) -> std::result::Result<(), FloorError> {
    let material = bootstrap::load_existing(data_dir).map_err(ServeError::from)?;
    let listener = crate::server::bind(listen).await?;
    let announce = |endpoint: &str| println!("nokv-server listening on {endpoint}");
    serve(
        &material,
        scratch,
        listener,
        durable,
        announce,
        crate::server::shutdown_signal(),
    )
    .await
}

/// Serves on `listener` (from [`crate::server::bind`]) until `shutdown` completes; `announce`
/// gets the endpoint once the scratch file is ready and the transport is built.
async fn serve(
    material: &bootstrap::Material,
    scratch: &Path,
    (listener, local): (TcpListener, std::net::SocketAddr),
    durable: Durable,
    announce: impl FnOnce(&str),
    shutdown: impl std::future::Future<Output = ()>,
) -> std::result::Result<(), FloorError> {
    let scratch = Scratch::prepare(scratch).map_err(|source| FloorError::Scratch {
        path: scratch.to_path_buf(),
        source,
    })?;
    let floor = FloorService(Arc::new(Floor {
        signer: material.signer.clone(),
        sink: Sink::new(durable, scratch),
    }));
    let router =
        crate::server::transport(tonic::transport::Server::builder(), material)?.add_service(floor);
    announce(&crate::server::advertised_endpoint(None, local));
    router
        .serve_with_incoming_shutdown(crate::server::incoming(listener), shutdown)
        .await
        .map_err(ServeError::from)?;
    Ok(())
}

#[cfg(test)]
mod tests;
