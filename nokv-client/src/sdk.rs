//! The SDK client. Every mutation gets a request id (random unless the caller supplies one)
//! and is retried with that same id while the server is unavailable or the outcome is
//! unknown; the server's replay records make those retries safe.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nokv_proto::v1 as pb;
use pb::admin_client::AdminClient;
use pb::workspace_client::WorkspaceClient;
use ring::rand::{SecureRandom, SystemRandom};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::config::ResolvedConfig;
use crate::error::ClientError;

pub type Result<T> = std::result::Result<T, ClientError>;

/// One unary `Workspace` call, retried with the very same request (same request id) while
/// the failure is retryable; yields the response message.
macro_rules! unary {
    ($client:expr, $method:ident, $req:expr) => {{
        let client = &$client;
        let req = $req;
        client
            .retrying(stringify!($method), || {
                let mut c = client.ws.clone();
                let req = req.clone();
                async move { c.$method(req).await }
            })
            .await
            .map(tonic::Response::into_inner)
    }};
}
pub(crate) use unary;

/// The largest body the CLI sends as a small file in one `Write`: the server's default
/// `--inline-max`. Larger bodies are published as artifacts. A server configured with a
/// smaller limit refuses a body between the two with `InvalidArgument`, naming its limit.
pub const INLINE_MAX: usize = 256 * 1024;

/// gRPC message limit, matching the server's: one 4 MiB block plus framing.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024 + 64 * 1024;

/// Adds the bearer token to every call. The token is held only here and never printed.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Bearer>;

/// How many times and how patiently a retryable call is repeated.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

#[derive(Clone)]
pub struct Client {
    pub(crate) ws: WorkspaceClient<Svc>,
    admin: AdminClient<Svc>,
    retry: RetryPolicy,
    faults: LostResponses,
}

