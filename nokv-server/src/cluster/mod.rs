//! Cluster mode at run time: which shards this node serves, how it takes them and how it hands
//! them off. The etcd side (leases, fenced ownership records) is [`crate::control::etcd`];
//! this module moves the *data* accordingly and keeps the node's routes current.
//!
//! One concept a file: **taking a shard** (`load.rs`: where its data comes from is
//! `source.rs`), **handing one off** (`handoff.rs`: balance steps, `nokv admin shard move`,
//! graceful exit), the **routes** other nodes' requests are forwarded by (`routes.rs`), and
//! provider-log **compaction** (`compaction.rs`). This file holds the runtime itself: the
//! balance loop, lease loss and the watch on etcd.
//!
//! **Lease loss**: when the acknowledge deadline passes, every shard is dropped at once (the
//! fence already refuses their sessions) and the node rejoins with a new lease
//! ([`EtcdControl::rejoin`]: the old membership is abandoned first — no more acknowledgements
//! under it, no more keep-alives, its lease revoked — so an etcd outage ends with the node
//! taking its id over from its own old lease rather than waiting for it); shards come back
//! through the balance step like any other.
//!
//! Nothing here is on the per-request path: requests read the node's slots and routes only.
//!
//! **Layering**: the runtime owns the node ([`Node`]) and drives it; the node never names this
//! type. What the node asks of the runtime (the cluster view and shard moves, for the admin
//! service) goes through the narrow [`Coordinator`] trait implemented here, so the imports
//! point one way: cluster → node.

mod compaction;
mod handoff;
mod load;
mod routes;
mod source;

pub use routes::ClusterRoutes;
pub use source::Source;

use handoff::{IfCheckpointRefused, next_surplus_pause};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::{Notify, watch};

use crate::config::Durability;
use crate::control::etcd::{ClusterView, EtcdControl, EtcdSettings};
use crate::error::Result;
use crate::node::{Coordinator, Node};
use crate::provider_log::StreamId;
use compaction::ShardLog;

/// The cluster runtime of one node.
pub struct Cluster {
    node: Arc<Node>,
    settings: EtcdSettings,
    control: RwLock<Arc<EtcdControl>>,
    routes: Arc<ClusterRoutes>,
    /// Wakes the balance loop early (a change under the cluster prefix).
    kick: Notify,
    /// Serialises handoffs and loads of this node (they are rare; one at a time keeps the
    /// reasoning simple).
    moving: tokio::sync::Mutex<()>,
    /// Shards an operator moved here (`nokv admin shard move`): rebalancing hands off others
    /// first, so a move is not undone by the next balance step.
    pinned: parking_lot::Mutex<std::collections::HashSet<u32>>,
    /// `--metadata-durability` and its cadences.
    durability: Durability,
    /// After a surplus handoff was given up (its checkpoint refused): the balance step hands
    /// nothing off before this instant; the pause doubles with each give-up in a row (up to
    /// [`handoff::SURPLUS_PAUSE_MAX`]) and ends with the next handoff that releases. A provider that
    /// refuses every checkpoint costs one export and one PUT per pause, not per balance step.
    surplus_pause: parking_lot::Mutex<(Instant, Duration)>,
    /// Shards served again after a given-up handoff whose record still says `draining` (etcd
    /// did not answer): each balance step marks them serving again.
    unmarked: parking_lot::Mutex<std::collections::HashSet<u32>>,
    /// Provider durability: the shards whose records name this node's current log stream
    /// (see [`compaction`]).
    logs: parking_lot::Mutex<HashMap<u32, ShardLog>>,
}

/// What the node asks of its runtime (the admin service's cluster view and shard moves): the
/// node knows only this trait, never [`Cluster`], so the imports point one way (cluster → node).
#[async_trait::async_trait]
impl Coordinator for Cluster {
    async fn view(&self) -> Result<ClusterView> {
        Cluster::view(self).await
    }

