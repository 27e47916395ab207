//! The SDK client. Every mutation gets a request id (random unless the caller supplies one)
//! and is retried with that same id while the server is unavailable or the outcome is
//! unknown; the server's replay records make those retries safe. The same retry loop moves
//! to the next configured endpoint when one does not answer and follows `NotOwner` hints
//! (see [`crate::route`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nokv_proto::v1 as pb;
use pb::workspace_client::WorkspaceClient;
use ring::rand::{SecureRandom, SystemRandom};
use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// The connection pieces live in [`crate::channel`]; re-exported here, where SDK users
/// have always found them.
pub use crate::channel::{Bearer, Svc, channel, tls_channel};
use crate::channel::{bearer, read_ca};
use crate::config::ResolvedConfig;
pub use crate::config::require_https;
use crate::error::{ClientError, Reason};
use crate::route::{Conn, Hint, MAX_HOPS, Router};

pub type Result<T> = std::result::Result<T, ClientError>;

/// One unary `Workspace` call, retried with the very same request (same request id) while
/// the failure is retryable; yields the response message.
macro_rules! unary {
    ($client:expr, $method:ident, $req:expr) => {{
        let client = &$client;
        let req = $req;
        client
            .retrying_for(
                stringify!($method),
                $crate::sdk::Routed::workspace(&req),
                |conn| {
                    let mut c = conn.ws;
                    let req = req.clone();
                    async move { c.$method(req).await }
                },
            )
            .await
            .map(tonic::Response::into_inner)
    }};
}
pub(crate) use unary;

/// Requests that name a workspace are sent to its cached owner first.
pub trait Routed {
    fn workspace(&self) -> Option<&str>;
}

macro_rules! routed {
    (with $($t:ident),*; without $($u:ident),*) => {
        $(impl Routed for pb::$t {
            fn workspace(&self) -> Option<&str> {
                Some(&self.workspace)
            }
        })*
        $(impl Routed for pb::$u {
            fn workspace(&self) -> Option<&str> {
                None
            }
        })*
    };
}
routed!(with StatRequest, ListRequest, ReadRequest, WriteRequest, DeleteRequest,
    BeginUploadRequest, GetManifestRequest, ReadBlockRequest, DeleteWorkspaceRequest,
    RouteRequest, EditRequest, AppendRequest, FindRequest, GrepRequest; without PutBlockRequest, RenewUploadRequest, CommitUploadRequest,
    AbortUploadRequest);