/// Fault injection for tests (named as such): the next `n` responses of a method are
/// dropped after the server executed the call, exactly as if the network lost them. The
/// retry loop then resends the same request, which is what recovery must survive.
#[derive(Clone, Default)]
pub struct LostResponses(Arc<Mutex<HashMap<&'static str, u32>>>);

impl LostResponses {
    pub fn lose(&self, method: &'static str, n: u32) {
        *self
            .0
            .lock()
            .expect("not poisoned")
            .entry(method)
            .or_default() += n;
    }

    fn take(&self, method: &str) -> bool {
        let mut map = self.0.lock().expect("not poisoned");
        match map.get_mut(method) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    fn error(method: &str) -> ClientError {
        ClientError {
            reason: crate::error::Reason::Transport,
            code: Some(tonic::Code::Unavailable),
            message: format!("injected fault: the response of {method} was lost"),
        }
    }
}

impl Client {
    /// Builds a TLS channel to the endpoint, trusting only the configured CA. The connection
    /// is made lazily, so a server that is briefly down is covered by the retry policy.
    /// A token that cannot travel in a header is refused here rather than dropped, so a call
    /// never goes out silently without the credentials the caller gave.
    pub async fn connect(cfg: &ResolvedConfig) -> Result<Client> {
        let token = cfg
            .token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(t) = token
            && format!("Bearer {t}")
                .parse::<MetadataValue<tonic::metadata::Ascii>>()
                .is_err()
        {
            return Err(ClientError::usage(
                "the token contains characters that cannot be sent: it is not a nokv token",
            ));
        }
        Ok(Self::from_channel(channel(cfg)?, token))
    }

    /// A client over `channel` sending `token` (surrounding whitespace trimmed) with every call.
    pub fn from_channel(channel: Channel, token: Option<&str>) -> Client {
        let bearer = Bearer(token.and_then(|t| format!("Bearer {}", t.trim()).parse().ok()));
        Client {
            ws: WorkspaceClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            admin: AdminClient::with_interceptor(channel, bearer),
            retry: RetryPolicy::default(),
            faults: LostResponses::default(),
        }
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Client {
        self.retry = retry;
        self
    }

    /// Installs a lost-response fault plan (tests only).
    pub fn with_lost_responses(mut self, faults: LostResponses) -> Client {
        self.faults = faults;
        self
    }

    pub fn workspace_client(&self) -> WorkspaceClient<Svc> {
        self.ws.clone()
    }

    /// Runs `call` until it succeeds, fails for good, or the attempts run out. The closure
    /// must resend the *same* request (same request id) every time.
    pub async fn retrying<T, F, Fut>(&self, method: &'static str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let mut backoff = self.retry.first_backoff;
        let mut attempt = 1;
        loop {
            let result = call().await.map_err(ClientError::from);
            let result = match result {
                Ok(_) if self.faults.take(method) => Err(LostResponses::error(method)),
                other => other,
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < self.retry.attempts => {
                    tracing::debug!(attempt, error = %e, "retrying with the same request id");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn stat(&self, ws: &str, path: &str) -> Result<pb::Entry> {
        let req = pb::StatRequest {
            workspace: ws.into(),
            path: path.into(),
        };
        let r = unary!(self, stat, req)?;
        Ok(r.entry.unwrap_or_default())
    }

    pub async fn list(
        &self,
        ws: &str,
        prefix: &str,
        limit: u32,
        cursor: &str,
    ) -> Result<pb::ListResponse> {
        let req = pb::ListRequest {
            workspace: ws.into(),
            prefix: prefix.into(),
            limit,
            cursor: cursor.into(),
        };
        let r = unary!(self, list, req)?;
        Ok(r)
    }

    pub async fn read(&self, ws: &str, path: &str) -> Result<pb::ReadResponse> {
        let req = pb::ReadRequest {
            workspace: ws.into(),
            path: path.into(),
        };
        let r = unary!(self, read, req)?;
        Ok(r)
    }

    /// Writes a small file. `request_id` defaults to a fresh random id.
    pub async fn write(&self, mut req: pb::WriteRequest) -> Result<pb::Entry> {
        if req.request_id.is_empty() {
            req.request_id = new_request_id();
        }
        let r = unary!(self, write, req)?;
        Ok(r.entry.unwrap_or_default())
    }

    pub async fn delete(&self, mut req: pb::DeleteRequest) -> Result<u64> {
        if req.request_id.is_empty() {
            req.request_id = new_request_id();
        }
        let r = unary!(self, delete, req)?;
        Ok(r.generation)
    }

    /// The accounting check: every provider object classified (admin token scoped to `*`).
    pub async fn audit(&self) -> Result<pb::AuditResponse> {
        let r = self
            .retrying("audit", || {
                let mut c = self.admin.clone();
                async move { c.audit(pb::AuditRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Deletes a whole workspace (admin token, or a write token for it). `request_id`
    /// defaults to a fresh random id; a retry with the same id never deletes again.
    pub async fn delete_workspace(
        &self,
        mut req: pb::DeleteWorkspaceRequest,
    ) -> Result<pb::DeleteWorkspaceResponse> {
        if req.request_id.is_empty() {
            req.request_id = new_request_id();
        }
        unary!(self, delete_workspace, req)
    }

    pub async fn health(&self) -> Result<pb::HealthResponse> {
        let r = self
            .retrying("health", || {
                let mut c = self.admin.clone();
                async move { c.health(pb::HealthRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }
}

/// A TLS channel to the endpoint, trusting only the configured CA. The connection is made
/// lazily, so a server that is briefly down is covered by the retry policy.
pub fn channel(cfg: &ResolvedConfig) -> Result<Channel> {
    let ca = std::fs::read(&cfg.ca)
        .map_err(|e| ClientError::local(format!("{}: {e}", cfg.ca.display())))?;
    require_https(&cfg.endpoint)?;
    let endpoint = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|e| ClientError::local(format!("endpoint {:?}: {e}", cfg.endpoint)))?
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?;
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // Room for whole blocks in flight instead of HTTP/2's 64 KiB default window.
        .initial_stream_window_size(MAX_MESSAGE as u32)
        .initial_connection_window_size(4 * MAX_MESSAGE as u32)
        .connect_lazy();
    Ok(channel)
}

/// nokv speaks only gRPC over TLS: an endpoint without a scheme, or with any scheme but
/// `https://`, is refused here with a message that says so, instead of failing later with an
/// HTTP/2 protocol error from a plaintext or non-HTTP peer.
pub fn require_https(endpoint: &str) -> Result<()> {
    match endpoint.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => Ok(()),
        Some((scheme, rest)) => Err(ClientError::usage(format!(
            "endpoint {endpoint:?} uses {scheme}://: `https://` required (nokv serves only TLS), \
             e.g. https://{rest}"
        ))),
        None => Err(ClientError::usage(format!(
            "endpoint {endpoint:?} has no scheme: `https://` required, e.g. https://{endpoint}"
        ))),
    }
}

/// A fresh random request id (128 bits, hex).
pub fn new_request_id() -> String {
    let mut b = [0u8; 16];
    SystemRandom::new()
        .fill(&mut b)
        .expect("the system random source works");
    hex::encode(b)
}
