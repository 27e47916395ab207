//! Cluster mode at run time: which shards this node serves, how it takes them and how it hands
//! them off. The etcd side (leases, fenced ownership records) is [`crate::control::etcd`];
//! this module moves the *data* accordingly and keeps the node's routes current.
//!
//! **Taking a shard** ([`Cluster::load`]): the balance step acquired it in etcd at epoch `e`.
//! Where its data comes from depends on the record the acquisition replaced ([`Source`]):
//! nothing (a new shard), a checkpoint (a graceful handoff, or an owner that lapsed without
//! changing anything since its checkpoint), or this node's own file (it owned the shard last
//! and comes back with its data dir). A checkpoint is verified (size, sha256, and the epoch
//! stored inside it); a local file must hold the epoch the record says it was served at. Then
//! the store records epoch `e` ([`crate::shard::Shard::adopt_epoch`]) and the node serves.
//!
//! **Handing a shard off** ([`Cluster::hand_off`]): the record is marked `draining`, the slot
//! turns new requests away (hint or retry), requests holding the shard finish (bounded wait),
//! the shard stops acknowledging (fail closed), a checkpoint of its store is uploaded under a
//! unique key, and one transaction guarded by this node's owner key records it and deletes the
//! owner key. If the checkpoint cannot be taken, a balance step or a move gives up: the
//! shard is served again at the same epoch (nothing left the node: its owner key still
//! excludes everyone else) and the handoff is tried again later. Only a node that is leaving
//! releases without one: with local durability the shard then waits for this node to take it
//! back (its data is on this disk only); with provider durability the record still names this
//! node's log, and whoever takes the shard loads the older base plus that log, fencing the
//! stream (see [`crate::takeover`]).
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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::{Notify, watch};

use crate::config::Durability;
use crate::control::etcd::{
    CheckpointRef, ClusterView, EtcdControl, EtcdSettings, LogRef, ShardRecord, ShardState,
};
use crate::control::{ControlError, Epoch, Ownership};
use crate::error::{Error, Result};
use crate::meta::{MetaStore, Tables};
use crate::node::{Coordinator, Node};
use crate::provider_log::StreamId;
use crate::route::{Route, Routes};
use crate::shard::Shard;
use crate::shard::checkpoint::{self, Checkpoint};
use crate::shard::fence::Fence;
use compaction::ShardLog;

/// How long a handoff waits for requests holding the shard before it fences them out.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// The longest pause of the balance step's handoffs after given-up ones (see
/// [`Cluster::surplus_pause`]).
const SURPLUS_PAUSE_MAX: Duration = Duration::from_secs(64);

/// What a handoff does when its checkpoint cannot be taken (the provider refused it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IfCheckpointRefused {
    /// Serve the shard again at the same epoch and try later (a balance step, a move). A
    /// release without a checkpoint would leave the shard unserved until a node restores it
    /// from older state: with local durability only this node can (its data is on this disk
    /// only); with provider durability any node may, by fencing this node's log stream, which
    /// deposes this node from every shard it serves — a refused PUT would cost all of them.
    KeepServing,
    /// Release anyway (the node is leaving): the record says where the data is (see the
    /// module doc).
    Release,
}

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
    /// [`SURPLUS_PAUSE_MAX`]) and ends with the next handoff that releases. A provider that
    /// refuses every checkpoint costs one export and one PUT per pause, not per balance step.
    surplus_pause: parking_lot::Mutex<(Instant, Duration)>,
    /// Shards served again after a given-up handoff whose record still says `draining` (etcd
    /// did not answer): each balance step marks them serving again.
    unmarked: parking_lot::Mutex<std::collections::HashSet<u32>>,
    /// Provider durability: the shards whose records name this node's current log stream
    /// (see [`compaction`]).
    logs: parking_lot::Mutex<HashMap<u32, ShardLog>>,
}

