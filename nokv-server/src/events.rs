//! Audit events: one durable, secret-free line per admitted operator action.
//!
//! **What is recorded.** Every admin action that passed authentication and authorisation
//! appends exactly one [`Event`] once its outcome is known: who (the caller's token id and
//! role), what ([`Action`] + a target such as a workspace name or shard), when (unix ms) and the
//! outcome (`ok`, or `error` with the error's machine-readable *reason*, never its message —
//! messages may quote provider errors, which can name keys or endpoints). A refused caller
//! (`Unauthenticated`, `PermissionDenied`) was not admitted and leaves no event; a caller that
//! goes away mid-action still leaves one, with reason `Cancelled`.
//!
//! **Never in an event:** a token (only its [`token_id`], a truncated SHA-256 that cannot be
//! turned back into the token), upload capabilities, object keys, endpoints or credentials.
//! Targets are built from names the caller chose (workspaces, shard numbers, node ids,
//! operation ids) — never from provider state.
//!
//! **Actions** ([`Action`]) — the list is closed; a new admin RPC adds a variant and wraps its
//! handler in [`audited`] (one line, see `service::admin`):
//! `DeleteWorkspace`, `MoveShard`, `TokenIssue` (offline: `nokv-server token issue`),
//! `RetryCleanup`, `SetQuota`, `StartInventory`, `Backup`.
//!
//! **Storage.** Node-level, not per shard: `DATA_DIR/events.jsonl`, one JSON object per line.
//! Each event is one `write` on a file opened with `O_APPEND`, then `fdatasync`, so the daemon
//! and the offline `token issue` command (which runs while the daemon holds the data dir) can
//! both append without coordinating: appends never interleave within a line and never
//! overwrite each other. A crash mid-write can leave one torn last line; opening the log ends a
//! torn tail with a newline so the next event starts on its own line, and readers skip lines
//! that do not parse. Listing reads the file backwards, so newest-first pages cost what they
//! return, not the file's size.
//!
//! **`token issue --data-dir C` on a cluster TLS directory** records its event in
//! `C/events.jsonl`, beside the `cluster.secret` that signed the token: the custody record
//! of a secret lives with the secret (a cluster directory is not any one node's data dir, and
//! the command has no node to ask). Read it with any JSON-lines tool; `nokv admin events` lists
//! the events of the node it asks.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::token::{Claims, Role};

/// The log's file name inside a data dir (or a cluster TLS dir, for offline token issues).
pub const EVENTS_FILE: &str = "events.jsonl";

/// `ListEvents` page size when the caller names none.
pub const DEFAULT_LIMIT: u32 = 50;
/// The largest `ListEvents` page.
pub const MAX_LIMIT: u32 = 1000;

/// `Event::outcome` of an action that succeeded.
pub const OK: &str = "ok";
/// `Event::outcome` of an action that failed; `Event::reason` says how.
pub const ERROR: &str = "error";

/// The admin actions that are audited (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    DeleteWorkspace,
    MoveShard,
    TokenIssue,
    RetryCleanup,
    SetQuota,
    StartInventory,
    Backup,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::DeleteWorkspace => "DeleteWorkspace",
            Action::MoveShard => "MoveShard",
            Action::TokenIssue => "TokenIssue",
            Action::RetryCleanup => "RetryCleanup",
            Action::SetQuota => "SetQuota",
            Action::StartInventory => "StartInventory",
            Action::Backup => "Backup",
        }
    }
}

/// One audit event as stored (one JSON line) and as `ListEvents` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When the outcome was known, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// The caller's [`token_id`]; empty for the offline `token issue` command.
    pub token_id: String,
    /// The caller's role (`admin`, `write`, `read`), or `local` for an offline command run by
    /// whoever can read the directory's `cluster.secret`.
    pub role: String,
    pub action: String,
    /// What the action was applied to, e.g. `workspace team-a` or `shard 3 to node b`.
    pub target: String,
    /// [`OK`] or [`ERROR`].
    pub outcome: String,
    /// The error's reason (e.g. `FailedPrecondition`, `Cancelled`); empty when ok.
    pub reason: String,
}

/// Who performs an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub token_id: String,
    pub role: String,
}

impl Who {
    /// An authenticated caller: its claims' role and its token's id.
    pub fn caller(claims: &Claims, token_id: String) -> Who {
        Who {
            token_id,
            role: role_name(claims.role).into(),
        }
    }

    /// The operator running an offline command on a directory holding the cluster secret.
    pub fn local() -> Who {
        Who {
            token_id: String::new(),
            role: "local".into(),
        }
    }
}

/// A role as events spell it.
pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Read => "read",
        Role::Write => "write",
        Role::Admin => "admin",
    }
}

/// The id under which a token appears in events: the first 16 hex digits of its SHA-256. It
/// names a token (the `TokenIssue` event of a token carries the same id as the events of its
/// later calls) without revealing it.
pub fn token_id(token: &str) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(token.as_bytes())[..8])
}

