//! Tables of the per-workspace byte accounting: each workspace's [`UsageRecord`] and the
//! shard's totals over all of them.
//!
//! Invariant: the totals row equals the sum of the workspace rows, because both change only
//! through [`WriteView::change_usage`], in the same write session. The counters themselves
//! equal what [`ReadView::recount_usage`] derives from the entries and upload records — the
//! callers (the shard's quota module) change them in the session that changes that state;
//! tests and audits compare the two.

use std::collections::BTreeMap;

use redb::ReadableTable;

use super::{EntryRecord, ReadView, UploadRecord, WriteView};
use super::{MetaResult, UploadState, UsageRecord, decode, optional};
use prost::Message;

const USED: &str = "used_bytes";
const RESERVED: &str = "reserved_bytes";
const RESERVATIONS: &str = "reservations";

/// The shard's totals of every workspace's usage.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageTotals {
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    pub reservations: u64,
}

/// A change to one workspace's counters (signed; a counter never goes below 0).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UsageDelta {
    pub used_bytes: i64,
    pub reserved_bytes: i64,
    pub reservations: i64,
}

/// What the entries and upload records of one snapshot say the counters must be.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct UsageRecount {
    /// Per workspace, quota left unset (a setting, not a count); empty workspaces omitted.
    pub workspaces: BTreeMap<String, UsageRecord>,
    pub totals: UsageTotals,
}

fn apply(v: u64, d: i64) -> u64 {
    if d >= 0 {
        v.saturating_add(d as u64)
    } else {
        v.saturating_sub(d.unsigned_abs())
    }
}

macro_rules! usage_reads {
    ($view:ty) => {
        impl $view {
            /// The usage of `ws` (empty when it has no row).
            pub fn usage(&self, ws: &str) -> MetaResult<UsageRecord> {
                let Some(t) = optional(self.txn.open_table(self.t.usage))? else {
                    return Ok(UsageRecord::default());
                };
                Ok(t.get(ws)?
                    .map(|v| decode(v.value()))
                    .transpose()?
                    .unwrap_or_default())
            }

            /// Every workspace's usage row, by name.
            pub fn usage_records(&self) -> MetaResult<BTreeMap<String, UsageRecord>> {
                let mut out = BTreeMap::new();
                let Some(t) = optional(self.txn.open_table(self.t.usage))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    let (k, v) = item?;
                    out.insert(k.value().to_string(), decode(v.value())?);
                }
                Ok(out)
            }

            /// The shard's totals (three point reads: constant cost, for health).
            pub fn usage_totals(&self) -> MetaResult<UsageTotals> {
                let Some(t) = optional(self.txn.open_table(self.t.usage_totals))? else {
                    return Ok(UsageTotals::default());
                };
                let get =
                    |k: &str| -> MetaResult<u64> { Ok(t.get(k)?.map(|v| v.value()).unwrap_or(0)) };
                Ok(UsageTotals {
                    used_bytes: get(USED)?,
                    reserved_bytes: get(RESERVED)?,
                    reservations: get(RESERVATIONS)?,
                })
            }

            /// Derives the counters from the state they count, by a full scan of entries and
            /// upload records (tests and audits only; cost follows the whole shard): used =
            /// the sizes of live entries; reserved = the sizes of unresolved (open or
            /// deleting) uploads that hold a reservation.
            pub fn recount_usage(&self) -> MetaResult<UsageRecount> {
                let mut out = UsageRecount::default();
                for item in self.txn.open_table(self.t.entries)?.iter()? {
                    let (k, v) = item?;
                    let e: EntryRecord = decode(v.value())?;
                    let (ws, _) = k.value();
                    out.workspaces.entry(ws.to_string()).or_default().used_bytes += e.size;
                    out.totals.used_bytes += e.size;
                }
                for item in self.txn.open_table(self.t.uploads)?.iter()? {
                    let u: UploadRecord = decode(item?.1.value())?;
                    let unresolved = u.state == UploadState::Open as i32
                        || u.state == UploadState::Deleting as i32;
                    if u.reserved && unresolved {
                        let w = out.workspaces.entry(u.workspace.clone()).or_default();
                        w.reserved_bytes += u.size;
                        w.reservations += 1;
                        out.totals.reserved_bytes += u.size;
                        out.totals.reservations += 1;
                    }
                }
                out.workspaces.retain(|_, r| !r.is_empty());
                Ok(out)
            }
        }
    };
}

usage_reads!(ReadView);
usage_reads!(WriteView<'_>);

impl WriteView<'_> {
    /// Applies `d` to the counters of `ws` and to the shard's totals (never below 0); drops
    /// the row once it is empty. Returns the new row.
    pub fn change_usage(&mut self, ws: &str, d: UsageDelta) -> MetaResult<UsageRecord> {
        // A rewrite of the same size changes no counter: writing the rows anyway would cost a
        // put two more tables in the batch's commit for nothing.
        if d == UsageDelta::default() {
            return self.usage(ws);
        }
        let mut rec = self.usage(ws)?;
        rec.used_bytes = apply(rec.used_bytes, d.used_bytes);
        rec.reserved_bytes = apply(rec.reserved_bytes, d.reserved_bytes);
        rec.reservations = apply(rec.reservations, d.reservations);
        self.put_usage(ws, &rec)?;
        let mut totals = self.table(self.t.usage_totals)?;
        for (name, delta) in [
            (USED, d.used_bytes),
            (RESERVED, d.reserved_bytes),
            (RESERVATIONS, d.reservations),
        ] {
            if delta != 0 {
                let v = totals.get(name)?.map(|v| v.value()).unwrap_or(0);
                totals.insert(name, apply(v, delta))?;
            }
        }
        Ok(rec)
    }

    /// Sets (or with `None` removes) the byte quota of `ws`; the counters are untouched.
    pub fn set_quota(&mut self, ws: &str, quota: Option<u64>) -> MetaResult<UsageRecord> {
        let mut rec = self.usage(ws)?;
        rec.quota = quota;
        self.put_usage(ws, &rec)?;
        Ok(rec)
    }

    fn put_usage(&mut self, ws: &str, rec: &UsageRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.usage)?;
        if rec.is_empty() {
            t.remove(ws)?;
        } else {
            t.insert(ws, rec.encode_to_vec().as_slice())?;
        }
        Ok(())
    }
}
