//! Cluster ownership through etcd: one lease per node, one fenced ownership record per shard.
//!
//! Keys, all under `/nokv/<cluster>/`:
//! * `config` — [`ClusterConfig`] (shard count, provider bucket and prefix). Created once by
//!   the first node with a create-if-absent transaction and never changed; a node whose
//!   settings disagree refuses to join ([`ControlError::ConfigMismatch`]).
//! * `nodes/<id>` — [`NodeRecord`] (endpoint), attached to the node's lease: it vanishes when
//!   the node stops keeping its lease alive, so live node keys = live nodes.
//! * `shards/<s>/record` — [`ShardRecord`] (epoch, state, owner, endpoint). No lease: it
//!   survives its owner and carries the epoch forward.
//! * `shards/<s>/owner` — [`OwnerKey`] (node, epoch), attached to the owner's lease: its
//!   presence *is* ownership; lease expiry or revocation frees the shard.
//!
//! Acquisition is one transaction: `create_revision(owner) == 0` (nobody owns it) and
//! `mod_revision(record) == seen` (nobody acquired or released since we read the record) →
//! record with `epoch + 1` and the owner key under our lease. Release is one transaction
//! guarded by our own owner key (its `create_revision`): delete it and set the record's state.
//! No other write touches these keys, so epochs of a shard strictly increase.
//!
//! The lease is kept alive by one background task on one keep-alive stream every TTL/3. Each
//! confirmed keep-alive extends the node's [`AckDeadline`]; [`EtcdControl::acknowledge_epoch`]
//! reads only memory (owned table + deadline), never etcd.
//!
//! A node whose lease lapsed (its deadline passed: etcd unreachable, or the lease gone)
//! rejoins with a new lease ([`EtcdControl::rejoin`]): it abandons the old membership first —
//! nothing more acknowledged under it, its keep-alive stopped, its lease revoked if etcd
//! answers. When etcd was down, the revocation cannot reach it, and a restarted etcd refreshes
//! every lease it had: the old lease still holds `nodes/<id>` and the owner keys. Registration
//! then revokes it and takes the id over instead of waiting for it to expire, because it is
//! provably this process's own ([`Lineage`]); a lease it cannot prove its own is waited out.
//!
//! Files, by concept (arrows point one way: the leaves know nothing of [`EtcdControl`]):
//! * `records` — the key layout and the records stored at the keys (leaf);
//! * `settings` — [`EtcdSettings`] and the cluster record check on join;
//! * `lease` — the lease: keep-alive task, revocation, registration, [`Lineage`](lease::Lineage);
//! * this file — [`EtcdControl`] itself: joining, rejoining, leaving;
//! * `ownership` — acquire, mark changed/draining, release; the memory-only answers;
//! * `balance` — which shards are takeable and the balance step;
//! * `view` — the cluster view and its change stream;
//! * `fault` — a test fault: etcd failing a shard's `serving` mark (tests only, named so).

mod balance;
mod fault;
mod lease;
mod ownership;
mod records;
mod settings;
mod view;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use parking_lot::Mutex;

use self::lease::{Lineage, keep_alive_loop, register_node, revoke_lease};
use self::records::Keys;
use self::settings::ensure_config;
use super::deadline::AckDeadline;
use super::{ControlError, Epoch};

pub use self::records::{
    CheckpointRef, ClusterConfig, ClusterView, LogRef, NodeRecord, OwnerKey, ShardRecord,
    ShardState, ShardView,
};
pub use self::settings::{ConfigOutcome, DEFAULT_NODE_TTL, EtcdSettings};

type Result<T, E = ControlError> = std::result::Result<T, E>;

/// Outcome of [`EtcdControl::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquisition {
    /// This node owns the shard at this (new) epoch.
    Acquired(Epoch),
    /// Someone owns the shard, or the record changed since it was read: nothing changed.
    Refused,
}

/// Outcome of [`EtcdControl::balance_step`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalanceReport {
    /// `ceil(shards / live nodes)`.
    pub target: usize,
    /// Shards acquired (or adopted) by this step, with their epochs.
    pub acquired: Vec<(u32, Epoch)>,
    /// How many shards this node owns beyond `target`: the caller hands that many off
    /// gracefully (checkpoint, then [`EtcdControl::release`]).
    pub surplus: usize,
}

/// A shard this node owns: its epoch and the owner key's create revision (the guard of
/// release and state changes: it identifies *this* ownership, not a later one).
#[derive(Clone, Copy, Debug)]
struct Owned {
    epoch: Epoch,
    owner_revision: i64,
    /// The record says `changed` for this ownership (see [`ShardRecord::changed`]).
    changed: bool,
    /// Cleared when a release begins: from then on nothing more is acknowledged (fail closed)
    /// while the checkpoint is taken and the release transaction sent.
    acknowledging: bool,
}

/// A node's membership in a cluster: its lease, its acknowledge deadline, its shards.
///
/// Dropping it stops the keep-alive task; the lease then expires after its TTL and etcd frees
/// the node's owner keys (use [`EtcdControl::leave`] to free them at once).
pub struct EtcdControl {
    client: Client,
    keys: Keys,
    settings: EtcdSettings,
    lease_id: i64,
    deadline: Arc<AckDeadline>,
    owned: Mutex<HashMap<u32, Owned>>,
    /// The record each acquisition replaced, kept until the shard is loaded: where its data
    /// comes from depends on it (see `crate::cluster`).
    previous: Mutex<HashMap<u32, Option<ShardRecord>>>,
    keep_alive: tokio::task::JoinHandle<()>,
    /// Every lease of this node runtime, this one included (see [`Lineage`]).
    lineage: Lineage,
    /// None in production (see [`fault`]).
    faults: fault::ControlFaults,
}

