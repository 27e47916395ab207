//! The operations ledger: every provider-side lifecycle the shard owns, as one list of
//! operations with an id, kind, workspace, bytes, state, attempts, last error and timestamps.
//! The shard's own records *are* the ledger — there is no second truth:
//!
//! * an **upload** operation is its [`UploadRecord`](crate::meta::UploadRecord) (the ledger
//!   row only links the operation id to the upload id);
//! * a **delete** operation (kind `delete`) is a key no longer referenced — an aborted or
//!   reclaimed upload's block, a released revision's block — queued in the collectable set;
//! * an **attempt_delete** operation is a write attempt's guarded key, from the moment the
//!   reconciler first tries to delete it (before that the guard belongs to its live upload).
//!
//! Operation ids are `<shard>-<n>`: `n` comes from the shard's sequence and is never reused.
//!
//! ## States and transitions (at most 8; these names are the operator contract)
//!
//! | state         | kind    | entered when                                                | leaves to |
//! |---------------|---------|-------------------------------------------------------------|-----------|
//! | `open`        | upload  | BeginUpload                                                 | committed, aborted, deleting, reclaimed |
//! | `committed`   | upload  | CommitUpload published the revision                         | (pruned)  |
//! | `aborted`     | upload  | AbortUpload, or its workspace was deleted                   | (pruned)  |
//! | `deleting`    | upload  | claimed after lease expiry while an attempt guard is unsettled | reclaimed |
//! | `reclaimed`   | upload  | claimed after expiry and every attempt's cleanup done       | (pruned)  |
//! | `deleting`    | deletes | queued (key released) / first delete of a guarded key       | deleted, dead_letter |
//! | `deleted`     | deletes | the provider delete succeeded and the key is absent         | (pruned)  |
//! | `dead_letter` | deletes | `--delete-attempts` deletes failed: out of the automatic queue | deleted (admin retry) |
//!
//! Rules:
//! * Every state change happens in one write session together with the counters it moves
//!   (per-state counts, the unresolved index, the queues; see `meta`), never with provider
//!   I/O inside the session.
//! * A dead letter keeps its record and its accounting (the key still counts as a delete
//!   intent in the audit) until `RetryCleanup` sees the key absent.
//! * **One pruning rule** for history: a terminal row (`committed`, `aborted`, `reclaimed`,
//!   `deleted`) is pruned by the reconciler in bounded pages once it ended more than
//!   `max(--history-retention, --replay-ttl)` ago — never earlier than the replay window
//!   that may still name it. Rows that own bytes or accounting are never pruned: unresolved
//!   ones (`open`, `deleting`, `dead_letter`), uploads a guard still names, deletes whose key
//!   is still guarded.
//! * Last errors are fixed, secret-free phrases ([`secret_free`]): never a key, endpoint or
//!   credential.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::Shard;
use super::quota::Accounts;
use crate::error::{Error, Result};
use crate::meta::{
    DeleteKind, DeleteState, LedgerRow, OpState, UploadState, WriteView, WriterState,
};
use crate::object::ObjectError;

/// Largest page of `ListOperations`, and the page when none is asked for.
pub const MAX_LIMIT: u32 = 100;
pub const DEFAULT_LIMIT: u32 = 50;
/// Most distinct states one `ListOperations` may filter on.
pub const MAX_STATES: usize = 8;
/// Rows of history read per shard and page request at most, so a filter that matches
/// little cannot turn one page into a scan of the whole ledger (the cursor resumes).
const SCAN: usize = 5_000;
/// Bound of each provider call of a retry.
const RETRY_IO: Duration = Duration::from_secs(20);
/// Rows pruned per write session.
const PRUNE_PAGE: usize = 500;

/// The outcome of one delete attempt, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Deleted, and the key is absent.
    Absent,
    /// The delete answered, but the key is still there.
    StillPresent,
    /// The provider failed; a secret-free reason.
    Failed(String),
}

