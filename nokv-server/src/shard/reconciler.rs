//! The shard's reconciler: deletes bytes nobody may reference any more, never bytes that are
//! live. Three steps per pass; metadata is always read and changed in bounded pages:
//!
//! * **Expired uploads** are claimed by an atomic state change to `Deleting` after re-checking,
//!   inside the claiming session, that the upload is still open and its lease has ended —
//!   so a stale candidate list can never claim an upload that was renewed or committed. The
//!   claim moves its uploaded block keys to the collectable set; pending attempts keep their
//!   guards. Pages are claimed until none is left or the pass's 5 s budget is spent; the
//!   candidates come from the open-upload index, so the cost follows the open uploads, not
//!   the upload history (ended records are pruned after the replay window, see
//!   [`Shard::prune_uploads`]).
//! * **Retired revisions** (replaced or deleted artifacts) stay readable for the retired
//!   grace; then their block keys move to the collectable set and the revision is dropped.
//! * **Collectable keys** (released revisions, aborted and expired uploads) are deleted from the
//!   provider with no lock held, then forgotten in one session. Keys are never reused, so a
//!   collectable key can never become referenced again.
//! * **Guards** whose upload is no longer live are deleted, oldest-attempted first; the
//!   attempt is recorded before the I/O. A guard is removed only once its writer is known
//!   finished *and* the delete succeeded; an unknown writer's guard stays and deletes late
//!   bytes again later, with an exponential back-off (1 min doubling to 1 h) rather than
//!   every pass. A guard's delete also removes the key's local staging leftovers. A key the upload's revision references is never deleted.
//!
//! Failed deletions keep their record and are retried on the next pass, until
//! `--delete-attempts` failures dead-letter the operation (see [`super::operations`]): it
//! leaves the automatic queue and waits for `nokv admin retry`.

use std::time::{Duration, Instant};

use super::Shard;
use super::operations::{Attempt, guards_name, record_attempt, secret_free};
use crate::error::Result;
use crate::meta::{GuardRecord, OpState, ReadView, UploadState, WriterState};

/// Records handled per page and kind.
const PAGE: usize = 100;

/// What one pass did, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    pub expired_uploads: usize,
    pub released_revisions: usize,
    pub deleted_keys: usize,
    pub settled_guards: usize,
    pub failed_deletes: usize,
    /// Delete operations that reached `--delete-attempts` in this pass.
    pub dead_lettered: usize,
}

impl Shard {
    pub async fn reconcile(&self) -> Result<Pass> {
        // Once per data directory: index uploads recorded before the upload indexes existed.
        // Read first: an idle shard's pass opens no write session (no fsync; in a cluster, no
        // mark that the shard changed since its checkpoint).
        if !self.gate.read(|r| Ok(r.uploads_indexed()?)).await? {
            self.gate.write(|w| Ok(w.index_uploads()?)).await?;
        }
        // Deletions cut short (crash, shutdown) finish first, so their bytes go this pass.
        self.resume_workspace_deletions().await?;
        // Repairs the node census after a session whose commit failed (see `admission`).
        self.publish_census().await?;
        let mut pass = Pass {
            expired_uploads: self.claim_expired_uploads().await?,
            ..Pass::default()
        };
        pass.released_revisions = self.release_retired().await?;
        self.collect_keys(&mut pass).await?;
        self.sweep_guards(&mut pass).await?;
        Ok(pass)
    }

    /// Claims expired uploads page after page until none is left or the pass's time budget
    /// is spent (the rest waits for the next pass), so a backlog drains at the speed of the
    /// store, not at one page per pass.
    async fn claim_expired_uploads(&self) -> Result<usize> {
        let started = Instant::now();
        let mut claimed = 0;
        while started.elapsed() < self.cfg.scan_budget {
            let candidates = self.expired_candidates(self.clock.now_ms()).await?;
            if candidates.is_empty() {
                break;
            }
            let page_claimed = self.claim_page(candidates).await?;
            claimed += page_claimed;
            if page_claimed == 0 {
                // Every candidate was renewed or ended meanwhile: nothing more to drain now.
                break;
            }
        }
        Ok(claimed)
    }

    /// Lists up to a page of uploads whose lease ended by `now`, from a snapshot. The list
    /// may be stale by the time it is claimed; [`Shard::claim_page`] re-checks each one.
    pub(super) async fn expired_candidates(&self, now: i64) -> Result<Vec<String>> {
        self.gate.read(|r| Ok(r.expired_uploads(now, PAGE)?)).await
    }

