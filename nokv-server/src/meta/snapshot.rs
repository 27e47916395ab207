//! A consistent copy of a shard file, for checkpoints (graceful handoff moves a shard's redb
//! file to its next owner through the provider; see [`crate::shard::checkpoint`]).
//!
//! redb has no backup call, but its file is consistent whenever no write transaction is open
//! and every commit is durable: a durable commit writes and fsyncs all pages and the header
//! that names them, and read transactions never write. So the copy is taken by the store's
//! single writer (the shard's committer, between two sessions), after an empty durable
//! commit that makes any deferred commits of the batch in progress durable too. The copy
//! then holds every commit made before it and opens like a file left by a crash at that
//! moment (redb repairs its allocator state on open; no committed data is lost).

use std::path::Path;

use super::{MetaError, MetaResult, MetaStore};

impl MetaStore {
    /// Copies the store's file to `dest` (replacing it), fsyncs the copy and returns its
    /// size in bytes. Every commit made through this handle before the call is in the copy.
    ///
    /// Must be called by the store's single writer with no write session running (the gate
    /// runs it as a job on the committer thread); a failed handle refuses, as it refuses
    /// every write. `dest`'s directory is not fsynced: the copy is a scratch file that is
    /// uploaded and removed, never a file a restart relies on.
    pub fn copy_to(&self, dest: &Path) -> MetaResult<u64> {
        self.flush()?;
        let io = |e: std::io::Error| MetaError::Copy {
            dest: dest.to_path_buf(),
            detail: e.to_string(),
        };
        let size = std::fs::copy(self.path(), dest).map_err(io)?;
        std::fs::File::open(dest)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Commit;

    // Catches: dropping `self.flush()` (a deferred commit would be missing from the copy, as
    // it is not in the file's durable state yet).
    #[test]
    fn a_copy_holds_every_commit_made_before_it_including_deferred_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::create(&dir.path().join("s.redb")).unwrap();
        store
            .write(|w| w.put_inline("ws", "durable", b"d"))
            .unwrap();
        store
            .write_with(Commit::Deferred, |w| w.put_inline("ws", "deferred", b"x"))
            .unwrap();

        let dest = dir.path().join("copy.redb");
        let size = store.copy_to(&dest).unwrap();
        assert_eq!(size, std::fs::metadata(&dest).unwrap().len());
        let copy = MetaStore::open(&dest).unwrap();
        for name in ["durable", "deferred"] {
            let have = copy.read(|r| r.inline("ws", name)).unwrap();
            assert!(have.is_some(), "{name} is missing from the copy");
        }
    }

    #[test]
    fn a_failed_store_refuses_to_be_copied() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::create(&dir.path().join("s.redb")).unwrap();
        store.faults().fill_disk();
        let dest = dir.path().join("copy.redb");
        let err = store.copy_to(&dest).unwrap_err();
        assert!(matches!(err, MetaError::Failed(_)), "{err:?}");
        assert!(!dest.exists());
    }
}