/// A caller-chosen name as it appears in a target: at most 128 characters, so an event stays
/// one short line whatever a caller sends.
pub fn clip(name: &str) -> String {
    name.chars().take(128).collect()
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A node's event log (`DATA_DIR/events.jsonl`), open for appending.
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
    file: Arc<File>,
}

impl EventLog {
    /// Opens (creating) `dir/events.jsonl` for appending; a torn last line is ended first.
    pub fn open(dir: &Path) -> std::io::Result<EventLog> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(EVENTS_FILE);
        let file = open_append(&path)?;
        end_torn_tail(&path, &file)?;
        Ok(EventLog {
            path,
            file: Arc::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event durably (blocking: one write, then fdatasync).
    pub fn append_blocking(&self, event: &Event) -> std::io::Result<()> {
        write_line(&self.file, event)
    }

    /// [`EventLog::append_blocking`] off the async workers.
    pub async fn append(&self, event: Event) -> std::io::Result<()> {
        let log = self.clone();
        tokio::task::spawn_blocking(move || log.append_blocking(&event))
            .await
            .map_err(std::io::Error::other)?
    }

    /// The newest `limit` events, newest first (lines that do not parse are skipped).
    pub fn newest(&self, limit: usize) -> std::io::Result<Vec<Event>> {
        newest_in(&self.path, limit)
    }

    /// Validates a `ListEvents` limit (0 = [`DEFAULT_LIMIT`]) and reads that page.
    pub async fn page(&self, limit: u32) -> Result<Vec<Event>> {
        let limit = match limit {
            0 => DEFAULT_LIMIT,
            n if n > MAX_LIMIT => {
                return Err(Error::InvalidArgument(format!(
                    "limit {n} is above the maximum of {MAX_LIMIT}"
                )));
            }
            n => n,
        };
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || newest_in(&path, limit as usize))
            .await
            .map_err(|e| Error::Internal(format!("event listing task failed: {e}")))?
            .map_err(|e| Error::Internal(format!("reading the event log: {e}")))
    }
}

/// Appends one event to `dir/events.jsonl` (creating it): the offline commands' path, which
/// runs beside a daemon that holds the same file open (see the module doc).
pub fn append_to_dir(dir: &Path, event: &Event) -> std::io::Result<()> {
    let path = dir.join(EVENTS_FILE);
    let file = open_append(&path)?;
    end_torn_tail(&path, &file)?;
    write_line(&file, event)
}

fn open_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// One `write` of the whole line (`O_APPEND` places it at the end atomically), then fdatasync.
fn write_line(file: &File, event: &Event) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = file;
    let written = f.write(&line)?;
    if written != line.len() {
        // A short write on a regular file means the disk is full; end the fragment so the
        // next event starts on its own line, and report the loss.
        let _ = f.write(b"\n");
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short write to the event log",
        ));
    }
    file.sync_data()
}

/// Ends a last line that a crash left without its newline.
fn end_torn_tail(path: &Path, file: &File) -> std::io::Result<()> {
    let mut reader = File::open(path)?;
    let len = reader.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    reader.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    reader.read_exact(&mut last)?;
    if last[0] != b'\n' {
        let mut f = file;
        f.write_all(b"\n")?;
        file.sync_data()?;
    }
    Ok(())
}

/// Reads `path` backwards in chunks until `limit` events are found or the start is reached.
fn newest_in(path: &Path, limit: usize) -> std::io::Result<Vec<Event>> {
    const CHUNK: u64 = 64 * 1024;
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut end = file.metadata()?.len();
    let mut events = Vec::new();
    // Bytes after the last newline seen so far, read but not yet a whole line.
    let mut tail: Vec<u8> = Vec::new();
    while events.len() < limit && end > 0 {
        let start = end.saturating_sub(CHUNK);
        let mut chunk = vec![0u8; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&tail);
        // Every line but the first of the chunk is whole (the first may continue backwards).
        let mut lines: Vec<&[u8]> = chunk.split(|b| *b == b'\n').collect();
        let first = if start > 0 { lines.remove(0) } else { &[][..] };
        for line in lines.iter().rev() {
            if events.len() == limit {
                break;
            }
            if let Ok(e) = serde_json::from_slice::<Event>(line) {
                events.push(e);
            }
        }
        tail = first.to_vec();
        end = start;
    }
    Ok(events)
}

/// Runs one admitted action and records its event: the one way an action is audited.
///
/// The event is appended once the outcome is known. If the caller goes away first (the
/// future is dropped), the event is still written, with reason `Cancelled`. A failure to
/// append is logged loudly and does not change the action's answer: the action has happened
/// by then, and reporting it as failed would invite a retry of something already done.
pub async fn audited<R>(
    log: &EventLog,
    who: Who,
    action: Action,
    target: String,
    work: impl Future<Output = Result<R>>,
) -> Result<R> {
    let mut pending = Pending {
        log,
        event: Some(Event {
            at_unix_ms: 0,
            token_id: who.token_id,
            role: who.role,
            action: action.as_str().into(),
            target,
            outcome: String::new(),
            reason: String::new(),
        }),
    };
    let outcome = work.await;
    let mut event = pending.event.take().expect("taken once");
    event.at_unix_ms = now_unix_ms();
    match &outcome {
        Ok(_) => event.outcome = OK.into(),
        Err(e) => {
            event.outcome = ERROR.into();
            event.reason = e.reason().into();
        }
    }
    if let Err(e) = log.append(event).await {
        tracing::error!(error = %e, action = action.as_str(), path = %log.path.display(), "AUDIT EVENT NOT RECORDED");
    }
    outcome
}

