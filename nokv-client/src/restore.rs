//! Restoring an artifact: the manifest first, then blocks in parallel, each verified against
//! its recorded checksums (a CRC-32C: early detection of a damaged block), then the whole
//! sha256 (the proof), computed over the blocks in order as they are written — the file is
//! not read back for it. A restore writes `DEST.partial`, fsyncs and
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

use futures::StreamExt;
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
        let block_size = well_formed(&m)?;
        let partial_name = partial_name(&dest.name);
        let partial = partial_path(&dest.shown);
        let (file, resuming) = open_partial(&dest.dir, &partial_name, &partial)?;
        if file.metadata().map_err(|e| io(&partial, e))?.len() != m.size {
            file.set_len(m.size).map_err(|e| io(&partial, e))?;
        }
        let target = Arc::new(Partial {
            file,
            path: partial.clone(),
            resuming,
        });

        // Blocks are fetched up to `parallel` ahead but taken in order, so the whole sha256
        // is computed over the bytes as they are written (on one blocking thread, off the
        // runtime): the proof needs no second pass reading the file back.
        let mut whole = InOrderDigest::start();
        let mut resumed = 0;
        let mut blocks = futures::stream::iter(m.blocks.iter().cloned())
            .map(|b| {
                let offset = u64::from(b.index) * block_size;
                self.restore_block(ws, path, m.revision, b, offset, target.clone())
            })
            .buffered(parallel.max(1));
        while let Some(block) = blocks.next().await {
            let (data, kept) = block?;
            resumed += u32::from(kept);
            if let Some(p) = &progress {
                p(data.len() as u64);
            }
            whole.feed(data).await?;
        }
        drop(blocks);

        let digest = whole.finish().await?;
        let (t, want) = (target.clone(), m.sha256.clone());
        if let Err(e) = blocking(move || finish(&t, &digest, &want)).await {
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

    /// One block of a restore: kept from an earlier attempt's partial file when it verifies
    /// there, else fetched and written at `offset`. Returns its bytes (for the whole sha256)
    /// and whether they were kept.
    async fn restore_block(
        &self,
        ws: &str,
        path: &str,
        revision: u64,
        b: pb::BlockInfo,
        offset: u64,
        target: Arc<Partial>,
    ) -> Result<(Vec<u8>, bool)> {
        if target.resuming {
            let (t, want) = (target.clone(), b.clone());
            if let Some(kept) = blocking(move || Ok(t.verified_block(offset, &want))).await? {
                return Ok((kept, true));
            }
        }
        let data = self
            .fetch_block(ws, revision, &b)
            .await
            .map_err(|e| revision_gone(e, ws, path, revision))?;
        let data = blocking(move || {
            target
                .file
                .write_all_at(&data, offset)
                .map(|()| data)
                .map_err(|e| io(&target.path, e))
        })
        .await?;
        Ok((data, false))
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
        let mut whole = InOrderDigest::start();
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
            out.write_all(&data)
                .await
                .map_err(|e| ClientError::local(format!("write: {e}")))?;
            whole.feed(data).await?;
        }
        out.flush()
            .await
            .map_err(|e| ClientError::local(format!("write: {e}")))?;
        drop(blocks);
        if whole.finish().await? != m.sha256 {
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

/// `DEST.partial`, open for the blocks of one restore.
struct Partial {
    file: std::fs::File,
    path: PathBuf,
    /// It existed before this restore: its blocks that verify are kept.
    resuming: bool,
}

impl Partial {
    /// The block at `offset` as an earlier attempt left it, if it matches the manifest.
    fn verified_block(&self, offset: u64, b: &pb::BlockInfo) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; b.length as usize];
        (self.file.read_exact_at(&mut buf, offset).is_ok() && BlockChecksums::from(b).matches(&buf))
            .then_some(buf)
    }
}

/// Runs `f` on a blocking thread: file I/O and hashing stay off the runtime that drives the
/// block fetches.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ClientError::local(e.to_string()))?
}

/// The block size of a manifest whose blocks tile its size in index order (every block
/// `block_size` long but the last, which is not empty). The whole sha256 is computed over
/// the blocks in manifest order, so a manifest that does not tile the file would otherwise
/// be reported as corrupt bytes.
fn well_formed(m: &pb::GetManifestResponse) -> Result<u64> {
    let n = m.blocks.len();
    let tiles = m.blocks.iter().enumerate().all(|(i, b)| {
        b.index as usize == i
            && b.length > 0
            && if i + 1 < n {
                b.length == m.block_size
            } else {
                b.length <= m.block_size
            }
    }) && m.blocks.iter().map(|b| b.length).sum::<u64>() == m.size;
    if !tiles {
        return Err(ClientError::integrity(format!(
            "the manifest of revision {} is malformed: its {n} blocks do not tile {} bytes in \
             blocks of {}",
            m.revision, m.size, m.block_size
        )));
    }
    Ok(m.block_size)
}

