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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::access::EtcdAccess;
use super::deadline::AckDeadline;
use super::{ControlError, Epoch};

type Result<T, E = ControlError> = std::result::Result<T, E>;

/// Default node lease TTL (`--node-ttl`).
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);

/// The immutable cluster record: settings every node must share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Number of shards, fixed at cluster creation (placement depends on it).
    pub shards: u32,
    /// Provider bucket all nodes write to.
    pub bucket: String,
    /// Key prefix inside the bucket.
    pub prefix: String,
}

/// `nodes/<id>`: where a live node answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub endpoint: String,
}

/// Lifecycle state of a shard's ownership record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardState {
    /// The owner serves the shard.
    Serving,
    /// The owner refuses new requests (NotOwner + hint) while in-flight ones finish.
    Draining,
    /// The owner released the shard gracefully; any node may take it at `epoch + 1`.
    Handoff,
}

/// `shards/<s>/record`: the shard's durable ownership record (no lease).
///
/// `owner`/`endpoint` name the current owner while `Serving`/`Draining`, and the last owner in
/// `Handoff`. A record still `Serving` whose owner key is gone means its owner crashed: the
/// balance step leaves it for that node to take back (crash failover is a later issue).
/// `checkpoint` is the snapshot recorded by the last graceful release, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub epoch: Epoch,
    pub state: ShardState,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointRef>,
    /// False from an acquisition until the owner's first write session: an owner must set it
    /// (a transaction guarded by its owner key) before it commits anything. A record whose
    /// owner lapsed with `changed == false` still equals its checkpoint, so another node may
    /// take the shard from that checkpoint without losing an acknowledged write.
    #[serde(default)]
    pub changed: bool,
    /// A handoff addressed to one node (`nokv admin shard move`): only that node takes it
    /// while it is alive.
    #[serde(default)]
    pub target: Option<String>,
}

/// A consistent snapshot of a shard's metadata uploaded by a releasing owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Provider key (`<prefix>/meta/<shard>/ckpt/<epoch>-...`), unique per upload.
    pub key: String,
    /// Hex SHA-256 of the object; the next owner refuses a checkpoint that does not match.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Epoch of the owner that took it; must equal the record's epoch when recorded.
    pub epoch: Epoch,
    /// Wall-clock creation time (milliseconds since the Unix epoch), for operators only.
    pub created_unix_ms: u64,
}

/// Everything under `/nokv/<cluster>/`, read at one etcd revision (for `nokv admin cluster`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    /// The cluster's name (`--cluster`); empty for the embedded default.
    pub cluster: String,
    pub config: Option<ClusterConfig>,
    /// Live nodes (their keys exist only while their leases do), sorted by id.
    pub nodes: Vec<(String, NodeRecord)>,
    /// One entry per shard `0..shards`.
    pub shards: Vec<ShardView>,
}

/// One shard in a [`ClusterView`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardView {
    pub shard: u32,
    pub record: Option<ShardRecord>,
    /// Present exactly while some node's lease holds the shard.
    pub owner: Option<OwnerKey>,
}

/// `shards/<s>/owner`: present exactly while the named node owns the shard at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerKey {
    pub node: String,
    pub epoch: Epoch,
}

/// What joining found at `config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigOutcome {
    /// This node created the cluster record.
    Created,
    /// The record existed and matches this node's settings.
    Joined,
}

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

/// How a node joins a cluster.
#[derive(Clone, Debug)]
pub struct EtcdSettings {
    /// etcd client URLs (`--etcd URL[,URL]`).
    pub endpoints: Vec<String>,
    /// Cluster name (`--cluster`): the key prefix `/nokv/<cluster>/`.
    pub cluster: String,
    /// This node's id (`--node-id`).
    pub node_id: String,
    /// Endpoint other nodes and clients reach this node at (`--advertise`).
    pub advertise: String,
    /// Lease TTL (`--node-ttl`, default 10 s); keep-alives go out every third of it.
    pub node_ttl: Duration,
    /// Subtracted from each confirmed lease life to get the acknowledge deadline.
    pub safety_margin: Duration,
    /// The settings this node expects the cluster record to hold.
    pub config: ClusterConfig,
    /// TLS and credentials for etcd ([`super::access`]); plain http by default.
    pub access: EtcdAccess,
}

