//! Small-file operations: Stat, List, Read, Write, Delete. Bodies up to the inline limit live
//! in the shard's metadata store, so each mutation is exactly one durable write session.

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use super::deletion_fence::require_not_deleting;
use super::replay::RequestKey;
use super::{Shard, to_entry};
use crate::error::{Error, Result};
use crate::meta::{EntryRecord, KIND_ARTIFACT, KIND_FILE, WriteView};

pub const LIST_DEFAULT: u32 = 100;
pub const LIST_MAX: u32 = 1000;

impl Shard {
    pub async fn stat(&self, ws: &str, path: &str) -> Result<pb::Entry> {
        self.gate
            .read_fenced(|r| match r.entry(ws, path)? {
                Some(e) => Ok(to_entry(ws, path, &e)),
                None => Err(not_found(ws, path)),
            })
            .await
    }

    /// One page of entries under `prefix`. The cursor is the hex of the last path returned,
    /// so pages stay correct while entries are added or removed between calls.
    pub async fn list(
        &self,
        ws: &str,
        prefix: &str,
        limit: u32,
        cursor: &str,
    ) -> Result<pb::ListResponse> {
        let limit = page_limit(limit)?;
        let after = page_after(cursor)?;
        // Fetch one extra entry to learn whether another page exists.
        let mut page = self
            .gate
            .read_fenced(|r| Ok(r.list(ws, prefix, after.as_deref(), limit + 1)?))
            .await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let next_cursor = match (more, page.last()) {
            (true, Some((p, _))) => page_cursor(p),
            _ => String::new(),
        };
        Ok(pb::ListResponse {
            entries: page.iter().map(|(p, e)| to_entry(ws, p, e)).collect(),
            next_cursor,
        })
    }

    /// The entry and, for a small file, its body — verified against the digest recorded when
    /// it was written, so damaged bytes are refused (`DataCorrupted`), never returned. An artifact's body is read block by block
    /// through its manifest, so `data` is empty for artifacts.
    pub async fn read(&self, ws: &str, path: &str) -> Result<pb::ReadResponse> {
        self.gate
            .read_fenced(|r| {
                let e = r.entry(ws, path)?.ok_or_else(|| not_found(ws, path))?;
                let data = if e.kind == KIND_FILE {
                    let data = r.inline(ws, path)?.unwrap_or_default();
                    verify_body(self.id, ws, path, &e, &data)?;
                    data
                } else {
                    Vec::new()
                };
                Ok(pb::ReadResponse {
                    entry: Some(to_entry(ws, path, &e)),
                    data: data.into(),
                })
            })
            .await
    }

