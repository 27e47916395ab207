//! The RPC instruments' tower layer: every gRPC call counted and timed by method and status
//! code, to the end of its response body (see the module doc of [`crate::metrics`] for the
//! `method` label's rule).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::metrics;

/// The tower layer that counts every gRPC call (installed on the server in `server.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcMetricsLayer;

impl<S> tower_layer::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    R: http_body::Body,
{
    type Response = http::Response<TimedBody<R>>;
    type Error = S::Error;
    type Future = RpcFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // A `&'static str` from the closed list: no allocation per call.
        let method = method_label(req.uri().path());
        RpcFuture {
            inner: self.inner.call(req),
            method,
            started: Instant::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// A call in flight until its response headers: then its body carries the measurement on.
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        method: &'static str,
        started: Instant,
    }
}

impl<F, R, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
    R: http_body::Body,
{
    type Output = Result<http::Response<TimedBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match std::task::ready!(this.inner.poll(cx)) {
            Ok(resp) => {
                // A trailers-only response (every unary error) has its status in the headers.
                let code = resp.headers().get("grpc-status").and_then(grpc_status_name);
                let call = Call {
                    method: this.method,
                    started: *this.started,
                    code,
                };
                // Such a call has ended already: count it before the client can see it.
                let call = if code.is_some() && resp.body().is_end_stream() {
                    call.finish(true);
                    None
                } else {
                    Some(call)
                };
                Poll::Ready(Ok(resp.map(|inner| TimedBody { inner, call })))
            }
            Err(e) => {
                metrics().rpc(this.method, "Unavailable", this.started.elapsed());
                Poll::Ready(Err(e))
            }
        }
    }
}

/// What is known of a call until it is counted.
struct Call {
    method: &'static str,
    started: Instant,
    /// The status seen so far (headers or trailers); `None` until one is.
    code: Option<&'static str>,
}

impl Call {
    /// Counts the call: with the status seen, else `OK` when the body ended normally and
    /// `Cancelled` when it was cut short.
    fn finish(self, ended: bool) {
        let code = self.code.unwrap_or(if ended { "OK" } else { "Cancelled" });
        metrics().rpc(self.method, code, self.started.elapsed());
    }
}

fn grpc_status_name(value: &http::HeaderValue) -> Option<&'static str> {
    let code = value.to_str().ok()?.parse::<i32>().ok()?;
    Some(code_name(code))
}

pin_project_lite::pin_project! {
    /// A response body that counts its call when it ends: at its trailers (gRPC sends its
    /// status there), at its end, at an error, or when it is dropped unfinished (the client
    /// went away: `Cancelled` unless a status was already seen).
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for TimedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(call) = this.call.take() {
                call.finish(false);
            }
        }
    }
}

impl<B: http_body::Body> http_body::Body for TimedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(trailers) = f.trailers_ref()
                    && let Some(mut call) = this.call.take()
                {
                    if let Some(code) = trailers.get("grpc-status").and_then(grpc_status_name) {
                        call.code = Some(code);
                    }
                    call.finish(true);
                }
            }
            Some(Err(_)) => {
                if let Some(mut call) = this.call.take() {
                    call.code.get_or_insert("Internal");
                    call.finish(true);
                }
            }
            None => {
                if let Some(call) = this.call.take() {
                    call.finish(true);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The label of a call to `path`: the path without its leading `/`, and without `nokv.v1.` for
/// nokv's services (`/nokv.v1.Workspace/Write` → `Workspace/Write`,
/// `/grpc.health.v1.Health/Check` → `grpc.health.v1.Health/Check`); anything the daemon does
/// not serve is `unknown`.
///
/// Invariant: every label comes from a closed list — the methods of the services this daemon
/// serves, read from their own descriptors — so no caller, authenticated or not, can add a
/// series by calling a method name of its choosing (300 calls of made-up names once added
/// 7,200 series lines).
pub fn method_label(path: &str) -> &'static str {
    match served_methods().get(path) {
        Some(label) => label,
        None => UNKNOWN_METHOD,
    }
}

/// The label of every call to a method this daemon does not serve.
pub const UNKNOWN_METHOD: &str = "unknown";

/// `/package.Service/Method` → its label, for every method of nokv.v1, gRPC health and
/// reflection.
fn served_methods() -> &'static std::collections::HashMap<String, String> {
    static METHODS: std::sync::OnceLock<std::collections::HashMap<String, String>> =
        std::sync::OnceLock::new();
    METHODS.get_or_init(|| {
        use prost::Message;
        let sets = [
            nokv_proto::v1::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        let mut methods = std::collections::HashMap::new();
        for set in sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(set) else {
                continue;
            };
            for file in set.file {
                let package = file.package();
                for service in &file.service {
                    for method in &service.method {
                        let path = format!("/{package}.{}/{}", service.name(), method.name());
                        let label = path.strip_prefix("/nokv.v1.").unwrap_or(&path[1..]);
                        methods.insert(path.clone(), label.to_string());
                    }
                }
            }
        }
        methods
    })
}

