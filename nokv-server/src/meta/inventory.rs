//! The inventory's tables: the shard's scan record and its quarantine observations (see
//! [`crate::shard::inventory`] for what they mean). Observations are indexed by when they were
//! last seen so that stale ones are pruned in bounded pages without reading the rest.

use redb::{ReadableTable, ReadableTableMetadata};

use super::{InventoryRecord, QuarantineRecord};
use super::{MetaResult, ReadView, WriteView, decode, optional};
use prost::Message;

const SCAN_KEY: &str = "scan";

macro_rules! inventory_reads {
    ($view:ty) => {
        impl $view {
            /// The shard's scan record (a default, never-scanned one if absent).
            pub fn inventory(&self) -> MetaResult<InventoryRecord> {
                let Some(t) = optional(self.txn.open_table(self.t.inventory))? else {
                    return Ok(InventoryRecord::default());
                };
                Ok(t.get(SCAN_KEY)?
                    .map(|v| decode(v.value()))
                    .transpose()?
                    .unwrap_or_default())
            }

            pub fn observation(&self, key: &str) -> MetaResult<Option<QuarantineRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.quarantine))? else {
                    return Ok(None);
                };
                t.get(key)?.map(|v| decode(v.value())).transpose()
            }

            /// How many observations the shard holds (a table length: constant cost).
            pub fn quarantined(&self) -> MetaResult<u64> {
                match optional(self.txn.open_table(self.t.quarantine))? {
                    Some(t) => Ok(t.len()?),
                    None => Ok(0),
                }
            }

            /// Up to `limit` observations in key order, strictly after `after` when given.
            pub fn observations(
                &self,
                after: Option<&str>,
                limit: usize,
            ) -> MetaResult<Vec<(String, QuarantineRecord)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.quarantine))? else {
                    return Ok(out);
                };
                let range = match after {
                    Some(a) => {
                        t.range::<&str>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))?
                    }
                    None => t.range::<&str>(..)?,
                };
                for item in range.take(limit) {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), decode(v.value())?));
                }
                Ok(out)
            }
        }
    };
}

inventory_reads!(ReadView);
inventory_reads!(WriteView<'_>);

impl WriteView<'_> {
    pub fn put_inventory(&mut self, rec: &InventoryRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.inventory)?;
        t.insert(SCAN_KEY, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    /// Records that scan `scan` saw the unaccounted object `key` of `size` bytes at `now_ms`:
    /// a new observation, or the existing one with its first sighting kept.
    pub fn observe(&mut self, key: &str, size: u64, now_ms: i64, scan: u64) -> MetaResult<()> {
        let old = self.observation(key)?;
        let first_seen_ms = old.as_ref().map_or(now_ms, |o| o.first_seen_ms);
        if let Some(old) = &old {
            self.table(self.t.quarantine_seen)?
                .remove((old.last_seen_ms, key))?;
        }
        let rec = QuarantineRecord {
            size,
            first_seen_ms,
            last_seen_ms: now_ms,
            seen_scan: scan,
        };
        self.table(self.t.quarantine)?
            .insert(key, rec.encode_to_vec().as_slice())?;
        self.table(self.t.quarantine_seen)?
            .insert((now_ms, key), ())?;
        Ok(())
    }

    /// Removes the observation of `key`, if any; returns whether there was one.
    pub fn forget_observation(&mut self, key: &str) -> MetaResult<bool> {
        let Some(old) = self.observation(key)? else {
            return Ok(false);
        };
        self.table(self.t.quarantine_seen)?
            .remove((old.last_seen_ms, key))?;
        self.table(self.t.quarantine)?.remove(key)?;
        Ok(true)
    }

    /// Removes up to `limit` observations last seen before `cutoff_ms`, least recently seen
    /// first; returns how many (a short page means none older is left).
    pub fn prune_observations(&mut self, cutoff_ms: i64, limit: usize) -> MetaResult<usize> {
        let mut victims = Vec::new();
        {
            let seen = self.table(self.t.quarantine_seen)?;
            for item in seen.range((i64::MIN, "")..(cutoff_ms, ""))?.take(limit) {
                let (k, _) = item?;
                let (ms, key) = k.value();
                victims.push((ms, key.to_string()));
            }
        }
        let mut seen = self.table(self.t.quarantine_seen)?;
        let mut quarantine = self.table(self.t.quarantine)?;
        for (ms, key) in &victims {
            seen.remove((*ms, key.as_str()))?;
            quarantine.remove(key.as_str())?;
        }
        Ok(victims.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MetaError, MetaStore};

    // Catches: a prune that ignores its page limit, or that removes recently seen ones.
    #[test]
    fn stale_observations_are_pruned_oldest_first_in_bounded_pages() {
        let dir = tempfile::tempdir().unwrap();
        let s = MetaStore::create(&dir.path().join("m.redb")).unwrap();
        s.write(|w| {
            for (i, ms) in [10i64, 20, 30, 40, 50].iter().enumerate() {
                w.observe(&format!("k{i}"), 1, *ms, 1)?;
            }
            // Seen again later: no longer stale, and its first sighting is kept.
            w.observe("k0", 1, 60, 2)?;
            Ok::<_, MetaError>(())
        })
        .unwrap();
        assert_eq!(s.write(|w| w.prune_observations(45, 2)).unwrap(), 2);
        assert_eq!(s.write(|w| w.prune_observations(45, 2)).unwrap(), 1);
        assert_eq!(s.write(|w| w.prune_observations(45, 2)).unwrap(), 0);
        let left: Vec<String> = s
            .read(|r| r.observations(None, 10))
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(left, ["k0", "k4"]);
        let k0 = s.read(|r| r.observation("k0")).unwrap().unwrap();
        assert_eq!((k0.first_seen_ms, k0.last_seen_ms), (10, 60));
        assert_eq!(s.read(|r| r.quarantined()).unwrap(), 2);
    }
}
