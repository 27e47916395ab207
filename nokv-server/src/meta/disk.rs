//! Where a store's two files live: the real file system, or — in tests — a simulated disk
//! that can lose power ([`super::powercut`]). Every byte of the node file and the redo log goes
//! through here, so that:
//! * an fsync that fails is noticed wherever it happens — in the log's append or deep inside a
//!   redb commit — and becomes fatal for the process ([`super::fatal`]) instead of an error a
//!   caller might retry (after a failed fsync the page cache no longer says what the disk
//!   holds: retrying, or reopening and trusting what reads back, can lose acknowledged writes);
//! * a test can cut power and keep only what was fsynced.

use std::io;
use std::ops::Bound;
use std::path::Path;

use redb::StorageBackend;
use redb::backends::FileBackend;

use super::StoreFaults;
use super::log_file::LogFile;

/// Which file an fsync was for (fault injection and the fatal report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    Log,
    Store,
}

/// The disk a store's files are on. `Default` is the real file system.
#[derive(Debug, Clone, Default)]
pub(super) enum Disk {
    #[default]
    Real,
    #[cfg(test)]
    Simulated(std::sync::Arc<super::powercut::SimDisk>),
}

impl Disk {
    /// The length of the file at `path`, `None` if it does not exist.
    pub(super) fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        match self {
            Disk::Real => match std::fs::metadata(path) {
                Ok(m) => Ok(Some(m.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
            #[cfg(test)]
            Disk::Simulated(d) => Ok(d.len_of(path)),
        }
    }

    /// Opens the existing log at `path` (`None`: there is none).
    pub(super) fn open_log(&self, path: &Path) -> io::Result<Option<Box<dyn LogFile>>> {
        match self {
            Disk::Real => {
                match std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                {
                    Ok(f) => Ok(Some(Box::new(f))),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e),
                }
            }
            #[cfg(test)]
            Disk::Simulated(d) => Ok(d.open(path).map(|f| Box::new(f) as Box<dyn LogFile>)),
        }
    }

    /// Opens the log at `path`, creating it (empty) if missing; the directory entry is made
    /// durable before this returns.
    pub(super) fn create_log(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        match self {
            Disk::Real => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .read(true)
                    .write(true)
                    .open(path)?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
                Ok(Box::new(f))
            }
            #[cfg(test)]
            Disk::Simulated(d) => Ok(Box::new(d.create(path))),
        }
    }

    /// Moves the file at `from` to `to` (same directory), durably.
    pub(super) fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Disk::Real => {
                std::fs::rename(from, to)?;
                if let Some(dir) = to.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
                Ok(())
            }
            #[cfg(test)]
            Disk::Simulated(d) => d.rename(from, to),
        }
    }

    /// The storage of the redb file at `path` (created if `create`), with its fsyncs watched.
    pub(super) fn store_backend(
        &self,
        path: &Path,
        create: bool,
        faults: &StoreFaults,
    ) -> Result<Watched, redb::DatabaseError> {
        let inner: Box<dyn StorageBackend> = match self {
            Disk::Real => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .truncate(false)
                    .open(path)?;
                Box::new(FileBackend::new(file)?)
            }
            #[cfg(test)]
            Disk::Simulated(d) => Box::new(d.create(path)),
        };
        Ok(Watched {
            inner,
            faults: faults.clone(),
        })
    }
}

/// A redb storage backend whose fsyncs are watched: an injected fault fails them, and a
/// failure is remembered in the fault hook's latch so that the commit that met it is known to
/// be fatal ([`super::fatal`]), not a full disk to recover from.
#[derive(Debug)]
pub(super) struct Watched {
    inner: Box<dyn StorageBackend>,
    faults: StoreFaults,
}

impl StorageBackend for Watched {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        let synced = self
            .faults
            .check_sync(Synced::Store)
            .and_then(|()| self.inner.sync_data());
        if let Err(e) = &synced {
            self.faults.sync_failed(Synced::Store, e.to_string());
        }
        synced
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
}