/// What `RetryCleanup` answers (JSON field `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryResult {
    /// The key is absent and the operation is `deleted` (now or before).
    Completed,
    /// The delete answered but the key is still present; the operation keeps its state.
    Pending,
    /// Another retry of this operation is running; it will settle it.
    AlreadyInProgress,
    /// The provider failed; the operation keeps its state and one attempt was counted.
    ProviderError,
}

impl RetryResult {
    pub fn name(self) -> &'static str {
        match self {
            RetryResult::Completed => "completed",
            RetryResult::Pending => "pending",
            RetryResult::AlreadyInProgress => "already_in_progress",
            RetryResult::ProviderError => "provider_error",
        }
    }
}

/// A provider error as a fixed phrase: object_store messages name keys, URLs and sometimes
/// request ids, none of which may reach an operator summary.
pub fn secret_free(e: &ObjectError) -> String {
    let text = e.to_string().to_ascii_lowercase();
    let what = if text.contains("timed out") || text.contains("timeout") {
        "timed out"
    } else if text.contains("refused") || text.contains("connect") || text.contains("dns") {
        "provider unreachable"
    } else if text.contains("denied") || text.contains("forbidden") || text.contains("403") {
        "provider refused access"
    } else {
        "provider error"
    };
    format!("delete failed: {what}")
}

/// Records one delete attempt of operation `id` in the caller's session: `Absent` settles it
/// `deleted` (and its guard, for an attempt key); a failure counts the attempt and, at
/// `max_attempts`, moves a `deleting` operation to `dead_letter`. An operation already
/// `deleted` keeps its row as it is (a second settlement changes nothing), but a guard is
/// still settled: an unknown writer's guard deletes late bytes again and again. Returns the
/// operation's state afterwards (`None`: no such delete operation).
pub(crate) fn record_attempt(
    w: &mut WriteView,
    accounts: &Accounts,
    id: u64,
    outcome: &Attempt,
    now: i64,
    max_attempts: u32,
) -> Result<Option<OpState>> {
    let Some(mut op) = w.operation(id)?.filter(|o| !o.is_upload()) else {
        return Ok(None);
    };
    if *outcome == Attempt::Absent && op.kind == DeleteKind::Attempt as i32 {
        settle_guard(w, accounts, &op.key, now)?;
    }
    if op.op_state() == OpState::Deleted {
        return Ok(Some(OpState::Deleted));
    }
    op.attempts = op.attempts.saturating_add(1);
    op.updated_ms = now;
    match outcome {
        Attempt::Absent => op.state = DeleteState::Deleted as i32,
        Attempt::StillPresent | Attempt::Failed(_) => {
            op.last_error = match outcome {
                Attempt::Failed(why) => why.clone(),
                _ => "delete answered but the object is still present".into(),
            };
            if op.op_state() == OpState::Deleting && op.attempts >= max_attempts {
                op.state = DeleteState::DeadLetter as i32;
                tracing::warn!(
                    operation = id,
                    attempts = op.attempts,
                    "delete dead-lettered; `nokv admin retry` settles it"
                );
            }
        }
    }
    let state = op.op_state();
    w.put_operation(id, &op)?;
    Ok(Some(state))
}

