//! The shard's inventory: a durable, paged scan of the shard's key space on the provider
//! that records every object no record of the shard accounts for as a *quarantine
//! observation* (key, size, first and last seen). The scan only observes: it never deletes an
//! object, whatever it finds.
//!
//! **One page = one session.** A page is listed from the provider first (no lock held),
//! classified against a metadata snapshot taken *after* the listing (a write records its
//! guard before its provider call, so every listed object's record is already in that
//! snapshot — the audit's order, [`crate::audit`]), and then its observations and the scan's
//! continuation cursor commit together in one write session. A crash between pages loses
//! nothing: the next page lists strictly after the stored cursor, so a restart resumes where
//! the last committed page ended. The session re-checks that the scan and cursor are still
//! the ones the page was listed from, so a page can never be committed twice.
//!
//! **An incomplete scan proves nothing.** Only the session committing the final page marks
//! the scan complete. Then, and only then, observations last seen by an earlier scan are
//! known absent and removed (the *absence sweep*, in bounded pages that resume after a
//! crash). While a scan runs no retention work runs: stale-observation pruning waits for an
//! idle inventory. An observation whose key is accounted for when a page sees it again is
//! removed in that page's session (being accounted for is positive evidence, not absence).
//!
//! **Key spaces.** Each shard scans its own `<prefix>/sNNNN/`. Keys under the prefix that
//! belong to no shard (not `sNNNN/` of a shard of the placement, not `meta/` checkpoints) are
//! scanned by shard 0 into shard 0's store: its scan covers the whole prefix and jumps over
//! the other shards' ranges and `meta/` (the cursor is set past the range, so a jump costs
//! one listing). Checkpoints are never quarantined. The jump target of a range `D/` is `D0`
//! (`0` follows `/`): an object named exactly `D0` (e.g. `<prefix>/s00010`) is not seen.

use super::Shard;
use super::accounting::KeyClass;
use crate::error::Result;

/// Observations examined per session by the absence sweep and stale pruning.
const PAGE: usize = 500;

/// Which keys a shard's scan covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `<prefix>/sNNNN/` of the shard only.
    Own,
    /// Shard 0 of a placement of `shard_count` shards: its own keys and every key under the
    /// prefix that belongs to no shard.
    OwnAndForeign { shard_count: u32 },
}

/// What one call of [`Shard::inventory_page`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No scan is running.
    Idle,
    /// One page committed; `last` when it completed the scan.
    Page { last: bool },
}

/// A snapshot of the shard's inventory, for status.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub record: crate::meta::InventoryRecord,
    pub quarantined: u64,
}

impl Shard {
    /// Starts a scan now unless one is running; returns whether this call started it.
    /// Idempotent: a running scan keeps its cursor.
    pub async fn start_inventory(&self) -> Result<bool> {
        if self.gate.read(|r| Ok(r.inventory()?.running)).await? {
            return Ok(false);
        }
        let clock = self.clock.clone();
        self.gate
            .write(move |w| {
                let mut rec = w.inventory()?;
                if rec.running {
                    return Ok(false);
                }
                rec.scan += 1;
                rec.running = true;
                rec.cursor.clear();
                rec.pages = 0;
                rec.objects = 0;
                rec.started_ms = clock.now_ms();
                w.put_inventory(&rec)?;
                Ok(true)
            })
            .await
    }

    /// Starts a scan if none runs and the last one completed at least `interval` ago (or
    /// none ever did): the periodic schedule, judged from the durable record, so restarts do
    /// not add scans.
    pub async fn start_inventory_if_due(&self, interval: std::time::Duration) -> Result<bool> {
        let rec = self.gate.read(|r| Ok(r.inventory()?)).await?;
        let due = rec.completed == 0
            || self.clock.now_ms() - rec.last_completed_ms >= interval.as_millis() as i64;
        if rec.running || !due {
            return Ok(false);
        }
        self.start_inventory().await
    }

