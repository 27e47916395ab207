//! Handing a shard off ([`Cluster::hand_off`], for a balance step, `nokv admin shard move` or
//! a graceful exit): the record is marked `draining`, the slot turns new requests away (hint
//! or retry), requests holding the shard finish (bounded wait), the shard stops acknowledging
//! (fail closed), a checkpoint of its store is uploaded under a unique key, and one
//! transaction guarded by this node's owner key records it and deletes the owner key. If the checkpoint cannot be taken, a balance step or a move gives up: the
//! shard is served again at the same epoch (nothing left the node: its owner key still
//! excludes everyone else) and the handoff is tried again later. Only a node that is leaving
//! releases without one: with local durability the shard then waits for this node to take it
//! back (its data is on this disk only); with provider durability the record still names this
//! node's log, and whoever takes the shard loads the older base plus that log, fencing the
//! stream (see [`crate::takeover`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Cluster;
use crate::control::etcd::{CheckpointRef, ClusterView, EtcdControl};
use crate::control::{ControlError, Epoch};
use crate::error::{Error, Result};
use crate::route::Routes;
use crate::shard::Shard;
use crate::shard::checkpoint;

/// How long a handoff waits for requests holding the shard before it fences them out.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// The longest pause of the balance step's handoffs after given-up ones (see
/// [`Cluster::surplus_pause`]).
pub(super) const SURPLUS_PAUSE_MAX: Duration = Duration::from_secs(64);

/// What a handoff does when its checkpoint cannot be taken (the provider refused it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IfCheckpointRefused {
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

impl Cluster {
    /// Hands `shard` off (see the module doc); `target` addresses the handoff to one node.
    /// Returns the recorded checkpoint, if one could be taken; without one, `if_refused` says
    /// whether the shard was released anyway or kept.
    pub(super) async fn hand_off(
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
    pub(super) async fn mark_serving(&self, control: &Arc<EtcdControl>, shard: u32) {
        match control.mark_serving(shard).await {
            Ok(()) | Err(ControlError::NotOwner { .. }) => {}
            Err(e) => {
                tracing::warn!(shard, error = %e, "could not mark the shard serving again; retrying at the next balance step");
                self.unmarked.lock().insert(shard);
            }
        }
    }

    /// Uploads a checkpoint of `held` at `epoch`: a handoff's, a taker's before it serves
    /// ([`Cluster::load`]), compaction's.
    pub(super) async fn take_checkpoint(
        &self,
        held: &Arc<Shard>,
        shard: u32,
        epoch: Epoch,
    ) -> Result<CheckpointRef> {
        Ok(self.take_checkpoint_covering(held, shard, epoch).await?.0)
    }

    /// [`Cluster::take_checkpoint`] and the sequence number it covers the node's log below
    /// (see [`crate::shard::gate::Gate::snapshot_covering`]).
    pub(super) async fn take_checkpoint_covering(
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
    ///
    /// Bounded by the lease: once it has lapsed this node owns nothing, so a handoff still
    /// waiting (on an etcd that answers nothing: a partition makes calls hang, not fail) is
    /// given up and its shards are left as a crashed node's — which every shard must survive
    /// anyway. Without the bound a node asked to stop during a partition never exits.
    pub async fn shutdown(&self) {
        let control = self.control();
        tokio::select! {
            () = self.hand_off_every_shard(&control) => {}
            _ = control.deadline().passed() => {
                tracing::warn!("the lease lapsed before every shard was handed off (etcd unreachable?); exiting: the rest are left as a crashed node's");
                return;
            }
        }
        let revoke = control.leave();
        match tokio::time::timeout(self.settings.node_ttl, revoke).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not revoke the lease; it expires by itself")
            }
            Err(_) => {
                tracing::warn!("etcd did not answer the lease revocation; it expires by itself")
            }
        }
    }

    async fn hand_off_every_shard(&self, control: &Arc<EtcdControl>) {
        if let Err(e) = control.withdraw().await {
            tracing::warn!(error = %e, "could not withdraw the node registration");
        }
        let _one = self.moving.lock().await;
        let shards = self.node.held();
        tracing::info!(?shards, "handing off every shard before exiting");
        let handoffs = shards
            .iter()
            .map(|s| self.hand_off(control, *s, None, IfCheckpointRefused::Release));
        for (shard, outcome) in shards.iter().zip(futures::future::join_all(handoffs).await) {
            if let Err(e) = outcome {
                tracing::error!(shard, error = %e, "handoff failed; the shard waits for this node");
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
pub(super) fn next_surplus_pause(last: Duration, period: Duration) -> Duration {
    (last * 2).max(period).min(SURPLUS_PAUSE_MAX.max(period))
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