/// A guarded key was deleted: a finished writer's guard is removed; an unknown writer's guard
/// stays (late bytes must keep being deleted) but records its first deletion. Either way the
/// upload it names may now be resolved. Returns true if the guard was removed.
pub(crate) fn settle_guard(
    w: &mut WriteView,
    accounts: &Accounts,
    key: &str,
    now: i64,
) -> Result<bool> {
    match w.guard(key)? {
        Some(g) if g.writer == WriterState::Finished as i32 => {
            w.remove_guard(key)?;
            resolve_if_reclaimed(w, accounts, &g.upload_id)?;
            Ok(true)
        }
        Some(mut g) if g.deleted_ms == 0 => {
            g.deleted_ms = now;
            w.put_guard(key, &g)?;
            resolve_if_reclaimed(w, accounts, &g.upload_id)?;
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// True while some attempt of `upload_id` still awaits its cleanup: a finished writer's
/// guard not yet settled, or an unknown writer's guard whose key was never deleted yet
/// (guards are few: a scan). Unknown writers' guards that deleted their key once stay — late
/// bytes must keep being deleted — but they no longer hold the upload unresolved: seed 000
/// keeps such guards as small persistent metadata, not as an open upload.
pub(crate) fn guards_name(w: &WriteView, upload_id: &str) -> Result<bool> {
    Ok(w.guards()?.iter().any(|(_, g)| {
        g.upload_id == upload_id && (g.writer == WriterState::Finished as i32 || g.deleted_ms == 0)
    }))
}

/// A claimed upload whose last pending cleanup just completed is resolved: `Deleting` →
/// `Reclaimed` (an upload transition of the ledger, so it lives here, below the reconciler
/// that claims uploads and settles guards), so `unresolved_uploads` in health reaches 0 once reconciliation has settled;
/// its byte reservation is released in the same session.
pub(crate) fn resolve_if_reclaimed(
    w: &mut WriteView,
    accounts: &Accounts,
    upload_id: &str,
) -> Result<()> {
    if let Some(mut u) = w.upload(upload_id)?
        && u.state == UploadState::Deleting as i32
        && !guards_name(w, upload_id)?
    {
        accounts.release(w, &mut u)?;
        u.state = UploadState::Reclaimed as i32;
        w.put_upload(upload_id, &u)?;
    }
    Ok(())
}

/// Retries in flight on one shard: a second `RetryCleanup` of the same operation answers
/// `already_in_progress` instead of racing the first (the settling session re-checks the
/// state too, so even a race settles once).
#[derive(Default)]
pub struct RetriesInFlight(parking_lot::Mutex<HashSet<u64>>);

impl RetriesInFlight {
    /// Marks `id` in flight; false if it already was.
    fn begin(&self, id: u64) -> bool {
        self.0.lock().insert(id)
    }

    fn end(&self, id: u64) {
        self.0.lock().remove(&id);
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.0.lock().contains(&id)
    }
}

/// Node-wide operation id: `<shard>-<n>`.
pub fn format_id(shard: u32, id: u64) -> String {
    format!("{shard}-{id}")
}

pub fn parse_id(text: &str) -> Result<(u32, u64)> {
    text.split_once('-')
        .and_then(|(s, n)| Some((s.parse().ok()?, n.parse().ok()?)))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{text:?} is not an operation id (ids look like 3-17; see `nokv admin ops`)"
            ))
        })
}

/// A position in the node-wide order (shard, then operation id): an operation strictly after
/// it comes next. Opaque to clients: `o` + 8 hex digits of shard + 16 of operation id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    pub shard: u32,
    pub id: u64,
}

impl Cursor {
    pub fn encode(self) -> String {
        format!("o{:08x}{:016x}", self.shard, self.id)
    }

    pub fn decode(text: &str) -> Result<Cursor> {
        let bad = || {
            Error::InvalidArgument(
                "the cursor is not one this server returned (pass the `next` of a previous page)"
                    .into(),
            )
        };
        let hex = text
            .strip_prefix('o')
            .filter(|h| h.len() == 24)
            .ok_or_else(bad)?;
        Ok(Cursor {
            shard: u32::from_str_radix(&hex[..8], 16).map_err(|_| bad())?,
            id: u64::from_str_radix(&hex[8..], 16).map_err(|_| bad())?,
        })
    }
}

/// A validated `ListOperations` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageQuery {
    /// Empty: every state.
    pub states: Vec<OpState>,
    pub limit: u32,
    pub after: Option<Cursor>,
}