/// The event of an action still running; dropping it unfinished records `Cancelled`.
struct Pending<'a> {
    log: &'a EventLog,
    event: Option<Event>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(mut event) = self.event.take() {
            event.at_unix_ms = now_unix_ms();
            event.outcome = ERROR.into();
            event.reason = "Cancelled".into();
            if let Err(e) = self.log.append_blocking(&event) {
                tracing::error!(error = %e, action = %event.action, "AUDIT EVENT NOT RECORDED");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: u64) -> Event {
        Event {
            at_unix_ms: i,
            token_id: "t".into(),
            role: "admin".into(),
            action: Action::MoveShard.as_str().into(),
            target: format!("shard {i}"),
            outcome: OK.into(),
            reason: String::new(),
        }
    }

    // Catches: reading forwards (oldest first), or losing lines that straddle a chunk
    // boundary of the backwards reader.
    #[test]
    fn events_are_listed_newest_first_across_chunk_boundaries_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path()).unwrap();
        // ~150 bytes per line: 2000 lines span several 64 KiB chunks.
        for i in 0..2000 {
            log.append_blocking(&event(i)).unwrap();
        }
        let all = log.newest(5000).unwrap();
        assert_eq!(all.len(), 2000);
        assert!(
            all.iter()
                .zip((0..2000).rev())
                .all(|(e, i)| e.at_unix_ms == i),
            "every event once, newest first"
        );
        let page = log.newest(3).unwrap();
        assert_eq!(
            page.iter().map(|e| e.at_unix_ms).collect::<Vec<_>>(),
            [1999, 1998, 1997]
        );
    }

    // Catches: dropping `end_torn_tail` (the next event would be glued to the torn fragment
    // and lost with it).
    #[test]
    fn a_torn_last_line_is_skipped_and_the_next_event_starts_on_its_own_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path()).unwrap();
        log.append_blocking(&event(1)).unwrap();
        let mut f = open_append(log.path()).unwrap();
        f.write_all(b"{\"at_unix_ms\":2,\"tok").unwrap();
        append_to_dir(dir.path(), &event(3)).unwrap();
        let got: Vec<_> = log
            .newest(10)
            .unwrap()
            .iter()
            .map(|e| e.at_unix_ms)
            .collect();
        assert_eq!(got, [3, 1]);
    }

    #[tokio::test]
    async fn a_page_limit_of_zero_means_the_default_and_one_above_the_maximum_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path()).unwrap();
        for i in 0..60 {
            log.append_blocking(&event(i)).unwrap();
        }
        assert_eq!(log.page(0).await.unwrap().len(), DEFAULT_LIMIT as usize);
        assert_eq!(log.page(MAX_LIMIT).await.unwrap().len(), 60);
        assert!(matches!(
            log.page(MAX_LIMIT + 1).await,
            Err(Error::InvalidArgument(_))
        ));
    }

    // Catches: an action abandoned by its caller leaving no trace.
    #[tokio::test]
    async fn an_action_whose_caller_goes_away_still_leaves_one_event_marked_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path()).unwrap();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let never = async {
            let _ = started_tx.send(());
            std::future::pending::<Result<()>>().await
        };
        let run = audited(
            &log,
            Who::local(),
            Action::SetQuota,
            "workspace a".into(),
            never,
        );
        tokio::select! {
            _ = run => unreachable!("the action never finishes"),
            _ = started_rx => {}
        }
        let events = log.newest(10).unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (events[0].outcome.as_str(), events[0].reason.as_str()),
            (ERROR, "Cancelled")
        );
    }

    #[tokio::test]
    async fn an_audited_action_records_its_outcome_and_the_error_reason_not_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(dir.path()).unwrap();
        let who = Who {
            token_id: "abc".into(),
            role: "admin".into(),
        };
        audited(
            &log,
            who.clone(),
            Action::MoveShard,
            "shard 1".into(),
            async { Ok(()) },
        )
        .await
        .unwrap();
        let _ = audited(&log, who, Action::MoveShard, "shard 2".into(), async {
            Err::<(), _>(Error::Unavailable(
                "provider https://secret-endpoint/key failed".into(),
            ))
        })
        .await;
        let events = log.newest(10).unwrap();
        assert_eq!(
            events
                .iter()
                .map(|e| (e.target.as_str(), e.outcome.as_str(), e.reason.as_str()))
                .collect::<Vec<_>>(),
            [("shard 2", ERROR, "Unavailable"), ("shard 1", OK, "")]
        );
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert!(!text.contains("secret-endpoint"), "{text}");
    }
}
