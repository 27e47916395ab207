//! The node's routes in cluster mode: which endpoint serves each shard, as the latest view of
//! etcd says, for forwarding requests and answering `Route`.

use std::sync::Arc;

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::control::etcd::{ClusterView, ShardState};
use crate::route::{Route, Routes};

/// The node's routes in cluster mode: a copy of the ownership records, refreshed on every
/// change under the cluster prefix (never read from etcd on the request path).
pub struct ClusterRoutes {
    own: String,
    table: RwLock<Vec<Route>>,
    version: watch::Sender<u64>,
}

impl ClusterRoutes {
    pub fn new(own: String, shard_count: u32) -> Arc<ClusterRoutes> {
        Arc::new(ClusterRoutes {
            own,
            table: RwLock::new(
                (0..shard_count)
                    .map(|shard| Route {
                        shard,
                        endpoint: String::new(),
                        epoch: 0,
                    })
                    .collect(),
            ),
            version: watch::Sender::new(0),
        })
    }

    /// Replaces the table from a view: a shard routes to its owner only while the owner key
    /// exists and the record says serving; otherwise the endpoint is empty (moving: retry).
    pub fn update(&self, view: &ClusterView) {
        let mut table = self.table.write();
        for s in &view.shards {
            let Some(route) = table.get_mut(s.shard as usize) else {
                continue;
            };
            let serving = s.owner.is_some()
                && s.record
                    .as_ref()
                    .is_some_and(|r| r.state == ShardState::Serving);
            route.epoch = s.record.as_ref().map_or(0, |r| r.epoch);
            route.endpoint = match (&s.record, serving) {
                (Some(r), true) => r.endpoint.clone().unwrap_or_default(),
                _ => String::new(),
            };
        }
        drop(table);
        self.version.send_modify(|v| *v += 1);
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

impl Routes for Arc<ClusterRoutes> {
    fn route(&self, shard: u32) -> Route {
        self.table
            .read()
            .get(shard as usize)
            .cloned()
            .unwrap_or(Route {
                shard,
                endpoint: String::new(),
                epoch: 0,
            })
    }

    fn own_endpoint(&self) -> String {
        self.own.clone()
    }
}