impl EtcdSettings {
    /// Settings with the default TTL and a safety margin of a fifth of it.
    pub fn new(
        endpoints: Vec<String>,
        cluster: impl Into<String>,
        node_id: impl Into<String>,
        advertise: impl Into<String>,
        config: ClusterConfig,
    ) -> EtcdSettings {
        EtcdSettings {
            endpoints,
            cluster: cluster.into(),
            node_id: node_id.into(),
            advertise: advertise.into(),
            node_ttl: DEFAULT_NODE_TTL,
            safety_margin: DEFAULT_NODE_TTL / 5,
            config,
            access: EtcdAccess::plain(),
        }
    }

    /// Sets how etcd is reached (TLS, client certificate, user).
    pub fn with_access(mut self, access: EtcdAccess) -> EtcdSettings {
        self.access = access;
        self
    }

    /// Sets the TTL and rescales the safety margin to a fifth of it.
    pub fn with_node_ttl(mut self, ttl: Duration) -> EtcdSettings {
        self.node_ttl = ttl;
        self.safety_margin = ttl / 5;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(ControlError::InvalidArgument(m.to_string()));
        if self.endpoints.is_empty() {
            return bad("--etcd needs at least one URL");
        }
        for (name, value) in [("--cluster", &self.cluster), ("--node-id", &self.node_id)] {
            if value.is_empty() || value.contains('/') {
                return bad(&format!("{name} must be non-empty and contain no '/'"));
            }
        }
        if self.advertise.is_empty() {
            return bad("--advertise must be set in cluster mode");
        }
        if self.node_ttl < Duration::from_secs(1) {
            return bad("--node-ttl must be at least 1s");
        }
        if self.safety_margin >= self.node_ttl {
            return bad("the safety margin must be shorter than --node-ttl");
        }
        if self.config.shards == 0 {
            return bad("the shard count must be at least 1");
        }
        Ok(())
    }
}

/// Key layout under `/nokv/<cluster>/`.
#[derive(Clone, Debug)]
struct Keys {
    root: String,
}

impl Keys {
    fn new(cluster: &str) -> Keys {
        Keys {
            root: format!("/nokv/{cluster}/"),
        }
    }
    fn config(&self) -> String {
        format!("{}config", self.root)
    }
    fn nodes(&self) -> String {
        format!("{}nodes/", self.root)
    }
    fn node(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.root)
    }
    fn shards(&self) -> String {
        format!("{}shards/", self.root)
    }
    fn record(&self, shard: u32) -> String {
        format!("{}shards/{shard}/record", self.root)
    }
    fn owner(&self, shard: u32) -> String {
        format!("{}shards/{shard}/owner", self.root)
    }
    /// `(shard, is_owner_key)` of a key under `shards/`.
    fn parse_shard_key(&self, key: &[u8]) -> Option<(u32, bool)> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.shards())?;
        let (shard, kind) = rest.split_once('/')?;
        let shard = shard.parse().ok()?;
        match kind {
            "owner" => Some((shard, true)),
            "record" => Some((shard, false)),
            _ => None,
        }
    }
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

/// The leases one node runtime granted for its id in this process: the current one and every
/// earlier one that may still exist (abandoned after a lapse, or granted by a join attempt
/// that failed; a lease is forgotten once etcd confirmed it revoked). Shared by the
/// memberships of one runtime: [`EtcdControl::join`] starts a lineage,
/// [`EtcdControl::rejoin`] continues it.
///
/// Membership is the proof a takeover needs: a lease in the lineage other than the joining
/// one is this process's own, and nothing acknowledges under it any more (a lease joins the
/// lineage before any key is put under it, and a rejoin abandons the old membership before it
/// grants the new lease), so revoking it frees nothing a live owner relies on. A lease not in
/// it may be a second live process started with the same id: that one is waited out, never
/// revoked. etcd chooses lease ids and nokv never asks for a particular one, so no other
/// process can hold a lease whose id is in this set.
#[derive(Clone, Debug, Default)]
struct Lineage(Arc<Mutex<BTreeSet<i64>>>);

impl Lineage {
    fn add(&self, lease: i64) {
        self.0.lock().insert(lease);
    }

