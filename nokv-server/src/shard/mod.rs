//! One shard: its metadata store behind a command gate, the object provider it writes
//! artifact blocks to, and the operations that run against them.
//!
//! Every mutation is one short write session (see [`gate`]); the upload sequencer is the one
//! operation that spans two sessions with provider I/O between them.

pub mod accounting;
pub mod admission;
pub mod checkpoint;
pub mod claims;
pub mod clock;
pub mod deletion_fence;
pub mod edit;
pub mod fence;
pub mod files;
#[cfg(test)]
pub(crate) mod fixture;
pub mod gate;
pub mod health;
pub mod inventory;
pub mod operations;
pub mod quota;
pub mod receipts;
pub mod reconciler;
#[cfg(test)]
mod reconciler_durability_tests;
pub mod replay;
pub mod search;
pub mod sequencer;
pub mod upload_digest;
pub mod workspaces;

use std::sync::Arc;
use std::time::Duration;

use nokv_proto::v1 as pb;

use crate::bulk::Bulk;
use crate::meta::{EntryRecord, MetaStore};
use crate::object::ObjectProvider;
use crate::token::Signer;
use clock::Clock;
use fence::Fence;
use gate::Gate;

/// Per-shard limits and timings, resolved from the server configuration.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Largest body stored inline by `Write`.
    pub inline_max: usize,
    pub block_size: u64,
    pub upload_lease: Duration,
    pub replay_ttl: Duration,
    /// How long a replaced or deleted artifact's revision stays readable before its blocks
    /// become collectable.
    pub retired_grace: Duration,
    /// Time budget of each kind of reconciler scan within one pass (`--scan-budget`).
    pub scan_budget: Duration,
    /// Admission caps on unresolved uploads and the node-wide census they are checked
    /// against (shared by every shard cloned from one configuration).
    pub admission: admission::Caps,
    /// Failed deletes after which a delete operation is dead-lettered (`--delete-attempts`).
    pub delete_attempts: u32,
    /// How long terminal operations stay in the ledger (`--history-retention`; never less
    /// than `replay_ttl`, see [`operations`]).
    pub history_retention: Duration,
    /// Work bounds of Find and Grep (see [`search`]).
    pub search: search::SearchLimits,
    /// The node-wide bound on upload blocks held for the running digests (see
    /// [`upload_digest`]; shared by every shard cloned from one configuration).
    pub held_ahead: Arc<upload_digest::HeldAhead>,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            inline_max: 256 * 1024,
            block_size: 4 * 1024 * 1024,
            upload_lease: Duration::from_secs(60),
            replay_ttl: Duration::from_secs(24 * 3600),
            retired_grace: Duration::from_secs(600),
            scan_budget: Duration::from_secs(5),
            admission: admission::Caps::default(),
            delete_attempts: 8,
            history_retention: Duration::from_secs(30 * 24 * 3600),
            search: search::SearchLimits::default(),
            held_ahead: upload_digest::HeldAhead::for_budget(crate::memory::DEFAULT_BLOCK_MEMORY),
        }
    }
}

pub struct Shard {
    pub id: u32,
    gate: Gate,
    object: ObjectProvider,
    bulk: Arc<Bulk>,
    signer: Signer,
    cfg: ShardConfig,
    claims: claims::BlockClaims,
    /// Every lease, replay window and grace period of this shard is judged by this clock.
    clock: Clock,
    /// Byte quota and admission accounting (see [`quota`]).
    accounts: quota::Accounts,
    /// Admin retries in flight (see [`operations`]).
    retries: operations::RetriesInFlight,
    /// Running whole-artifact digests of open uploads (see [`upload_digest`]).
    digests: Arc<upload_digest::UploadDigests>,
}

impl Drop for Shard {
    /// A shard the node no longer holds stops counting toward the node's admission cap.
    fn drop(&mut self) {
        self.accounts.caps().census.forget(self.id);
    }
}

impl Shard {
    /// Opens a shard on a standalone store with its own committer (epoch 0, always owner):
    /// tests and tools.
    pub fn open(
        id: u32,
        meta: MetaStore,
        object: ObjectProvider,
        bulk: Arc<Bulk>,
        signer: Signer,
        cfg: ShardConfig,
    ) -> Arc<Shard> {
        let gate = Gate::new(meta, format!("nokv-shard-{id}"), Fence::local(id));
        Self::build(id, gate, object, bulk, signer, cfg, Clock::wall())
    }

    /// Opens a shard behind `gate` (a node's shard: its namespace of the node file, the
    /// node's committer, and its fence).
    pub fn on(
        id: u32,
        gate: Gate,
        object: ObjectProvider,
        bulk: Arc<Bulk>,
        signer: Signer,
        cfg: ShardConfig,
    ) -> Arc<Shard> {
        Self::build(id, gate, object, bulk, signer, cfg, Clock::wall())
    }

    /// Like [`Shard::open`] with a given shard clock (tests pass a manual one).
    pub fn open_with_clock(
        id: u32,
        meta: MetaStore,
        object: ObjectProvider,
        bulk: Arc<Bulk>,
        signer: Signer,
        cfg: ShardConfig,
        clock: Clock,
    ) -> Arc<Shard> {
        let gate = Gate::new(meta, format!("nokv-shard-{id}"), Fence::local(id));
        Self::build(id, gate, object, bulk, signer, cfg, clock)
    }

