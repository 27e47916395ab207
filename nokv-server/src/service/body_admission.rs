//! Admission of `PutBlock` bodies to the block-memory budget *before* they are decoded.
//!
//! tonic reads and decodes a unary request's whole message before the handler runs, so a
//! budget taken in the handler would come too late: 128 concurrent PutBlocks would already be
//! 128 decoded blocks. This wrapper sits between the transport and the generated
//! `WorkspaceServer`: for a PutBlock it authenticates the caller from the headers, then
//! reserves one message's worth of the budget ([`MAX_MESSAGE`]) and only then
//! lets tonic read the body. Until then the body stays in HTTP/2 flow control, where the
//! connection window bounds what a connection can make the server buffer. The reservation
//! travels to the handler in the request's extensions ([`BodyReservation`]), which attaches it
//! to the decoded bytes.
//!
//! A caller that cannot get memory before the budget's deadline gets `ResourceExhausted`; an
//! unauthenticated one gets `Unauthenticated` — both without the body ever being read. Every
//! other method passes through untouched.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use nokv_proto::MAX_MESSAGE;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http;
use tonic::server::NamedService;

use crate::auth::authenticate;
use crate::memory::{BlockMemory, Reservation};
use crate::token::Signer;

/// The gRPC path whose bodies are block bytes.
const PUT_BLOCK: &str = "/nokv.v1.Workspace/PutBlock";

/// A reservation handed from the transport to the PutBlock handler (extensions must be
/// `Clone`; the handler takes the one reservation out).
#[derive(Clone, Default)]
pub struct BodyReservation(Arc<parking_lot::Mutex<Option<Reservation>>>);

impl BodyReservation {
    pub fn take(&self) -> Option<Reservation> {
        self.0.lock().take()
    }
}

/// Wraps a service (the `WorkspaceServer`) with PutBlock body admission.
#[derive(Clone)]
pub struct BodyAdmission<S> {
    inner: S,
    memory: BlockMemory,
    signer: Signer,
}

impl<S> BodyAdmission<S> {
    pub fn new(inner: S, memory: BlockMemory, signer: Signer) -> Self {
        BodyAdmission {
            inner,
            memory,
            signer,
        }
    }
}

impl<S: NamedService> NamedService for BodyAdmission<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for BodyAdmission<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != PUT_BLOCK {
            return Box::pin(self.inner.call(req));
        }
        // The ready inner service is used for this call; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (memory, signer) = (self.memory.clone(), self.signer.clone());
        Box::pin(async move {
            let headers = tonic::Request::from_parts(
                tonic::metadata::MetadataMap::from_headers(req.headers().clone()),
                Default::default(),
                (),
            );
            if let Err(e) = authenticate(&signer, &headers) {
                return Ok(tonic::Status::from(e).into_http());
            }
            match memory.reserve(MAX_MESSAGE as u64).await {
                Ok(r) => {
                    req.extensions_mut()
                        .insert(BodyReservation(Arc::new(parking_lot::Mutex::new(Some(r)))));
                    inner.call(req).await
                }
                Err(e) => Ok(tonic::Status::from(e).into_http()),
            }
        })
    }
}