    fn forget(&self, lease: i64) {
        self.0.lock().remove(&lease);
    }

    fn contains(&self, lease: i64) -> bool {
        self.0.lock().contains(&lease)
    }
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
}

impl Drop for EtcdControl {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl EtcdControl {
    /// Joins the cluster: connects, creates or checks the cluster record, grants the node's
    /// lease and starts its keep-alive task, then registers `nodes/<id>` under it (waiting out
    /// a crashed predecessor's lease, see [`register_node`]).
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

    /// The epoch under which `shard` may be acknowledged now: owned by this node *and* the
    /// lease confirmed recently enough. Memory only: no await, no etcd.
    ///
    /// Also requires the record to say `changed` for this ownership: a session may only commit
    /// once etcd knows the shard can differ from its checkpoint ([`EtcdControl::mark_changed`]).
    pub fn acknowledge_epoch(&self, shard: u32) -> Result<Epoch> {
        match self.holding(shard) {
            Ok((epoch, true)) => Ok(epoch),
            _ => Err(ControlError::NotOwner { shard }),
        }
    }

    /// The epoch `shard` is held at and whether it is marked changed, if it is owned, still
    /// acknowledged and the lease confirmed recently enough. Memory only.
    pub fn holding(&self, shard: u32) -> Result<(Epoch, bool)> {
        let owned = self.owned.lock().get(&shard).copied();
        match owned {
            Some(o) if o.acknowledging && self.deadline.allows() => Ok((o.epoch, o.changed)),
            _ => Err(ControlError::NotOwner { shard }),
        }
    }

    /// Records in etcd, once per ownership, that the shard may now differ from its
    /// checkpoint; must succeed before the first write session of the ownership commits.
    /// Guarded by the owner key: a deposed owner cannot mark (nor then write).
    pub async fn mark_changed(&self, shard: u32) -> Result<()> {
        let owned = match self.holding(shard)? {
            (_, true) => return Ok(()),
            _ => self.owned.lock().get(&shard).copied(),
        }
        .ok_or(ControlError::NotOwner { shard })?;
        let marked = self
            .update_guarded(shard, owned, |r| r.changed = true, false)
            .await?;
        if !marked {
            self.owned.lock().remove(&shard);
            return Err(ControlError::NotOwner { shard });
        }
        if let Some(o) = self.owned.lock().get_mut(&shard)
            && o.owner_revision == owned.owner_revision
        {
            o.changed = true;
        }
        Ok(())
    }

    /// The record that this node's acquisition of `shard` replaced (`Some(None)`: there was
    /// none), taken once by the loader.
    pub fn take_previous(&self, shard: u32) -> Option<Option<ShardRecord>> {
        self.previous.lock().remove(&shard)
    }

    /// Stops acknowledging `shard` at once (the first step of a release); it stays owned in
    /// etcd until [`EtcdControl::release`].
    pub fn stop_acknowledging(&self, shard: u32) {
        if let Some(o) = self.owned.lock().get_mut(&shard) {
            o.acknowledging = false;
        }
    }

    /// Shards this node currently holds (regardless of the deadline), with epochs, sorted.
    pub fn owned(&self) -> Vec<(u32, Epoch)> {
        let mut owned: Vec<_> = self
            .owned
            .lock()
            .iter()
            .map(|(s, o)| (*s, o.epoch))
            .collect();
        owned.sort_unstable();
        owned
    }

    fn check_shard(&self, shard: u32) -> Result<()> {
        let shard_count = self.settings.config.shards;
        if shard >= shard_count {
            return Err(ControlError::ShardOutOfRange { shard, shard_count });
        }
        Ok(())
    }

    /// Reads a shard's ownership record and its `mod_revision` (0 when absent).
    pub async fn record(&self, shard: u32) -> Result<(Option<ShardRecord>, i64)> {
        self.check_shard(shard)?;
        let key = self.keys.record(shard);
        let response = self.client.clone().get(key.clone(), None).await?;
        match response.kvs().first() {
            Some(kv) => Ok((Some(decode(&key, kv.value())?), kv.mod_revision())),
            None => Ok((None, 0)),
        }
    }

