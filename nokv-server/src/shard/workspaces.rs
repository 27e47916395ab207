//! Workspace deletion: a fence first, then the contents released in bounded pages.
//!
//! Workspaces are implicit — a name exists by having entries — so the shard keeps a record
//! only for a workspace being deleted (`meta` table `workspaces`: name → state `Deleting`
//! and the deletion's progress).
//!
//! `DeleteWorkspace` runs as write sessions on the gate, none of them doing provider I/O:
//! 1. **Fence** (one session, with request-id replay): the record is set to `Deleting`. From
//!    that commit on, [`require_not_deleting`](super::deletion_fence::require_not_deleting) — called by the sessions of Write, Delete,
//!    BeginUpload, PutBlock admission, RenewUpload and CommitUpload — refuses every mutation
//!    of the workspace with `FailedPrecondition`, by state read inside that session, so no
//!    mutation admitted after the fence can leave anything behind. The same session already
//!    releases the first page.
//! 2. **Pages** (one session each, at most [`PAGE`] items): the workspace's open uploads are
//!    ended (state `Aborted`; their recorded blocks become collectable, pending attempts keep
//!    their unknown-writer guards), its entries are removed with their inline bodies, the
//!    revisions they point at are dropped and their block keys made collectable, and its
//!    retired revisions (replaced or deleted artifacts still in their grace) are released the
//!    same way, found by a resumable cursor over the retired index.
//! 3. **Completion**: the session whose page finds nothing left removes the record. That
//!    frees the name: later requests find no record and use it as a fresh, empty workspace.
//!    Everything of the old one was ended or removed under the fence, so nothing of it can be
//!    revived: its uploads are ended (their later calls are refused by upload state), its
//!    revisions are gone. Path generations continue from the old ones (they are never reused)
//!    and replay records of old request ids stay until their TTL (a retry gets the recorded
//!    outcome; it changes nothing). The record counts what the pages released, and the
//!    completing session — the caller's, or the reconciler's after a crash — writes the totals
//!    into the fencing call's replay record: a retry answers what the deletion did.
//!
//! The call drives the pages to completion itself; a deletion cut short (crash, shutdown)
//! is resumed by the reconciler's next pass ([`Shard::resume_workspace_deletions`]), since
//! the fence record is durable. The reconciler then deletes the released bytes.
//!
//! Races with uploads: a PutBlock admitted before the fence whose PUT lands after it finds
//! its upload ended in its record session, so its writer is marked finished and its guard
//! deletes the late bytes. A CommitUpload either committed before the fence — its entry is
//! then removed and its blocks collected with the rest — or its session runs after the fence
//! and is refused: never a live entry in a deleted workspace.

use nokv_proto::v1 as pb;
use prost::Message;

use super::Shard;
use super::quota::Accounts;
use super::replay::RequestKey;
use crate::error::{Error, Result};
use crate::meta::{
    BlockState, KIND_ARTIFACT, UploadState, WorkspaceRecord, WorkspaceState, WriteView,
};

/// Items (uploads, entries, retired revisions examined) handled per write session.
pub(crate) const PAGE: usize = 256;

/// Sets the deletion fence of `ws` for the call with `request_id` (a no-op while a deletion
/// of it is already under way).
fn fence(w: &mut WriteView, ws: &str, now: i64, request_id: &str) -> Result<()> {
    if w.workspace(ws)?.is_none() {
        w.put_workspace(
            ws,
            &WorkspaceRecord {
                state: WorkspaceState::Deleting as i32,
                deleting_since_ms: now,
                request_id: request_id.to_string(),
                ..Default::default()
            },
        )?;
        tracing::info!(workspace = %ws, "workspace deletion fenced");
    }
    Ok(())
}

/// What one page released.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Page {
    entries: u64,
    uploads: u64,
    retired: u64,
    /// Nothing of the workspace is left: the record was removed in this session.
    done: bool,
}

