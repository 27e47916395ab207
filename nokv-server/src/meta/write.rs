//! The single writer's view of one namespace: typed writes whose every insert and remove
//! records its undo step (and, in a batch, its redo effect) first.

use prost::Message;
use redb::ReadableTable;

use super::durability::Effects;
use super::ledger::Tracked;
use super::records::*;
use super::undo;
use super::{EPOCH_KEY, UPLOAD_INDEX_MARKER};
use super::{MetaError, MetaResult, Namespace, decode, ended_at, self_dated};

pub struct WriteView<'a> {
    /// The session's reads: tables open read-only (see [`undo::SessionTxn`]).
    pub(super) txn: undo::SessionTxn<'a>,
    pub(super) t: Namespace,
    /// The session's writes: the one way to a writable table (see [`undo`]).
    capture: undo::Capture<'a>,
}

impl<'a> WriteView<'a> {
    /// A one-off session on `txn`, a transaction of its own that its caller commits on `Ok`
    /// and aborts on `Err` (see [`super::MetaStore::write_in`]): no redo record describes it.
    pub(super) fn new(txn: &'a redb::WriteTransaction, t: Namespace) -> Self {
        let (txn, capture) = undo::Capture::begin(txn, None);
        WriteView { txn, t, capture }
    }

    /// A session of a batch: its rows also go to the batch's redo effects (see
    /// [`super::Batch::session`]).
    pub(super) fn in_batch(
        txn: &'a redb::WriteTransaction,
        t: Namespace,
        redo: &'a std::cell::RefCell<Effects>,
    ) -> Self {
        let (txn, capture) = undo::Capture::begin(txn, Some(redo));
        WriteView { txn, t, capture }
    }

    /// How to undo what this session wrote, in the order it wrote it.
    pub(super) fn into_undo(self) -> Vec<undo::UndoStep> {
        self.capture.into_undo()
    }

    /// Opens one of the session's tables for writing: every insert and remove through it
    /// records its undo step first.
    pub(super) fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<'static, K, V>,
    ) -> MetaResult<undo::UndoTable<'_, K, V>> {
        self.capture.table(def)
    }
}