/// The name of a gRPC status code, as `tonic::Code`'s variants spell it (`OK` for 0, as
/// the gRPC specification spells it).
pub fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Cancelled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use std::convert::Infallible;

    type Frames =
        futures::channel::mpsc::UnboundedSender<Result<http_body::Frame<Bytes>, Infallible>>;
    type StreamBody = http_body_util::StreamBody<
        futures::channel::mpsc::UnboundedReceiver<Result<http_body::Frame<Bytes>, Infallible>>,
    >;

    /// A service answering `headers` at once, with a body the test feeds frame by frame.
    struct Streaming(Option<(http::HeaderMap, StreamBody)>);

    impl tower_service::Service<http::Request<()>> for Streaming {
        type Response = http::Response<StreamBody>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let (headers, body) = self.0.take().expect("one call");
            let mut resp = http::Response::new(body);
            *resp.headers_mut() = headers;
            std::future::ready(Ok(resp))
        }
    }

    /// Calls `path` through the metrics layer; returns the response and the feed of its body.
    async fn call(
        path: &str,
        headers: http::HeaderMap,
    ) -> (http::Response<TimedBody<StreamBody>>, Frames) {
        use tower_layer::Layer;
        use tower_service::Service;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut svc = RpcMetricsLayer.layer(Streaming(Some((
            headers,
            http_body_util::StreamBody::new(rx),
        ))));
        let req = http::Request::builder().uri(path).body(()).unwrap();
        (svc.call(req).await.unwrap(), tx)
    }

    fn count(method: &str, code: &str) -> (u64, u64) {
        let m = metrics();
        (
            m.rpc_requests.with_label_values(&[method, code]).get(),
            m.rpc_duration
                .with_label_values(&[method, code])
                .get_sample_count(),
        )
    }

    fn trailers(code: i32) -> http_body::Frame<Bytes> {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.to_string().parse().unwrap());
        http_body::Frame::trailers(t)
    }

    // Catches: the call counted when its headers are ready (the old `RpcFuture`), which timed
    // a stream only to its first byte and counted one failing mid-stream as `OK`.
    #[tokio::test]
    async fn a_streaming_call_is_counted_when_its_body_ends_with_the_status_of_its_trailers() {
        let method = "grpc.health.v1.Health/Watch";
        let before = count(method, "DataLoss");
        let (resp, tx) = call("/grpc.health.v1.Health/Watch", http::HeaderMap::new()).await;
        let mut body = resp.into_body();
        tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from_static(b"one"))))
            .unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        assert_eq!(
            count(method, "DataLoss"),
            before,
            "counted before the stream ended"
        );
        tx.unbounded_send(Ok(trailers(15))).unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        assert_eq!(count(method, "DataLoss"), (before.0 + 1, before.1 + 1));
        drop(tx);
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!(
            count(method, "DataLoss"),
            (before.0 + 1, before.1 + 1),
            "counted once"
        );
    }

    #[tokio::test]
    async fn a_stream_dropped_before_its_end_counts_as_cancelled_or_as_the_status_its_headers_gave()
    {
        let method = "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let cancelled = count(method, "Cancelled");
        let (resp, tx) = call(path, http::HeaderMap::new()).await;
        tx.unbounded_send(Ok(http_body::Frame::data(Bytes::from_static(b"x"))))
            .unwrap();
        drop(resp);
        assert_eq!(
            count(method, "Cancelled"),
            (cancelled.0 + 1, cancelled.1 + 1)
        );

        // A status in the headers with a body still open: counted when the body ends.
        let denied = count(method, "PermissionDenied");
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", "7".parse().unwrap());
        let (resp, tx) = call(path, headers).await;
        assert_eq!(count(method, "PermissionDenied"), denied);
        drop(tx);
        drop(resp);
        assert_eq!(
            count(method, "PermissionDenied"),
            (denied.0 + 1, denied.1 + 1)
        );
    }

    // A unary error is a trailers-only response (status in the headers, empty body) that
    // hyper may send before it drops the body: it is counted before the client can see it.
    #[tokio::test]
    async fn a_trailers_only_error_is_counted_when_its_headers_are_ready() {
        use tower_layer::Layer;
        use tower_service::Service;
        struct Refuse;
        impl tower_service::Service<http::Request<()>> for Refuse {
            type Response = http::Response<http_body_util::Empty<Bytes>>;
            type Error = Infallible;
            type Future = std::future::Ready<Result<Self::Response, Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                let mut resp = http::Response::new(http_body_util::Empty::new());
                resp.headers_mut()
                    .insert("grpc-status", "16".parse().unwrap());
                std::future::ready(Ok(resp))
            }
        }
        let method = "grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
        let before = count(method, "Unauthenticated");
        let req = http::Request::builder()
            .uri("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
            .body(())
            .unwrap();
        let resp = RpcMetricsLayer.layer(Refuse).call(req).await.unwrap();
        assert_eq!(
            count(method, "Unauthenticated"),
            (before.0 + 1, before.1 + 1)
        );
        drop(resp);
        assert_eq!(
            count(method, "Unauthenticated"),
            (before.0 + 1, before.1 + 1)
        );
    }

    // series per made-up method name).
    #[test]
    fn a_method_the_daemon_does_not_serve_is_labelled_unknown_whatever_its_name() {
        for path in [
            "/nokv.v1.Workspace/X0d2c1f7e",
            "/nokv.v1.Nope/Write",
            "/evil.Service/Method",
            "",
            "/",
            "/nokv.v1.Workspace/Write/extra",
        ] {
            assert_eq!(method_label(path), UNKNOWN_METHOD, "{path:?}");
        }
        assert!(served_methods().len() > 20, "the served services were read");
    }

    #[test]
    fn rpc_labels_name_the_service_and_method_and_the_status_code() {
        assert_eq!(method_label("/nokv.v1.Workspace/Write"), "Workspace/Write");
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
        assert_eq!(method_label("/nokv.v1.Admin/Health"), "Admin/Health");
        assert_eq!(
            method_label("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        );
        // One form for every service: `<service>/<Method>`, never a leading slash.
        for label in served_methods().values() {
            assert!(!label.starts_with('/'), "{label}");
            assert_eq!(label.matches('/').count(), 1, "{label}");
        }
        assert_eq!(code_name(0), "OK");
        for c in 1..=16 {
            assert_eq!(
                code_name(c),
                format!("{:?}", tonic::Code::from_i32(c)),
                "code {c}"
            );
        }
    }
}