impl Drop for EtcdControl {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl EtcdControl {
    /// Joins the cluster: connects, creates or checks the cluster record, grants the node's
    /// lease and starts its keep-alive task, then registers `nodes/<id>` under it (waiting out
    /// a crashed predecessor's lease, see [`register_node`](lease::register_node)).
    pub async fn join(settings: EtcdSettings) -> Result<(Arc<EtcdControl>, ConfigOutcome)> {
        Self::join_in(settings, Lineage::default()).await
    }

    /// Rejoins after this membership's lease lapsed: abandons it first
    /// ([`EtcdControl::abandon`]), then joins with a new lease in the same [`Lineage`], so
    /// registration takes the id over from any lease of this runtime still holding it instead
    /// of waiting for it to expire. Call it again on the same (old) membership after a failed
    /// attempt: abandoning is idempotent and retries the revocation.
    pub async fn rejoin(&self) -> Result<(Arc<EtcdControl>, ConfigOutcome)> {
        self.abandon().await;
        Self::join_in(self.settings.clone(), self.lineage.clone()).await
    }

    async fn join_in(
        settings: EtcdSettings,
        lineage: Lineage,
    ) -> Result<(Arc<EtcdControl>, ConfigOutcome)> {
        settings.validate()?;
        let mut client = super::access::connect(&settings.endpoints, &settings.access).await?;
        let keys = Keys::new(&settings.cluster);
        let outcome = ensure_config(&mut client, &keys, &settings).await?;

        let sent = Instant::now();
        let grant = client
            .lease_grant(settings.node_ttl.as_secs() as i64, None)
            .await?;
        let lease_id = grant.id();
        // Before any key can be put under it: from here on a lost answer can leave this lease
        // holding `nodes/<id>`, and a later attempt must recognise it as its own.
        lineage.add(lease_id);
        let granted = Duration::from_secs(grant.ttl().max(0) as u64);
        let deadline = Arc::new(AckDeadline::new());
        deadline.extend(sent, granted, settings.safety_margin);

        // Keep-alives start before registration: it may wait out a predecessor's lease,
        // which can take longer than our own TTL.
        let keep_alive = tokio::spawn(keep_alive_loop(
            client.clone(),
            lease_id,
            settings.node_ttl,
            settings.safety_margin,
            deadline.clone(),
        ));
        if let Err(error) = register_node(&mut client, &keys, &settings, lease_id, &lineage).await {
            keep_alive.abort();
            // Free our fresh lease rather than leave it to expire.
            if revoke_lease(&mut client, lease_id, settings.node_ttl / 3).await {
                lineage.forget(lease_id);
            }
            return Err(error);
        }

        tracing::info!(
            cluster = %settings.cluster,
            node = %settings.node_id,
            lease = lease_id,
            ttl_secs = granted.as_secs(),
            ?outcome,
            "joined the cluster"
        );
        let control = EtcdControl {
            client,
            keys,
            settings,
            lease_id,
            deadline,
            owned: Mutex::new(HashMap::new()),
            previous: Mutex::new(HashMap::new()),
            keep_alive,
            lineage,
            faults: fault::ControlFaults::from_env(),
        };
        Ok((Arc::new(control), outcome))
    }

    /// The node's etcd lease id.
    pub fn lease_id(&self) -> i64 {
        self.lease_id
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.settings.node_id
    }

    /// The acknowledge deadline (read it with [`AckDeadline::allows`], wait on
    /// [`AckDeadline::passed`] to stop serving at once when it lapses).
    pub fn deadline(&self) -> &Arc<AckDeadline> {
        &self.deadline
    }

    /// Withdraws this node's registration (its `nodes/<id>` key) while it keeps its lease and
    /// shards: the first step of a graceful shutdown, so the other nodes raise their targets
    /// and take the shards this node is about to hand off.
    pub async fn withdraw(&self) -> Result<()> {
        self.client
            .clone()
            .delete(self.keys.node(&self.settings.node_id), None)
            .await?;
        Ok(())
    }

    /// Leaves the cluster at once: stops acknowledging, stops the keep-alives and revokes the
    /// lease (etcd deletes the node key and every owner key of this node). Records keep their
    /// state: shards not released first are left as a crashed owner's.
    pub async fn leave(&self) -> Result<()> {
        self.stop();
        self.client.clone().lease_revoke(self.lease_id).await?;
        Ok(())
    }

    /// Ends this membership for good after its lease lapsed: stops acknowledging, forgets
    /// every shard, stops the keep-alives (a restarted etcd would otherwise see the abandoned
    /// lease renewed for ever), then revokes the lease if etcd answers within a third of the
    /// TTL, which deletes its node key and owner keys at once. Idempotent. The revocation is
    /// best effort: a lease etcd did not confirm revoked stays in the [`Lineage`], for the next
    /// registration to revoke, and otherwise expires by itself.
    ///
    /// Acknowledging ends before anything is sent: the shards are released in etcd only after
    /// this node stopped acting as their owner (fail closed).
    pub async fn abandon(&self) {
        self.stop();
        let mut client = self.client.clone();
        if revoke_lease(&mut client, self.lease_id, self.settings.node_ttl / 3).await {
            self.lineage.forget(self.lease_id);
        }
    }

    /// The memory side of ending a membership: the deadline is revoked (for good: no late
    /// keep-alive confirmation revives it), no shard is held, no keep-alive goes out.
    fn stop(&self) {
        self.deadline.revoke();
        self.owned.lock().clear();
        self.previous.lock().clear();
        self.keep_alive.abort();
    }
}
