//! Restoring an artifact: the manifest first, then blocks in parallel, each verified against
//! its recorded checksums (a CRC-32C: early detection of a damaged block), then the whole
//! sha256 (the proof). A restore writes `DEST.partial`, fsyncs and
//! renames, so DEST either does not exist or is complete and verified. An interrupted restore
//! resumes: blocks already in `DEST.partial` whose digest verifies are not fetched again.
//!
//! Safety of the local files, checked before any block is downloaded:
//! * DEST must be something a rename can replace: not a directory, in an existing directory.
//! * DEST's directory is opened once ([`Destination`]); `DEST.partial` is created, renamed and
//!   removed relative to that handle, so a parent swapped for a symbolic link meanwhile cannot
//!   redirect the writes elsewhere (and `nokv mcp --local-root` can hand restore a directory
//!   it resolved beneath its root).
//! * `DEST.partial` is opened without following a symbolic link (`O_NOFOLLOW`), created `0600`
//!   if new, and must be a regular file owned by this user that nobody else can write. A
//!   partial file planted by someone else (e.g. a link to a file the user can write, in a
//!   shared directory) would otherwise be overwritten, or resumed from with the planter's
//!   bytes; it is refused with a message that names it instead.
//!
//! A revision that disappears mid-way (the artifact was overwritten or deleted and its old
//! blocks were collected) cannot be completed: the server answers `NotFound` for the revision,
//! and the restore fails saying that the artifact was replaced.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use nokv_proto::block_checksum::BlockChecksums;
use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::dir::{Dir, EntryKind};
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
    PathBuf::from(partial_name(dest.as_os_str()))
}

fn partial_name(name: &OsStr) -> OsString {
    let mut p = name.to_owned();
    p.push(".partial");
    p
}

/// Where a restore writes: a file name in an open directory, checked to be something the
/// final rename can replace (not a directory). `shown` names it in messages.
#[derive(Debug)]
pub struct Destination {
    dir: Dir,
    name: OsString,
    shown: PathBuf,
}

impl Destination {
    /// The destination `dest`: its directory is opened now, and must exist.
    pub fn new(dest: &Path) -> Result<Destination> {
        if dest.as_os_str().is_empty() {
            return Err(ClientError::usage("the destination path is empty"));
        }
        let Some(name) = dest.file_name() else {
            return Err(ClientError::usage(format!(
                "{} does not name a file: restore needs a file path to create or replace",
                dest.display()
            )));
        };
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = Dir::open(parent).map_err(|e| {
            ClientError::usage(match e.raw_os_error() {
                Some(libc::ENOTDIR) => format!(
                    "{}: {} is not a directory",
                    dest.display(),
                    parent.display()
                ),
                _ => format!(
                    "{}: its directory {}: {e}",
                    dest.display(),
                    parent.display()
                ),
            })
        })?;
        Destination::in_dir(dir, name.to_owned(), dest.to_owned())
    }

    /// The destination `name` in the open directory `dir`; `name` is one path component.
    pub fn in_dir(dir: Dir, name: OsString, shown: PathBuf) -> Result<Destination> {
        match dir.entry_kind(&name) {
            Ok(Some(EntryKind::Directory)) => Err(ClientError::usage(format!(
                "{} is a directory: restore needs a file path to create or replace (e.g. {}/NAME)",
                shown.display(),
                shown.display()
            ))),
            Ok(_) => Ok(Destination { dir, name, shown }),
            Err(e) => Err(io(&shown, e)),
        }
    }
}

impl Client {
    pub async fn manifest(&self, ws: &str, path: &str) -> Result<pb::GetManifestResponse> {
        let req = pb::GetManifestRequest {
            workspace: ws.into(),
            path: path.into(),
        };
        unary!(self, get_manifest, req)
    }

    /// One block, verified against the manifest's length and checksums.
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
        if data.len() as u64 != block.length || !BlockChecksums::from(block).matches(&data) {
            return Err(ClientError::integrity(format!(
                "block {} of revision {revision} is corrupt: its bytes do not match the recorded checksum",
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
        let dest = Destination::new(dest)?;
        self.restore_to(ws, path, &dest, parallel, progress).await
    }

    /// Restores `ws:path` into `dest` atomically, as [`Client::restore`] does.
    pub async fn restore_to(
        &self,
        ws: &str,
        path: &str,
        dest: &Destination,
        parallel: usize,
        progress: Option<Progress>,
    ) -> Result<Restored> {
        let m = self.manifest(ws, path).await?;
        self.restore_manifest_to(ws, path, m, dest, parallel, progress)
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
        let dest = Destination::new(dest)?;
        self.restore_manifest_to(ws, path, m, &dest, parallel, progress)
            .await
    }

    /// [`Client::restore_manifest`] into an open [`Destination`].
    pub async fn restore_manifest_to(
        &self,
        ws: &str,
        path: &str,
        m: pb::GetManifestResponse,
        dest: &Destination,
        parallel: usize,
        progress: Option<Progress>,
    ) -> Result<Restored> {
        let partial_name = partial_name(&dest.name);
        let partial = partial_path(&dest.shown);
        let (file, resuming) = open_partial(&dest.dir, &partial_name, &partial)?;
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
        let whole = tokio::task::spawn_blocking(move || finish(&f, &p, &want))
            .await
            .map_err(|e| ClientError::local(e.to_string()))?;
        if let Err(e) = whole {
            if e.reason == crate::Reason::Integrity {
                // None of its blocks can be trusted as a resume point.
                let _ = dest.dir.remove_file(&partial_name);
            }
            return Err(e);
        }
        dest.dir
            .rename(&partial_name, &dest.name)
            .map_err(|e| io(&dest.shown, e))?;
        // Make the rename itself durable.
        let _ = dest.dir.sync();
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

/// Opens (or creates, mode 0600) `DEST.partial` without following a symbolic link, and
/// refuses it unless it is a regular file owned by this user and writable by nobody else.
/// Returns the file and whether it existed before (a resume).
fn open_partial(dir: &Dir, name: &OsStr, partial: &Path) -> Result<(std::fs::File, bool)> {
    let refuse = |why: String| {
        ClientError::local(format!(
            "{}: {why}; refusing to use it (remove it if you did not create it)",
            partial.display()
        ))
    };
    let existed = dir.entry_kind(name).map_err(|e| io(partial, e))?.is_some();
    let file = dir
        .open_file(
            name,
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0o600,
        )
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
    file.read_exact_at(&mut buf, offset).is_ok() && BlockChecksums::from(b).matches(&buf)
}

/// Verifies the whole sha256 of the assembled file and makes it durable. On a mismatch the
/// caller removes the partial file: none of its blocks can be trusted as a resume point then.
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
        return Err(ClientError::integrity(
            "the restored file does not match the artifact's recorded sha256",
        ));
    }
    Ok(())
}