    /// The shard's owner key, if any.
    pub async fn owner(&self, shard: u32) -> Result<Option<OwnerKey>> {
        self.check_shard(shard)?;
        let key = self.keys.owner(shard);
        let response = self.client.clone().get(key.clone(), None).await?;
        response
            .kvs()
            .first()
            .map(|kv| decode(&key, kv.value()))
            .transpose()
    }

    /// Tries to take `shard`: one transaction that succeeds only if nobody owns it and its
    /// record is unchanged since read; then the record carries `epoch + 1`, state `serving`,
    /// this node as owner, and the owner key is attached to this node's lease.
    ///
    /// Refuses to try once the acknowledge deadline has passed (the lease may be gone).
    pub async fn acquire(&self, shard: u32) -> Result<Acquisition> {
        self.check_shard(shard)?;
        if !self.deadline.allows() {
            return Err(ControlError::LeaseLost);
        }
        let (record, seen) = self.record(shard).await?;
        let epoch = record.as_ref().map_or(0, |r| r.epoch) + 1;
        // Kept before sending: an acquisition whose answer is lost is adopted later and still
        // needs to know what it replaced.
        self.previous.lock().insert(shard, record.clone());
        // The checkpoint pointer carries over: the new owner restores from it (verifying its
        // digest and that its epoch is `epoch - 1`) before serving.
        let next = ShardRecord {
            epoch,
            state: ShardState::Serving,
            owner: Some(self.settings.node_id.clone()),
            endpoint: Some(self.settings.advertise.clone()),
            checkpoint: record.and_then(|r| r.checkpoint),
            changed: false,
            target: None,
        };
        let owner = OwnerKey {
            node: self.settings.node_id.clone(),
            epoch,
        };
        let owner_key = self.keys.owner(shard);
        let record_key = self.keys.record(shard);
        let response = self
            .client
            .clone()
            .txn(
                Txn::new()
                    .when([
                        Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0),
                        Compare::mod_revision(record_key.clone(), CompareOp::Equal, seen),
                    ])
                    .and_then([
                        TxnOp::put(record_key, encode(&next), None),
                        TxnOp::put(
                            owner_key,
                            encode(&owner),
                            Some(PutOptions::new().with_lease(self.lease_id)),
                        ),
                    ]),
            )
            .await?;
        if !response.succeeded() {
            return Ok(Acquisition::Refused);
        }
        let owner_revision = response.header().map_or(0, |h| h.revision());
        self.owned.lock().insert(
            shard,
            Owned {
                epoch,
                owner_revision,
                changed: false,
                acknowledging: true,
            },
        );
        tracing::info!(shard, epoch, "acquired shard");
        Ok(Acquisition::Acquired(epoch))
    }

    /// Marks an owned shard `draining` (new requests are to be refused with a hint while
    /// in-flight ones finish). Guarded by this node's owner key; the shard stays owned.
    pub async fn mark_draining(&self, shard: u32) -> Result<()> {
        self.check_shard(shard)?;
        let owned = self
            .owned
            .lock()
            .get(&shard)
            .copied()
            .ok_or(ControlError::NotOwner { shard })?;
        if !self
            .update_guarded(shard, owned, |r| r.state = ShardState::Draining, false)
            .await?
        {
            self.owned.lock().remove(&shard);
            return Err(ControlError::NotOwner { shard });
        }
        Ok(())
    }

    /// Gives `shard` up gracefully: it stops being acknowledged *first* (fail closed), then one
    /// transaction guarded by this node's owner key deletes the key and sets the record to
    /// `handoff` with `checkpoint` and `target` (keeping this node as the last owner). Returns
    /// false when the owner key was already gone (the lease lapsed and the shard may have moved
    /// on): nothing was changed then.
    ///
    /// Without a checkpoint the record's pointer is cleared if this ownership marked the shard
    /// changed (an older one would miss later acknowledged writes): only this node may then
    /// take the shard back, its data is on this node's disk only. If it never marked it, the
    /// old pointer still holds everything and is kept. A checkpoint must carry this
    /// ownership's epoch.
    pub async fn release(
        &self,
        shard: u32,
        checkpoint: Option<CheckpointRef>,
        target: Option<String>,
    ) -> Result<bool> {
        self.check_shard(shard)?;
        let epoch = self
            .owned
            .lock()
            .get(&shard)
            .map(|o| o.epoch)
            .ok_or(ControlError::NotOwner { shard })?;
        if let Some(c) = &checkpoint
            && c.epoch != epoch
        {
            return Err(ControlError::InvalidArgument(format!(
                "checkpoint of epoch {} cannot release shard {shard} owned at epoch {epoch}",
                c.epoch
            )));
        }
        let owned = self
            .owned
            .lock()
            .remove(&shard)
            .ok_or(ControlError::NotOwner { shard })?;
        let released = self
            .update_guarded(
                shard,
                owned,
                move |r| {
                    r.state = ShardState::Handoff;
                    // Without a new checkpoint the old pointer stays valid only if this
                    // ownership changed nothing (e.g. a shard released before it was loaded).
                    if checkpoint.is_some() || owned.changed {
                        r.checkpoint = checkpoint;
                    }
                    r.target = target;
                },
                true,
            )
            .await?;
        tracing::info!(shard, epoch = owned.epoch, released, "released shard");
        Ok(released)
    }