    async fn move_shard(&self, shard: u32, to: &str) -> Result<u64> {
        Cluster::move_shard(self, shard, to).await
    }
}

impl Cluster {
    /// Joins etcd (creating or checking the cluster record) and builds the runtime around
    /// `node`; nothing is served until [`Cluster::run`] takes shards.
    pub fn new(
        node: Arc<Node>,
        settings: EtcdSettings,
        control: Arc<EtcdControl>,
        routes: Arc<ClusterRoutes>,
        durability: Durability,
    ) -> Arc<Cluster> {
        let cluster = Arc::new(Cluster {
            node,
            settings,
            control: RwLock::new(control),
            routes,
            kick: Notify::new(),
            moving: tokio::sync::Mutex::new(()),
            pinned: Default::default(),
            surplus_pause: parking_lot::Mutex::new((Instant::now(), Duration::ZERO)),
            unmarked: Default::default(),
            durability,
            logs: Default::default(),
        });
        let coordinator: Arc<dyn Coordinator> = cluster.clone();
        cluster.node.attach_coordinator(&coordinator);
        cluster.begin_stream();
        cluster
    }

    /// Provider durability: the node's log goes to a new stream for each membership (its
    /// incarnation is the lease id, new at every join), so a stream fenced under an old
    /// membership is never written again.
    fn begin_stream(&self) {
        if let Some(replica) = self.node.committer().replica() {
            let control = self.control();
            replica.begin(StreamId {
                node: control.node_id().to_string(),
                incarnation: control.lease_id() as u64,
            });
        }
    }

    fn control(&self) -> Arc<EtcdControl> {
        self.control.read().clone()
    }

    /// The cluster as etcd holds it now.
    pub async fn view(&self) -> Result<ClusterView> {
        Ok(self.control().cluster_view().await?)
    }