impl WriteView<'_> {
    pub fn put_entry(&mut self, ws: &str, path: &str, rec: &EntryRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.entries)?;
        t.insert((ws, path), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    /// Removes the entry and any inline body. The entry's generation moves to the
    /// generations table, so the path's next generation still exceeds it (see
    /// [`WriteView::next_generation`]).
    pub fn remove_entry(&mut self, ws: &str, path: &str) -> MetaResult<()> {
        let removed = self.entry(ws, path)?;
        self.table(self.t.entries)?.remove((ws, path))?;
        if let Some(EntryRecord { generation, .. }) = removed {
            let mut t = self.table(self.t.generations)?;
            let kept = t.get((ws, path))?.map_or(0, |v| v.value());
            if generation > kept {
                t.insert((ws, path), generation)?;
            }
        }
        self.table(self.t.inline)?.remove((ws, path))?;
        Ok(())
    }

    pub fn put_inline(&mut self, ws: &str, path: &str, data: &[u8]) -> MetaResult<()> {
        self.table(self.t.inline)?.insert((ws, path), data)?;
        Ok(())
    }

    pub fn remove_inline(&mut self, ws: &str, path: &str) -> MetaResult<()> {
        self.table(self.t.inline)?.remove((ws, path))?;
        Ok(())
    }

    /// Issues the path's next generation: strictly greater than every generation the path
    /// ever had, including deleted ones. The caller stores it in the path's entry in the
    /// same session.
    ///
    /// Invariants: a path's highest generation so far is the larger of its live entry's and
    /// its generations row — a live entry carries its own, and [`WriteView::remove_entry`]
    /// moves it to the row when the entry goes — and a live entry's generation is never below
    /// the row (an entry created after a removal starts above it; files written before this
    /// rule kept the row equal to the live entry's). So a rewrite, the common case, reads and
    /// writes no generations row; only a path without a live entry consults it.
    pub fn next_generation(&mut self, ws: &str, path: &str) -> MetaResult<u64> {
        let live = self.entry(ws, path)?;
        self.next_generation_after(ws, path, live.as_ref())
    }

    /// [`WriteView::next_generation`] for a caller that already read the path's live entry
    /// in this session (`live`: that read, `None` if there was none) and wrote no entry of the
    /// path since: the rewrite then reads nothing more. Passing an entry from elsewhere (an
    /// earlier session, a snapshot) could issue a generation the path already had.
    pub fn next_generation_after(
        &mut self,
        ws: &str,
        path: &str,
        live: Option<&EntryRecord>,
    ) -> MetaResult<u64> {
        if let Some(live) = live {
            return Ok(live.generation + 1);
        }
        let kept = self
            .table(self.t.generations)?
            .get((ws, path))?
            .map_or(0, |v| v.value());
        Ok(kept + 1)
    }

    /// Records that the shard is now owned under `epoch`. Epochs only grow: a lower one is
    /// refused (a stale owner must never lower the fence of a newer one).
    pub fn set_epoch(&mut self, epoch: u64) -> MetaResult<()> {
        let current = self.epoch()?;
        if epoch < current {
            return Err(MetaError::EpochRegression { current, epoch });
        }
        self.table(self.t.ownership)?.insert(EPOCH_KEY, epoch)?;
        Ok(())
    }

    /// Issues the next value of a named sequence (starting at 1, never reused).
    pub fn next_sequence(&mut self, name: &str) -> MetaResult<u64> {
        let mut t = self.table(self.t.sequences)?;
        let next = t.get(name)?.map(|v| v.value()).unwrap_or(0) + 1;
        t.insert(name, next)?;
        Ok(next)
    }

    /// Records a request's outcome. Its pruning row is written only when the request id does
    /// not carry its own time (see [`self_dated`]): an SDK id is found by its prefix.
    pub fn put_replay(&mut self, ws: &str, request_id: &str, rec: &ReplayRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.requests)?;
        t.insert((ws, request_id), rec.encode_to_vec().as_slice())?;
        if !self_dated(request_id, rec.created_ms) {
            let mut age = self.table(self.t.request_age)?;
            age.insert((rec.created_ms.max(0) as u64, ws, request_id), ())?;
        }
        Ok(())
    }

    /// Removes up to `limit` replay records created before `cutoff_ms`: those in the pruning
    /// order oldest first, then self-dated ones (see [`self_dated`]). Returns how many were
    /// removed; a short page means nothing older is left.
    pub fn prune_replays(&mut self, cutoff_ms: i64, limit: usize) -> MetaResult<usize> {
        let age = self.table(self.t.request_age)?;
        let mut victims = Vec::new();
        for item in age.range(..(cutoff_ms.max(0) as u64, "", ""))? {
            if victims.len() == limit {
                break;
            }
            let (k, _) = item?;
            let (ms, ws, id) = k.value();
            victims.push((ms, ws.to_string(), id.to_string()));
        }
        drop(age);
        if victims.len() < limit {
            // The scan also meets ids that have an age row (their prefix happens to sort
            // low): those found above are not counted twice.
            let aged: std::collections::HashSet<(String, String)> = victims
                .iter()
                .map(|(_, ws, id)| (ws.clone(), id.clone()))
                .collect();
            for (ws, id, ms) in self.self_dated_replays_before(cutoff_ms, limit)? {
                if victims.len() == limit {
                    break;
                }
                if !aged.contains(&(ws.clone(), id.clone())) {
                    victims.push((ms.max(0) as u64, ws, id));
                }
            }
        }
        let mut age = self.table(self.t.request_age)?;
        let mut requests = self.table(self.t.requests)?;
        for (ms, ws, id) in &victims {
            // A self-dated record has no age row; removing the absent row is a no-op.
            age.remove((*ms, ws.as_str(), id.as_str()))?;
            requests.remove((ws.as_str(), id.as_str()))?;
        }
        Ok(victims.len())
    }

    /// Stores an upload record and keeps the open and ended indexes in step with it.
    pub fn put_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        let old = self.upload(id)?;
        if let Some(old) = &old {
            self.unindex_upload(id, old)?;
        }
        // The upload's ledger operation: kept from the stored record, else a new one.
        let mut rec = rec.clone();
        let tracked_old = old
            .as_ref()
            .filter(|o| o.operation != 0)
            .map(|o| (o.operation, Tracked::upload(o)));
        if rec.operation == 0 {
            rec.operation = match tracked_old {
                Some((op, _)) => op,
                None => self.new_upload_operation(id)?,
            };
        }
        self.track(
            rec.operation,
            tracked_old.map(|(_, t)| t),
            Some(Tracked::upload(&rec)),
            false,
        )?;
        let mut t = self.table(self.t.uploads)?;
        t.insert(id, rec.encode_to_vec().as_slice())?;
        drop(t);
        self.index_upload(id, &rec)
    }

    /// Forgets a terminal upload record (pruning), and the receipt record that names it: a
    /// receipt is remembered exactly as long as its latest upload's history.
    pub fn remove_upload(&mut self, id: &str) -> MetaResult<()> {
        if let Some(old) = self.upload(id)? {
            self.unindex_upload(id, &old)?;
            if old.operation != 0 {
                self.track(old.operation, Some(Tracked::upload(&old)), None, false)?;
                self.table(self.t.operations)?.remove(old.operation)?;
            }
            self.table(self.t.uploads)?.remove(id)?;
            if !old.receipt.is_empty()
                && self
                    .receipt(&old.workspace, &old.receipt)?
                    .is_some_and(|r| r.upload_id == id)
            {
                self.table(self.t.receipts)?
                    .remove((old.workspace.as_str(), old.receipt.as_str()))?;
            }
        }
        Ok(())
    }

    /// Removes up to `limit` receipt records of workspace `ws`; returns how many.
    pub fn remove_receipts(&mut self, ws: &str, limit: usize) -> MetaResult<usize> {
        let mut t = self.table(self.t.receipts)?;
        let mut names = Vec::new();
        for item in t.range((ws, "")..)? {
            let (k, _) = item?;
            let (kws, name) = k.value();
            if kws != ws || names.len() == limit {
                break;
            }
            names.push(name.to_string());
        }
        for name in &names {
            t.remove((ws, name.as_str()))?;
        }
        Ok(names.len())
    }

    pub fn put_receipt(&mut self, ws: &str, receipt: &str, rec: &ReceiptRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.receipts)?;
        t.insert((ws, receipt), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    fn index_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        if rec.state == UploadState::Open as i32 {
            self.table(self.t.open_uploads)?
                .insert((rec.lease_expires_ms, id), ())?;
        } else if rec.is_ended() {
            self.table(self.t.ended_uploads)?
                .insert((ended_at(rec), id), ())?;
        }
        Ok(())
    }

    fn unindex_upload(&mut self, id: &str, rec: &UploadRecord) -> MetaResult<()> {
        self.table(self.t.open_uploads)?
            .remove((rec.lease_expires_ms, id))?;
        self.table(self.t.ended_uploads)?
            .remove((ended_at(rec), id))?;
        Ok(())
    }

    /// Indexes every upload record once, for data directories written before the indexes
    /// existed; a no-op afterwards. Returns how many records were indexed.
    pub fn index_uploads(&mut self) -> MetaResult<u64> {
        let mut seq = self.table(self.t.sequences)?;
        if seq.get(UPLOAD_INDEX_MARKER)?.is_some() {
            return Ok(0);
        }
        seq.insert(UPLOAD_INDEX_MARKER, 1)?;
        drop(seq);
        let mut all = Vec::new();
        for item in self.table(self.t.uploads)?.iter()? {
            let (k, v) = item?;
            all.push((k.value().to_string(), decode::<UploadRecord>(v.value())?));
        }
        for (id, rec) in &all {
            self.index_upload(id, rec)?;
        }
        Ok(all.len() as u64)
    }

    pub fn put_block(&mut self, upload: &str, index: u32, rec: &BlockRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.blocks)?;
        t.insert((upload, index), rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    /// Removes every block record of an upload (after its keys moved to a revision or to
    /// the collectable set).
    pub fn remove_blocks(&mut self, upload: &str) -> MetaResult<()> {
        let mut t = self.table(self.t.blocks)?;
        t.remove_range((upload, 0u32)..=(upload, u32::MAX))?;
        Ok(())
    }

    pub fn put_revision(&mut self, rev: u64, rec: &RevisionRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.revisions)?;
        t.insert(rev, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_revision(&mut self, rev: u64) -> MetaResult<()> {
        self.table(self.t.revisions)?.remove(rev)?;
        Ok(())
    }

    pub fn put_guard(&mut self, key: &str, rec: &GuardRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.guards)?;
        t.insert(key, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_guard(&mut self, key: &str) -> MetaResult<()> {
        self.table(self.t.guards)?.remove(key)?;
        Ok(())
    }

    /// Records that no entry points at `rev` any more (it stays stored and readable).
    pub fn retire_revision(&mut self, rev: u64, now_ms: i64) -> MetaResult<()> {
        self.table(self.t.retired)?.insert((now_ms, rev), ())?;
        Ok(())
    }

    /// Forgets a retired revision's index entry (once its keys were released).
    pub fn remove_retired(&mut self, retired_ms: i64, rev: u64) -> MetaResult<()> {
        self.table(self.t.retired)?.remove((retired_ms, rev))?;
        Ok(())
    }

    /// Marks an object key as no longer referenced, so the reconciler may delete it.
    /// Without workspace, size or time: prefer [`WriteView::queue_delete`].
    pub fn add_collectable(&mut self, key: &str, _revision: u64) -> MetaResult<()> {
        self.queue_delete(key, "", 0, 0)?;
        Ok(())
    }

    /// Settles the queued delete of `key` as deleted (its operation keeps its last update
    /// time): prefer recording the attempt through [`crate::shard::operations`].
    pub fn remove_collectable(&mut self, key: &str) -> MetaResult<()> {
        let Some(id) = self.table(self.t.collectable)?.get(key)?.map(|v| v.value()) else {
            return Ok(());
        };
        match self.operation(id)? {
            Some(mut op) if !op.is_upload() => {
                op.state = DeleteState::Deleted as i32;
                self.put_operation(id, &op)?;
            }
            _ => {
                self.table(self.t.collectable)?.remove(key)?;
            }
        }
        Ok(())
    }

    pub fn put_workspace(&mut self, ws: &str, rec: &WorkspaceRecord) -> MetaResult<()> {
        let mut t = self.table(self.t.workspaces)?;
        t.insert(ws, rec.encode_to_vec().as_slice())?;
        Ok(())
    }

    pub fn remove_workspace(&mut self, ws: &str) -> MetaResult<()> {
        self.table(self.t.workspaces)?.remove(ws)?;
        Ok(())
    }

    /// The ids of every open upload (of any workspace), soonest expiry first: a scan of the
    /// open-upload index, whose size follows the open uploads, not the upload history.
    pub fn open_upload_ids(&self) -> MetaResult<Vec<String>> {
        self.expired_uploads(i64::MAX, usize::MAX)
    }
}