    /// One transaction: if our owner key (by create revision and lease) still exists, write
    /// the record changed by `change`; `delete_owner` also deletes the owner key (a release).
    async fn update_guarded(
        &self,
        shard: u32,
        owned: Owned,
        change: impl FnOnce(&mut ShardRecord),
        delete_owner: bool,
    ) -> Result<bool> {
        let (record, _) = self.record(shard).await?;
        let mut record = record.unwrap_or(ShardRecord {
            epoch: owned.epoch,
            state: ShardState::Serving,
            owner: None,
            endpoint: None,
            checkpoint: None,
            changed: false,
            target: None,
        });
        change(&mut record);
        let owner_key = self.keys.owner(shard);
        let mut ops = vec![TxnOp::put(self.keys.record(shard), encode(&record), None)];
        if delete_owner {
            ops.push(TxnOp::delete(owner_key.clone(), None));
        }
        let response = self
            .client
            .clone()
            .txn(
                Txn::new()
                    .when([
                        Compare::create_revision(
                            owner_key.clone(),
                            CompareOp::Equal,
                            owned.owner_revision,
                        ),
                        Compare::lease(owner_key, CompareOp::Equal, self.lease_id),
                    ])
                    .and_then(ops),
            )
            .await?;
        Ok(response.succeeded())
    }