    /// Balances until `stop` flips: on every change under the cluster prefix and at least
    /// every third of the lease TTL. Keeps the routes current, drops everything at once if the
    /// lease lapses, then rejoins.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        tokio::spawn(self.clone().watch_changes(stop.clone()));
        tokio::spawn(self.clone().compact_loop(stop.clone()));
        let period = self.settings.node_ttl / 3;
        let mut fenced = self.node.committer().replica().map(|r| r.fenced());
        loop {
            // A stop seen inside `lease_lost` was consumed there.
            if *stop.borrow() {
                return;
            }
            let control = self.control();
            let deposed = async {
                match fenced.as_mut() {
                    Some(f) => {
                        let _ = f.changed().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // A lapsed lease wins over everything: nothing may be served past it.
                biased;
                _ = stop.changed() => return,
                _ = control.deadline().passed() => {
                    self.lease_lost(&mut stop).await;
                    continue;
                }
                // Another node fenced this node's log stream: it took a shard over, so this
                // node may have been presumed dead. It acknowledges nothing more on that
                // stream; it drops everything and rejoins under a new incarnation.
                () = deposed => {
                    tracing::error!("the provider log stream was fenced by another node: deposed");
                    self.lease_lost(&mut stop).await;
                    continue;
                }
                _ = self.kick.notified() => {}
                _ = tokio::time::sleep(period) => {}
            }
            // A step still waiting on etcd when the lease lapses (a partition makes calls hang,
            // not fail) is dropped there, as a crash would drop it: this node owns nothing from
            // then on, and the loop goes on to the lease-loss path. Otherwise the step would hold
            // `moving`, which the graceful exit needs, and this task, which the server waits for.
            // A step that finishes in time is never cut short, not even by a stop.
            let step = tokio::select! {
                step = self.balance_once() => step,
                _ = control.deadline().passed() => continue,
            };
            if let Err(e) = step {
                tracing::warn!(error = %e, "balance step failed; will retry");
            }
        }
    }

    /// One balance step and the data moves it calls for.
    async fn balance_once(&self) -> Result<()> {
        let _one = self.moving.lock().await;
        let control = self.control();
        if !control.deadline().allows() {
            return Ok(());
        }
        let unmarked: Vec<u32> = self.unmarked.lock().drain().collect();
        for shard in unmarked {
            self.mark_serving(&control, shard).await;
        }
        let report = control.balance_step().await?;
        // Everything owned but not loaded: just acquired, or a load that failed earlier.
        for (shard, epoch) in control.owned() {
            if self.node.held().contains(&shard) {
                continue;
            }
            if let Err(e) = self.load(&control, shard, epoch).await {
                tracing::error!(shard, epoch, error = %e, "cannot load an acquired shard; will retry");
            }
        }
        let pinned = self.pinned.lock().clone();
        let mut unpinned = self.node.held().into_iter().filter(|s| !pinned.contains(s));
        if report.surplus > 0
            && Instant::now() >= self.surplus_pause.lock().0
            && let Some(shard) = unpinned.next_back()
        {
            tracing::info!(shard, target = report.target, "handing off a surplus shard");
            self.hand_off(&control, shard, None, IfCheckpointRefused::KeepServing)
                .await?;
            let mut pause = self.surplus_pause.lock();
            if self.node.held().contains(&shard) {
                let next = next_surplus_pause(pause.1, self.settings.node_ttl / 3);
                *pause = (Instant::now() + next, next);
            } else {
                *pause = (Instant::now(), Duration::ZERO);
            }
        }
        Ok(())
    }

    /// The lease lapsed: drop every shard at once (their sessions are already fenced), then
    /// rejoin with a fresh lease. Each attempt abandons the old membership first (see
    /// [`EtcdControl::rejoin`]): its keep-alive must not renew the old lease once etcd is
    /// back, or the old lease would hold this node's id and shards against the new one.
    ///
    /// Gives up rejoining when `stop` flips: a node asked to stop while etcd is unreachable
    /// holds nothing, so there is nothing to hand off, and it must not retry forever instead
    /// of exiting.
    async fn lease_lost(&self, stop: &mut watch::Receiver<bool>) {
        let dropped: Vec<u32> = self.node.held();
        for shard in &dropped {
            self.node.remove(*shard);
        }
        // The next membership writes a new stream; the old one is the sweep's.
        self.logs.lock().clear();
        self.unmarked.lock().clear();
        tracing::error!(
            ?dropped,
            "lease lapsed: serving nothing; rejoining the cluster"
        );
        let old = self.control();
        while !*stop.borrow() {
            let attempt = tokio::select! {
                _ = stop.changed() => break,
                attempt = old.rejoin() => attempt,
            };
            match attempt {
                Ok((control, _)) => {
                    *self.control.write() = control;
                    self.begin_stream();
                    tracing::info!("rejoined the cluster with a new lease");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rejoining failed; retrying");
                    tokio::select! {
                        _ = stop.changed() => break,
                        _ = tokio::time::sleep(self.settings.node_ttl / 3) => {}
                    }
                }
            }
        }
        tracing::info!("stopping: no longer rejoining the cluster");
    }

    /// Keeps the routes current from etcd and kicks the balance loop on every change.
    async fn watch_changes(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            let control = self.control();
            let stream = control.changes().await;
            if let Ok(view) = control.cluster_view().await {
                self.routes.update(&view);
                self.kick.notify_one();
            }
            let mut stream = match stream {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the cluster; retrying");
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                tokio::select! {
                    _ = stop.changed() => return,
                    message = stream.message() => match message {
                        Ok(Some(_)) => {
                            match control.cluster_view().await {
                                Ok(view) => self.routes.update(&view),
                                Err(e) => tracing::warn!(error = %e, "cannot read the cluster"),
                            }
                            self.kick.notify_one();
                        }
                        _ => break,
                    }
                }
            }
        }
    }
}
