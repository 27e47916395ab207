//! Text mutations of small files done on the server: Edit (replace exactly one occurrence)
//! and Append. Each is one write session that reads the body, computes the new one and
//! writes it, so no other mutation of the file can slip between the read and the write: two
//! concurrent appends both land, whole, one after the other; two edits conditioned on the
//! same generation cannot both apply.
//!
//! Both are replay-protected like Write (see [`super::replay`]): a retry answers the first
//! attempt's outcome, including a `MatchCount` refusal, even after the file changed.

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use super::deletion_fence::require_not_deleting;
use super::files::{not_found, verify_body};
use super::quota::Accounts;
use super::replay::RequestKey;
use super::{Shard, to_entry};
use crate::error::{Error, Result};
use crate::meta::{EntryRecord, KIND_FILE, WriteView};

impl Shard {
    pub async fn edit(&self, mut req: pb::EditRequest) -> Result<pb::EditResponse> {
        if req.old.is_empty() {
            return Err(Error::InvalidArgument(
                "old is empty: an edit replaces one occurrence of a non-empty text".into(),
            ));
        }
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "Edit", &req);
        let (clock, accounts, shard, inline_max) = (
            self.clock.clone(),
            self.accounts.clone(),
            self.id,
            self.cfg.inline_max,
        );
        self.gate
            .write(move |w| {
                let (ws, path) = (req.workspace.as_str(), req.path.as_str());
                let check = |w: &WriteView| {
                    require_not_deleting(w, ws)?;
                    let current = w.entry(ws, path)?.ok_or_else(|| not_found(ws, path))?;
                    let expected = req.expected_generation;
                    if expected != 0 && expected != current.generation {
                        return Err(Error::GenerationMismatch {
                            expected,
                            current: current.generation,
                        });
                    }
                    let body = text_body(shard, w, ws, path, &current)?;
                    let count = body.matches(req.old.as_str()).count() as u64;
                    if count != 1 {
                        return Err(Error::MatchCount {
                            count,
                            what: format!("{ws}:{path}"),
                        });
                    }
                    let edited = body.replacen(req.old.as_str(), &req.new, 1);
                    within_limit(edited.len(), inline_max, "the edited file")?;
                    Ok((current, edited.into_bytes()))
                };
                let apply = |w: &mut WriteView, (current, body): (EntryRecord, Vec<u8>), now| {
                    let entry = put_file(w, &accounts, ws, path, current.size, &body, now)?;
                    Ok(pb::EditResponse { entry: Some(entry) })
                };
                key.execute(w, clock.now_ms(), check, apply)
            })
            .await?
    }

    pub async fn append(&self, mut req: pb::AppendRequest) -> Result<pb::AppendResponse> {
        within_limit(req.data.len(), self.cfg.inline_max, "the appended data")?;
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "Append", &req);
        let (clock, accounts, shard, inline_max) = (
            self.clock.clone(),
            self.accounts.clone(),
            self.id,
            self.cfg.inline_max,
        );
        self.gate
            .write(move |w| {
                let (ws, path) = (req.workspace.as_str(), req.path.as_str());
                let check = |w: &WriteView| {
                    require_not_deleting(w, ws)?;
                    let current = w.entry(ws, path)?;
                    let mut body = match &current {
                        Some(e) if e.kind != KIND_FILE => return Err(not_a_small_file(ws, path)),
                        Some(e) => {
                            let body = w.inline(ws, path)?.unwrap_or_default();
                            // Appending to damaged bytes would seal them under a fresh digest.
                            verify_body(shard, ws, path, e, &body)?;
                            body
                        }
                        None => Vec::new(),
                    };
                    within_limit(
                        body.len() + req.data.len(),
                        inline_max,
                        "the file after the append",
                    )?;
                    body.extend_from_slice(&req.data);
                    Ok((current, body))
                };
                let apply =
                    |w: &mut WriteView, (current, body): (Option<EntryRecord>, Vec<u8>), now| {
                        let old_size = current.map_or(0, |c| c.size);
                        let entry = put_file(w, &accounts, ws, path, old_size, &body, now)?;
                        Ok(pb::AppendResponse { entry: Some(entry) })
                    };
                key.execute(w, clock.now_ms(), check, apply)
            })
            .await?
    }
}

/// The body of a small file as text, verified against its recorded digest.
fn text_body(shard: u32, w: &WriteView, ws: &str, path: &str, e: &EntryRecord) -> Result<String> {
    if e.kind != KIND_FILE {
        return Err(not_a_small_file(ws, path));
    }
    let body = w.inline(ws, path)?.unwrap_or_default();
    verify_body(shard, ws, path, e, &body)?;
    String::from_utf8(body).map_err(|e| {
        Error::InvalidArgument(format!(
            "{ws}:{path} is not UTF-8 text (invalid byte at offset {}); edit it with a write",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Writes `body` as the file's new content with a fresh generation, charged against the
/// quota like Write (growth past the quota refuses; the session then aborts and changes
/// nothing). `old_size` is the size it replaces (0: none).
fn put_file(
    w: &mut WriteView,
    accounts: &Accounts,
    ws: &str,
    path: &str,
    old_size: u64,
    body: &[u8],
    now: i64,
) -> Result<pb::Entry> {
    accounts.charge_write(w, ws, old_size, body.len() as u64)?;
    let rec = EntryRecord {
        kind: KIND_FILE,
        size: body.len() as u64,
        sha256: Sha256::digest(body).to_vec(),
        generation: w.next_generation(ws, path)?,
        modified_ms: now,
        ..Default::default()
    };
    w.put_entry(ws, path, &rec)?;
    w.put_inline(ws, path, body)?;
    Ok(to_entry(ws, path, &rec))
}

fn within_limit(len: usize, inline_max: usize, what: &str) -> Result<()> {
    if len > inline_max {
        return Err(Error::InvalidArgument(format!(
            "{what} would be {len} bytes; small files are limited to {inline_max} bytes \
             (the inline limit)"
        )));
    }
    Ok(())
}

fn not_a_small_file(ws: &str, path: &str) -> Error {
    Error::InvalidArgument(format!(
        "{ws}:{path} is an artifact; edit and append work on small files only"
    ))
}

#[cfg(test)]
mod tests;