    /// Scans one page of at most `limit` objects (see the module doc). Finishes a pending
    /// absence sweep first.
    pub async fn inventory_page(&self, scope: Scope, limit: usize) -> Result<Step> {
        self.sweep_absent().await?;
        let rec = self.gate.read(|r| Ok(r.inventory()?)).await?;
        if !rec.running {
            return Ok(Step::Idle);
        }
        let within = match scope {
            Scope::Own => format!("s{:04}", self.id),
            Scope::OwnAndForeign { .. } => String::new(),
        };
        let after = (!rec.cursor.is_empty()).then_some(rec.cursor.as_str());
        let page = self
            .object
            .list_page(&within, after, limit.max(1))
            .await
            .map_err(crate::error::Error::from)?;
        // After the listing, never before (see the module doc).
        let ledger = self.ledger().await?;
        let mut seen = Vec::new();
        let mut jump = None;
        for (key, size) in page.objects {
            if let Some(target) = self.jump_target(scope, &key) {
                jump = Some(target);
                break;
            }
            let class = ledger.classify(&key);
            seen.push((key, size, class));
        }
        let last = jump.is_none() && page.last;
        let cursor = match (jump, seen.last()) {
            (Some(target), _) => target,
            (None, Some((key, _, _))) => key.clone(),
            (None, None) => rec.cursor.clone(),
        };
        let (scan, from) = (rec.scan, rec.cursor);
        let clock = self.clock.clone();
        let committed = self
            .gate
            .write(move |w| {
                let mut rec = w.inventory()?;
                // Another step committed this page meanwhile: never commit it twice.
                if !rec.running || rec.scan != scan || rec.cursor != from {
                    return Ok(false);
                }
                let now = clock.now_ms();
                for (key, size, class) in &seen {
                    if *class == KeyClass::Unaccounted {
                        w.observe(key, *size, now, scan)?;
                    } else {
                        w.forget_observation(key)?;
                    }
                }
                rec.cursor = cursor;
                rec.pages += 1;
                rec.objects += seen.len() as u64;
                if last {
                    rec.running = false;
                    rec.last_completed_ms = now;
                    rec.completed += 1;
                    rec.sweep_scan = scan;
                    rec.sweep_cursor.clear();
                }
                w.put_inventory(&rec)?;
                Ok(true)
            })
            .await?;
        if committed && last {
            self.sweep_absent().await?;
        }
        Ok(Step::Page { last })
    }

    /// Where shard 0's scan continues when `key` starts a range it does not scan (another
    /// shard's keys, checkpoints); `None` for a key it scans.
    fn jump_target(&self, scope: Scope, key: &str) -> Option<String> {
        let Scope::OwnAndForeign { shard_count } = scope else {
            return None;
        };
        let prefix = self.object.prefix();
        let rel = if prefix.is_empty() {
            key
        } else {
            key.strip_prefix(prefix)?.strip_prefix('/')?
        };
        let range = match self.object.shard_of_key(key) {
            Some(id) if id != self.id && id < shard_count => format!("s{id:04}"),
            _ if rel.starts_with("meta/") => "meta".to_string(),
            _ => return None,
        };
        Some(if prefix.is_empty() {
            format!("{range}0")
        } else {
            format!("{prefix}/{range}0")
        })
    }

    /// Removes, in bounded pages, the observations a completed scan did not see again (they
    /// are absent); a no-op unless a completed scan left that work pending.
    async fn sweep_absent(&self) -> Result<usize> {
        let mut removed = 0;
        loop {
            if self.gate.read(|r| Ok(r.inventory()?.sweep_scan)).await? == 0 {
                return Ok(removed);
            }
            removed += self
                .gate
                .write(|w| {
                    let mut rec = w.inventory()?;
                    if rec.sweep_scan == 0 {
                        return Ok(0);
                    }
                    let after = (!rec.sweep_cursor.is_empty()).then_some(rec.sweep_cursor.as_str());
                    let page = w.observations(after, PAGE)?;
                    let mut n = 0;
                    for (key, o) in &page {
                        if o.seen_scan < rec.sweep_scan {
                            w.forget_observation(key)?;
                            n += 1;
                        }
                    }
                    match page.last() {
                        Some((key, _)) if page.len() == PAGE => rec.sweep_cursor = key.clone(),
                        _ => {
                            rec.sweep_scan = 0;
                            rec.sweep_cursor.clear();
                        }
                    }
                    w.put_inventory(&rec)?;
                    Ok(n)
                })
                .await?;
        }
    }

    /// Removes observations not seen for `retention`, one bounded page per session; does
    /// nothing while a scan runs (an incomplete scan advances no retention).
    pub async fn prune_quarantine(&self, retention: std::time::Duration) -> Result<usize> {
        let mut total = 0;
        loop {
            let clock = self.clock.clone();
            let retention_ms = retention.as_millis() as i64;
            let n = self
                .gate
                .write(move |w| {
                    if w.inventory()?.running {
                        return Ok(0);
                    }
                    Ok(w.prune_observations(clock.now_ms() - retention_ms, PAGE)?)
                })
                .await?;
            total += n;
            if n < PAGE {
                return Ok(total);
            }
        }
    }

    /// The shard's scan record and observation count (a snapshot read).
    pub async fn inventory_status(&self) -> Result<Status> {
        self.gate
            .read(|r| {
                Ok(Status {
                    record: r.inventory()?,
                    quarantined: r.quarantined()?,
                })
            })
            .await
    }

    /// Up to `limit` observations in key order, strictly after `after`.
    pub async fn quarantine(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(String, crate::meta::QuarantineRecord)>> {
        self.gate
            .read(move |r| Ok(r.observations(after.as_deref(), limit)?))
            .await
    }
}

#[cfg(test)]
mod tests;