    /// One balance step: counts live nodes, adopts owner keys of this lease it does not know
    /// (an acquisition whose answer was lost), takes every handoff addressed to this node,
    /// then takes free shards until it holds `ceil(shards / nodes)`. See [`takeable`] for
    /// which shards are free. Returns the surplus to hand off (see the end of the body).
    pub async fn balance_step(&self) -> Result<BalanceReport> {
        let mut client = self.client.clone();
        let shard_count = self.settings.config.shards;
        let live: Vec<String> = client
            .get(self.keys.nodes(), Some(GetOptions::new().with_prefix()))
            .await?
            .kvs()
            .iter()
            .filter_map(|kv| {
                std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(&self.keys.nodes())
                    .map(str::to_string)
            })
            .collect();
        let target = (shard_count as usize).div_ceil(live.len().max(1));

        let response = client
            .get(self.keys.shards(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut records: BTreeMap<u32, ShardRecord> = BTreeMap::new();
        let mut owners: BTreeMap<u32, (OwnerKey, &KeyValue)> = BTreeMap::new();
        for kv in response.kvs() {
            let Some((shard, is_owner)) = self.keys.parse_shard_key(kv.key()) else {
                continue;
            };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if is_owner {
                owners.insert(shard, (decode(&key, kv.value())?, kv));
            } else {
                records.insert(shard, decode(&key, kv.value())?);
            }
        }

        let mut report = BalanceReport {
            target,
            ..BalanceReport::default()
        };
        {
            let mut owned = self.owned.lock();
            for (shard, (owner, kv)) in &owners {
                if kv.lease() == self.lease_id && !owned.contains_key(shard) {
                    owned.insert(
                        *shard,
                        Owned {
                            epoch: owner.epoch,
                            owner_revision: kv.create_revision(),
                            changed: records.get(shard).is_some_and(|r| r.changed),
                            acknowledging: true,
                        },
                    );
                    report.acquired.push((*shard, owner.epoch));
                }
            }
        }

        let me = self.settings.node_id.as_str();
        // Handoffs addressed to this node first, whatever it holds.
        for (shard, record) in &records {
            if !owners.contains_key(shard)
                && record.state == ShardState::Handoff
                && record.checkpoint.is_some()
                && record.target.as_deref() == Some(me)
                && let Acquisition::Acquired(epoch) = self.acquire(*shard).await?
            {
                report.acquired.push((*shard, epoch));
            }
        }
        // Start at a node-specific offset so nodes balancing at once mostly try different shards.
        let offset = fnv1a(me.as_bytes()) % u64::from(shard_count);
        for i in 0..shard_count {
            if self.owned.lock().len() >= target {
                break;
            }
            let shard = ((offset + u64::from(i)) % u64::from(shard_count)) as u32;
            if owners.contains_key(&shard)
                || self.owned.lock().contains_key(&shard)
                || !takeable(records.get(&shard), me, &live)
            {
                continue;
            }
            if let Acquisition::Acquired(epoch) = self.acquire(shard).await? {
                report.acquired.push((shard, epoch));
            }
        }
        // Hand off beyond the target, or one shard while some live node is starved — holds
        // fewer than `floor(shards / nodes)` with no free shard it could take — and this one
        // holds more: nodes converge to 5–6 of 16 on 3 nodes. While a free shard is there for
        // it, the starved node takes that one itself (its balance step may be mid-acquisition
        // at this very read), and a handoff on top would be churn: a shard out of service for
        // nothing, which this node would then take back.
        let floor = shard_count as usize / live.len().max(1);
        let mine = self.owned.lock().len();
        let free_for = |node: &str| {
            (0..shard_count)
                .any(|s| !owners.contains_key(&s) && takeable(records.get(&s), node, &live))
        };
        let starved = live.iter().any(|node| {
            node != me
                && owners.values().filter(|(o, _)| &o.node == node).count() < floor
                && !free_for(node)
        });
        report.surplus = if mine > target {
            mine - target
        } else {
            usize::from(starved && mine > floor)
        };
        Ok(report)
    }

    /// Reads the whole cluster prefix at one revision.
    pub async fn cluster_view(&self) -> Result<ClusterView> {
        let response = self
            .client
            .clone()
            .get(
                self.keys.root.clone(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        let mut view = ClusterView {
            cluster: self.settings.cluster.clone(),
            config: None,
            nodes: Vec::new(),
            shards: (0..self.settings.config.shards)
                .map(|shard| ShardView {
                    shard,
                    record: None,
                    owner: None,
                })
                .collect(),
        };
        let nodes_prefix = self.keys.nodes();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if key == self.keys.config() {
                view.config = Some(decode(&key, kv.value())?);
            } else if let Some(id) = key.strip_prefix(&nodes_prefix) {
                view.nodes.push((id.to_string(), decode(&key, kv.value())?));
            } else if let Some((shard, is_owner)) = self.keys.parse_shard_key(kv.key())
                && let Some(entry) = view.shards.get_mut(shard as usize)
            {
                if is_owner {
                    entry.owner = Some(decode(&key, kv.value())?);
                } else {
                    entry.record = Some(decode(&key, kv.value())?);
                }
            }
        }
        view.nodes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(view)
    }

    /// A stream of every change under the cluster prefix from now on (nodes joining or
    /// leaving, ownership records and owner keys). Carries no decoded data: the caller re-reads
    /// [`EtcdControl::cluster_view`] when it fires.
    pub async fn changes(&self) -> Result<etcd_client::WatchStream> {
        let stream = self
            .client
            .clone()
            .watch(
                self.keys.root.clone(),
                Some(WatchOptions::new().with_prefix()),
            )
            .await?;
        Ok(stream)
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

/// Whether node `me` may take a shard nobody holds (no owner key), given its record:
/// * no record: a new shard;
/// * `handoff` with a checkpoint: released gracefully — by anyone, unless it is addressed to
///   another live node; `handoff` without a checkpoint: only by its last owner (the data is on
///   its disk);
/// * `serving`/`draining` (the owner's lease lapsed: a crash or a pause): by the same node
///   (restarted with its data dir), or by anyone if the owner never marked it changed and the
///   checkpoint it was taken from is there — then it still equals that checkpoint and nothing
///   acknowledged can be lost. Otherwise it waits for its owner (crash failover is not built).
fn takeable(record: Option<&ShardRecord>, me: &str, live: &[String]) -> bool {
    let Some(r) = record else {
        return true;
    };
    let mine = r.owner.as_deref() == Some(me);
    match r.state {
        ShardState::Handoff => match (&r.checkpoint, &r.target) {
            (None, _) => mine,
            (Some(_), Some(target)) => target == me || !live.contains(target),
            (Some(_), None) => true,
        },
        ShardState::Serving | ShardState::Draining => {
            mine || (!r.changed
                && r.checkpoint
                    .as_ref()
                    .is_some_and(|c| c.epoch + 1 == r.epoch))
        }
    }
}

/// Creates the cluster record if absent (one transaction), else checks it against ours.
async fn ensure_config(
    client: &mut Client,
    keys: &Keys,
    settings: &EtcdSettings,
) -> Result<ConfigOutcome> {
    let key = keys.config();
    let ours = &settings.config;
    let response = client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), encode(ours), None)])
                .or_else([TxnOp::get(key.clone(), None)]),
        )
        .await?;
    if response.succeeded() {
        tracing::info!(cluster = %settings.cluster, "created the cluster record");
        return Ok(ConfigOutcome::Created);
    }
    let recorded: ClusterConfig = response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .map(|value| decode(&key, &value))
        .transpose()?
        .ok_or_else(|| ControlError::Corrupt {
            key: key.clone(),
            reason: "present for the compare, absent for the read".into(),
        })?;
    let mismatch = |field, recorded: String, ours: String| {
        Err(ControlError::ConfigMismatch {
            cluster: settings.cluster.clone(),
            field,
            recorded,
            ours,
        })
    };
    if recorded.shards != ours.shards {
        return mismatch(
            "shards",
            recorded.shards.to_string(),
            ours.shards.to_string(),
        );
    }
    if recorded.bucket != ours.bucket {
        return mismatch("bucket", recorded.bucket, ours.bucket.clone());
    }
    if recorded.prefix != ours.prefix {
        return mismatch("prefix", recorded.prefix, ours.prefix.clone());
    }
    Ok(ConfigOutcome::Joined)
}

