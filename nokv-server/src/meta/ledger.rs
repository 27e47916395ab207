//! Writes of the operations ledger: every upload and delete operation's state change keeps
//! the per-state counters and the unresolved, deleted and queue indexes in the same session.

use prost::Message;
use redb::ReadableTable;

use super::records::*;
use super::{MetaResult, OPERATION_SEQ, OPERATIONS_MARKER, WriteView, decode, ended_at};

/// How an operation shows in the counters and indexes: its state, creation and end time.
#[derive(Clone, Copy)]
pub(super) struct Tracked {
    state: OpState,
    created_ms: i64,
    ended_ms: i64,
}

impl Tracked {
    pub(super) fn upload(u: &UploadRecord) -> Tracked {
        Tracked {
            state: OpState::of_upload(u),
            created_ms: u.created_ms,
            ended_ms: ended_at(u),
        }
    }

    pub(super) fn delete(d: &OperationRecord) -> Tracked {
        Tracked {
            state: d.op_state(),
            created_ms: d.created_ms,
            ended_ms: d.updated_ms,
        }
    }
}

/// Writes of the operations ledger. Every change of an operation's state goes through
/// `put_upload`/`remove_upload` or `put_operation`/`remove_operation`, which keep the per-state
/// counters, the unresolved index, the deleted index and the queues in the same session.
impl WriteView<'_> {
    /// Moves operation `id` from `old` to `new` in the counters and indexes.
    pub(super) fn track(
        &mut self,
        id: u64,
        old: Option<Tracked>,
        new: Option<Tracked>,
        delete: bool,
    ) -> MetaResult<()> {
        let mut states = self.table(self.t.op_states)?;
        if let Some(o) = old {
            let n = states.get(o.state.name())?.map_or(0, |v| v.value());
            states.insert(o.state.name(), n.saturating_sub(1))?;
        }
        if let Some(n) = new {
            let c = states.get(n.state.name())?.map_or(0, |v| v.value());
            states.insert(n.state.name(), c + 1)?;
        }
        drop(states);
        let mut unresolved = self.table(self.t.unresolved_ops)?;
        if let Some(o) = old.filter(|o| o.state.unresolved()) {
            unresolved.remove((o.created_ms, id))?;
        }
        if let Some(n) = new.filter(|n| n.state.unresolved()) {
            unresolved.insert((n.created_ms, id), ())?;
        }
        drop(unresolved);
        if delete {
            let mut deleted = self.table(self.t.deleted_ops)?;
            if let Some(o) = old.filter(|o| o.state == OpState::Deleted) {
                deleted.remove((o.ended_ms, id))?;
            }
            if let Some(n) = new.filter(|n| n.state == OpState::Deleted) {
                deleted.insert((n.ended_ms, id), ())?;
            }
        }
        Ok(())
    }

    /// Assigns a fresh operation id to upload `upload_id`.
    pub(super) fn new_upload_operation(&mut self, upload_id: &str) -> MetaResult<u64> {
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            upload_id: upload_id.to_string(),
            ..Default::default()
        };
        self.table(self.t.operations)?
            .insert(id, rec.encode_to_vec().as_slice())?;
        Ok(id)
    }

    /// Stores a delete operation and keeps counters, indexes and queues in step: a block
    /// delete is in the collectable queue exactly while `deleting`; any delete is in the
    /// dead-letter set exactly while `dead_letter`.
    pub fn put_operation(&mut self, id: u64, rec: &OperationRecord) -> MetaResult<()> {
        let old = self.operation(id)?;
        self.table(self.t.operations)?
            .insert(id, rec.encode_to_vec().as_slice())?;
        self.track(
            id,
            old.as_ref().map(Tracked::delete),
            Some(Tracked::delete(rec)),
            true,
        )?;
        let state = rec.op_state();
        let key = rec.key.as_str();
        if rec.kind == DeleteKind::Block as i32 {
            let mut q = self.table(self.t.collectable)?;
            if state == OpState::Deleting {
                q.insert(key, id)?;
            } else if q.get(key)?.is_some_and(|v| v.value() == id) {
                q.remove(key)?;
            }
        }
        let mut dead = self.table(self.t.dead_letters)?;
        if state == OpState::DeadLetter {
            dead.insert(key, id)?;
        } else if dead.get(key)?.is_some_and(|v| v.value() == id) {
            dead.remove(key)?;
        }
        Ok(())
    }

    /// Forgets a delete operation's row (pruning of history). Callers prune only `deleted`
    /// rows whose key no guard names.
    pub fn remove_operation(&mut self, id: u64) -> MetaResult<()> {
        if let Some(old) = self.operation(id)? {
            self.track(id, Some(Tracked::delete(&old)), None, !old.is_upload())?;
            self.table(self.t.operations)?.remove(id)?;
        }
        Ok(())
    }

    /// Queues `key` for deletion as a new `deleting` block-delete operation (or returns the
    /// operation already queued for it).
    pub fn queue_delete(
        &mut self,
        key: &str,
        workspace: &str,
        bytes: u64,
        now_ms: i64,
    ) -> MetaResult<u64> {
        if let Some(v) = self.table(self.t.collectable)?.get(key)? {
            return Ok(v.value());
        }
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            kind: DeleteKind::Block as i32,
            key: key.to_string(),
            workspace: workspace.to_string(),
            bytes,
            state: DeleteState::Deleting as i32,
            created_ms: now_ms,
            updated_ms: now_ms,
            ..Default::default()
        };
        self.put_operation(id, &rec)?;
        Ok(id)
    }

    /// The delete operation of the guard on `key`, created (`deleting`, with the guard's
    /// workspace and bytes) the first time the guard is about to be deleted. `None` if no
    /// guard names the key.
    pub fn guard_operation(&mut self, key: &str, now_ms: i64) -> MetaResult<Option<u64>> {
        let Some(mut g) = self.guard(key)? else {
            return Ok(None);
        };
        if g.operation != 0 {
            return Ok(Some(g.operation));
        }
        let workspace = self
            .upload(&g.upload_id)?
            .map(|u| u.workspace)
            .unwrap_or_default();
        let id = self.next_sequence(OPERATION_SEQ)?;
        let rec = OperationRecord {
            kind: DeleteKind::Attempt as i32,
            key: key.to_string(),
            workspace,
            bytes: g.bytes,
            state: DeleteState::Deleting as i32,
            created_ms: now_ms,
            updated_ms: now_ms,
            ..Default::default()
        };
        self.put_operation(id, &rec)?;
        g.operation = id;
        self.put_guard(key, &g)?;
        Ok(Some(id))
    }

    /// Gives every upload record and collectable key of a data dir written before the ledger
    /// existed its ledger row, once; a no-op afterwards (and on a new store). Returns how
    /// many rows it created.
    pub fn backfill_operations(&mut self, now_ms: i64) -> MetaResult<u64> {
        let mut seq = self.table(self.t.sequences)?;
        if seq.get(OPERATIONS_MARKER)?.is_some() {
            return Ok(0);
        }
        seq.insert(OPERATIONS_MARKER, 1)?;
        drop(seq);
        let mut uploads = Vec::new();
        for item in self.table(self.t.uploads)?.iter()? {
            let (k, v) = item?;
            uploads.push((k.value().to_string(), decode::<UploadRecord>(v.value())?));
        }
        let mut collectable = Vec::new();
        for item in self.table(self.t.collectable)?.iter()? {
            let (k, v) = item?;
            collectable.push((k.value().to_string(), v.value()));
        }
        let mut created = 0;
        for (id, rec) in uploads.iter().filter(|(_, r)| r.operation == 0) {
            self.put_upload(id, rec)?;
            created += 1;
        }
        // Values were the releasing revision (or 0) before; they become operation ids.
        for (key, rev) in &collectable {
            let (workspace, bytes) = match self.revision(*rev)? {
                Some(r) => {
                    let len = r
                        .blocks
                        .iter()
                        .find(|b| &b.key == key)
                        .map_or(0, |b| b.length);
                    (r.workspace, len)
                }
                None => (String::new(), 0),
            };
            self.table(self.t.collectable)?.remove(key.as_str())?;
            self.queue_delete(key, &workspace, bytes, now_ms)?;
            created += 1;
        }
        Ok(created)
    }
}
