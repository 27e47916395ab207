//! A shard's state copied out of a store on its own (a checkpoint: graceful handoff moves a
//! shard to its next owner through the provider, see [`crate::shard::checkpoint`]) and copied
//! into a node file on its own (the next owner's load, and the one-time move of a data dir's
//! per-shard files into the node file). A node backup copies every shard out together, from
//! one snapshot ([`MetaStore::export_each`], see [`crate::backup`]).
//!
//! The copy is a standalone single-shard file with canonical table names (see
//! [`super::tables`]), written in one durable transaction from one read snapshot of the
//! shard's namespace. It is taken by the store's single writer between two sessions, after an
//! empty durable commit that makes any deferred commits of the batch in progress durable too,
//! so it holds every commit made before it.

use std::path::Path;

use redb::ReadableDatabase;

use super::{MetaError, MetaResult, MetaStore, Namespace, Tables};

impl MetaStore {
    /// Copies namespace `ns` to a new standalone file `dest` (replacing it) and returns its
    /// size in bytes. Every commit made through this handle before the call is in the copy.
    ///
    /// Must be called by the store's single writer with no write session running (the gate
    /// runs it as a job on the committer thread); a failed handle refuses, as it refuses
    /// every write. `dest`'s directory is not fsynced: the copy is a scratch file that is
    /// uploaded and removed, never a file a restart relies on.
    pub fn export(&self, ns: Namespace, dest: &Path) -> MetaResult<u64> {
        Ok(self.export_each(&[(ns, dest)])?[0])
    }