    pub async fn write(&self, mut req: pb::WriteRequest) -> Result<pb::WriteResponse> {
        if req.data.len() > self.cfg.inline_max {
            return Err(Error::InvalidArgument(format!(
                "file is {} bytes; small files are limited to {} bytes (publish it as an artifact)",
                req.data.len(),
                self.cfg.inline_max
            )));
        }
        let mode = pb::WriteMode::try_from(req.mode)
            .map_err(|_| Error::InvalidArgument(format!("unknown write mode {}", req.mode)))?;
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "Write", &req);
        let sha256 = Sha256::digest(&req.data).to_vec();
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                let (ws, path) = (req.workspace.as_str(), req.path.as_str());
                let check = |w: &WriteView| {
                    require_not_deleting(w, ws)?;
                    let current = w.entry(ws, path)?;
                    match (mode, &current) {
                        (pb::WriteMode::CreateOnly, Some(_)) => {
                            Err(Error::AlreadyExists(format!("{ws}:{path} already exists")))
                        }
                        (pb::WriteMode::IfGeneration, cur) => {
                            let have = cur.as_ref().map_or(0, |c| c.generation);
                            if have != req.if_generation {
                                return Err(Error::GenerationMismatch {
                                    expected: req.if_generation,
                                    current: have,
                                });
                            }
                            Ok(current)
                        }
                        _ => Ok(current),
                    }
                };
                let apply = |w: &mut WriteView, current: Option<EntryRecord>, now| {
                    // Refused past the quota: the session aborts and changes nothing.
                    let old_size = current.as_ref().map_or(0, |c| c.size);
                    accounts.charge_write(w, ws, old_size, req.data.len() as u64)?;
                    if let Some(old) = &current {
                        retire(w, old, now)?;
                    }
                    // `current` is this session's read of the path's entry (in `check`).
                    let generation = w.next_generation_after(ws, path, current.as_ref())?;
                    let rec = EntryRecord {
                        kind: KIND_FILE,
                        size: req.data.len() as u64,
                        sha256,
                        generation,
                        modified_ms: now,
                        ..Default::default()
                    };
                    w.put_entry(ws, path, &rec)?;
                    w.put_inline(ws, path, &req.data)?;
                    Ok(pb::WriteResponse {
                        entry: Some(to_entry(ws, path, &rec)),
                    })
                };
                key.execute(w, clock.now_ms(), check, apply)
            })
            .await?
    }

    pub async fn delete(&self, mut req: pb::DeleteRequest) -> Result<pb::DeleteResponse> {
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "Delete", &req);
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                let (ws, path) = (req.workspace.as_str(), req.path.as_str());
                let check = |w: &WriteView| {
                    require_not_deleting(w, ws)?;
                    let current = w.entry(ws, path)?.ok_or_else(|| not_found(ws, path))?;
                    if req.if_generation != 0 && req.if_generation != current.generation {
                        return Err(Error::GenerationMismatch {
                            expected: req.if_generation,
                            current: current.generation,
                        });
                    }
                    Ok(current)
                };
                let apply = |w: &mut WriteView, current: EntryRecord, now| {
                    retire(w, &current, now)?;
                    w.remove_entry(ws, path)?;
                    accounts.release_entry(w, ws, current.size)?;
                    Ok(pb::DeleteResponse {
                        generation: current.generation,
                    })
                };
                key.execute(w, clock.now_ms(), check, apply)
            })
            .await?
    }
}

/// A page size as List and Find take it: 0 is the default, past the maximum is refused.
pub(super) fn page_limit(limit: u32) -> Result<usize> {
    match limit {
        0 => Ok(LIST_DEFAULT as usize),
        1..=LIST_MAX => Ok(limit as usize),
        _ => Err(Error::InvalidArgument(format!(
            "limit must be 1..={LIST_MAX}"
        ))),
    }
}

/// The path a page cursor continues after (`None`: the first page). A cursor is the hex of
/// a path, so it stays valid while entries come and go between pages.
pub(super) fn page_after(cursor: &str) -> Result<Option<String>> {
    if cursor.is_empty() {
        return Ok(None);
    }
    hex::decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .map(Some)
        .ok_or_else(|| Error::InvalidArgument("cursor is not valid".into()))
}

pub(super) fn page_cursor(last_path: &str) -> String {
    hex::encode(last_path)
}

/// Releases what an entry being replaced or deleted held. An artifact's revision is retired,
/// not dropped: it stays readable for the shard's retired grace (`--retired-grace`), so a
/// restore that started before the overwrite completes from its revision; after the grace
/// the reconciler drops it and makes its block keys collectable.
/// `now` is the shard clock read inside the session.
pub(crate) fn retire(w: &mut WriteView, old: &EntryRecord, now: i64) -> Result<()> {
    if old.kind == KIND_ARTIFACT && w.revision(old.revision)?.is_some() {
        w.retire_revision(old.revision, now)?;
    }
    Ok(())
}

pub(crate) fn not_found(ws: &str, path: &str) -> Error {
    Error::NotFound(format!("{ws}:{path} does not exist"))
}

/// A small file's body must hash to the sha256 its entry recorded at write time: the store
/// does not checksum values on read, so this is the only thing between a flipped bit on disk
/// and an agent reading wrong bytes with success.
pub(super) fn verify_body(
    shard: u32,
    ws: &str,
    path: &str,
    e: &EntryRecord,
    data: &[u8],
) -> Result<()> {
    if Sha256::digest(data).as_slice() == e.sha256.as_slice() {
        return Ok(());
    }
    tracing::error!(
        shard,
        workspace = ws,
        path,
        "stored body does not match its recorded sha256; refusing to return it"
    );
    Err(Error::DataCorrupted(format!(
        "{ws}:{path}: stored bytes do not match their recorded sha256 (generation {}); write the file again from a good copy",
        e.generation
    )))
}

#[cfg(test)]
mod tests;