    /// Claims the listed uploads that are still open with an ended lease, each in its own
    /// session; returns how many it claimed. Separate from the listing so that tests can
    /// change an upload between the two steps.
    pub(super) async fn claim_page(&self, candidates: Vec<String>) -> Result<usize> {
        let mut claimed = 0;
        for id in candidates {
            let clock = self.clock.clone();
            let accounts = self.accounts.clone();
            claimed += self
                .gate
                .write(move |w| {
                    let Some(mut u) = w.upload(&id)? else {
                        return Ok(0);
                    };
                    // Re-check inside the claiming session, by a fresh reading of the clock:
                    // the candidate list may be stale.
                    let now = clock.now_ms();
                    if u.state != UploadState::Open as i32 || u.lease_expires_ms > now {
                        return Ok(0);
                    }
                    for (_, b) in w.blocks(&id)? {
                        if w.guard(&b.key)?.is_none() {
                            w.queue_delete(&b.key, &u.workspace, b.length, now)?;
                        }
                    }
                    w.remove_blocks(&id)?;
                    u.state = if guards_name(w, &id)? {
                        // An attempt may still land: the reservation stays until settled.
                        UploadState::Deleting
                    } else {
                        accounts.release(w, &mut u)?;
                        UploadState::Reclaimed
                    } as i32;
                    u.ended_ms = now;
                    w.put_upload(&id, &u)?;
                    Ok(1)
                })
                .await?;
        }
        Ok(claimed)
    }

    /// Drops retired revisions whose grace has passed, page by page within the pass budget,
    /// and makes their block keys collectable. Until then a retired revision stays readable.
    async fn release_retired(&self) -> Result<usize> {
        let started = Instant::now();
        let grace_ms = self.cfg.retired_grace.as_millis() as i64;
        let mut released = 0;
        while started.elapsed() < self.cfg.scan_budget {
            // Read first: an idle shard's pass opens no write session (see `reconcile`).
            let cutoff = self.clock.now_ms() - grace_ms;
            if self
                .gate
                .read(|r| Ok(r.retired_before(cutoff, 1)?.is_empty()))
                .await?
            {
                break;
            }
            let clock = self.clock.clone();
            let n = self
                .gate
                .write(move |w| {
                    let now = clock.now_ms();
                    let due = w.retired_before(now - grace_ms, PAGE)?;
                    for (ms, rev) in &due {
                        if let Some(r) = w.revision(*rev)? {
                            for b in &r.blocks {
                                w.queue_delete(&b.key, &r.workspace, b.length, now)?;
                            }
                            w.remove_revision(*rev)?;
                        }
                        w.remove_retired(*ms, *rev)?;
                    }
                    Ok(due.len())
                })
                .await?;
            released += n;
            if n < PAGE {
                break;
            }
        }
        Ok(released)
    }

    /// Deletes a page of queued keys with no lock held, then records every outcome in one
    /// session: a success settles its operation `deleted`, a failure counts an attempt (and
    /// dead-letters the operation at `--delete-attempts`). Keys an admin retry is working on
    /// are left to it.
    async fn collect_keys(&self, pass: &mut Pass) -> Result<()> {
        let queued = self.gate.read(|r| Ok(r.collectable_ops(PAGE)?)).await?;
        let mut outcomes = Vec::new();
        for (key, op) in queued {
            if self.retries.contains(op) {
                continue;
            }
            match self.object.delete(&key).await {
                Ok(()) => {
                    pass.deleted_keys += 1;
                    outcomes.push((op, Attempt::Absent));
                }
                Err(e) => {
                    pass.failed_deletes += 1;
                    tracing::warn!(shard = self.id, operation = op, error = %e, "collectable delete failed; will retry");
                    outcomes.push((op, Attempt::Failed(secret_free(&e))));
                }
            }
        }
        if !outcomes.is_empty() {
            let (clock, max) = (self.clock.clone(), self.cfg.delete_attempts);
            let accounts = self.accounts.clone();
            pass.dead_lettered += self
                .gate
                .write(move |w| {
                    let now = clock.now_ms();
                    let mut dead = 0;
                    for (op, outcome) in &outcomes {
                        let st = record_attempt(w, &accounts, *op, outcome, now, max)?;
                        dead += usize::from(
                            st == Some(OpState::DeadLetter) && *outcome != Attempt::Absent,
                        );
                    }
                    Ok(dead)
                })
                .await?;
        }
        Ok(())
    }