/// Where a newly acquired shard's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No record: a new shard (an existing local file from an earlier life is kept if its
    /// epoch is 0).
    New,
    /// The checkpoint the record points at: it holds everything acknowledged.
    Checkpoint(CheckpointRef),
    /// This node's own file, which must hold epoch `epoch` (`exact`) or at most `epoch`.
    Local { epoch: Epoch, exact: bool },
    /// The provider: the checkpoint (none: empty) plus the previous owner's log for the shard,
    /// read up to the fence the taker puts on it (see [`crate::takeover`]). The log's
    /// segments must name the shard at an epoch from `log.epoch` (the one it was recorded
    /// at) to the one being taken.
    Provider {
        checkpoint: Option<CheckpointRef>,
        log: LogRef,
    },
}

impl Source {
    /// Decides from the record the acquisition replaced (see the module doc and
    /// `control::etcd::balance::takeable`, which admits exactly these cases).
    pub fn of(previous: Option<&ShardRecord>) -> Source {
        let Some(r) = previous else {
            return Source::New;
        };
        // A record that names a log is checkpoint + log whatever its state: a release with a
        // new checkpoint clears the log, so a handoff that still names one is a release whose
        // checkpoint failed, and its checkpoint is an older base the log goes on from.
        if let Some(log) = &r.log {
            let mut log = log.clone();
            if log.epoch == 0 {
                // Recorded before logs kept their epoch.
                log.epoch = r.epoch;
            }
            return Source::Provider {
                checkpoint: r.checkpoint.clone(),
                log,
            };
        }
        match (&r.state, &r.checkpoint) {
            (ShardState::Handoff, Some(c)) => Source::Checkpoint(c.clone()),
            (ShardState::Serving | ShardState::Draining, Some(c))
                if !r.changed && (c.epoch + 1 == r.epoch || c.epoch == r.epoch) =>
            {
                Source::Checkpoint(c.clone())
            }
            _ => Source::Local {
                epoch: r.epoch,
                exact: r.changed,
            },
        }
    }
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
                    self.lease_lost().await;
                    continue;
                }
                // Another node fenced this node's log stream: it took a shard over, so this
                // node may have been presumed dead. It acknowledges nothing more on that
                // stream; it drops everything and rejoins under a new incarnation.
                () = deposed => {
                    tracing::error!("the provider log stream was fenced by another node: deposed");
                    self.lease_lost().await;
                    continue;
                }
                _ = self.kick.notified() => {}
                _ = tokio::time::sleep(period) => {}
            }
            if let Err(e) = self.balance_once().await {
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

    /// Loads shard `shard`, acquired at `epoch`, and serves it (see the module doc).
    async fn load(&self, control: &Arc<EtcdControl>, shard: u32, epoch: Epoch) -> Result<()> {
        let started = Instant::now();
        // Peeked, not taken: a load that fails (a provider or etcd error) is retried by the
        // next balance step and must see the same record, not the one that already names
        // this node's epoch (its log would be checked against the wrong epoch).
        let previous = match control.previous(shard) {
            Some(previous) => previous,
            // Adopted without an acquisition of this process: only its own record is known,
            // so accept the local file if it is not newer than the record.
            None => control.record(shard).await?.0.map(|mut r| {
                r.changed = false;
                r.checkpoint = None;
                r
            }),
        };
        let source = Source::of(previous.as_ref());
        if previous.as_ref().and_then(|r| r.target.as_deref()) == Some(control.node_id()) {
            self.pinned.lock().insert(shard);
        } else {
            self.pinned.lock().remove(&shard);
        }
        let committer = self.node.committer().clone();
        let replica = committer.replica();
        let ns = Tables::shard(shard);
        match &source {
            Source::New => {
                if committer.holds(ns)? {
                    let stored = committer.read(ns, |r| Ok(r.epoch()?))?;
                    if stored != 0 {
                        return Err(Error::FailedPrecondition(format!(
                            "the node file holds shard {shard} at epoch {stored} of an earlier \
                             ownership, but the cluster has no record of this shard: this data \
                             dir belongs to another cluster; move it away"
                        )));
                    }
                }
                committer.exclusive(move |m| Ok(m.prepare(ns)?)).await?;
            }
            Source::Checkpoint(c) => {
                let scratch = self.node.scratch_path(shard);
                checkpoint::restore(&self.node.provider, &to_checkpoint(c), &scratch).await?;
                let imported = match verify_epoch(&scratch, c, shard) {
                    Ok(()) => {
                        let from = scratch.clone();
                        committer.exclusive(move |m| Ok(m.import(ns, &from)?)).await
                    }
                    Err(e) => Err(e),
                };
                let _ = std::fs::remove_file(&scratch);
                imported?;
            }
            Source::Local {
                epoch: expected,
                exact,
            } => {
                if !committer.holds(ns)? {
                    return Err(Error::FailedPrecondition(format!(
                        "shard {shard} was last served here at epoch {expected}, but the node \
                         file holds no tables for it: this is not the data dir it was served from"
                    )));
                }
                let stored = committer.read(ns, |r| Ok(r.epoch()?))?;
                if stored > *expected || (*exact && stored != *expected) {
                    return Err(Error::FailedPrecondition(format!(
                        "the local data of shard {shard} holds epoch {stored} but the shard was \
                         last served at epoch {expected}: it is not this shard's latest data"
                    )));
                }
            }
            Source::Provider { checkpoint, log } => {
                let own = replica.and_then(|r| r.stream()).map(|s| s.name());
                let replay = crate::takeover::read_log(
                    &self.node.provider,
                    &log.stream,
                    log.from_seq,
                    (control.node_id(), shard, epoch),
                    log.epoch,
                    own.as_deref() != Some(log.stream.as_str()),
                )
                .await?;
                let scratch = self.node.scratch_path(shard);
                let restored = async {
                    let base = match checkpoint {
                        Some(c) => {
                            checkpoint::restore(&self.node.provider, &to_checkpoint(c), &scratch)
                                .await?;
                            verify_epoch(&scratch, c, shard)?;
                            Some(scratch.clone())
                        }
                        None => None,
                    };
                    let records = replay.records;
                    committer
                        .exclusive(move |m| {
                            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                            Ok(m.restore(ns, base.as_deref(), &refs)?)
                        })
                        .await
                }
                .await;
                let _ = std::fs::remove_file(&scratch);
                restored?;
                tracing::info!(
                    shard,
                    stream = %log.stream,
                    from_seq = log.from_seq,
                    fenced_at = replay.end,
                    segments = replay.segments,
                    "replayed the previous owner's provider log"
                );
            }
        };
        if let Some(r) = replica {
            r.hold(shard, epoch);
        }
        let fence = Fence::new(shard, Ownership::Etcd(control.clone()));
        let opened = self.node.open_shard(shard, fence);
        opened.adopt_epoch().await?;
        self.record_state(control, &opened, shard, epoch, &source, previous.as_ref())
            .await?;
        self.node.install(shard, opened);
        control.take_previous(shard);
        tracing::info!(
            shard,
            epoch,
            ?source,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "serving shard"
        );
        Ok(())
    }

    /// Records in etcd what the shard's durable state is before it is served (see
    /// [`EtcdControl::record_state`]): with provider durability its log from here on, on top
    /// of a checkpoint the provider holds — the one it was loaded from, or, when it was loaded
    /// from a log or from the local file, a new one of the state just loaded (see
    /// [`crate::takeover`] for why). With local durability only a shard restored from a log
    /// needs that new checkpoint (its record must stop naming the old log).
    async fn record_state(
        &self,
        control: &Arc<EtcdControl>,
        opened: &Arc<Shard>,
        shard: u32,
        epoch: Epoch,
        source: &Source,
        previous: Option<&ShardRecord>,
    ) -> Result<()> {
        let replica = self.node.committer().replica();
        let needs_base = match source {
            Source::Provider { .. } => true,
            Source::Local { .. } => replica.is_some(),
            Source::New | Source::Checkpoint(_) => false,
        };
        if !needs_base && replica.is_none() {
            return Ok(());
        }
        let base = if needs_base {
            Some(self.take_checkpoint(opened, shard, epoch).await?)
        } else {
            None
        };
        let log = match replica {
            Some(r) => Some(LogRef {
                stream: r
                    .stream()
                    .ok_or_else(|| Error::Unavailable("the provider log has no stream yet".into()))?
                    .name(),
                from_seq: self.node.committer().next_seq(),
                epoch,
            }),
            None => None,
        };
        control
            .record_state(shard, base.clone(), log.clone())
            .await?;
        if let Some(log) = log {
            // What was sent for the shard so far (its epoch's adoption, acknowledged before
            // this) lies below `from_seq`: the log proper starts empty.
            if let Some(r) = replica {
                r.checkpointed(shard, u64::MAX);
            }
            let base = base
                .clone()
                .or_else(|| previous.and_then(|r| r.checkpoint.clone()));
            self.logs.lock().insert(
                shard,
                ShardLog {
                    from_seq: log.from_seq,
                    base,
                    since: Instant::now(),
                    held: true,
                },
            );
        }
        if base.is_some()
            && let Some(old) = previous.and_then(|r| r.checkpoint.as_ref())
            && let Err(e) = checkpoint::discard(&self.node.provider, &old.key).await
        {
            tracing::warn!(shard, error = %e, "could not delete the superseded checkpoint");
        }
        Ok(())
    }

    /// Hands `shard` off (see the module doc); `target` addresses the handoff to one node.
    /// Returns the recorded checkpoint, if one could be taken; without one, `if_refused` says
    /// whether the shard was released anyway or kept.
    async fn hand_off(
        &self,
        control: &Arc<EtcdControl>,
        shard: u32,
        target: Option<String>,
        if_refused: IfCheckpointRefused,
    ) -> Result<Option<CheckpointRef>> {
        let started = Instant::now();
        let epoch = control
            .owned()
            .into_iter()
            .find(|(s, _)| *s == shard)
            .map(|(_, e)| e)
            .ok_or(ControlError::NotOwner { shard })?;
        if let Err(e) = control.mark_draining(shard).await {
            tracing::warn!(shard, error = %e, "could not mark the shard draining; releasing anyway");
        }
        let previous = control.record(shard).await.ok().and_then(|(r, _)| r);
        let held = self.node.begin_drain(shard);
        if let Some(held) = &held {
            wait_for_requests(held).await;
        }
        control.stop_acknowledging(shard);
        let checkpoint = match &held {
            Some(held) => match self.take_checkpoint(held, shard, epoch).await {
                Ok(c) => Some(c),
                Err(e) if if_refused == IfCheckpointRefused::KeepServing => {
                    tracing::warn!(shard, error = %e, "checkpoint failed; the shard stays with this node (the handoff is retried later)");
                    self.keep_serving(control, shard, held.clone()).await;
                    return Ok(None);
                }
                Err(e) => {
                    tracing::error!(shard, error = %e, "checkpoint failed; releasing without one");
                    None
                }
            },
            None => None,
        };
        self.node.remove(shard);
        if let Some(r) = self.node.committer().replica() {
            r.release(shard);
        }
        // Released with a checkpoint, the record no longer names this node's log; without
        // one it still does, and the segments stay.
        if checkpoint.is_some() {
            self.logs.lock().remove(&shard);
        } else if let Some(l) = self.logs.lock().get_mut(&shard) {
            l.held = false;
        }
        drop(held);
        let released = control
            .release(
                shard,
                checkpoint.clone(),
                target.filter(|_| checkpoint.is_some()),
            )
            .await?;
        if released
            && checkpoint.is_some()
            && let Some(old) = previous.and_then(|r| r.checkpoint)
        {
            // A failed delete leaves a superseded checkpoint behind: counted by the audit
            // (`checkpoints`), never mistaken for live data.
            if let Err(e) = checkpoint::discard(&self.node.provider, &old.key).await {
                tracing::warn!(shard, error = %e, "could not delete the superseded checkpoint");
            }
        }
        tracing::info!(
            shard,
            epoch,
            released,
            checkpoint_bytes = checkpoint.as_ref().map_or(0, |c| c.size),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "handed off shard"
        );
        Ok(checkpoint)
    }

    /// Ends a handoff that released nothing: the shard is served again at the same epoch, or
    /// forgotten if its ownership was lost meanwhile.
    async fn keep_serving(&self, control: &Arc<EtcdControl>, shard: u32, held: Arc<Shard>) {
        self.mark_serving(control, shard).await;
        if control.resume_acknowledging(shard) {
            self.node.install(shard, held);
        } else {
            tracing::warn!(
                shard,
                "the shard's ownership ended during the handoff; dropping it"
            );
            self.node.remove(shard);
        }
    }

    /// Records that a shard whose handoff was given up is served again. Until etcd has it the
    /// other nodes route the shard as moving, so a failure is retried by every balance step
    /// ([`Cluster::unmarked`]); an ownership found gone is the lease-loss path's to drop.
    async fn mark_serving(&self, control: &Arc<EtcdControl>, shard: u32) {
        match control.mark_serving(shard).await {
            Ok(()) | Err(ControlError::NotOwner { .. }) => {}
            Err(e) => {
                tracing::warn!(shard, error = %e, "could not mark the shard serving again; retrying at the next balance step");
                self.unmarked.lock().insert(shard);
            }
        }
    }

    async fn take_checkpoint(
        &self,
        held: &Arc<Shard>,
        shard: u32,
        epoch: Epoch,
    ) -> Result<CheckpointRef> {
        Ok(self.take_checkpoint_covering(held, shard, epoch).await?.0)
    }

    /// [`Cluster::take_checkpoint`] and the sequence number it covers the node's log below
    /// (see [`crate::shard::gate::Gate::snapshot_covering`]).
    async fn take_checkpoint_covering(
        &self,
        held: &Arc<Shard>,
        shard: u32,
        epoch: Epoch,
    ) -> Result<(CheckpointRef, u64)> {
        let scratch = self.node.scratch_path(shard);
        let c = checkpoint::take(held, &self.node.provider, epoch, &scratch).await?;
        let covers = c.covers;
        Ok((
            CheckpointRef {
                key: c.key,
                sha256: c.sha256,
                size: c.size,
                epoch,
                created_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            },
            covers,
        ))
    }

    /// `nokv admin shard move S NODE`: hands `shard` to node `to` and answers once the routes
    /// name `to` as its owner, with its epoch. `to` may still be opening the checkpoint then:
    /// its first answers for the shard can be a retryable `Unavailable`.
    pub async fn move_shard(&self, shard: u32, to: &str) -> Result<u64> {
        if shard >= self.node.shard_count() {
            return Err(Error::InvalidArgument(format!(
                "shard {shard} does not exist (the cluster has {} shards)",
                self.node.shard_count()
            )));
        }
        let view = self.view().await?;
        if !view.nodes.iter().any(|(id, _)| id == to) {
            return Err(Error::InvalidArgument(format!(
                "node {to:?} is not a live member of cluster {:?}",
                self.settings.cluster
            )));
        }
        let control = self.control();
        if to != control.node_id() {
            let endpoint = &view
                .nodes
                .iter()
                .find(|(id, _)| id == to)
                .expect("listed")
                .1
                .endpoint;
            if let Err(why) = crate::peer_probe::reachable(endpoint).await {
                return Err(Error::FailedPrecondition(format!(
                    "node {to:?} is down: {why}; it is still listed until its lease lapses \
                     (within {:?}); shard {shard} was not moved",
                    self.settings.node_ttl
                )));
            }
        }
        if !self.node.held().contains(&shard) {
            owner_alive(&view, shard).await?;
            // Not ours: `NotOwner` points the caller at the owner (the CLI follows the hint),
            // or `Unavailable` while the shard is between owners.
            self.node.shard(shard)?;
        }
        if to == control.node_id() {
            // Already here (e.g. a retried move whose answer was lost).
            return Ok(control.holding(shard).map(|(e, _)| e).unwrap_or(0));
        }
        let mut version = self.routes.subscribe();
        {
            let _one = self.moving.lock().await;
            let checkpoint = self
                .hand_off(
                    &control,
                    shard,
                    Some(to.to_string()),
                    IfCheckpointRefused::KeepServing,
                )
                .await?;
            if checkpoint.is_none() {
                return Err(Error::Unavailable(format!(
                    "shard {shard} could not be checkpointed; it stays with this node, retry"
                )));
            }
        }
        // Answer once the target owns it (its endpoint in the routes at a higher epoch).
        let target_endpoint = view
            .nodes
            .iter()
            .find(|(id, _)| id == to)
            .map(|(_, n)| n.endpoint.clone())
            .unwrap_or_default();
        let wait = async {
            loop {
                let route = self.routes.route(shard);
                if route.endpoint == target_endpoint {
                    return route.epoch;
                }
                if version.changed().await.is_err() {
                    return 0;
                }
            }
        };
        tokio::time::timeout(DRAIN_WAIT * 3, wait).await.map_err(|_| {
            Error::Unavailable(format!(
                "shard {shard} was handed off but {to} has not taken it yet; check `nokv admin cluster`"
            ))
        })
    }

    /// Graceful shutdown: withdraw the node's registration, hand off every shard (in
    /// parallel), then leave (revoke the lease).
    pub async fn shutdown(&self) {
        let control = self.control();
        if let Err(e) = control.withdraw().await {
            tracing::warn!(error = %e, "could not withdraw the node registration");
        }
        let _one = self.moving.lock().await;
        let shards = self.node.held();
        tracing::info!(?shards, "handing off every shard before exiting");
        let handoffs = shards
            .iter()
            .map(|s| self.hand_off(&control, *s, None, IfCheckpointRefused::Release));
        for (shard, outcome) in shards.iter().zip(futures::future::join_all(handoffs).await) {
            if let Err(e) = outcome {
                tracing::error!(shard, error = %e, "handoff failed; the shard waits for this node");
            }
        }
        if let Err(e) = control.leave().await {
            tracing::warn!(error = %e, "could not revoke the lease; it expires by itself");
        }
    }

    /// The lease lapsed: drop every shard at once (their sessions are already fenced), then
    /// rejoin with a fresh lease. Each attempt abandons the old membership first (see
    /// [`EtcdControl::rejoin`]): its keep-alive must not renew the old lease once etcd is
    /// back, or the old lease would hold this node's id and shards against the new one.
    async fn lease_lost(&self) {
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
        loop {
            match old.rejoin().await {
                Ok((control, _)) => {
                    *self.control.write() = control;
                    self.begin_stream();
                    tracing::info!("rejoined the cluster with a new lease");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rejoining failed; retrying");
                    tokio::time::sleep(self.settings.node_ttl / 3).await;
                }
            }
        }
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

/// Waits (bounded by [`DRAIN_WAIT`]) until no request holds `shard` any more: the slot no
/// longer hands it out, so the count of holders only falls. Requests still holding it after
/// the wait are fenced out by the caller.
async fn wait_for_requests(shard: &Arc<Shard>) {
    let deadline = Instant::now() + DRAIN_WAIT;
    // Holders: the caller's clone and the slot's (until removed). Polling is fine here: this
    // is a rare operator path, never a request path.
    while Arc::strong_count(shard) > 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The pause after one more given-up surplus handoff, the last pause having been `last`:
/// twice as long, at least one balance period, at most [`SURPLUS_PAUSE_MAX`] (or one period,
/// if that is longer).
fn next_surplus_pause(last: Duration, period: Duration) -> Duration {
    (last * 2).max(period).min(SURPLUS_PAUSE_MAX.max(period))
}

/// Refuses a restored checkpoint file whose stored epoch is not the one its record names.
fn verify_epoch(scratch: &std::path::Path, c: &CheckpointRef, shard: u32) -> Result<()> {
    let stored = MetaStore::open_plain(scratch)
        .and_then(|m| m.read(|r| r.epoch()))
        .map_err(Error::from)?;
    if stored != c.epoch {
        return Err(Error::DataCorrupted(format!(
            "checkpoint {} of shard {shard} holds epoch {stored}, its record says {}; refusing it",
            c.key, c.epoch
        )));
    }
    Ok(())
}

fn to_checkpoint(c: &CheckpointRef) -> Checkpoint {
    Checkpoint {
        key: c.key.clone(),
        sha256: c.sha256.clone(),
        size: c.size,
        covers: 0,
    }
}

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

    fn subscribe(&self) -> watch::Receiver<u64> {
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

/// `Ok` unless shard `shard` of `view` belongs to a node that is down; then why, and what
/// becomes of the shard, for an operator who asked to move it.
///
/// A dead owner's shards are not movable: their latest acknowledged writes exist only in its
/// data dir, so they wait for it to restart (a shard it never changed since its checkpoint is
/// taken from that checkpoint by another node, without anyone moving it).
async fn owner_alive(view: &ClusterView, shard: u32) -> Result<()> {
    let Some(sv) = view.shards.get(shard as usize) else {
        return Ok(());
    };
    let waits = "its latest acknowledged writes exist only in that node's data dir, so the \
                 shard waits for it to restart and take the shard back (a shard it never \
                 changed since its last checkpoint is taken over by another node by itself)";
    let (owner, why) = match &sv.owner {
        Some(key) => {
            let endpoint = view
                .nodes
                .iter()
                .find(|(id, _)| *id == key.node)
                .map(|(_, n)| n.endpoint.clone())
                .or_else(|| sv.record.as_ref().and_then(|r| r.endpoint.clone()));
            let Some(endpoint) = endpoint else {
                return Ok(());
            };
            match crate::peer_probe::reachable(&endpoint).await {
                Ok(()) => return Ok(()),
                Err(why) => (key.node.clone(), why),
            }
        }
        None => match sv.record.as_ref().and_then(|r| r.owner.clone()) {
            Some(owner) if !view.nodes.iter().any(|(id, _)| *id == owner) => {
                (owner, "its lease has lapsed".to_string())
            }
            _ => return Ok(()),
        },
    };
    Err(Error::FailedPrecondition(format!(
        "shard {shard} cannot be moved: its owner {owner:?} is down ({why}); {waits}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: ShardState, epoch: Epoch, changed: bool, ckpt: Option<Epoch>) -> ShardRecord {
        ShardRecord {
            epoch,
            state,
            owner: Some("a".into()),
            endpoint: Some("https://a:1".into()),
            checkpoint: ckpt.map(|epoch| CheckpointRef {
                key: format!("p/meta/1/ckpt/{epoch}-x"),
                sha256: "00".into(),
                size: 1,
                epoch,
                created_unix_ms: 0,
            }),
            changed,
            target: None,
            log: None,
        }
    }

    #[test]
    fn a_lapsed_owner_whose_log_is_in_the_provider_is_loaded_from_checkpoint_and_log() {
        let mut r = record(ShardState::Serving, 5, true, Some(4));
        r.log = Some(LogRef {
            stream: "a.0000000000000007".into(),
            from_seq: 90,
            epoch: 5,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { checkpoint: Some(c), log } if c.epoch == 4 && log.from_seq == 90 && log.epoch == 5
        ));
        // Also when it released without a checkpoint: the log still holds what it wrote.
        r.state = ShardState::Handoff;
        r.checkpoint = None;
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider {
                checkpoint: None,
                ..
            }
        ));
    }

    /// Found by the provider chaos schedule (seed 2004): an owner that had loaded the shard
    /// from a log (so its record held a base checkpoint of its own epoch) released it while
    /// the provider refused the handoff checkpoint; the next owner loaded the base alone and
    /// every write in the log after it was gone.
    #[test]
    fn a_handoff_whose_checkpoint_failed_is_loaded_from_the_older_base_and_the_log() {
        let mut r = record(ShardState::Handoff, 2, true, Some(2));
        r.log = Some(LogRef {
            stream: "b.0000000000000009".into(),
            from_seq: 40,
            epoch: 2,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { checkpoint: Some(c), log } if c.epoch == 2 && log.from_seq == 40
        ));
    }

    /// Found by the provider chaos schedule (seed 9108): an acquisition carries the record's
    /// log over, so a record can be of a later epoch than its log — the owner took back a
    /// shard it had released without a checkpoint and died before its load recorded a log
    /// of its own. The log's segments are of the epoch it was recorded at, which the taker
    /// must read from the log, not from the record.
    #[test]
    fn a_log_carried_over_by_an_acquisition_keeps_the_epoch_it_was_recorded_at() {
        let mut r = record(ShardState::Serving, 4, false, None);
        r.log = Some(LogRef {
            stream: "b.0000000000000009".into(),
            from_seq: 9,
            epoch: 3,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { log, .. } if log.epoch == 3
        ));
        // A record written before logs kept their epoch: the record's is all there is.
        r.log.as_mut().unwrap().epoch = 0;
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { log, .. } if log.epoch == 4
        ));
    }

    #[test]
    fn a_lapsed_owner_that_recorded_a_checkpoint_of_its_own_epoch_and_changed_nothing_is_loaded_from_it()
     {
        let clean = record(ShardState::Serving, 5, false, Some(5));
        assert!(matches!(Source::of(Some(&clean)), Source::Checkpoint(c) if c.epoch == 5));
    }

    #[test]
    fn a_shard_handed_off_gracefully_is_loaded_from_its_checkpoint() {
        let r = record(ShardState::Handoff, 4, true, Some(4));
        assert!(matches!(Source::of(Some(&r)), Source::Checkpoint(c) if c.epoch == 4));
    }

    #[test]
    fn a_lapsed_owner_that_changed_nothing_since_its_checkpoint_is_loaded_from_it() {
        let clean = record(ShardState::Serving, 5, false, Some(4));
        assert!(matches!(Source::of(Some(&clean)), Source::Checkpoint(c) if c.epoch == 4));
    }

    #[test]
    fn a_lapsed_owner_that_changed_the_shard_is_loaded_only_from_its_own_file_at_its_epoch() {
        let changed = record(ShardState::Serving, 5, true, Some(4));
        assert_eq!(
            Source::of(Some(&changed)),
            Source::Local {
                epoch: 5,
                exact: true
            }
        );
        assert_eq!(Source::of(None), Source::New);
    }

    #[test]
    fn given_up_handoffs_pause_the_balance_step_twice_as_long_each_time_up_to_a_minute() {
        let period = Duration::from_secs(1);
        let mut pause = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..9 {
            pause = next_surplus_pause(pause, period);
            seen.push(pause.as_secs());
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        // A balance period longer than the cap is the pause itself.
        let long = Duration::from_secs(100);
        assert_eq!(next_surplus_pause(Duration::ZERO, long), long);
        assert_eq!(next_surplus_pause(long, long), long);
    }
}
