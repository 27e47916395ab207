//! Restoring an artifact: the manifest first, then blocks in parallel, each verified against
//! its recorded digest, then the whole sha256. A restore writes `DEST.partial`, fsyncs and
//! renames, so DEST either does not exist or is complete and verified. An interrupted restore
//! resumes: blocks already in `DEST.partial` whose digest verifies are not fetched again.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::ClientError;
use crate::publish::Progress;
use crate::sdk::{Client, Result, unary};

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    pub manifest: pb::GetManifestResponse,
    /// Blocks found verified in an earlier `.partial` and not fetched again.
    pub resumed_blocks: u32,
}

fn io(path: &Path, e: std::io::Error) -> ClientError {
    ClientError::local(format!("{}: {e}", path.display()))
}

pub fn partial_path(dest: &Path) -> PathBuf {
    let mut p = dest.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

impl Client {
    pub async fn manifest(&self, ws: &str, path: &str) -> Result<pb::GetManifestResponse> {
        let req = pb::GetManifestRequest {
            workspace: ws.into(),
            path: path.into(),
        };
        unary!(self, get_manifest, req)
    }

    /// One block, verified against the manifest's length and digest.
    pub async fn fetch_block(
        &self,
        ws: &str,
        revision: u64,
        block: &pb::BlockInfo,
    ) -> Result<Vec<u8>> {
        let req = pb::ReadBlockRequest {
            workspace: ws.into(),
            revision,
            index: block.index,
        };
        let data = self
            .retrying("read_block", || {
                let mut c = self.ws.clone();
                let req = req.clone();
                async move {
                    let mut stream = c.read_block(req).await?.into_inner();
                    let mut data = Vec::new();
                    while let Some(chunk) = stream.message().await? {
                        data.extend_from_slice(&chunk.data);
                    }
                    Ok(data)
                }
            })
            .await?;
        if data.len() as u64 != block.length || Sha256::digest(&data).as_slice() != block.sha256 {
            return Err(ClientError::integrity(format!(
                "block {} of revision {revision} is corrupt: its bytes do not match the recorded sha256",
                block.index
            )));
        }
        Ok(data)
    }

    /// Restores `ws:path` into `dest` atomically (see the module docs).
    pub async fn restore(
        &self,
        ws: &str,
        path: &str,
        dest: &Path,
        parallel: usize,
        progress: Option<Progress>,
    ) -> Result<Restored> {
        let m = self.manifest(ws, path).await?;
        let partial = partial_path(dest);
        let resuming = partial.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&partial)
            .map_err(|e| io(&partial, e))?;
        if file.metadata().map_err(|e| io(&partial, e))?.len() != m.size {
            file.set_len(m.size).map_err(|e| io(&partial, e))?;
        }
        let file = Arc::new(file);

        let mut todo = Vec::new();
        let mut resumed = 0;
        for b in &m.blocks {
            let offset = u64::from(b.index) * m.block_size;
            if resuming && block_verifies(&file, offset, b) {
                resumed += 1;
                if let Some(p) = &progress {
                    p(b.length);
                }
            } else {
                todo.push((b.clone(), offset));
            }
        }
        futures::stream::iter(todo)
            .map(|(b, offset)| {
                let (file, progress, partial) = (file.clone(), progress.clone(), partial.clone());
                async move {
                    let data = self.fetch_block(ws, m.revision, &b).await?;
                    tokio::task::spawn_blocking(move || file.write_all_at(&data, offset))
                        .await
                        .map_err(|e| ClientError::local(e.to_string()))?
                        .map_err(|e| io(&partial, e))?;
                    if let Some(p) = progress {
                        p(b.length);
                    }
                    Ok::<_, ClientError>(())
                }
            })
            .buffer_unordered(parallel.max(1))
            .try_collect::<Vec<()>>()
            .await?;

        let (f, p, want) = (file.clone(), partial.clone(), m.sha256.clone());
        tokio::task::spawn_blocking(move || finish(&f, &p, &want))
            .await
            .map_err(|e| ClientError::local(e.to_string()))??;
        std::fs::rename(&partial, dest).map_err(|e| io(dest, e))?;
        // Make the rename itself durable.
        if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = std::fs::File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(Restored {
            manifest: m,
            resumed_blocks: resumed,
        })
    }

    /// Streams `ws:path` to `out` in order, verifying every block and the whole sha256
    /// (up to `parallel` blocks are fetched ahead). On a digest failure the stream stops
    /// with an error; bytes already written cannot be taken back, so prefer
    /// [`Client::restore`] for files.
    pub async fn read_artifact_to<W: AsyncWrite + Unpin>(
        &self,
        ws: &str,
        path: &str,
        out: &mut W,
        parallel: usize,
    ) -> Result<pb::GetManifestResponse> {
        let m = self.manifest(ws, path).await?;
        let mut whole = Sha256::new();
        let revision = m.revision;
        let mut blocks = futures::stream::iter(m.blocks.clone())
            .map(|b| async move { self.fetch_block(ws, revision, &b).await })
            .buffered(parallel.max(1));
        while let Some(data) = blocks.next().await {
            let data = data?;
            whole.update(&data);
            out.write_all(&data)
                .await
                .map_err(|e| ClientError::local(format!("write: {e}")))?;
        }
        out.flush()
            .await
            .map_err(|e| ClientError::local(format!("write: {e}")))?;
        if whole.finalize().as_slice() != m.sha256 {
            return Err(ClientError::integrity(
                "the artifact's bytes do not match its recorded sha256",
            ));
        }
        Ok(m)
    }
}

fn block_verifies(file: &std::fs::File, offset: u64, b: &pb::BlockInfo) -> bool {
    let mut buf = vec![0u8; b.length as usize];
    file.read_exact_at(&mut buf, offset).is_ok() && Sha256::digest(&buf).as_slice() == b.sha256
}

/// Verifies the whole sha256 of the assembled file and makes it durable. A mismatch removes
/// the partial file: none of its blocks can be trusted as a resume point then.
fn finish(file: &std::fs::File, partial: &Path, want: &[u8]) -> Result<()> {
    file.sync_all().map_err(|e| io(partial, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        let n = file.read_at(&mut buf, pos).map_err(|e| io(partial, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        pos += n as u64;
    }
    if h.finalize().as_slice() != want {
        let _ = std::fs::remove_file(partial);
        return Err(ClientError::integrity(
            "the restored file does not match the artifact's recorded sha256",
        ));
    }
    Ok(())
}