impl Page {
    fn add(&mut self, other: Page) {
        self.entries += other.entries;
        self.uploads += other.uploads;
        self.retired += other.retired;
        self.done = other.done;
    }
}

impl Shard {
    /// Deletes workspace `req.workspace` (authorization is the caller's: admin, or write on
    /// the workspace). Deleting a workspace that holds nothing succeeds.
    pub async fn delete_workspace(
        &self,
        mut req: pb::DeleteWorkspaceRequest,
    ) -> Result<pb::DeleteWorkspaceResponse> {
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "DeleteWorkspace", &req);
        let ws = req.workspace;
        let first = {
            let (ws, key) = (ws.clone(), key.clone());
            let clock = self.clock.clone();
            let accounts = self.accounts.clone();
            self.gate
                .write(move |w| {
                    if let Some(done) = key.recorded::<pb::DeleteWorkspaceResponse>(w)? {
                        // A retry: never a second fence (the name may be in use again by
                        // now).
                        done?;
                        return Ok(None);
                    }
                    let now = clock.now_ms();
                    fence(w, &ws, now, &key.request_id)?;
                    key.record(w, &pb::DeleteWorkspaceResponse::default(), now)?;
                    release_page(w, &accounts, &ws, now).map(Some)
                })
                .await?
        };
        let Some(first) = first else {
            // A deletion still in progress is only driven on; then the answer is the one the
            // completing session recorded.
            self.drain_deletion(&ws).await?;
            return self
                .gate
                .write(move |w| {
                    key.recorded::<pb::DeleteWorkspaceResponse>(w)?
                        .unwrap_or_else(|| Ok(Default::default()))
                })
                .await;
        };
        let mut total = first;
        if !first.done {
            total.add(self.drain_deletion(&ws).await?);
        }
        Ok(pb::DeleteWorkspaceResponse {
            entries_removed: total.entries,
            uploads_ended: total.uploads,
            retired_revisions_released: total.retired,
        })
    }

    /// Finishes every deletion that was fenced but not completed (e.g. cut short by a
    /// crash). Called by each reconciler pass; returns how many deletions it completed.
    pub(crate) async fn resume_workspace_deletions(&self) -> Result<usize> {
        let pending = self.gate.read(|r| Ok(r.workspace_records(PAGE)?)).await?;
        let mut completed = 0;
        for (ws, _) in pending {
            let page = self.drain_deletion(&ws).await?;
            tracing::info!(workspace = %ws, entries = page.entries, uploads = page.uploads,
                "resumed workspace deletion completed");
            completed += 1;
        }
        Ok(completed)
    }

    /// Releases pages of a fenced workspace, one session each, until its record is gone.
    /// A workspace without a record is left alone: it is not being deleted (any more).
    async fn drain_deletion(&self, ws: &str) -> Result<Page> {
        let mut total = Page::default();
        loop {
            let ws = ws.to_string();
            let clock = self.clock.clone();
            let accounts = self.accounts.clone();
            let page = self
                .gate
                .write(move |w| {
                    let now = clock.now_ms();
                    if w.workspace(&ws)?.is_none() {
                        return Ok(Page {
                            done: true,
                            ..Page::default()
                        });
                    }
                    release_page(w, &accounts, &ws, now)
                })
                .await?;
            total.add(page);
            if page.done {
                return Ok(total);
            }
        }
    }
}

