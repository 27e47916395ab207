//! Balancing: which shards a node may take ([`takeable`]) and one step that takes free shards
//! up to its share and reports the surplus to hand off ([`EtcdControl::balance_step`]).
//!
//! Invariants:
//! * every shard taken goes through [`EtcdControl::acquire`] (the fenced transaction); the
//!   step itself writes nothing else to etcd;
//! * an owner key under this node's lease that the owned table does not know (an acquisition
//!   whose answer was lost) is adopted, never re-acquired;
//! * a shard with an owner key is never taken; a shard without one only when [`takeable`]
//!   admits it, so an acknowledged write is never lost to a takeover (a shard whose log is in
//!   the provider is taken by anyone, who fences and replays it; under local durability a
//!   changed shard waits for its owner, a handoff without checkpoint for its last owner);
//! * the step never releases anything: it only reports a surplus, which the caller hands off
//!   gracefully (checkpoint, then [`EtcdControl::release`]).

use std::collections::BTreeMap;

use etcd_client::{GetOptions, KeyValue};

use super::records::{OwnerKey, ShardRecord, ShardState, decode};
use super::{Acquisition, BalanceReport, EtcdControl, Owned};
use crate::control::ControlError;

type Result<T, E = ControlError> = std::result::Result<T, E>;

impl EtcdControl {
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
}

/// Whether node `me` may take a shard nobody holds (no owner key), given its record:
/// * no record: a new shard;
/// * `handoff` with a checkpoint: released gracefully — by anyone, unless it is addressed to
///   another live node; `handoff` without a checkpoint: only by its last owner (the data is on
///   its disk);
/// * `serving`/`draining` (the owner's lease lapsed: a crash or a pause): by the same node
///   (restarted with its data dir); by anyone if its owner logs it to the provider (`log`:
///   checkpoint plus log hold every acknowledged write, and the taker fences the log before
///   reading it); or by anyone if the owner never marked it changed and its checkpoint is
///   the one it was taken from or one it recorded itself — then it still equals that
///   checkpoint and nothing acknowledged can be lost. Otherwise (local durability) it waits
///   for its owner;
/// * a handoff without checkpoint whose log is in the provider, likewise by anyone.
pub(super) fn takeable(record: Option<&ShardRecord>, me: &str, live: &[String]) -> bool {
    let Some(r) = record else {
        return true;
    };
    let mine = r.owner.as_deref() == Some(me);
    match r.state {
        ShardState::Handoff => match (&r.checkpoint, &r.target) {
            (None, _) => mine || r.log.is_some(),
            (Some(_), Some(target)) => target == me || !live.contains(target),
            (Some(_), None) => true,
        },
        ShardState::Serving | ShardState::Draining => {
            mine || r.log.is_some()
                || (!r.changed
                    && r.checkpoint
                        .as_ref()
                        .is_some_and(|c| c.epoch + 1 == r.epoch || c.epoch == r.epoch))
        }
    }
}

/// FNV-1a: a stable (cross-process, cross-version) hash for the balance start offset.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