/// Slack over a lease's reported remaining TTL before its keys are gone (etcd checks expiry
/// every 500 ms and reports whole seconds).
const LEASE_EXPIRY_SLACK: Duration = Duration::from_secs(2);

/// Revokes `lease`, bounded by `bound`: true when etcd confirmed it gone (revoked now, or
/// already unknown to it), false when etcd did not answer or refused (logged).
async fn revoke_lease(client: &mut Client, lease: i64, bound: Duration) -> bool {
    match tokio::time::timeout(bound, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) if lease_not_found(&error) => true,
        Ok(Err(error)) => {
            tracing::warn!(lease, %error, "could not revoke a lease; it expires by itself");
            false
        }
        Err(_) => {
            tracing::warn!(lease, "revoking a lease timed out; it expires by itself");
            false
        }
    }
}

/// etcd's answer to an operation on a lease it does not know (expired or revoked).
fn lease_not_found(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::NotFound)
}

/// Registers `nodes/<id>` under `lease_id` with a create-if-absent transaction.
///
/// If the key exists under another lease of this runtime's [`Lineage`] (an abandoned lease
/// that etcd kept alive through an outage, or a failed attempt's), that lease is revoked and
/// the id taken over at once: it is provably this process's own and nothing acknowledges
/// under it. Any other lease is either a crashed predecessor of this node (kill -9, then
/// restart within a TTL) or a live second process with the same id. The two are told apart by
/// waiting, bounded by the old lease's remaining TTL, for etcd to delete the key: a dead lease
/// expires, a live one is renewed and the join fails with `NodeIdInUse`.
async fn register_node(
    client: &mut Client,
    keys: &Keys,
    settings: &EtcdSettings,
    lease_id: i64,
    lineage: &Lineage,
) -> Result<()> {
    let key = keys.node(&settings.node_id);
    let value = encode(&NodeRecord {
        endpoint: settings.advertise.clone(),
    });
    let in_use = || ControlError::NodeIdInUse {
        cluster: settings.cluster.clone(),
        node: settings.node_id.clone(),
    };
    let mut waited = false;
    loop {
        let response = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease_id)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await?;
        if response.succeeded() {
            return Ok(());
        }
        let revision = response.header().map_or(0, |h| h.revision());
        let old_lease = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.lease()),
                _ => None,
            })
            .unwrap_or(0);
        if old_lease != 0 && old_lease != lease_id && lineage.contains(old_lease) {
            match client.lease_revoke(old_lease).await {
                Ok(_) => {}
                Err(error) if lease_not_found(&error) => {}
                Err(error) => return Err(error.into()),
            }
            lineage.forget(old_lease);
            tracing::info!(
                node = %settings.node_id,
                old_lease,
                "took the node id over from this process's own earlier lease (revoked it)"
            );
            // The key went with the lease: the next transaction creates it under ours.
            continue;
        }
        if waited || old_lease == 0 {
            return Err(in_use());
        }
        waited = true;
        let left = client.lease_time_to_live(old_lease, None).await?.ttl();
        let bound = Duration::from_secs(left.max(0) as u64) + LEASE_EXPIRY_SLACK;
        tracing::info!(
            node = %settings.node_id,
            old_lease,
            ?bound,
            "node id held by an earlier lease; waiting for it to expire"
        );
        // Watch from just after the revision we read at: a deletion in between is not missed.
        let mut watch = client
            .watch(
                key.clone(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await?;
        let deleted = tokio::time::timeout(bound, async {
            while let Some(message) = watch.message().await? {
                if message
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(true);
                }
            }
            Ok::<_, etcd_client::Error>(false)
        })
        .await;
        match deleted {
            Ok(Ok(true)) => continue,
            Ok(Ok(false)) | Err(_) => return Err(in_use()),
            Ok(Err(error)) => return Err(error.into()),
        }
    }
}