/// One page of a fenced workspace's deletion, inside one session: up to [`PAGE`] items, open
/// uploads first, then entries, then retired revisions. Removes the record when every kind
/// came back short (nothing is left). `now` is the shard clock read inside the session.
fn release_page(w: &mut WriteView, accounts: &Accounts, ws: &str, now: i64) -> Result<Page> {
    let mut left = PAGE;
    let mut page = Page::default();

    // Open uploads: ended like an abort. The open index holds only open uploads (bounded by
    // admission), so reading each record to find this workspace's is cheap.
    for id in w.open_upload_ids()? {
        if left == 0 {
            break;
        }
        let Some(mut upload) = w.upload(&id)? else {
            continue;
        };
        if upload.workspace != ws {
            continue;
        }
        for (_, b) in w.blocks(&id)? {
            if b.state == BlockState::Uploaded as i32 {
                w.queue_delete(&b.key, ws, b.length, now)?;
            }
        }
        w.remove_blocks(&id)?;
        accounts.release(w, &mut upload)?;
        upload.state = UploadState::Aborted as i32;
        upload.ended_ms = now;
        w.put_upload(&id, &upload)?;
        page.uploads += 1;
        left -= 1;
    }

    // Entries, with inline bodies and the revisions they point at.
    if left > 0 {
        for (path, entry) in w.list(ws, "", None, left)? {
            if entry.kind == KIND_ARTIFACT {
                release_revision(w, entry.revision, now)?;
            }
            w.remove_entry(ws, &path)?;
            accounts.release_entry(w, ws, entry.size)?;
            page.entries += 1;
            left -= 1;
        }
    }

    // Receipts: a publication of the old workspace must never answer for the fresh one of
    // the same name (a rerun would print an entry that no longer exists).
    if left > 0 {
        left -= w.remove_receipts(ws, left)?;
    }

    let mut rec = w
        .workspace(ws)?
        .ok_or_else(|| Error::Internal(format!("workspace {ws:?} lost its record")))?;
    // Retired revisions of the workspace, from where the previous page stopped. Nothing of
    // the workspace can be retired after the fence, so a forward scan sees all of them.
    if left > 0 {
        let after = rec
            .retired_cursor_set
            .then_some((rec.retired_cursor_ms, rec.retired_cursor_rev));
        let scanned = w.retired_after(after, left)?;
        for &(ms, rev) in &scanned {
            if w.revision(rev)?.is_some_and(|r| r.workspace == ws) {
                release_revision(w, rev, now)?;
                w.remove_retired(ms, rev)?;
                page.retired += 1;
            }
            (rec.retired_cursor_ms, rec.retired_cursor_rev) = (ms, rev);
            rec.retired_cursor_set = true;
            left -= 1;
        }
    }
    rec.entries_removed += page.entries;
    rec.uploads_ended += page.uploads;
    rec.retired_released += page.retired;

    // Every kind came back short of what was asked: nothing of the workspace is left.
    if left == 0 {
        w.put_workspace(ws, &rec)?;
    } else {
        answer_fencing_call(w, ws, &rec)?;
        w.remove_workspace(ws)?;
        // The fresh workspace of the same name starts without a quota. Reservations of
        // claimed uploads still settling stay counted until they are reclaimed.
        w.set_quota(ws, None)?;
        page.done = true;
        tracing::info!(workspace = %ws, "workspace deletion completed");
    }
    Ok(page)
}

/// Records the deletion's totals as the answer of the call that fenced it (its replay record,
/// while that is kept).
fn answer_fencing_call(w: &mut WriteView, ws: &str, rec: &WorkspaceRecord) -> Result<()> {
    if rec.request_id.is_empty() {
        return Ok(());
    }
    if let Some(mut replay) = w.replay(ws, &rec.request_id)? {
        replay.response = pb::DeleteWorkspaceResponse {
            entries_removed: rec.entries_removed,
            uploads_ended: rec.uploads_ended,
            retired_revisions_released: rec.retired_released,
        }
        .encode_to_vec();
        w.put_replay(ws, &rec.request_id, &replay)?;
    }
    Ok(())
}

/// Drops a revision and makes its block keys collectable (the reconciler deletes them).
fn release_revision(w: &mut WriteView, rev: u64, now: i64) -> Result<()> {
    if let Some(r) = w.revision(rev)? {
        for b in &r.blocks {
            w.queue_delete(&b.key, &r.workspace, b.length, now)?;
        }
        w.remove_revision(rev)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
