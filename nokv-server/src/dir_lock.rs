//! The data directory's exclusive lock: one daemon per data directory.
//!
//! Invariant: a daemon takes `DATA_DIR/LOCK` (an advisory `flock`, released by the kernel when
//! the process ends, even by `kill -9`) before it writes anything else in the directory. So a
//! second start on the same directory is refused before it can rewrite the running daemon's
//! `client.toml`, certificates or shard files. The lock file's content (the holder's pid) is
//! informational only; the lock itself is the truth.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "data dir {dir} is in use by another nokv-server{holder}; stop it first or choose another --data-dir"
    )]
    InUse { dir: PathBuf, holder: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Held for the life of the daemon; dropping it releases the directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "LOCK";

impl DirLock {
    /// Creates the data directory if needed and takes its lock without waiting.
    pub fn acquire(data_dir: &Path) -> Result<DirLock, LockError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| LockError::Io { path, source }
        };
        std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::InUse {
                    dir: std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.into()),
                    holder: if pid.is_empty() {
                        String::new()
                    } else {
                        format!(" (pid {pid})")
                    },
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        file.set_len(0).map_err(io(&path))?;
        file.rewind().map_err(io(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(io(&path))?;
        Ok(DirLock { _file: file })
    }
}

/// Whether a data directory held anything before this start: looked at before the lock is
/// taken (which creates it), acted on only once the lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// The directory did not exist.
    Missing,
    /// It existed and was empty.
    Empty,
    /// It held something (a node's files, or whatever the operator put there).
    Used,
}

impl Before {
    pub fn of(data_dir: &Path) -> Before {
        match std::fs::read_dir(data_dir) {
            Ok(mut entries) => match entries.next() {
                None => Before::Empty,
                Some(_) => Before::Used,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Before::Missing,
            // Unreadable: never treated as fresh, so nothing is ever removed from it.
            Err(_) => Before::Used,
        }
    }
}

/// A data directory this start found missing or empty: if the start fails before the daemon
/// serves (a port in use, a bad provider setting), dropping the guard removes what the start
/// put there — the directory itself if it created it, else its contents — so no fresh CA key,
/// cluster secret or admin token is left behind by a daemon that never ran. [`FreshDir::keep`]
/// disarms it once the daemon serves.
///
/// Invariant: it exists only while the caller holds the directory's [`DirLock`] and is
/// dropped before it, so nothing another process wrote is removed: a start that found the
/// directory fresh but lost the lock race never builds one.
#[derive(Debug)]
pub struct FreshDir {
    dir: PathBuf,
    before: Before,
    armed: bool,
}

impl FreshDir {
    /// The guard for `data_dir`, or `None` if it held something before this start (then it is
    /// never touched).
    pub fn new(data_dir: &Path, before: Before, _held: &DirLock) -> Option<FreshDir> {
        (before != Before::Used).then(|| FreshDir {
            dir: data_dir.to_path_buf(),
            before,
            armed: true,
        })
    }

    /// The daemon serves: what it wrote stays.
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for FreshDir {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let removed = match self.before {
            Before::Missing => std::fs::remove_dir_all(&self.dir),
            _ => std::fs::read_dir(&self.dir).and_then(|entries| {
                entries.into_iter().try_for_each(|e| {
                    let e = e?;
                    if e.file_type()?.is_dir() {
                        std::fs::remove_dir_all(e.path())
                    } else {
                        std::fs::remove_file(e.path())
                    }
                })
            }),
        };
        if let Err(e) = removed {
            eprintln!(
                "nokv-server: could not remove what this failed start wrote in {}: {e}",
                self.dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_is_locked_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, LockError::InUse { .. }), "{err}");
        assert!(
            err.to_string().contains(&std::process::id().to_string()),
            "{err}"
        );
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_failed_start_removes_a_data_dir_it_created_or_found_empty_and_never_a_used_one() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("new");
        let before = Before::of(&missing);
        assert_eq!(before, Before::Missing);
        let lock = DirLock::acquire(&missing).unwrap();
        std::fs::create_dir(missing.join("tls")).unwrap();
        std::fs::write(missing.join("tls").join("ca.key"), b"secret").unwrap();
        drop(FreshDir::new(&missing, before, &lock));
        drop(lock);
        assert!(!missing.exists(), "the created directory is gone");

        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let before = Before::of(&empty);
        assert_eq!(before, Before::Empty);
        let lock = DirLock::acquire(&empty).unwrap();
        std::fs::write(empty.join("cluster.secret"), b"secret").unwrap();
        drop(FreshDir::new(&empty, before, &lock));
        drop(lock);
        assert_eq!(
            std::fs::read_dir(&empty).unwrap().count(),
            0,
            "emptied, kept"
        );

        let used = root.path().join("used");
        std::fs::create_dir(&used).unwrap();
        std::fs::write(used.join("mine"), b"x").unwrap();
        let before = Before::of(&used);
        assert_eq!(before, Before::Used);
        let lock = DirLock::acquire(&used).unwrap();
        assert!(FreshDir::new(&used, before, &lock).is_none());

        // A start that serves keeps what it wrote.
        let kept = root.path().join("kept");
        let before = Before::of(&kept);
        let lock = DirLock::acquire(&kept).unwrap();
        FreshDir::new(&kept, before, &lock).unwrap().keep();
        drop(lock);
        assert!(kept.join(LOCK_FILE).exists());
    }
}
