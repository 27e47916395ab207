//! Owning shards: acquiring, marking changed or draining, and releasing them, each one
//! fenced transaction; and the memory-only answers of the write path.
//!
//! Invariants:
//! * acquisition is one transaction: `create_revision(owner) == 0` and
//!   `mod_revision(record) == seen` → record at `epoch + 1` plus the owner key under this
//!   node's lease; so epochs of a shard strictly increase and two acquisitions never share one;
//! * a shard enters the owned table only after etcd committed its acquisition (or, in
//!   [`EtcdControl::balance_step`], after finding an owner key under this lease);
//! * every later write to the record ([`EtcdControl::mark_changed`],
//!   [`EtcdControl::mark_draining`], [`EtcdControl::release`]) is guarded by this ownership's
//!   owner key (its create revision and lease): a deposed owner changes nothing;
//! * [`EtcdControl::acknowledge_epoch`] and [`EtcdControl::holding`] read memory only (owned
//!   table and deadline) and refuse once the deadline passed or a release began (fail closed);
//!   a release stops acknowledging before its transaction is sent.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::records::{CheckpointRef, LogRef, OwnerKey, ShardRecord, ShardState, decode, encode};
use super::{Acquisition, EtcdControl, Owned};
use crate::control::{ControlError, Epoch};

type Result<T, E = ControlError> = std::result::Result<T, E>;

impl EtcdControl {
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
        self.settle_changed(shard, owned, marked, true)
    }

    /// After a guarded update of `shard`'s record as `owned`: a refused one means the owner
    /// key is gone (the shard is no longer ours); an applied one sets what this ownership
    /// knows of `changed` (unless the ownership was replaced meanwhile).
    fn settle_changed(&self, shard: u32, owned: Owned, applied: bool, changed: bool) -> Result<()> {
        if !applied {
            self.owned.lock().remove(&shard);
            return Err(ControlError::NotOwner { shard });
        }
        if let Some(o) = self.owned.lock().get_mut(&shard)
            && o.owner_revision == owned.owner_revision
        {
            o.changed = changed;
        }
        Ok(())
    }

    /// Records, before this node serves `shard`, what its durable state is from now on: the
    /// checkpoint `base` if given (else the record's own), plus — with provider durability —
    /// this node's log from `log` (`changed`: the shard may differ from its checkpoint from
    /// now on; no later [`EtcdControl::mark_changed`] is needed). Without `log` the shard is
    /// exactly `base` (then required) and unchanged. Replaces any earlier owner's log: the
    /// caller has made everything it held part of `base`. Guarded by the owner key.
    pub async fn record_state(
        &self,
        shard: u32,
        base: Option<CheckpointRef>,
        log: Option<LogRef>,
    ) -> Result<()> {
        let owned = self.owned_now(shard)?;
        if let Some(c) = &base
            && c.epoch != owned.epoch
        {
            return Err(ControlError::InvalidArgument(format!(
                "checkpoint of epoch {} cannot be the base of shard {shard} owned at epoch {}",
                c.epoch, owned.epoch
            )));
        }
        if let Some(l) = &log
            && l.epoch != owned.epoch
        {
            return Err(ControlError::InvalidArgument(format!(
                "a log recorded at epoch {} cannot be the log of shard {shard} owned at epoch {}",
                l.epoch, owned.epoch
            )));
        }
        let changed = log.is_some();
        let recorded = self
            .update_guarded(
                shard,
                owned,
                move |r| {
                    if base.is_some() {
                        r.checkpoint = base;
                    }
                    r.log = log;
                    r.changed = changed;
                },
                false,
            )
            .await?;
        self.settle_changed(shard, owned, recorded, changed)
    }

    /// The record that this node's acquisition of `shard` replaced (`Some(None)`: there was
    /// none), taken once by the loader.
    pub fn take_previous(&self, shard: u32) -> Option<Option<ShardRecord>> {
        self.previous.lock().remove(&shard)
    }

    /// The record this node's acquisition of `shard` replaced, kept for a load that fails and
    /// is retried (the record in etcd then already names this node's epoch);
    /// [`EtcdControl::take_previous`] once the load succeeded.
    pub fn previous(&self, shard: u32) -> Option<Option<ShardRecord>> {
        self.previous.lock().get(&shard).cloned()
    }

    /// Stops acknowledging `shard` at once (the first step of a release); it stays owned in
    /// etcd until [`EtcdControl::release`].
    pub fn stop_acknowledging(&self, shard: u32) {
        if let Some(o) = self.owned.lock().get_mut(&shard) {
            o.acknowledging = false;
        }
    }

    /// This node's ownership of `shard` as it stands (regardless of the deadline), or
    /// `NotOwner`.
    fn owned_now(&self, shard: u32) -> Result<Owned> {
        self.check_shard(shard)?;
        self.owned
            .lock()
            .get(&shard)
            .copied()
            .ok_or(ControlError::NotOwner { shard })
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

    pub(super) fn check_shard(&self, shard: u32) -> Result<()> {
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
            checkpoint: record.as_ref().and_then(|r| r.checkpoint.clone()),
            changed: false,
            target: None,
            // The state is still the previous owner's: checkpoint plus that log (provider
            // durability), until this owner replaces both (see `record_state`).
            log: record.and_then(|r| r.log),
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
        self.mark_state(shard, ShardState::Draining).await
    }

    /// Marks an owned shard `serving` again (a handoff that was given up, see
    /// [`EtcdControl::resume_acknowledging`]). Guarded by this node's owner key like
    /// [`EtcdControl::mark_draining`]: `NotOwner` (and the shard forgotten) if this ownership
    /// is gone. Until it succeeds the other nodes route the shard as moving (retry).
    pub async fn mark_serving(&self, shard: u32) -> Result<()> {
        self.faults.mark_serving(shard)?;
        self.mark_state(shard, ShardState::Serving).await
    }

    /// Sets an owned shard's record state, guarded by this ownership's owner key; a shard
    /// whose owner key is gone is forgotten (`NotOwner`).
    async fn mark_state(&self, shard: u32, state: ShardState) -> Result<()> {
        let owned = self.owned_now(shard)?;
        if !self
            .update_guarded(shard, owned, |r| r.state = state, false)
            .await?
        {
            self.owned.lock().remove(&shard);
            return Err(ControlError::NotOwner { shard });
        }
        Ok(())
    }

    /// Undoes [`EtcdControl::stop_acknowledging`] for a release that was never sent: the
    /// shard is acknowledged again at the same epoch. False if it is no longer owned (the
    /// lease lapsed, or [`EtcdControl::mark_serving`] found the owner key gone).
    ///
    /// Safe because nothing left this node: the owner key still excludes every other node, the
    /// epoch is the one the store holds, and the lease deadline still bounds every
    /// acknowledgement.
    pub fn resume_acknowledging(&self, shard: u32) -> bool {
        match self.owned.lock().get_mut(&shard) {
            Some(o) => {
                o.acknowledging = true;
                true
            }
            None => false,
        }
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
        let epoch = self.owned_now(shard)?.epoch;
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
                    // ownership changed nothing (e.g. a shard released before it was loaded),
                    // or if its log is in the provider (then checkpoint + log still hold
                    // every acknowledged write). A new checkpoint holds everything: the log
                    // is no longer needed.
                    if checkpoint.is_some() {
                        r.checkpoint = checkpoint;
                        r.log = None;
                    } else if owned.changed && r.log.is_none() {
                        r.checkpoint = None;
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
            log: None,
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
}
