//! `nokv admin backup DEST`: receives a node's backup stream into a local file.
//!
//! Invariants: DEST appears only complete and checked — the bytes go to `DEST.partial`, which
//! becomes DEST only after the stream ended with the server's summary and the received length
//! and sha256 equal it (and after an fsync); any failure or interruption removes
//! `DEST.partial`. An existing DEST is never replaced without `--force`: the check before the
//! call saves the node the work, and the final step links the file into place (which fails if
//! DEST appeared meanwhile) instead of renaming over it. The file is written as it arrives, so
//! memory stays at a few chunks whatever the backup's size.

use std::path::{Path, PathBuf};

use nokv_client::{Client, ClientError, Reason};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::output::{Output, human_bytes, plural};

pub async fn backup(
    client: &Client,
    out: Output,
    dest: &Path,
    force: bool,
) -> Result<(), ClientError> {
    if !force && dest.symlink_metadata().is_ok() {
        return Err(exists(dest));
    }
    let mut stream = client.backup().await?;
    let partial = Partial(partial_path(dest));
    let local = |e: std::io::Error| ClientError::local(format!("{}: {e}", partial.0.display()));
    let mut file = tokio::fs::File::create(&partial.0).await.map_err(local)?;
    let (mut hash, mut bytes, mut summary) = (Sha256::new(), 0u64, None);
    while let Some(chunk) = stream.message().await? {
        if summary.is_some() {
            return Err(broken("data after the backup's summary"));
        }
        if !chunk.data.is_empty() {
            hash.update(&chunk.data);
            bytes += chunk.data.len() as u64;
            file.write_all(&chunk.data).await.map_err(local)?;
        }
        summary = chunk.summary;
    }
    let summary = summary.ok_or_else(|| broken("the stream ended before the backup's summary"))?;
    let sha256 = hex::encode(hash.finalize());
    if summary.bytes != bytes || summary.sha256 != sha256 {
        return Err(ClientError::integrity(format!(
            "the backup received ({bytes} bytes, sha256 {sha256}) is not the one the node sent \
             ({} bytes, sha256 {}); nothing was written to {}",
            summary.bytes,
            summary.sha256,
            dest.display()
        )));
    }
    file.sync_all().await.map_err(local)?;
    drop(file);
    partial.publish(dest, force)?;
    let shards = summary.shards;
    out.emit(
        json!({"path": dest.display().to_string(), "bytes": bytes, "sha256": sha256,
               "shards": shards}),
        || {
            format!(
                "backup written to {}: {} ({bytes} bytes), {} of {}\nsha256 {sha256}",
                dest.display(),
                human_bytes(bytes),
                shards.len(),
                plural(summary.shard_count, "shard")
            )
        },
    );
    Ok(())
}

/// `DEST.partial`.
fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn exists(dest: &Path) -> ClientError {
    ClientError::usage(format!(
        "{} exists; pass --force to replace it",
        dest.display()
    ))
}

/// The stream did not end the way a complete backup does.
fn broken(what: &str) -> ClientError {
    ClientError {
        reason: Reason::Transport,
        code: None,
        message: format!("{what}: the backup is incomplete and was discarded; run it again"),
    }
}

/// The file being received: removed on drop unless it became DEST.
struct Partial(PathBuf);

impl Partial {
    /// Puts the checked file in place as `dest` (replacing it only when `force`) and makes
    /// the new name durable.
    fn publish(self, dest: &Path, force: bool) -> Result<(), ClientError> {
        let local =
            |p: &Path, e: std::io::Error| ClientError::local(format!("{}: {e}", p.display()));
        if force {
            std::fs::rename(&self.0, dest).map_err(|e| local(dest, e))?;
        } else {
            match std::fs::hard_link(&self.0, dest) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(exists(dest));
                }
                Err(e) => return Err(local(dest, e)),
            }
        }
        // Dropping removes DEST.partial: after a rename it is gone already, after a link
        // DEST keeps the bytes.
        drop(self);
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| local(dir, e))
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("nokv: could not remove {}: {e}", self.0.display());
            }
            _ => {}
        }
    }
}
