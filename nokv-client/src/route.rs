//! Routing on the client: several endpoints, one channel per endpoint (reused), and a route
//! cache fed by `Route` answers and `NotOwner` hints.
//!
//! Invariants:
//! * Epochs of a shard only grow: a hint or route older than the cached epoch of its shard
//!   is ignored (it comes from a node that has not yet learnt of a newer owner), so a client
//!   never goes back to an old owner.
//! * An unreachable endpoint is forgotten as a route; the client then tries the next
//!   configured endpoint, which answers or hints at the owner.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nokv_proto::MAX_MESSAGE;
use nokv_proto::v1 as pb;
use pb::admin_client::AdminClient;
use pb::workspace_client::WorkspaceClient;
use tonic::Status;
use tonic::transport::{Certificate, Channel};

use crate::channel::{Bearer, Svc, tls_channel};
use crate::error::ClientError;

/// Metadata keys of a `NotOwner` status (the server's `error.rs` writes them).
const OWNER_HINT_KEY: &str = "nokv-owner-hint";
const OWNER_EPOCH_KEY: &str = "nokv-owner-epoch";
const OWNER_SHARD_KEY: &str = "nokv-owner-shard";

/// How many `NotOwner` hints one call follows before it fails for good.
pub const MAX_HOPS: u32 = 4;

/// The owner of a shard as last learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRoute {
    pub endpoint: String,
    pub epoch: u64,
}

/// A `NotOwner` hint: the shard, the owner's endpoint and its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub shard: u32,
    pub endpoint: String,
    pub epoch: u64,
}

impl Hint {
    /// The hint of a `NotOwner` status, if it names an owner.
    pub fn of(status: &Status) -> Option<Hint> {
        let md = status.metadata();
        let get = |k| md.get(k).and_then(|v| v.to_str().ok());
        let endpoint = get(OWNER_HINT_KEY).filter(|e| !e.is_empty())?;
        Some(Hint {
            shard: get(OWNER_SHARD_KEY)?.parse().ok()?,
            endpoint: endpoint.to_string(),
            epoch: get(OWNER_EPOCH_KEY)?.parse().ok()?,
        })
    }
}

/// Workspace → shard, shard → owner.
#[derive(Debug, Default)]
pub struct RouteCache {
    workspaces: HashMap<String, u32>,
    shards: HashMap<u32, CachedRoute>,
}

impl RouteCache {
    /// Records that `shard` is served by `endpoint` at `epoch` (and holds `workspace`).
    /// Returns false, changing nothing, when the cache already knows a newer epoch. An equal
    /// epoch is accepted: a draining owner hints at its successor before the successor has
    /// raised the epoch, and a later hint of the same epoch is at least as fresh.
    pub fn learn(
        &mut self,
        workspace: Option<&str>,
        shard: u32,
        endpoint: &str,
        epoch: u64,
    ) -> bool {
        if self.shards.get(&shard).is_some_and(|c| c.epoch > epoch) {
            return false;
        }
        if let Some(ws) = workspace {
            self.workspaces.insert(ws.to_string(), shard);
        }
        self.shards.insert(
            shard,
            CachedRoute {
                endpoint: endpoint.to_string(),
                epoch,
            },
        );
        true
    }

    /// The cached owner of `workspace`'s shard.
    pub fn route_of(&self, workspace: &str) -> Option<&CachedRoute> {
        self.shards.get(self.workspaces.get(workspace)?)
    }

    pub fn shard(&self, shard: u32) -> Option<&CachedRoute> {
        self.shards.get(&shard)
    }

    /// Forgets the endpoint of every shard served by the unreachable `endpoint`, keeping its
    /// epoch so an older hint still cannot win.
    pub fn unreachable(&mut self, endpoint: &str) {
        for r in self.shards.values_mut() {
            if r.endpoint == endpoint {
                r.endpoint.clear();
            }
        }
    }
}

/// The two service clients over one endpoint's channel.
#[derive(Clone)]
pub struct Conn {
    pub ws: WorkspaceClient<Svc>,
    pub admin: AdminClient<Svc>,
}

impl Conn {
    pub fn new(channel: Channel, bearer: Bearer) -> Conn {
        Conn {
            ws: WorkspaceClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            admin: AdminClient::with_interceptor(channel, bearer),
        }
    }
}

/// The endpoints of a client, their channels and the route cache.
pub struct Router {
    endpoints: Vec<String>,
    /// Index into `endpoints` of the one tried first for calls without a cached route.
    current: AtomicUsize,
    /// The CA for endpoints learnt from hints (`None`: a client built on a caller's channel,
    /// whose hinted endpoints are connected as given).
    ca: Option<Certificate>,
    bearer: Bearer,
    conns: Mutex<HashMap<String, Conn>>,
    pub(crate) cache: Mutex<RouteCache>,
    /// Whether any endpoint has ever answered a call of this client. Until one has, a refused
    /// connection means a wrong endpoint or a server that is not running, and is not retried;
    /// after, it is a server restarting, and is retried like any transient failure.
    answered: AtomicBool,
}

impl Router {
    /// `conns` holds a ready channel for some endpoints (at least the first).
    pub fn new(
        endpoints: Vec<String>,
        ca: Option<Certificate>,
        bearer: Bearer,
        conns: HashMap<String, Conn>,
    ) -> Router {
        Router {
            endpoints,
            current: AtomicUsize::new(0),
            ca,
            bearer,
            conns: Mutex::new(conns),
            cache: Mutex::default(),
            answered: AtomicBool::new(false),
        }
    }

    /// Records that a server answered a call (with a result or a server's error).
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Whether a server has ever answered a call of this client.
    pub fn has_answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    /// The configured endpoints, in the order they are tried.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// The endpoint a call for `workspace` goes to first: its cached owner, else the
    /// current configured endpoint.
    pub fn target(&self, workspace: Option<&str>) -> String {
        let cache = self.cache.lock().expect("not poisoned");
        workspace
            .and_then(|ws| cache.route_of(ws))
            .filter(|r| !r.endpoint.is_empty())
            .map(|r| r.endpoint.clone())
            .unwrap_or_else(|| self.current_endpoint())
    }

    fn current_endpoint(&self) -> String {
        let i = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        self.endpoints[i].clone()
    }

    /// `endpoint` did not answer: forget it as a route and move on to the next configured
    /// endpoint (if it was the current one).
    pub fn unreachable(&self, endpoint: &str) {
        self.cache
            .lock()
            .expect("not poisoned")
            .unreachable(endpoint);
        let i = self.current.load(Ordering::Relaxed);
        if self.endpoints[i % self.endpoints.len()] == endpoint {
            let _ = self.current.compare_exchange(
                i,
                (i + 1) % self.endpoints.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// The channel's clients for `endpoint`, made once and reused.
    pub fn conn(&self, endpoint: &str) -> Result<Conn, ClientError> {
        let mut conns = self.conns.lock().expect("not poisoned");
        if let Some(c) = conns.get(endpoint) {
            return Ok(c.clone());
        }
        let channel = match &self.ca {
            Some(ca) => tls_channel(endpoint, ca.clone())?,
            None => tonic::transport::Endpoint::from_shared(endpoint.to_string())
                .map_err(|e| ClientError::local(format!("endpoint {endpoint:?}: {e}")))?
                .connect_lazy(),
        };
        let conn = Conn::new(channel, self.bearer.clone());
        conns.insert(endpoint.to_string(), conn.clone());
        Ok(conn)
    }
}

#[cfg(test)]
mod tests;
