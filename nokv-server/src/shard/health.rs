//! One shard's health counters, as `nokv admin health` reports them and the metrics endpoint
//! exports them: computed here once, from MVCC reads (no write session), so the two views
//! can never disagree on what a counter means.

use std::collections::HashMap;

use nokv_proto::v1 as pb;

use super::Shard;
use crate::error::{Error, Result};
use crate::meta::{Counts, OpState};

impl Shard {
    /// This shard's health. A shard whose store is out of service reports itself not serving,
    /// with zero counts, instead of failing: health must answer during an outage.
    pub async fn health(&self) -> Result<pb::ShardHealth> {
        let (serving, c) = match self.counts().await {
            Ok(c) => (self.serving(), c),
            Err(Error::Unavailable(_)) => (false, Default::default()),
            Err(e) => return Err(e),
        };
        let quarantined = match self.inventory_status().await {
            Ok(st) => st.quarantined,
            Err(Error::Unavailable(_)) => 0,
            Err(e) => return Err(e),
        };
        let totals = match self.usage_totals().await {
            Ok(t) => t,
            Err(Error::Unavailable(_)) => Default::default(),
            Err(e) => return Err(e),
        };
        let (operations, oldest_unresolved_age_ms) = ledger_health(&c, self.now_ms());
        let unresolved_uploads = c.uploads + c.deleting_uploads;
        Ok(pb::ShardHealth {
            operations,
            oldest_unresolved_age_ms,
            shard: self.id,
            owned: true,
            entries: c.entries,
            open_uploads: c.uploads,
            guards: c.guards,
            serving,
            unknown_guards: c.unknown_guards,
            unresolved_uploads,
            guards_finished: c.guards - c.unknown_guards,
            collectable: c.collectable,
            quarantined,
            dead_letters: c.operations[OpState::DeadLetter as usize],
            reserved_bytes: totals.reserved_bytes,
            reservations: totals.reservations,
            // Every unresolved upload holds exactly one reservation (see `quota`).
            reservations_match: totals.reservations == unresolved_uploads,
        })
    }
}

/// Ledger operations per state name (every state, zeros included) and the age of the oldest
/// unresolved one at `now_ms` (0 when none is).
fn ledger_health(c: &Counts, now_ms: i64) -> (HashMap<String, u64>, i64) {
    let operations = OpState::ALL
        .iter()
        .enumerate()
        .map(|(i, st)| (st.name().to_string(), c.operations[i]))
        .collect();
    let age = c
        .oldest_unresolved_ms
        .map_or(0, |created| (now_ms - created).max(0));
    (operations, age)
}