impl PageQuery {
    /// Validates the wire request: up to 8 unique known states, limit 1–100 (absent: 50),
    /// a cursor this server issued. Anything else is `InvalidArgument` and reads nothing.
    pub fn parse(states: &[String], limit: Option<u32>, after: &str) -> Result<PageQuery> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::InvalidArgument(format!(
                "limit must be between 1 and {MAX_LIMIT} (got {limit})"
            )));
        }
        if states.len() > MAX_STATES {
            return Err(Error::InvalidArgument(format!(
                "at most {MAX_STATES} states may be filtered on (got {})",
                states.len()
            )));
        }
        let mut parsed = Vec::new();
        for s in states {
            let st = OpState::parse(s).ok_or_else(|| {
                let known: Vec<_> = OpState::ALL.iter().map(|s| s.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown state {s:?} (states: {})",
                    known.join(", ")
                ))
            })?;
            if parsed.contains(&st) {
                return Err(Error::InvalidArgument(format!(
                    "state {s:?} is given twice; states must be unique"
                )));
            }
            parsed.push(st);
        }
        let after = match after {
            "" => None,
            c => Some(Cursor::decode(c)?),
        };
        Ok(PageQuery {
            states: parsed,
            limit,
            after,
        })
    }
}

/// One page of the node-wide ledger: rows with their shard, and the cursor of the next page
/// (`None`: the walk is complete).
#[derive(Debug, Default)]
pub struct Page {
    pub rows: Vec<(u32, LedgerRow)>,
    pub next: Option<Cursor>,
}

/// Lists operations over `shards` in (shard, id) order after the query's cursor, so a walk
/// that follows `next` returns each operation exactly once. Each read of a shard is one
/// snapshot bounded to `SCAN` rows; a sparse filter takes several.
pub async fn list(shards: &[Arc<Shard>], q: &PageQuery) -> Result<Page> {
    let mut shards: Vec<_> = shards.to_vec();
    shards.sort_by_key(|s| s.id);
    let start = q.after.unwrap_or_default();
    let limit = q.limit as usize;
    let mut page = Page::default();
    for shard in shards.iter().filter(|s| s.id >= start.shard) {
        let mut after = if shard.id == start.shard { start.id } else { 0 };
        loop {
            let want = limit - page.rows.len();
            let states = q.states.clone();
            let (rows, last) = shard
                .gate
                .read(move |r| {
                    let keep = |s: OpState| states.is_empty() || states.contains(&s);
                    Ok(r.ledger_page(after, &keep, want, SCAN)?)
                })
                .await?;
            page.rows.extend(rows.into_iter().map(|r| (shard.id, r)));
            if page.rows.len() == limit {
                let (s, r) = page.rows.last().expect("a full page");
                page.next = Some(Cursor {
                    shard: *s,
                    id: r.id,
                });
                return Ok(page);
            }
            match last {
                Some(l) => after = l,
                None => break,
            }
        }
    }
    Ok(page)
}

impl Shard {
    /// The ledger row of operation `id`, if it exists.
    pub async fn ledger_row(&self, id: u64) -> Result<Option<LedgerRow>> {
        self.gate.read(move |r| Ok(r.ledger_row(id)?)).await
    }