/// The sha256 of blocks fed in order, computed on one blocking thread so that hashing a
/// block (milliseconds for 4 MiB) never stalls the fetches. At most two blocks wait for it.
struct InOrderDigest {
    blocks: tokio::sync::mpsc::Sender<Vec<u8>>,
    digest: tokio::task::JoinHandle<Vec<u8>>,
}

impl InOrderDigest {
    fn start() -> InOrderDigest {
        let (blocks, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(2);
        let digest = tokio::task::spawn_blocking(move || {
            let mut h = Sha256::new();
            while let Some(block) = rx.blocking_recv() {
                h.update(&block);
            }
            h.finalize().to_vec()
        });
        InOrderDigest { blocks, digest }
    }

    async fn feed(&mut self, block: Vec<u8>) -> Result<()> {
        self.blocks
            .send(block)
            .await
            .map_err(|_| ClientError::local("the sha256 thread stopped"))
    }

    async fn finish(self) -> Result<Vec<u8>> {
        drop(self.blocks);
        self.digest
            .await
            .map_err(|e| ClientError::local(e.to_string()))
    }
}

/// Makes the assembled file durable and checks the whole sha256 computed while it was
/// written. On a mismatch the caller removes the partial file: none of its blocks can be
/// trusted as a resume point then.
fn finish(partial: &Partial, digest: &[u8], want: &[u8]) -> Result<()> {
    partial.file.sync_all().map_err(|e| io(&partial.path, e))?;
    if digest != want {
        return Err(ClientError::integrity(
            "the restored file does not match the artifact's recorded sha256",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(size: u64, block_size: u64, lengths: &[u64]) -> pb::GetManifestResponse {
        pb::GetManifestResponse {
            revision: 7,
            size,
            block_size,
            blocks: lengths
                .iter()
                .enumerate()
                .map(|(i, &length)| pb::BlockInfo {
                    index: i as u32,
                    length,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_manifest_whose_blocks_tile_its_size_in_order_is_well_formed() {
        assert_eq!(well_formed(&manifest(10, 4, &[4, 4, 2])).unwrap(), 4);
        assert_eq!(well_formed(&manifest(8, 4, &[4, 4])).unwrap(), 4);
        assert_eq!(well_formed(&manifest(0, 4, &[])).unwrap(), 4);
    }

    #[test]
    fn a_manifest_that_does_not_tile_its_size_in_order_is_refused_before_any_block() {
        let short_middle = manifest(9, 4, &[4, 1, 4]);
        let long_last = manifest(13, 4, &[4, 4, 5]);
        let empty_last = manifest(8, 4, &[4, 4, 0]);
        let wrong_size = manifest(11, 4, &[4, 4, 2]);
        let mut out_of_order = manifest(10, 4, &[4, 4, 2]);
        out_of_order.blocks.swap(0, 2);
        for (m, what) in [
            (short_middle, "a short block before the last"),
            (long_last, "a last block longer than the block size"),
            (empty_last, "an empty block"),
            (wrong_size, "lengths that do not add up to the size"),
            (out_of_order, "blocks out of index order"),
        ] {
            let e = well_formed(&m).expect_err(what);
            assert_eq!(e.reason, crate::Reason::Integrity, "{what}");
            assert!(e.message.contains("revision 7 is malformed"), "{what}: {e}");
        }
    }

    #[tokio::test]
    async fn the_in_order_digest_is_the_sha256_of_the_blocks_concatenated() {
        let blocks: Vec<Vec<u8>> = (0u8..5).map(|i| vec![i; 1000 + usize::from(i)]).collect();
        let mut whole = InOrderDigest::start();
        for b in &blocks {
            whole.feed(b.clone()).await.unwrap();
        }
        assert_eq!(
            whole.finish().await.unwrap(),
            Sha256::digest(blocks.concat()).to_vec()
        );
        assert_eq!(
            InOrderDigest::start().finish().await.unwrap(),
            Sha256::digest(b"").to_vec(),
            "no blocks: the digest of nothing"
        );
    }

    #[test]
    fn a_restored_file_whose_digest_differs_from_the_manifest_is_refused() {
        let path = std::env::temp_dir().join(format!("nokv-restore-finish-{}", std::process::id()));
        let partial = Partial {
            file: std::fs::File::create(&path).unwrap(),
            path: path.clone(),
            resuming: false,
        };
        let got = Sha256::digest(b"abc").to_vec();
        finish(&partial, &got, &got).expect("a matching digest");
        let e = finish(&partial, &got, &Sha256::digest(b"abd")).expect_err("a mismatch");
        assert_eq!(e.reason, crate::Reason::Integrity);
        std::fs::remove_file(&path).unwrap();
    }
}