/// Keeps the lease alive on one stream, a keep-alive every `ttl / 3`, extending `deadline`
/// from the *send* time of each confirmed request. A stream error reopens the stream at the
/// next period (the deadline simply stops advancing meanwhile: fail closed). A confirmation
/// with TTL 0 means etcd no longer knows the lease (expired or revoked): the deadline is
/// revoked and the task ends — the node must rejoin with a new lease.
async fn keep_alive_loop(
    mut client: Client,
    lease_id: i64,
    ttl: Duration,
    margin: Duration,
    deadline: Arc<AckDeadline>,
) {
    let period = ttl / 3;
    loop {
        let opened = tokio::time::timeout(period, client.lease_keep_alive(lease_id)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            // The client's words for a first answer with TTL 0: etcd no longer knows the
            // lease, the same end as below (retrying it would never succeed).
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(why))) if why == "lease not found" => {
                tracing::error!(
                    lease = lease_id,
                    "the node's lease is gone; acknowledging nothing more"
                );
                deadline.revoke();
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = lease_id, %error, "cannot open the keep-alive stream");
                tokio::time::sleep(period).await;
                continue;
            }
            Err(_) => {
                tracing::warn!(lease = lease_id, "opening the keep-alive stream timed out");
                continue;
            }
        };
        loop {
            let sent = Instant::now();
            let round = tokio::time::timeout(period, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match round {
                Ok(Ok(Some(response))) if response.ttl() > 0 => {
                    deadline.extend(sent, Duration::from_secs(response.ttl() as u64), margin);
                }
                Ok(Ok(Some(_))) => {
                    tracing::error!(
                        lease = lease_id,
                        "the node's lease is gone; acknowledging nothing more"
                    );
                    deadline.revoke();
                    return;
                }
                Ok(Ok(None)) => {
                    tracing::warn!(lease = lease_id, "keep-alive stream closed");
                    break;
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = lease_id, %error, "keep-alive failed");
                    break;
                }
                Err(_) => {
                    tracing::warn!(lease = lease_id, "keep-alive timed out");
                    break;
                }
            }
            tokio::time::sleep_until((sent + period).into()).await;
        }
        tokio::time::sleep(period).await;
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("control records serialize")
}

fn decode<T: for<'de> Deserialize<'de>>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| ControlError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

/// FNV-1a: a stable (cross-process, cross-version) hash for the balance start offset.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