    /// The shard clock now (health ages are judged by it).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// `RetryCleanup`: one bounded delete + existence check of a delete operation, read
    /// entirely from the shard's records. The provider work runs in a spawned task whose
    /// outcome is recorded even if the caller goes away, so a cancelled call never loses an
    /// attempt it made, nor counts one it did not make.
    pub async fn retry_cleanup(self: &Arc<Self>, id: u64) -> Result<RetryResult> {
        let op = self
            .gate
            .read(move |r| Ok(r.operation(id)?))
            .await?
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "operation {} does not exist (or was pruned)",
                    format_id(self.id, id)
                ))
            })?;
        if op.is_upload() {
            return Err(Error::FailedPrecondition(format!(
                "operation {} is an upload; only delete operations can be retried",
                format_id(self.id, id)
            )));
        }
        if op.op_state() == OpState::Deleted {
            return Ok(RetryResult::Completed);
        }
        if !self.retries.begin(id) {
            return Ok(RetryResult::AlreadyInProgress);
        }
        let shard = self.clone();
        let task = tokio::spawn(async move {
            let outcome = shard.delete_and_check(&op.key, op.kind).await;
            let (clock, max) = (shard.clock.clone(), shard.cfg.delete_attempts);
            let accounts = shard.accounts.clone();
            let o = outcome.clone();
            let recorded = shard
                .gate
                .write(move |w| record_attempt(w, &accounts, id, &o, clock.now_ms(), max))
                .await;
            shard.retries.end(id);
            let state = recorded?;
            Ok::<_, Error>(match (outcome, state) {
                (_, Some(OpState::Deleted)) => RetryResult::Completed,
                (Attempt::StillPresent, _) => RetryResult::Pending,
                _ => RetryResult::ProviderError,
            })
        });
        task.await
            .map_err(|e| Error::Internal(format!("retry task failed: {e}")))?
    }

    /// Deletes `key` and checks it is gone, each step bounded.
    async fn delete_and_check(&self, key: &str, kind: i32) -> Attempt {
        let delete = async {
            if kind == DeleteKind::Attempt as i32 {
                self.object.delete_attempt(key).await
            } else {
                self.object.delete(key).await
            }
        };
        match tokio::time::timeout(RETRY_IO, delete).await {
            Err(_) => return Attempt::Failed("delete failed: timed out".into()),
            Ok(Err(e)) => return Attempt::Failed(secret_free(&e)),
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout(RETRY_IO, self.object.exists(key)).await {
            Err(_) => Attempt::Failed("existence check failed: timed out".into()),
            Ok(Err(e)) => Attempt::Failed(secret_free(&e)),
            Ok(Ok(true)) => Attempt::StillPresent,
            Ok(Ok(false)) => Attempt::Absent,
        }
    }

    /// The cutoff of history pruning: rows that ended at or before it go (see the module
    /// doc's one rule).
    pub(crate) fn history_cutoff(&self) -> i64 {
        let keep = self.cfg.history_retention.max(self.cfg.replay_ttl);
        self.clock.now_ms() - keep.as_millis() as i64
    }

    /// Prunes `deleted` delete operations that ended before the history cutoff, one bounded
    /// page per write session; a row whose key a guard still names is kept (the guard still
    /// deletes late bytes under that operation). Returns how many rows were removed.
    pub async fn prune_operations(&self) -> Result<usize> {
        let cutoff = self.history_cutoff();
        if self
            .gate
            .read(move |r| Ok(r.deleted_ops_before(cutoff, 1)?))
            .await?
            .is_empty()
        {
            return Ok(0);
        }
        let mut total = 0;
        loop {
            let (seen, removed) = self
                .gate
                .write(move |w| prune_page(w, cutoff, PRUNE_PAGE))
                .await?;
            total += removed;
            if seen < PRUNE_PAGE || removed == 0 {
                return Ok(total);
            }
        }
    }
}

/// One pruning page: up to `limit` deleted operations that ended by `cutoff`; returns (seen,
/// removed).
pub(crate) fn prune_page(w: &mut WriteView, cutoff: i64, limit: usize) -> Result<(usize, usize)> {
    let ids = w.deleted_ops_before(cutoff, limit)?;
    let mut removed = 0;
    for &id in &ids {
        let Some(op) = w.operation(id)? else { continue };
        if op.op_state() != OpState::Deleted || w.guard(&op.key)?.is_some() {
            continue;
        }
        w.remove_operation(id)?;
        removed += 1;
    }
    Ok((ids.len(), removed))
}

#[cfg(test)]
mod tests;
