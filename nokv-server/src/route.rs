//! Routing: which node owns a shard, at which fencing epoch.
//!
//! The node asks its [`Routes`] for the owner of a shard; the answer feeds the `Route` RPC
//! and the hint of a `NotOwner` error. The embedded default is [`LocalRoutes`]: this node
//! owns every shard at epoch 0. The cluster's control module implements the same trait from
//! its ownership records (no etcd round trip: it answers from its watched copy).

/// Where a shard is served: the owner's advertised endpoint and its fencing epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub shard: u32,
    /// `https://host:port` of the owner.
    pub endpoint: String,
    /// The owner's epoch for the shard; epochs only grow, so a client can refuse a hint
    /// older than what it has cached.
    pub epoch: u64,
}

/// The source of routes of a node.
pub trait Routes: Send + Sync {
    /// The current owner of `shard` (endpoint empty when unknown, e.g. mid-move).
    fn route(&self, shard: u32) -> Route;

    /// This node's own advertised endpoint.
    fn own_endpoint(&self) -> String;
}

/// The embedded default: this node owns every shard, at epoch 0.
pub struct LocalRoutes {
    endpoint: String,
}

impl LocalRoutes {
    /// `endpoint` is this node's advertised endpoint.
    pub fn new(endpoint: impl Into<String>) -> Self {
        LocalRoutes {
            endpoint: endpoint.into(),
        }
    }
}

impl Routes for LocalRoutes {
    fn route(&self, shard: u32) -> Route {
        Route {
            shard,
            endpoint: self.endpoint.clone(),
            epoch: 0,
        }
    }

    fn own_endpoint(&self) -> String {
        self.endpoint.clone()
    }
}
