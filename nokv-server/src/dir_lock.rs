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
}