    /// [`MetaStore::export`] of several namespaces, each to its own standalone file, all from
    /// one read snapshot (a node backup: the copies agree with each other, not only with
    /// every commit before the call). Returns the files' sizes in the order given.
    ///
    /// Same caller rule as [`MetaStore::export`]: the store's single writer, between sessions.
    pub fn export_each(&self, copies: &[(Namespace, &Path)]) -> MetaResult<Vec<u64>> {
        self.flush()?;
        let snapshot = self.db.begin_read()?;
        let mut sizes = Vec::with_capacity(copies.len());
        for &(ns, dest) in copies {
            let io = |e: std::io::Error| MetaError::Copy {
                dest: dest.to_path_buf(),
                detail: e.to_string(),
            };
            match std::fs::remove_file(dest) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => {}
            }
            {
                let copy = MetaStore::create_plain(dest)?;
                copy.write_bare(|txn| ns.copy_all(&snapshot, Tables::canonical(), txn))?;
            }
            sizes.push(std::fs::metadata(dest).map_err(io)?.len());
        }
        Ok(sizes)
    }

    /// Replaces namespace `ns` of this store with the content of the standalone file `src`,
    /// in one durable transaction (a crash leaves the old tables or the new ones, never a
    /// mix), then brings it to the current layout ([`MetaStore::prepare`]).
    ///
    /// Must be called by the store's single writer; `src` is opened read-only in effect (its
    /// own open only makes sure its tables exist).
    pub fn import(&self, ns: Namespace, src: &Path) -> MetaResult<()> {
        let source = MetaStore::open_plain(src)?;
        let snapshot = source.db.begin_read()?;
        self.write_bare(|txn| {
            ns.delete_all(txn)?;
            Tables::canonical().copy_all(&snapshot, ns, txn)
        })?;
        self.prepare(ns)
    }

    /// Replaces namespace `ns` with the checkpoint file `base` (`None`: nothing) followed by
    /// the rows of `records` — redo payloads ([`super::Redo::payload`]) in sequence order,
    /// possibly of another node's store — that belong to `ns`, in one durable transaction (a
    /// crash leaves the old tables or the restored ones, never a mix); then brings it to the
    /// current layout ([`MetaStore::prepare`]). How a node takes over a shard whose state is
    /// in the provider: a checkpoint plus its owner's log.
    ///
    /// Same caller rule as [`MetaStore::import`].
    pub fn restore(&self, ns: Namespace, base: Option<&Path>, records: &[&[u8]]) -> MetaResult<()> {
        let source = base.map(MetaStore::open_plain).transpose()?;
        let snapshot = source.as_ref().map(|s| s.db.begin_read()).transpose()?;
        self.write_bare(|txn| {
            ns.delete_all(txn)?;
            if let Some(snapshot) = &snapshot {
                Tables::canonical().copy_all(snapshot, ns, txn)?;
            }
            for payload in records {
                super::durability::apply_in(txn, payload, ns)?;
            }
            Ok(())
        })?;
        self.prepare(ns)
    }

    /// Runs `f` on a write transaction of its own and commits it durably (on `Err` it is
    /// aborted and nothing changes): the bulk copies above, which write a whole namespace.
    /// They get the bare transaction — no undo step or redo effect per row — because they are
    /// never part of a batch: a durable commit, so the redo log never needs to describe
    /// them, and atomic, so a failure needs no undo. No session runs inside it.
    fn write_bare(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> MetaResult<()>,
    ) -> MetaResult<()> {
        let txn = self.begin_write()?;
        f(&txn)?;
        self.commit(txn)?;
        self.count_durable();
        Ok(())
    }

    /// [`MetaStore::export`] of a standalone file's own tables.
    pub fn copy_to(&self, dest: &Path) -> MetaResult<u64> {
        self.export(self.home(), dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Commit;

    // Catches: a copy that leaves out a commit that is not durable yet (one made from the
    // file's durable state instead of a read snapshot of the last commit). Dropping
    // `self.flush()` from `export` does not turn it red — a read snapshot sees non-durable
    // commits too (tried); that flush is what `a_failed_store_refuses_to_be_copied` needs.
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

    // Catches: a copy that misses a table or takes another shard's rows (the namespace of the
    // source not used), and an import that keeps rows the checkpoint does not have.
    #[test]
    fn a_shard_exported_from_a_node_file_and_imported_into_another_carries_its_rows_only() {
        let dir = tempfile::tempdir().unwrap();
        let node = MetaStore::create_node(&dir.path().join("node.redb")).unwrap();
        let (three, four) = (Tables::shard(3), Tables::shard(4));
        node.prepare(three).unwrap();
        node.prepare(four).unwrap();
        node.write_in(three, Commit::Durable, |w| w.put_inline("ws", "mine", b"3"))
            .unwrap();
        node.write_in(four, Commit::Deferred, |w| {
            w.put_inline("ws", "other", b"4")
        })
        .unwrap();
        node.write_in(three, Commit::Deferred, |w| w.set_epoch(7))
            .unwrap();

        let ckpt = dir.path().join("s3.ckpt");
        node.export(three, &ckpt).unwrap();
        let copy = MetaStore::open(&ckpt).unwrap();
        assert_eq!(
            copy.read(|r| r.inline("ws", "mine")).unwrap(),
            Some(b"3".to_vec())
        );
        assert_eq!(copy.read(|r| r.inline("ws", "other")).unwrap(), None);
        assert_eq!(copy.read(|r| r.epoch()).unwrap(), 7);
        drop(copy);

        let next = MetaStore::create_node(&dir.path().join("next.redb")).unwrap();
        next.prepare(three).unwrap();
        next.write_in(three, Commit::Durable, |w| {
            w.put_inline("ws", "stale", b"s")
        })
        .unwrap();
        next.import(three, &ckpt).unwrap();
        assert!(next.holds(three).unwrap());
        assert!(!next.holds(four).unwrap());
        let read = |name: &str| next.read_in(three, |r| r.inline("ws", name)).unwrap();
        assert_eq!(read("mine"), Some(b"3".to_vec()));
        assert_eq!(read("stale"), None, "the import replaces the namespace");
        assert_eq!(next.read_in(three, |r| r.epoch()).unwrap(), 7);
    }

    // Catches: an export that copies from a failed handle (dropping `self.flush()` from
    // `export`: the flush is its one write, and a failed handle refuses writes; verified red).
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