    fn build(
        id: u32,
        gate: Gate,
        object: ObjectProvider,
        bulk: Arc<Bulk>,
        signer: Signer,
        cfg: ShardConfig,
        clock: Clock,
    ) -> Arc<Shard> {
        // The node's census counts this shard's unresolved uploads from its first session on.
        let accounts = quota::Accounts::new(id, cfg.admission.clone());
        if let Ok(t) = gate.read_now(|r| Ok(r.usage_totals()?)) {
            cfg.admission.census.publish(id, t.reservations);
        }
        let digests = Arc::new(upload_digest::UploadDigests::new(cfg.held_ahead.clone()));
        Arc::new(Shard {
            id,
            accounts,
            gate,
            object,
            bulk,
            signer,
            cfg,
            claims: Default::default(),
            clock,
            retries: Default::default(),
            digests,
        })
    }

    /// Drops every running upload digest, as a restart does (tests of the read-back path).
    #[cfg(test)]
    pub(crate) fn forget_running_digests(&self) {
        self.digests.forget_all();
    }

    /// Records the node's ownership epoch in the shard's store (see [`Gate::adopt_epoch`]).
    pub async fn adopt_epoch(&self) -> crate::error::Result<u64> {
        self.gate.adopt_epoch().await
    }

    /// The epoch the shard's store holds (0: never owned in a cluster).
    pub async fn stored_epoch(&self) -> crate::error::Result<u64> {
        self.gate.read(|r| Ok(r.epoch()?)).await
    }

    /// False while the shard's metadata store is out of service after a storage failure
    /// (see [`gate`]); it comes back by itself.
    pub fn serving(&self) -> bool {
        self.gate.serving()
    }

    pub async fn counts(&self) -> crate::error::Result<crate::meta::Counts> {
        self.gate.read(|r| Ok(r.counts()?)).await
    }

    /// Removes replay records older than the TTL, one bounded page per write session so that
    /// pruning never holds the gate for long.
    pub async fn prune_replays(&self) -> crate::error::Result<usize> {
        const PAGE: usize = 500;
        let ttl_ms = self.cfg.replay_ttl.as_millis() as i64;
        let mut total = 0;
        // Read first: nothing to prune means no write session (see `reconcile`).
        let cutoff = self.clock.now_ms() - ttl_ms;
        if !self
            .gate
            .read(move |r| Ok(r.has_replays_before(cutoff)?))
            .await?
        {
            return Ok(0);
        }
        loop {
            let clock = self.clock.clone();
            let n = self
                .gate
                .write(move |w| Ok(w.prune_replays(clock.now_ms() - ttl_ms, PAGE)?))
                .await?;
            total += n;
            if n < PAGE {
                return Ok(total);
            }
        }
    }

    /// Removes terminal upload records (committed, aborted, claimed) that ended more than
    /// the history retention (at least the replay TTL) ago: no replay record can reference
    /// them any more, so history does not accumulate. One bounded page per write session; a
    /// record still named by a cleanup guard is kept (the guard's sweep reads it to decide
    /// whether the key is live). Also lets go of blocks held for the running digest of an
    /// upload left idle (see [`upload_digest::STALE_AFTER`]).
    pub async fn prune_uploads(&self) -> crate::error::Result<usize> {
        self.digests.release_stale(upload_digest::STALE_AFTER);
        const PAGE: usize = 500;
        // One rule for ledger history (see `operations`): max(history retention, replay TTL).
        let ttl_ms = self
            .cfg
            .history_retention
            .max(self.cfg.replay_ttl)
            .as_millis() as i64;
        let mut total = 0;
        let cutoff = self.history_cutoff();
        if self
            .gate
            .read(move |r| Ok(r.ended_uploads(cutoff, 1)?))
            .await?
            .is_empty()
        {
            return Ok(0);
        }
        loop {
            let clock = self.clock.clone();
            let (seen, removed) = self
                .gate
                .write(move |w| {
                    let ended = w.ended_uploads(clock.now_ms() - ttl_ms, PAGE)?;
                    let guarded: std::collections::HashSet<String> =
                        w.guards()?.into_iter().map(|(_, g)| g.upload_id).collect();
                    let mut removed = 0;
                    for id in &ended {
                        if !guarded.contains(id) {
                            w.remove_upload(id)?;
                            removed += 1;
                        }
                    }
                    Ok((ended.len(), removed))
                })
                .await?;
            total += removed;
            if seen < PAGE || removed == 0 {
                return Ok(total);
            }
        }
    }
}

pub(crate) fn to_entry(ws: &str, path: &str, r: &EntryRecord) -> pb::Entry {
    pb::Entry {
        workspace: ws.to_string(),
        path: path.to_string(),
        kind: r.kind,
        size: r.size,
        sha256: r.sha256.clone(),
        generation: r.generation,
        modified_ms: r.modified_ms,
        revision: r.revision,
        block_count: r.block_count,
        manifest_sha256: r.manifest_sha256.clone(),
    }
}