    /// Deletes guarded keys whose upload is no longer live. The first attempt turns the guard
    /// into a delete operation of the ledger; a dead-lettered one is skipped until an admin
    /// retry settles it.
    async fn sweep_guards(&self, pass: &mut Pass) -> Result<()> {
        let now = self.clock.now_ms();
        let mut due = self
            .gate
            .read(|r| {
                let mut out = Vec::new();
                for (key, g) in r.guards()? {
                    let dead = g.operation != 0
                        && r.operation(g.operation)?
                            .is_some_and(|o| o.op_state() == OpState::DeadLetter);
                    if !dead && guard_due(&g, now) && !guard_protects_live_bytes(r, &key, &g, now)?
                    {
                        out.push((key, g));
                    }
                }
                Ok(out)
            })
            .await?;
        due.sort_by_key(|(_, g)| g.last_attempt_ms);
        due.truncate(PAGE);
        for (key, _) in due {
            // Record the attempt before the I/O, so a crash mid-delete is visible.
            let (k, clock) = (key.clone(), self.clock.clone());
            let op = self
                .gate
                .write(move |w| {
                    let now = clock.now_ms();
                    let op = w.guard_operation(&k, now)?;
                    if let Some(mut g) = w.guard(&k)? {
                        g.attempts += 1;
                        g.last_attempt_ms = now;
                        w.put_guard(&k, &g)?;
                    }
                    Ok(op)
                })
                .await?;
            let Some(op) = op else { continue };
            if self.retries.contains(op) {
                continue;
            }
            let outcome = match self.object.delete_attempt(&key).await {
                Ok(()) => {
                    pass.deleted_keys += 1;
                    Attempt::Absent
                }
                Err(e) => {
                    pass.failed_deletes += 1;
                    tracing::warn!(shard = self.id, operation = op, error = %e, "guarded delete failed; will retry");
                    Attempt::Failed(secret_free(&e))
                }
            };
            let (clock, max) = (self.clock.clone(), self.cfg.delete_attempts);
            let accounts = self.accounts.clone();
            let (settled, dead) = self
                .gate
                .write(move |w| {
                    let present = w.guard(&key)?.is_some();
                    let st = record_attempt(w, &accounts, op, &outcome, clock.now_ms(), max)?;
                    let removed = present && w.guard(&key)?.is_none();
                    Ok((
                        removed,
                        st == Some(OpState::DeadLetter) && outcome != Attempt::Absent,
                    ))
                })
                .await?;
            pass.settled_guards += usize::from(settled);
            pass.dead_lettered += usize::from(dead);
        }
        Ok(())
    }
}

/// First wait before an unknown writer's guard deletes its key again; doubles per attempt.
const UNKNOWN_RETRY_FIRST: Duration = Duration::from_secs(60);
/// Longest wait between two deletes of an unknown writer's key.
const UNKNOWN_RETRY_MAX: Duration = Duration::from_secs(3600);

/// How long after its `attempts`-th delete an unknown writer's guard waits before the next:
/// 1 min, 2 min, 4 min ... capped at 1 h. Late bytes are rare and the delete is idempotent,
/// so a guard that may stay for good must not cost a provider call every pass.
pub(crate) fn unknown_retry_after(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    (UNKNOWN_RETRY_FIRST * (1u32 << doublings)).min(UNKNOWN_RETRY_MAX)
}

/// Whether a guard's delete is due now. A finished writer's guard is due every pass until
/// its delete succeeds (then it is removed); an unknown writer's guard backs off.
fn guard_due(g: &GuardRecord, now: i64) -> bool {
    if g.writer != WriterState::Unknown as i32 || g.attempts == 0 {
        return true;
    }
    now >= g.last_attempt_ms + unknown_retry_after(g.attempts).as_millis() as i64
}

/// True while the guarded key may still become (or is) referenced: its upload is open with a
/// live lease (a write may be in flight and about to be recorded), or the upload's revision
/// references the key.
fn guard_protects_live_bytes(r: &ReadView, key: &str, g: &GuardRecord, now: i64) -> Result<bool> {
    let Some(u) = r.upload(&g.upload_id)? else {
        return Ok(false);
    };
    if u.state == UploadState::Open as i32 && u.lease_expires_ms > now {
        return Ok(true);
    }
    if u.state == UploadState::Committed as i32
        && let Some(rev) = r.revision(u.revision)?
    {
        return Ok(rev.blocks.iter().any(|b| b.key == key));
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_writers_guard_is_retried_with_exponential_back_off_capped_at_an_hour() {
        let minute = Duration::from_secs(60);
        assert_eq!(unknown_retry_after(1), minute);
        assert_eq!(unknown_retry_after(2), 2 * minute);
        assert_eq!(unknown_retry_after(6), 32 * minute);
        assert_eq!(unknown_retry_after(7), 60 * minute);
        assert_eq!(unknown_retry_after(u32::MAX), 60 * minute);
        let g = |writer: WriterState, attempts| GuardRecord {
            writer: writer as i32,
            attempts,
            last_attempt_ms: 1_000_000,
            ..Default::default()
        };
        assert!(
            guard_due(&g(WriterState::Unknown, 0), 0),
            "first delete at once"
        );
        assert!(!guard_due(&g(WriterState::Unknown, 3), 1_000_000 + 239_999));
        assert!(guard_due(&g(WriterState::Unknown, 3), 1_000_000 + 240_000));
        assert!(
            guard_due(&g(WriterState::Finished, 3), 1_000_000),
            "finished: every pass"
        );
    }
}
