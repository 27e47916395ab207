//! Shard checkpoints: how a graceful handoff moves a shard's redb database from its owner to
//! the next one through the provider. This module is the mechanism only; *when* it runs
//! (draining, releasing and acquiring ownership) is the cluster's business.
//!
//! * [`take`] snapshots the store on the shard's committer (a consistent copy holding every
//!   acknowledged session, see [`Gate::snapshot_to`](super::gate::Gate::snapshot_to)) into a
//!   scratch file, hashes it, uploads it under a fresh key and removes the scratch file.
//! * [`restore`] downloads a checkpoint, refuses it unless its size and sha256 are the ones
//!   recorded, and installs it atomically: temporary file, fsync, open as a store, rename
//!   over the destination, fsync the directory. A refused checkpoint leaves the destination
//!   as it was.
//! * [`discard`] deletes a superseded checkpoint (nothing else ever deletes one).
//!
//! A checkpoint is held in memory whole while it is hashed and uploaded (one create-if-absent
//! PUT: the provider's only write that cannot overwrite), which bounds the shard size a
//! handoff can move by the node's memory and the provider's single-PUT limit.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::Shard;
use crate::error::{Error, Result};
use crate::meta::MetaStore;
use crate::object::ObjectProvider;

/// One uploaded checkpoint, as the ownership record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The provider key ([`ObjectProvider::checkpoint_key`]).
    pub key: String,
    /// Lowercase hex sha256 of the uploaded bytes.
    pub sha256: String,
    /// Size of the uploaded bytes.
    pub size: u64,
    /// Every batch of the node numbered below this is in the checkpoint (where the shard's
    /// provider log may begin after it); 0 when not known (a checkpoint read back).
    pub covers: u64,
}

/// Snapshots `shard` into `scratch` (e.g. `DATA_DIR/shards/NNNN.ckpt`; replaced if present),
/// uploads it as a checkpoint of the shard at `epoch`, and removes `scratch` whatever the
/// outcome. Holds every session acknowledged before the call. A failed upload is deleted
/// again on a best-effort basis (its outcome may be unknown; an orphan is harmless: its key
/// is unique and no record names it).
pub async fn take(
    shard: &Shard,
    provider: &ObjectProvider,
    epoch: u64,
    scratch: &Path,
) -> Result<Checkpoint> {
    let outcome = upload_snapshot(shard, provider, epoch, scratch).await;
    let path = scratch.to_path_buf();
    let removed = tokio::task::spawn_blocking(move || remove_if_present(&path))
        .await
        .map_err(|e| Error::Internal(format!("removing the scratch file: {e}")))?;
    if let Err(e) = removed {
        tracing::warn!(shard = shard.id, scratch = %scratch.display(), error = %e,
            "could not remove a checkpoint scratch file");
    }
    outcome
}

async fn upload_snapshot(
    shard: &Shard,
    provider: &ObjectProvider,
    epoch: u64,
    scratch: &Path,
) -> Result<Checkpoint> {
    let (size, covers) = shard.gate.snapshot_covering(scratch.to_path_buf()).await?;
    let path = scratch.to_path_buf();
    let (data, sha256) = tokio::task::spawn_blocking(move || -> Result<(Bytes, String)> {
        let data = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
        let sha256 = hex::encode(Sha256::digest(&data));
        Ok((Bytes::from(data), sha256))
    })
    .await
    .map_err(|e| Error::Internal(format!("hashing the checkpoint: {e}")))??;
    if data.len() as u64 != size {
        return Err(Error::Internal(format!(
            "checkpoint scratch file {} changed size after the snapshot ({size} → {})",
            scratch.display(),
            data.len()
        )));
    }
    let key = provider.checkpoint_key(shard.id, epoch);
    if let Err(e) = provider.put_checkpoint(&key, data).await {
        if let Err(d) = provider.delete(&key).await {
            tracing::debug!(key, error = %d, "could not delete a failed checkpoint upload");
        }
        return Err(e.into());
    }
    tracing::info!(shard = shard.id, epoch, key, size, "checkpoint uploaded");
    Ok(Checkpoint {
        key,
        sha256,
        size,
        covers,
    })
}

/// Downloads `checkpoint`, verifies it, and installs it as the shard file `dest`: written to
/// `dest.tmp`, fsynced, opened as a [`MetaStore`] (a file that does not open is refused and
/// the temporary file removed), renamed over `dest`, directory fsynced. On any refusal
/// (wrong size or digest: `DataCorrupted`; not a store: `Internal`) `dest` is unchanged.
pub async fn restore(
    provider: &ObjectProvider,
    checkpoint: &Checkpoint,
    dest: &Path,
) -> Result<()> {
    let data = provider
        .get_checkpoint(&checkpoint.key, &checkpoint.sha256, checkpoint.size)
        .await?;
    let dest = dest.to_path_buf();
    let key = checkpoint.key.clone();
    tokio::task::spawn_blocking(move || install(&data, &dest, &key))
        .await
        .map_err(|e| Error::Internal(format!("installing checkpoint: {e}")))?
}

/// Deletes a superseded checkpoint (idempotent: an absent key counts as deleted).
pub async fn discard(provider: &ObjectProvider, key: &str) -> Result<()> {
    Ok(provider.delete(key).await?)
}

/// The blocking part of [`restore`].
fn install(data: &[u8], dest: &Path, key: &str) -> Result<()> {
    use std::io::Write;
    let tmp = temp_path(dest);
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = remove_if_present(&tmp);
        return Err(io_error(&tmp, e));
    }
    // Opening proves the bytes are a shard store (and lets redb repair the allocator state
    // of a copy taken from an open file, so the installed file opens cleanly); closing it
    // writes once more, so it is fsynced again before it takes the shard file's place.
    let opened = MetaStore::open_plain(&tmp).map(drop).and_then(|()| {
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| crate::meta::MetaError::Damaged {
                path: tmp.clone(),
                detail: e.to_string(),
            })
    });
    if let Err(e) = opened {
        let _ = remove_if_present(&tmp);
        return Err(Error::Internal(format!(
            "checkpoint {key} is not a shard store, refused: {e}"
        )));
    }
    std::fs::rename(&tmp, dest).map_err(|e| io_error(dest, e))?;
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

/// `dest` with `.tmp` appended to its file name.
fn temp_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Internal(format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests;
