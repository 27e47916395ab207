//! `nokv-server restore-backup --data-dir D FILE`: a new data dir from a backup file.
//!
//! Order, and why:
//! 1. `D` must be missing or empty — a restore never mixes with files that are already there
//!    (an old node file, a redo log, another node's objects) and never replaces one.
//! 2. The whole file is read once and every digest checked ([`super::format::read`]) before
//!    anything is created: a damaged backup leaves the disk exactly as it was.
//! 3. `D/shards.partial/` is built: the file is read again (checked again: it could change
//!    between the passes), each section lands in a scratch file and is imported into a fresh
//!    node file in its own durable transaction, then `COUNT` is written — the marker of a
//!    complete data dir (see [`crate::node`]) — and the directory fsynced.
//! 4. `shards.partial` is renamed to `shards` and `D` fsynced. A crash before the rename
//!    leaves no `shards/`, so no daemon can start on half a restore; a failure removes what
//!    this run created.
//!
//! Nothing else is written to `D`: the daemon's first start makes the TLS material, the
//! secret and the admin token of a fresh data dir (see the module doc of [`super`]).

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use super::format::{self, Manifest};
use super::{BackupError, Damage};
use crate::meta::{MetaStore, Tables};

/// What a restore created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub shards: Vec<u32>,
    pub shard_count: u32,
    /// Length of the backup file.
    pub bytes: u64,
    pub created_unix_ms: u64,
}

/// Makes data dir `data_dir` from backup `file` (see the module doc).
pub fn restore(file: &Path, data_dir: &Path) -> Result<Restored, BackupError> {
    require_empty(data_dir)?;
    let manifest = read(file, |_, _| Ok(()))?;
    let created_dir = !data_dir.exists();
    std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let staging = data_dir.join("shards.partial");
    let built = build(file, &manifest, &staging).and_then(|()| {
        let shards = data_dir.join("shards");
        std::fs::rename(&staging, &shards).map_err(io(&shards))?;
        sync_dir(data_dir)
    });
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&staging);
        if created_dir {
            let _ = std::fs::remove_dir(data_dir);
        }
        return Err(e);
    }
    Ok(Restored {
        shards: manifest.sections.iter().map(|s| s.shard).collect(),
        shard_count: manifest.shard_count,
        bytes: manifest.bytes,
        created_unix_ms: manifest.created_unix_ms,
    })
}

fn require_empty(dir: &Path) -> Result<(), BackupError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(BackupError::NotEmpty {
                dir: dir.to_path_buf(),
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // A plain file where the directory should be is as much "not empty" as a full one.
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(BackupError::NotEmpty {
            dir: dir.to_path_buf(),
        }),
        Err(e) => Err(io(dir)(e)),
    }
}

/// Step 3 of the module doc, into `staging`.
fn build(file: &Path, verified: &Manifest, staging: &Path) -> Result<(), BackupError> {
    std::fs::create_dir(staging).map_err(io(staging))?;
    let section = |shard: u32| staging.join(format!("{shard:04}.section"));
    let mut current: Option<(u32, File)> = None;
    let again = read(file, |shard, bytes| {
        if current.as_ref().is_none_or(|(s, _)| *s != shard) {
            let path = section(shard);
            current = Some((shard, File::create(&path).map_err(io(&path))?));
        }
        let (_, f) = current.as_mut().expect("opened above");
        f.write_all(bytes).map_err(io(&section(shard)))
    })?;
    drop(current);
    if again != *verified {
        return Err(BackupError::Interrupted(format!(
            "{} changed while it was being restored",
            file.display()
        )));
    }
    let store = MetaStore::create_node(&staging.join(crate::node::NODE_FILE))?;
    for s in &verified.sections {
        let path = section(s.shard);
        store.import(Tables::shard(s.shard), &path)?;
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    drop(store);
    crate::node::record_shard_count(staging, verified.shard_count)?;
    sync_dir(staging)
}

/// Reads and checks `file`, handing section bodies to `body` (see [`format::read`]).
fn read(
    file: &Path,
    body: impl FnMut(u32, &[u8]) -> Result<(), BackupError>,
) -> Result<Manifest, BackupError> {
    let src = File::open(file).map_err(io(file))?;
    let mut body = body;
    format::read(BufReader::new(src), |shard, bytes| {
        body(shard, bytes).map_err(Failure::Write)
    })
    .map_err(|f| match f {
        Failure::Damage(damage) => BackupError::Damaged {
            file: file.to_path_buf(),
            damage,
        },
        Failure::Io(e) => io(file)(e),
        Failure::Write(e) => e,
    })
}

/// Why reading a backup stopped: the file's fault, its disk's, or the restore's own writes.
enum Failure {
    Damage(Damage),
    Io(std::io::Error),
    Write(BackupError),
}

impl From<Damage> for Failure {
    fn from(d: Damage) -> Self {
        Failure::Damage(d)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: PathBuf::from(path),
        source,
    }
}
