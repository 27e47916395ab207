//! Taking a backup on a running node (`nokv admin backup`): copy every served shard out in one
//! committer job, then stream the copies as one [`super::format`] file.
//!
//! The copies go to a scratch directory in the data dir (`shards/backup.<unique>`), removed when
//! the backup ends in any way — sent, failed or abandoned by its caller; one a crash left behind
//! is removed at the next start ([`sweep_scratch`]). So a backup needs free disk about the size
//! of the node's metadata while it runs, and holds at most a few chunks in memory.
//!
//! While the copy runs, write sessions of every shard wait for it (reads go on): that is what
//! makes it hold every acknowledged write without stopping the node. Streaming happens after
//! the job, with writes flowing again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use super::BackupError;
use super::format::Encoder;
use crate::meta::Tables;
use crate::node::Node;

/// Bytes of a backup per message (well below the gRPC message limit).
const CHUNK: usize = 1024 * 1024;
/// Name prefix of scratch directories in `DATA_DIR/shards`.
const SCRATCH_PREFIX: &str = "backup.";

/// Where a backup's bytes go, in order. `false`: the receiver went away.
pub trait Sink {
    fn send(&mut self, bytes: Bytes) -> impl Future<Output = bool> + Send;
}

/// What was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Length of the whole file.
    pub bytes: u64,
    /// Lowercase hex sha256 of the whole file.
    pub sha256: String,
    /// The shards the backup holds, ascending.
    pub shards: Vec<u32>,
    pub shard_count: u32,
}

/// Backs up every shard `node` serves and sends the file to `sink`.
pub async fn take(node: &Node, sink: &mut impl Sink) -> Result<Summary, BackupError> {
    let mut shards: Vec<u32> = node.shards().iter().map(|s| s.id).collect();
    shards.sort_unstable();
    let scratch = Scratch::create(node.shards_dir())?;
    let files: Vec<PathBuf> = shards
        .iter()
        .map(|id| scratch.0.join(format!("{id:04}.redb")))
        .collect();
    let copies: Vec<(u32, PathBuf)> = shards.iter().copied().zip(files.clone()).collect();
    let sizes = node
        .committer()
        .exclusive(move |meta| {
            // A shard handed off while the job was queued has no tables to copy any more.
            for (id, _) in &copies {
                if !meta.holds(Tables::shard(*id))? {
                    return Err(BackupError::Interrupted(format!(
                        "shard {id} left this node during the backup"
                    ))
                    .into());
                }
            }
            let each: Vec<_> = copies
                .iter()
                .map(|(id, f)| (Tables::shard(*id), f.as_path()))
                .collect();
            Ok(meta.export_each(&each)?)
        })
        .await?;
    let created = crate::events::now_unix_ms();
    let mut out = Out {
        sink,
        hash: Sha256::new(),
        bytes: 0,
    };
    let (mut enc, head) = Encoder::new(node.shard_count(), shards.len() as u32, created);
    out.send(head).await?;
    for ((id, file), size) in shards.iter().zip(&files).zip(sizes) {
        out.send(enc.begin_section(*id, size)).await?;
        let io = |e| BackupError::Io {
            path: file.clone(),
            source: e,
        };
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let mut left = size;
        while left > 0 {
            let mut buf = vec![0u8; left.min(CHUNK as u64) as usize];
            f.read_exact(&mut buf).await.map_err(|e| {
                BackupError::Interrupted(format!("{} shrank while sent: {e}", file.display()))
            })?;
            enc.body(&buf);
            left -= buf.len() as u64;
            out.send(buf).await?;
        }
        let digest = enc.end_section().expect("exactly `size` bytes were sent");
        out.send(digest).await?;
    }
    out.send(enc.finish()).await?;
    drop(scratch);
    Ok(Summary {
        bytes: out.bytes,
        sha256: hex::encode(out.hash.finalize()),
        shards,
        shard_count: node.shard_count(),
    })
}

/// The sink with the digest and length of the whole stream.
struct Out<'a, S> {
    sink: &'a mut S,
    hash: Sha256,
    bytes: u64,
}

impl<S: Sink> Out<'_, S> {
    async fn send(&mut self, bytes: Vec<u8>) -> Result<(), BackupError> {
        self.hash.update(&bytes);
        self.bytes += bytes.len() as u64;
        if self.sink.send(Bytes::from(bytes)).await {
            Ok(())
        } else {
            Err(BackupError::CallerGone)
        }
    }
}

/// A backup's scratch directory, removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create(shards_dir: &Path) -> Result<Scratch, BackupError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{SCRATCH_PREFIX}{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = shards_dir.join(name);
        std::fs::create_dir(&dir).map_err(|e| BackupError::Io {
            path: dir.clone(),
            source: e,
        })?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(dir = %self.0.display(), error = %e, "could not remove a backup's scratch directory");
        }
    }
}

/// Removes the scratch directories of backups a crash interrupted. Called at start-up, while
/// the data dir lock is held and before any backup can run, so none of them is in use.
pub fn sweep_scratch(shards_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(shards_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(SCRATCH_PREFIX) && entry.path().is_dir() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    tracing::info!(dir = %entry.path().display(), "removed an interrupted backup's scratch directory")
                }
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), error = %e, "could not remove an interrupted backup's scratch directory")
                }
            }
        }
    }
}
