//! Per-workspace byte quotas (`nokv admin quota set WS BYTES|none`) and the byte accounting
//! they are checked against, kept in the workspace's shard ([`crate::meta::UsageRecord`]).
//!
//! * **used bytes**: the sizes of the workspace's live entries. A small-file write adds its
//!   size and releases the replaced entry's; a commit adds the artifact's; deleting or
//!   overwriting an entry releases its size in the session that retires it (a retired
//!   revision in its grace is not counted); workspace deletion releases every entry's.
//! * **reserved bytes / reservations**: a BeginUpload reserves the artifact's declared size
//!   in its admit session, before any provider I/O, and is refused with `QuotaExceeded`
//!   (gRPC `RESOURCE_EXHAUSTED`) when used + reserved + size would pass the quota, or with
//!   `AdmissionCapReached` at an admission cap (see [`super::admission`]). The commit
//!   session consumes the reservation (reserved → used); abort, the reconciler's expiry
//!   reclaim and workspace deletion release it. An upload claimed after expiry whose write
//!   attempt is still unsettled (`Deleting`) keeps its reservation until it is `Reclaimed`:
//!   its bytes may still land, so its accounting stays (seed 001). Hence the invariant that
//!   health checks: a shard's reservations equal its unresolved uploads.
//! * A small-file write that would pass the quota is refused with `QuotaExceeded`.
//!
//! Every counter changes in the write session that changes the state it counts, through
//! the functions below; [`crate::meta::ReadView::recount_usage`] derives them from that
//! state for tests and audits. A quota may be set below current usage: nothing is removed,
//! new reservations and growing writes are refused until usage falls below it. Completing
//! a workspace deletion removes its quota with everything else of it (the name is then a
//! fresh workspace).

use super::Shard;
use super::admission::Caps;
use crate::error::{Error, Result};
use crate::meta::{UploadRecord, UsageDelta, UsageRecord, WriteView};

/// The accounting context of one shard, cloned into the write sessions that change usage.
#[derive(Debug, Clone)]
pub struct Accounts {
    shard: u32,
    caps: Caps,
}

impl Accounts {
    pub fn new(shard: u32, caps: Caps) -> Accounts {
        Accounts { shard, caps }
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// Applies `d` to `ws` and publishes the shard's unresolved count to the node's census
    /// (from inside the session, so a shard's publications follow its commit order).
    fn change(&self, w: &mut WriteView, ws: &str, d: UsageDelta) -> Result<UsageRecord> {
        let rec = w.change_usage(ws, d)?;
        if d.reservations != 0 {
            self.caps
                .census
                .publish(self.shard, w.usage_totals()?.reservations);
        }
        Ok(rec)
    }

    /// Reserves `upload.size` bytes for a new upload of its workspace, or refuses it (quota,
    /// admission caps) changing nothing; marks the record as holding the reservation. The
    /// caller stores the record in the same session.
    pub fn reserve(&self, w: &mut WriteView, upload: &mut UploadRecord) -> Result<()> {
        let ws = upload.workspace.as_str();
        let u = w.usage(ws)?;
        if let Some(quota) = u.quota
            && u.used_bytes + u.reserved_bytes + upload.size > quota
        {
            return Err(quota_exceeded(ws, quota, &u, upload.size));
        }
        let in_shard = w.usage_totals()?.reservations;
        self.caps.admit(self.shard, ws, u.reservations, in_shard)?;
        self.change(
            w,
            ws,
            UsageDelta {
                reserved_bytes: upload.size as i64,
                reservations: 1,
                ..Default::default()
            },
        )?;
        upload.reserved = true;
        Ok(())
    }

    /// The commit session: the upload's bytes become used, its reservation (if it holds one)
    /// is consumed.
    pub fn consume(&self, w: &mut WriteView, upload: &mut UploadRecord) -> Result<()> {
        let held = std::mem::take(&mut upload.reserved);
        let size = upload.size as i64;
        self.change(
            w,
            &upload.workspace,
            UsageDelta {
                used_bytes: size,
                reserved_bytes: if held { -size } else { 0 },
                reservations: -i64::from(held),
            },
        )?;
        Ok(())
    }

    /// Abort, reclaim or workspace deletion: the upload's reservation (if it still holds one)
    /// is released. Idempotent: the record stops holding it.
    pub fn release(&self, w: &mut WriteView, upload: &mut UploadRecord) -> Result<()> {
        if !std::mem::take(&mut upload.reserved) {
            return Ok(());
        }
        self.change(
            w,
            &upload.workspace,
            UsageDelta {
                reserved_bytes: -(upload.size as i64),
                reservations: -1,
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// A small-file write of `new` bytes replacing an entry of `old` bytes (0: none): refused
    /// with `QuotaExceeded` when it grows usage past the quota; otherwise counted.
    pub fn charge_write(&self, w: &mut WriteView, ws: &str, old: u64, new: u64) -> Result<()> {
        // Only growth can pass the quota (a put that does not grow usage reads nothing).
        if new > old {
            let u = w.usage(ws)?;
            if let Some(quota) = u.quota
                && u.used_bytes + u.reserved_bytes + (new - old) > quota
            {
                return Err(quota_exceeded(ws, quota, &u, new - old));
            }
        }
        if new != old {
            self.change(
                w,
                ws,
                UsageDelta {
                    used_bytes: new as i64 - old as i64,
                    ..Default::default()
                },
            )?;
        }
        Ok(())
    }

    /// An entry of `size` bytes was deleted, replaced by a commit, or removed with its
    /// workspace.
    pub fn release_entry(&self, w: &mut WriteView, ws: &str, size: u64) -> Result<()> {
        self.change(
            w,
            ws,
            UsageDelta {
                used_bytes: -(size as i64),
                ..Default::default()
            },
        )?;
        Ok(())
    }
}

fn quota_exceeded(ws: &str, quota: u64, u: &UsageRecord, more: u64) -> Error {
    Error::QuotaExceeded(format!(
        "workspace {ws:?} has a quota of {quota} bytes: {} used + {} reserved + {more} more \
         would pass it",
        u.used_bytes, u.reserved_bytes
    ))
}

impl Shard {
    /// Sets (`Some`) or removes (`None`) the byte quota of `ws`; answers its usage. Refused
    /// while the workspace is being deleted.
    pub async fn set_quota(&self, ws: &str, quota: Option<u64>) -> Result<UsageRecord> {
        let ws = ws.to_string();
        self.gate
            .write(move |w| {
                super::deletion_fence::require_not_deleting(w, &ws)?;
                Ok(w.set_quota(&ws, quota)?)
            })
            .await
    }

    /// The quota and usage of `ws` (a snapshot read).
    pub async fn usage(&self, ws: &str) -> Result<UsageRecord> {
        self.gate.read(|r| Ok(r.usage(ws)?)).await
    }

    /// The shard's totals of every workspace's usage (a snapshot read).
    pub async fn usage_totals(&self) -> Result<crate::meta::UsageTotals> {
        self.gate.read(|r| Ok(r.usage_totals()?)).await
    }

    /// The counters as a full recount of entries and uploads derives them (tests, audits).
    pub async fn recount_usage(&self) -> Result<crate::meta::UsageRecount> {
        self.gate.read(|r| Ok(r.recount_usage()?)).await
    }

    /// Publishes the committed unresolved count to the node's census (after a failed commit
    /// the in-session publication may be wrong; the reconciler calls this every pass).
    pub(crate) async fn publish_census(&self) -> Result<()> {
        let n = self.usage_totals().await?.reservations;
        self.accounts.caps().census.publish(self.id, n);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
