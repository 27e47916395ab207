//! Restoring an artifact: the manifest first, then blocks in parallel, each verified against
//! its recorded digest, then the whole sha256. A restore writes `DEST.partial`, fsyncs and
//! renames, so DEST either does not exist or is complete and verified. An interrupted restore
//! resumes: blocks already in `DEST.partial` whose digest verifies are not fetched again.
//!
//! Safety of the local files, checked before any block is downloaded:
//! * DEST must be something a rename can replace: not a directory, in an existing directory.
//! * `DEST.partial` is opened without following a symbolic link (`O_NOFOLLOW`), created `0600`
//!   if new, and must be a regular file owned by this user that nobody else can write. A
//!   partial file planted by someone else (e.g. a link to a file the user can write, in a
//!   shared directory) would otherwise be overwritten, or resumed from with the planter's
//!   bytes; it is refused with a message that names it instead.
//!
//! A revision that disappears mid-way (the artifact was overwritten or deleted and its old
//! blocks were collected) cannot be completed: the server answers `NotFound` for the revision,
//! and the restore fails saying that the artifact was replaced.

use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
            .retrying_for("read_block", Some(ws), |conn| {
                let mut c = conn.ws;
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
        check_destination(dest)?;
        let m = self.manifest(ws, path).await?;
        self.restore_manifest(ws, path, m, dest, parallel, progress)
            .await
    }

    /// Restores the revision described by `m` (a manifest of `ws:path` fetched earlier) into
    /// `dest`, as [`Client::restore`] does.
    pub async fn restore_manifest(
        &self,
        ws: &str,
        path: &str,
        m: pb::GetManifestResponse,
        dest: &Path,
        parallel: usize,
        progress: Option<Progress>,
    ) -> Result<Restored> {
        check_destination(dest)?;
        let partial = partial_path(dest);
        let (file, resuming) = open_partial(&partial)?;
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
                    let data = self
                        .fetch_block(ws, m.revision, &b)
                        .await
                        .map_err(|e| revision_gone(e, ws, path, m.revision))?;
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
            .map(|b| async move {
                self.fetch_block(ws, revision, &b)
                    .await
                    .map_err(|e| revision_gone(e, ws, path, revision))
            })
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

/// Refuses a destination that the final rename could not replace, before anything is
/// downloaded: an existing directory, or a parent that is missing or not a directory.
fn check_destination(dest: &Path) -> Result<()> {
    if dest.as_os_str().is_empty() {
        return Err(ClientError::usage("the destination path is empty"));
    }
    match std::fs::symlink_metadata(dest) {
        Ok(md) if md.is_dir() => {
            return Err(ClientError::usage(format!(
                "{} is a directory: restore needs a file path to create or replace (e.g. {}/NAME)",
                dest.display(),
                dest.display()
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(dest, e)),
    }
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => Err(ClientError::usage(format!(
            "{}: {} is not a directory",
            dest.display(),
            parent.display()
        ))),
        Err(e) => Err(ClientError::usage(format!(
            "{}: its directory {}: {e}",
            dest.display(),
            parent.display()
        ))),
    }
}

/// Opens (or creates, mode 0600) `DEST.partial` without following a symbolic link, and
/// refuses it unless it is a regular file owned by this user and writable by nobody else.
/// Returns the file and whether it existed before (a resume).
fn open_partial(partial: &Path) -> Result<(std::fs::File, bool)> {
    let refuse = |why: String| {
        ClientError::local(format!(
            "{}: {why}; refusing to use it (remove it if you did not create it)",
            partial.display()
        ))
    };
    let existed = std::fs::symlink_metadata(partial).is_ok();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(partial)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("is a symbolic link".into()),
            _ => io(partial, e),
        })?;
    let md = file.metadata().map_err(|e| io(partial, e))?;
    if !md.is_file() {
        return Err(refuse("is not a regular file".into()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(refuse(format!(
            "is owned by uid {}, not by this user (uid {me})",
            md.uid()
        )));
    }
    if md.permissions().mode() & 0o022 != 0 {
        return Err(refuse(format!(
            "is writable by other users (mode {:o})",
            md.permissions().mode() & 0o7777
        )));
    }
    // A partial file of this user's own with a looser mode (0644 after a copy) is resumed, but
    // what it becomes is restored data: 0600 like a fresh one, before a byte of it is written.
    if md.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io(partial, e))?;
    }
    Ok((file, existed))
}

/// A `NotFound` for the revision being read means it is gone: the artifact was overwritten
/// or deleted and the old revision's blocks were collected after the restore began.
fn revision_gone(e: ClientError, ws: &str, path: &str, revision: u64) -> ClientError {
    if !e.is("NotFound") {
        return e;
    }
    ClientError {
        message: format!(
            "revision {revision} of {ws}:{path} is no longer available: the artifact was \
             replaced or deleted while it was being restored; run the restore again for the \
             current revision"
        ),
        ..e
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
