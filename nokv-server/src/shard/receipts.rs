//! Resumable publication under a stable receipt (seed 000's generated-output rule).
//!
//! A receipt names one logical publication in a workspace: its identity is the path, the size
//! and the whole-file sha256 the client declares at BeginUpload, and never changes. The shard
//! keeps (workspace, receipt) → identity + the receipt's latest upload in its own table. A
//! BeginUpload under a receipt, in one write session:
//!
//! * **another identity** → `RequestIdReused`, nothing changes: a receipt never names two
//!   publications;
//! * **already committed** → the entry the commit published, no upload and no block write;
//! * **upload open and its lease live** → that same upload (its capability again), its lease
//!   renewed, and the indexes of the blocks already recorded: the client sends only the
//!   others. Every block attempt still gets a fresh object key in the sequencer's admit
//!   session, so a superseded attempt of the dead client can never publish into the block;
//! * **otherwise** (no record yet, or the upload expired, was reclaimed or aborted) → a new
//!   upload, which the receipt now names. An expired upload is never revived: it may already
//!   be claimed, and the reconciler owns it from its expiry on.
//!
//! The commit session of a receipt's upload calls [`on_commit`]: the declared sha256 must be
//! the receipt's (so a receipt can only ever publish its identity), and the published entry is
//! recorded so that a rerun answers it. A receipt record lives exactly as long as the upload
//! record it names (the meta layer drops it when pruning that record), so receipts follow the
//! same history rules as ended uploads.

use nokv_proto::v1 as pb;

use super::replay::RequestKey;
use super::{Shard, to_entry};
use crate::error::{Error, Result};
use crate::ids::random_hex;
use crate::meta::{BlockState, EntryRecord, ReceiptRecord, UploadRecord, UploadState, WriteView};

impl Shard {
    /// BeginUpload with a non-empty `req.receipt` (see the module docs). `req.size` was
    /// already bounded by the caller.
    pub(super) async fn begin_receipt_upload(
        &self,
        mut req: pb::BeginUploadRequest,
    ) -> Result<pb::BeginUploadResponse> {
        if req.sha256.len() != 32 {
            return Err(Error::InvalidArgument(
                "a BeginUpload with a receipt must declare the source's 32-byte sha256".into(),
            ));
        }
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "BeginUpload", &req);
        let block_size = self.cfg.block_size;
        let block_count = req.size.div_ceil(block_size) as u32;
        let lease_ms = self.cfg.upload_lease.as_millis() as i64;
        let fresh_id = format!("{}.{}", self.id, random_hex(16));
        let signer = self.signer.clone();
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                if let Some(done) = key.recorded(w)? {
                    return done;
                }
                super::deletion_fence::require_not_deleting(w, &req.workspace)?;
                let now = clock.now_ms();
                let answer = |upload_id: String, lease_expires_ms: i64| pb::BeginUploadResponse {
                    upload_token: signer.upload_capability(&upload_id),
                    upload_id,
                    block_size,
                    block_count,
                    lease_expires_ms,
                    lease_ms: lease_ms as u64,
                    ..Default::default()
                };
                let (ws, name) = (req.workspace.as_str(), req.receipt.as_str());
                let existing = w.receipt(ws, name)?;
                if let Some(r) = &existing {
                    require_same_identity(r, &req)?;
                }
                let open = match &existing {
                    Some(r) if r.committed.is_none() => resumable(w, &r.upload_id, now)?,
                    _ => None,
                };
                let resp = match (existing, open) {
                    (
                        Some(ReceiptRecord {
                            committed: Some(entry),
                            path,
                            ..
                        }),
                        _,
                    ) => pb::BeginUploadResponse {
                        committed: Some(to_entry(ws, &path, &entry)),
                        block_size,
                        block_count,
                        ..Default::default()
                    },
                    (Some(r), Some(mut upload)) => {
                        upload.lease_expires_ms = now + lease_ms;
                        w.put_upload(&r.upload_id, &upload)?;
                        let recorded = w
                            .blocks(&r.upload_id)?
                            .into_iter()
                            .filter(|(_, b)| b.state == BlockState::Uploaded as i32)
                            .map(|(i, _)| i)
                            .collect();
                        tracing::info!(
                            upload = %r.upload_id,
                            receipt = name,
                            "resuming the receipt's open upload"
                        );
                        pb::BeginUploadResponse {
                            recorded_blocks: recorded,
                            ..answer(r.upload_id, upload.lease_expires_ms)
                        }
                    }
                    (previous, _) => {
                        let mut rec = UploadRecord::open(
                            &req.workspace,
                            &req.path,
                            req.size,
                            block_count,
                            now,
                            lease_ms,
                            &req.receipt,
                        );
                        // Before any provider I/O: a refusal here changes nothing.
                        accounts.reserve(w, &mut rec)?;
                        w.put_upload(&fresh_id, &rec)?;
                        w.put_receipt(
                            ws,
                            name,
                            &ReceiptRecord {
                                path: req.path.clone(),
                                size: req.size,
                                sha256: req.sha256.clone(),
                                upload_id: fresh_id.clone(),
                                created_ms: previous.map_or(now, |p| p.created_ms),
                                committed: None,
                            },
                        )?;
                        answer(fresh_id, rec.lease_expires_ms)
                    }
                };
                key.record(w, &resp, now)?;
                Ok(resp)
            })
            .await
    }
}

/// The receipt's upload when it can still be resumed: open with a live lease by the shard
/// clock (read inside the session).
fn resumable(w: &WriteView, upload_id: &str, now: i64) -> Result<Option<UploadRecord>> {
    Ok(w.upload(upload_id)?
        .filter(|u| u.state == UploadState::Open as i32 && u.lease_expires_ms > now))
}

/// A receipt names one publication: the same path, size and whole-file sha256, always.
fn require_same_identity(r: &ReceiptRecord, req: &pb::BeginUploadRequest) -> Result<()> {
    if r.path == req.path && r.size == req.size && r.sha256 == req.sha256 {
        return Ok(());
    }
    Err(Error::RequestIdReused(format!(
        "receipt {:?} already names another publication ({}: {} bytes, sha256 {}); a receipt \
         publishes one file only",
        req.receipt,
        r.path,
        r.size,
        hex::encode(&r.sha256)
    )))
}

/// Called by the commit session of every upload, before it returns: for an upload begun under
/// a receipt, refuses a declared sha256 other than the receipt's (`DigestMismatch`; the
/// session then aborts and changes nothing) and records the published entry in the receipt.
pub(super) fn on_commit(
    w: &mut WriteView,
    upload_id: &str,
    upload: &UploadRecord,
    declared_sha256: &[u8],
    entry: &EntryRecord,
) -> Result<()> {
    if upload.receipt.is_empty() {
        return Ok(());
    }
    let Some(mut r) = w.receipt(&upload.workspace, &upload.receipt)? else {
        return Ok(());
    };
    if r.sha256 != declared_sha256 {
        return Err(Error::DigestMismatch(format!(
            "the commit declares another sha256 than receipt {:?} was begun with; nothing was \
             published",
            upload.receipt
        )));
    }
    if r.upload_id == upload_id {
        r.committed = Some(entry.clone());
        w.put_receipt(&upload.workspace, &upload.receipt, &r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