/// The largest body the CLI sends as a small file in one `Write`: the server's default
/// `--inline-max`. Larger bodies are published as artifacts. A server configured with a
/// smaller limit refuses a body between the two with `InvalidArgument`, naming its limit.
pub const INLINE_MAX: usize = 256 * 1024;

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
    router: Arc<Router>,
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
    /// is made lazily, so a server that is briefly down is covered by the retry policy — once
    /// it has answered: a refused connection before any answer fails at once (a wrong endpoint
    /// or a server that is not running; see [`Client::retrying_for`]).
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
        let endpoints = cfg.endpoints();
        let ca = read_ca(cfg)?;
        let first = tls_channel(&endpoints[0], ca.clone())?;
        let bearer = bearer(token);
        let conns = HashMap::from([(endpoints[0].clone(), Conn::new(first, bearer.clone()))]);
        for e in &endpoints[1..] {
            require_https(e)?;
        }
        Ok(Client {
            router: Arc::new(Router::new(endpoints, Some(ca), bearer, conns)),
            retry: RetryPolicy::default(),
            faults: LostResponses::default(),
        })
    }

    /// A client over `channel` sending `token` (surrounding whitespace trimmed) with every call.
    /// Endpoints named by `NotOwner` hints are connected as given (no configured CA).
    pub fn from_channel(channel: Channel, token: Option<&str>) -> Client {
        let bearer = bearer(token);
        let conns = HashMap::from([(String::new(), Conn::new(channel, bearer.clone()))]);
        Client {
            router: Arc::new(Router::new(vec![String::new()], None, bearer, conns)),
            retry: RetryPolicy::default(),
            faults: LostResponses::default(),
        }
    }

    /// A client of plaintext `endpoints` (tests: fake nodes on loopback), tried in order.
    #[cfg(test)]
    pub(crate) fn plain(endpoints: Vec<String>) -> Client {
        let bearer = bearer(None);
        Client {
            router: Arc::new(Router::new(endpoints, None, bearer, HashMap::new())),
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

    /// The `Workspace` client of the current endpoint.
    pub fn workspace_client(&self) -> WorkspaceClient<Svc> {
        let target = self.router.target(None);
        self.router
            .conn(&target)
            .expect("the current endpoint was validated at connect")
            .ws
    }

    /// The route cache (shard, owner, epoch per workspace), for inspection.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Runs `call` until it succeeds, fails for good, or the attempts run out. The closure
    /// must resend the *same* request (same request id) every time.
    pub async fn retrying<T, F, Fut>(&self, method: &'static str, call: F) -> Result<T>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        self.retrying_for(method, None, call).await
    }

    /// [`Client::retrying`] for a call about `workspace`: sent to its cached owner first.
    /// A `NotOwner` hint not older than the cached epoch is followed at once (at most
    /// [`MAX_HOPS`] times); an unreachable endpoint hands over to the next configured one.
    /// Every attempt resends the same request, so the server's request-id replay keeps a
    /// retried mutation from applying twice.
    ///
    /// A refused connection sent nothing ([`Reason::Refused`]: the outcome is known). Before
    /// any endpoint of this client has answered, it means a wrong endpoint or a server that is
    /// not running: each configured endpoint is tried once, without backoff, and the call
    /// fails naming them. After an answer, it is a restarting server and is retried like any
    /// transient failure. A refusal after an attempt whose outcome is unknown is reported as
    /// `Transport` (unknown), never as known.
    pub async fn retrying_for<T, F, Fut>(
        &self,
        method: &'static str,
        workspace: Option<&str>,
        mut call: F,
    ) -> Result<T>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let mut backoff = self.retry.first_backoff;
        let mut attempt = 1;
        let mut hops = 0;
        let mut target = self.router.target(workspace);
        // Endpoints that refused this call's connection while no endpoint had ever answered.
        let mut refused: Vec<String> = Vec::new();
        // Whether an earlier attempt of this call may have been applied: a later refusal
        // does not make the outcome known again.
        let mut maybe_sent = false;
        loop {
            let conn = self.router.conn(&target)?;
            let result = call(conn).await;
            let hint = match &result {
                Err(s) => Hint::of(s),
                Ok(_) => None,
            };
            let result = result.map_err(|s| match ClientError::from(s) {
                e if e.reason == Reason::Refused && !target.is_empty() => {
                    crate::error::refused(&target)
                }
                e => e,
            });
            let result = match result {
                Ok(_) if self.faults.take(method) => Err(LostResponses::error(method)),
                other => other,
            };
            if !matches!(&result, Err(e) if e.is_transport()) {
                self.router.answered();
            }
            let result = result.map_err(|e| {
                let e = if maybe_sent && e.reason == Reason::Refused {
                    ClientError {
                        reason: Reason::Transport,
                        message: format!("{}; an earlier attempt may have been applied", e.message),
                        ..e
                    }
                } else {
                    e
                };
                maybe_sent |= e.outcome_unknown();
                e
            });
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.is("NotOwner") => {
                    hops += 1;
                    let next = hint.and_then(|h| self.follow(workspace, &h, &target));
                    match next {
                        Some(next) if hops <= MAX_HOPS => {
                            tracing::debug!(from = %target, to = %next, "following the owner hint");
                            target = next;
                        }
                        _ => {
                            return Err(ClientError {
                                message: format!(
                                    "{}; no usable owner hint after {hops} attempt(s) (last \
                                     endpoint {target})",
                                    e.message
                                ),
                                ..e
                            });
                        }
                    }
                }
                // Nothing has ever answered and this endpoint refuses connections: a wrong
                // endpoint or a server that is not running, known at once — no backoff, no
                // second try of it; the other configured endpoints are still tried once.
                Err(e)
                    if e.reason == Reason::Refused
                        && !self.router.has_answered()
                        && attempt < self.retry.attempts =>
                {
                    refused.push(target.clone());
                    self.router.unreachable(&target);
                    target = self.router.target(workspace);
                    if refused.contains(&target) {
                        return Err(refused_everywhere(e, &refused));
                    }
                    attempt += 1;
                    tracing::debug!(error = %e, next = %target, "connection refused: next endpoint");
                }
                Err(e) if e.is_retryable() && attempt < self.retry.attempts => {
                    tracing::debug!(attempt, error = %e, "retrying with the same request id");
                    if e.is_transport() {
                        self.router.unreachable(&target);
                        target = self.router.target(workspace);
                    }
                    // A fresh endpoint is tried at once; a full round of them backs off.
                    if !e.is_transport()
                        || (attempt as usize).is_multiple_of(self.router.endpoint_count())
                    {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(self.retry.max_backoff);
                    }
                    attempt += 1;
                }
                Err(e) if e.is_transport() && self.router.endpoint_count() > 1 => {
                    // Forgotten even on the last attempt: the caller's next call must not go
                    // back to an endpoint that did not answer (with one attempt per call, the
                    // caller's loop is the retry).
                    self.router.unreachable(&target);
                    return Err(ClientError {
                        message: format!(
                            "{}; no answer from any of the endpoints {}",
                            e.message,
                            self.router.endpoints().join(", ")
                        ),
                        ..e
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Applies a `NotOwner` hint received from `from`; the endpoint to try next, or `None`
    /// when the hint is older than the cache and the cached owner is `from` itself.
    fn follow(&self, workspace: Option<&str>, hint: &Hint, from: &str) -> Option<String> {
        let mut cache = self.router.cache.lock().expect("not poisoned");
        if cache.learn(workspace, hint.shard, &hint.endpoint, hint.epoch) {
            return Some(hint.endpoint.clone());
        }
        tracing::debug!(?hint, "ignoring an owner hint older than the cached route");
        cache
            .shard(hint.shard)
            .map(|r| r.endpoint.clone())
            .filter(|e| !e.is_empty() && e != from)
    }

    /// The route of `workspace` (shard, owner endpoint, epoch), as the server answers it;
    /// the answer also feeds the route cache unless it is older than the cached one.
    pub async fn route(&self, ws: &str) -> Result<pb::RouteResponse> {
        let req = pb::RouteRequest {
            workspace: ws.into(),
        };
        let r = unary!(self, route, req)?;
        self.router.cache.lock().expect("not poisoned").learn(
            Some(ws),
            r.shard,
            &r.endpoint,
            r.epoch,
        );
        Ok(r)
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

    /// Replaces exactly one occurrence of `req.old` with `req.new` in a small file on the
    /// server, in one write session. `request_id` defaults to a fresh random id.
    pub async fn edit(&self, mut req: pb::EditRequest) -> Result<pb::Entry> {
        if req.request_id.is_empty() {
            req.request_id = new_request_id();
        }
        let r = unary!(self, edit, req)?;
        Ok(r.entry.unwrap_or_default())
    }

    /// Appends to a small file (creating it) atomically on the server. `request_id` defaults
    /// to a fresh random id.
    pub async fn append(&self, mut req: pb::AppendRequest) -> Result<pb::Entry> {
        if req.request_id.is_empty() {
            req.request_id = new_request_id();
        }
        let r = unary!(self, append, req)?;
        Ok(r.entry.unwrap_or_default())
    }

    /// One page of the paths of `ws` matching `glob`.
    pub async fn find(
        &self,
        ws: &str,
        glob: &str,
        limit: u32,
        cursor: &str,
    ) -> Result<pb::FindResponse> {
        let req = pb::FindRequest {
            workspace: ws.into(),
            glob: glob.into(),
            limit,
            cursor: cursor.into(),
        };
        unary!(self, find, req)
    }

    /// Runs a server-side grep and gathers its stream: every match, and the summary the
    /// server sends last (default when the server sent none).
    pub async fn grep(
        &self,
        req: pb::GrepRequest,
    ) -> Result<(Vec<pb::GrepMatch>, pb::GrepSummary)> {
        let ws = req.workspace.clone();
        self.retrying_for("grep", Some(&ws), |conn| {
            let mut c = conn.ws;
            let req = req.clone();
            async move {
                let mut stream = c.grep(req).await?.into_inner();
                let mut matches = Vec::new();
                let mut summary = pb::GrepSummary::default();
                while let Some(chunk) = stream.message().await? {
                    matches.extend(chunk.matches);
                    if let Some(s) = chunk.summary {
                        summary = s;
                    }
                }
                Ok((matches, summary))
            }
        })
        .await
    }

    /// The accounting check: every provider object classified (admin token scoped to `*`).
    pub async fn audit(&self) -> Result<pb::AuditResponse> {
        let r = self
            .retrying("audit", |conn| {
                let mut c = conn.admin;
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

    /// The cluster as the answering node sees it: live nodes and every shard's owner, epoch,
    /// state and last checkpoint (admin token scoped to `*`).
    pub async fn cluster(&self) -> Result<pb::ClusterResponse> {
        let r = self
            .retrying("cluster", |conn| {
                let mut c = conn.admin;
                async move { c.cluster(pb::ClusterRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Hands `shard` gracefully to node `node` (cluster mode; admin token scoped to `*`).
    /// Answers once `node` serves the shard. A retry after a lost answer asks for the same
    /// end state again.
    pub async fn move_shard(&self, shard: u32, node: &str) -> Result<pb::MoveShardResponse> {
        let r = self
            .retrying("move_shard", |conn| {
                let mut c = conn.admin;
                let req = pb::MoveShardRequest {
                    shard,
                    node: node.to_string(),
                };
                async move { c.move_shard(req).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// The node's audit events, newest first: `limit` 1–1000 (0 = the server's default, 50).
    pub async fn list_events(&self, limit: u32) -> Result<pb::ListEventsResponse> {
        let r = self
            .retrying("list_events", |conn| {
                let mut c = conn.admin;
                async move { c.list_events(pb::ListEventsRequest { limit }).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// A page of the node's operations ledger (admin token). `limit` absent = the server's
    /// default (50); `after` = the previous page's `next`.
    pub async fn list_operations(
        &self,
        states: &[String],
        limit: Option<u32>,
        after: &str,
    ) -> Result<pb::ListOperationsResponse> {
        let r = self
            .retrying("list_operations", |conn| {
                let mut c = conn.admin;
                let req = pb::ListOperationsRequest {
                    states: states.to_vec(),
                    limit,
                    after: after.to_string(),
                };
                async move { c.list_operations(req).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Sets (`Some`) or removes (`None`) workspace `ws`'s byte quota and answers its usage
    /// (admin token scoped to `*`; sent to the workspace's owner).
    pub async fn set_quota(&self, ws: &str, quota: Option<u64>) -> Result<pb::QuotaResponse> {
        let req = pb::SetQuotaRequest {
            workspace: ws.into(),
            quota,
        };
        let r = self
            .retrying_for("set_quota", Some(ws), |conn| {
                let mut c = conn.admin;
                let req = req.clone();
                async move { c.set_quota(req).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Starts an inventory scan on every shard of the answering node that is not scanning
    /// (idempotent; admin token scoped to `*`).
    pub async fn inventory_start(&self) -> Result<pb::InventoryStartResponse> {
        let r = self
            .retrying("inventory_start", |conn| {
                let mut c = conn.admin;
                async move { c.inventory_start(pb::InventoryStartRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// The inventory's progress per shard and overall (admin token scoped to `*`).
    pub async fn inventory_status(&self) -> Result<pb::InventoryStatusResponse> {
        let r = self
            .retrying("inventory_status", |conn| {
                let mut c = conn.admin;
                async move { c.inventory_status(pb::InventoryStatusRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Up to `limit` quarantine observations (0: the server's default; admin token scoped to
    /// `*`).
    pub async fn quarantine(&self, limit: u32) -> Result<pb::QuarantineResponse> {
        let r = self
            .retrying("quarantine", |conn| {
                let mut c = conn.admin;
                async move { c.quarantine(pb::QuarantineRequest { limit }).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Workspace `ws`'s byte quota, used and reserved bytes (admin token scoped to `*`).
    pub async fn get_quota(&self, ws: &str) -> Result<pb::QuotaResponse> {
        let req = pb::GetQuotaRequest {
            workspace: ws.into(),
        };
        let r = self
            .retrying_for("get_quota", Some(ws), |conn| {
                let mut c = conn.admin;
                let req = req.clone();
                async move { c.get_quota(req).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Retries a delete operation's cleanup now (admin token). Idempotent: a retry after a
    /// lost answer reads the settled state.
    pub async fn retry_cleanup(&self, operation_id: &str) -> Result<pb::RetryCleanupResponse> {
        let r = self
            .retrying("retry_cleanup", |conn| {
                let mut c = conn.admin;
                let req = pb::RetryCleanupRequest {
                    operation_id: operation_id.to_string(),
                };
                async move { c.retry_cleanup(req).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    /// Starts a backup of the answering node's metadata (admin token scoped to `*`): the
    /// backup file's chunks in order, the last message carrying the summary. Only the call's
    /// start is retried; a stream that breaks fails the backup (its bytes must be discarded).
    pub async fn backup(&self) -> Result<tonic::Streaming<pb::BackupChunk>> {
        let r = self
            .retrying("backup", |conn| {
                let mut c = conn.admin;
                async move { c.backup(pb::BackupRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }

    pub async fn health(&self) -> Result<pb::HealthResponse> {
        let r = self
            .retrying("health", |conn| {
                let mut c = conn.admin;
                async move { c.health(pb::HealthRequest {}).await }
            })
            .await?;
        Ok(r.into_inner())
    }
}

/// The error of a call that every endpoint refused (`last` is the last refusal): one
/// endpoint's refusal as it is, several named together.
fn refused_everywhere(last: ClientError, refused: &[String]) -> ClientError {
    if refused.len() < 2 {
        return last;
    }
    ClientError {
        message: format!(
            "cannot connect to any of {} (connection refused): is nokv-server running?",
            refused.join(", ")
        ),
        ..last
    }
}

/// A fresh request id: 32 hex digits, the first 12 the wall clock in ms, the other 20 random
/// (80 bits, so ids of one millisecond still never collide in practice).
///
/// Why time first: the server keeps a replay record per request keyed by (workspace, request
/// id). Random keys land each insert on a random leaf of that B-tree, so a batch of N writes
/// dirties N leaves (and the tree's cache churns as it grows with every write until the
/// replay TTL); ids that grow with time append at the right edge of the workspace's range, so
/// a batch dirties one or two leaves per workspace. Nothing relies on the order for
/// correctness: a request id only has to be unique.
pub fn new_request_id() -> String {
    let mut random = [0u8; 10];
    SystemRandom::new()
        .fill(&mut random)
        .expect("the system random source works");
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    request_id_at(ms, random)
}

/// The request id issued at `ms` with `random` bits (see [`new_request_id`]).
fn request_id_at(ms: u64, random: [u8; 10]) -> String {
    // 48 bits of milliseconds last until the year 10889.
    format!("{:012x}{}", ms & 0xffff_ffff_ffff, hex::encode(random))
}

#[cfg(test)]
mod request_id_tests {
    use super::{new_request_id, request_id_at};

    #[test]
    fn request_ids_sort_by_the_millisecond_they_were_issued_whatever_their_random_bits() {
        let earlier = request_id_at(1_764_000_000_000, [0xff; 10]);
        let later = request_id_at(1_764_000_000_001, [0x00; 10]);
        assert!(earlier < later, "{earlier} should sort before {later}");
        let a = new_request_id();
        let b = new_request_id();
        assert!(a[..12] <= b[..12], "{a} was issued before {b}");
    }

    #[test]
    fn a_request_id_is_32_lowercase_hex_digits_and_two_are_never_equal() {
        let id = new_request_id();
        assert_eq!(id.len(), 32);
        assert!(
            id.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        );
        assert_ne!(new_request_id(), new_request_id());
    }
}
