//! Typed reads, shared by both views: a [`ReadView`] reads one MVCC snapshot, a
//! [`WriteView`] reads through its own write transaction so a session sees its own writes.

use std::ops::Bound;

use redb::{ReadableTable, ReadableTableMetadata};

use super::overlay::Stored;
use super::records::*;
use super::{Counts, MetaResult, Namespace, WriteView, decode, optional, time_prefix};
use super::{EPOCH_KEY, SELF_DATED_SKEW_MS, UPLOAD_INDEX_MARKER};

pub struct ReadView {
    /// The snapshot, read through the memtable (see [`super::overlay`]).
    pub(super) txn: super::Snapshot,
    pub(super) t: Namespace,
}

/// The first `limit` keys of a time index (`(ms, id) => ()`, oldest first) whose time is at
/// or before `cutoff_ms`, each turned by `key` into its time and what the caller keeps. The
/// scan stops at the first later key, so it reads only what is due, however long the index;
/// an index absent from an older data dir is empty.
fn due<K: redb::Key + 'static, G: Stored<K>, X, T>(
    index: Option<impl Iterator<Item = Result<(G, X), redb::StorageError>>>,
    cutoff_ms: i64,
    limit: usize,
    key: impl Fn(K::SelfType<'_>) -> (i64, T),
) -> MetaResult<Vec<T>> {
    let mut out = Vec::new();
    let Some(index) = index else {
        return Ok(out);
    };
    for item in index {
        let (ms, kept) = key(item?.0.stored());
        if ms > cutoff_ms || out.len() == limit {
            break;
        }
        out.push(kept);
    }
    Ok(out)
}

/// Point reads and scans shared by both views: a write session must see its own writes, so it
/// reads through its write transaction rather than a snapshot.
macro_rules! readable {
    ($view:ty) => {
        impl $view {
            pub fn entry(&self, ws: &str, path: &str) -> MetaResult<Option<EntryRecord>> {
                let t = self.txn.open_table(self.t.entries)?;
                t.get((ws, path))?.map(|v| decode(v.value())).transpose()
            }

            pub fn inline(&self, ws: &str, path: &str) -> MetaResult<Option<Vec<u8>>> {
                let t = self.txn.open_table(self.t.inline)?;
                Ok(t.get((ws, path))?.map(|v| v.value().to_vec()))
            }

            /// Up to `limit` entries of `ws` whose path starts with `prefix`, in path order,
            /// strictly after `after` when given.
            pub fn list(
                &self,
                ws: &str,
                prefix: &str,
                after: Option<&str>,
                limit: usize,
            ) -> MetaResult<Vec<(String, EntryRecord)>> {
                let t = self.txn.open_table(self.t.entries)?;
                let start = match after {
                    Some(a) if a >= prefix => Bound::Excluded((ws, a)),
                    _ => Bound::Included((ws, prefix)),
                };
                let mut out = Vec::new();
                for item in t.range((start, Bound::Unbounded))? {
                    let (k, v) = item?;
                    let (kws, kpath) = k.value();
                    if kws != ws || !kpath.starts_with(prefix) || out.len() == limit {
                        break;
                    }
                    out.push((kpath.to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            pub fn replay(&self, ws: &str, request_id: &str) -> MetaResult<Option<ReplayRecord>> {
                let t = self.txn.open_table(self.t.requests)?;
                t.get((ws, request_id))?
                    .map(|v| decode(v.value()))
                    .transpose()
            }

            pub fn upload(&self, id: &str) -> MetaResult<Option<UploadRecord>> {
                let t = self.txn.open_table(self.t.uploads)?;
                t.get(id)?.map(|v| decode(v.value())).transpose()
            }

            pub fn receipt(&self, ws: &str, receipt: &str) -> MetaResult<Option<ReceiptRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.receipts))? else {
                    return Ok(None);
                };
                t.get((ws, receipt))?.map(|v| decode(v.value())).transpose()
            }

            pub fn block(&self, upload: &str, index: u32) -> MetaResult<Option<BlockRecord>> {
                let t = self.txn.open_table(self.t.blocks)?;
                t.get((upload, index))?
                    .map(|v| decode(v.value()))
                    .transpose()
            }

            /// Every block record of an upload, by index.
            pub fn blocks(&self, upload: &str) -> MetaResult<Vec<(u32, BlockRecord)>> {
                let t = self.txn.open_table(self.t.blocks)?;
                let mut out = Vec::new();
                for item in t.range((upload, 0u32)..=(upload, u32::MAX))? {
                    let (k, v) = item?;
                    out.push((k.value().1, decode(v.value())?));
                }
                Ok(out)
            }

            pub fn revision(&self, rev: u64) -> MetaResult<Option<RevisionRecord>> {
                let t = self.txn.open_table(self.t.revisions)?;
                t.get(rev)?.map(|v| decode(v.value())).transpose()
            }

            pub fn guard(&self, key: &str) -> MetaResult<Option<GuardRecord>> {
                let t = self.txn.open_table(self.t.guards)?;
                t.get(key)?.map(|v| decode(v.value())).transpose()
            }

            /// Up to `limit` collectable keys, in key order.
            pub fn collectable_page(&self, limit: usize) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.collectable)?;
                let mut out = Vec::new();
                for item in t.iter()?.take(limit) {
                    out.push(item?.0.value().to_string());
                }
                Ok(out)
            }

            /// Every collectable key, in key order (for accounting; the reconciler pages
            /// with [`Self::collectable_page`]).
            pub fn collectable_keys(&self) -> MetaResult<Vec<String>> {
                self.collectable_page(usize::MAX)
            }

            /// The object key of every block record. Block records exist only while their
            /// upload is open, so this follows the open uploads.
            pub fn block_keys(&self) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.blocks)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let b: BlockRecord = decode(item?.1.value())?;
                    out.push(b.key);
                }
                Ok(out)
            }

            /// The object key of every block of every revision, live or retired (a retired
            /// revision's keys stay referenced until the reconciler releases it).
            pub fn revision_keys(&self) -> MetaResult<Vec<String>> {
                let t = self.txn.open_table(self.t.revisions)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let r: RevisionRecord = decode(item?.1.value())?;
                    out.extend(r.blocks.into_iter().map(|b| b.key));
                }
                Ok(out)
            }

            /// Every guard with its record (guards are small and few: one per unsettled
            /// attempt).
            pub fn guards(&self) -> MetaResult<Vec<(String, GuardRecord)>> {
                let t = self.txn.open_table(self.t.guards)?;
                let mut out = Vec::new();
                for item in t.iter()? {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            /// Up to `limit` open uploads whose lease ended at or before `now_ms`, soonest
            /// expired first (a range of the open-upload index: its cost does not grow with
            /// the number of ended uploads).
            pub fn expired_uploads(&self, now_ms: i64, limit: usize) -> MetaResult<Vec<String>> {
                let t = optional(self.txn.open_table(self.t.open_uploads))?;
                due(
                    t.as_ref().map(|t| t.iter()).transpose()?,
                    now_ms,
                    limit,
                    |(lease, id)| (lease, id.to_string()),
                )
            }

            /// Up to `limit` terminal uploads that ended at or before `cutoff_ms`, oldest
            /// first.
            pub fn ended_uploads(&self, cutoff_ms: i64, limit: usize) -> MetaResult<Vec<String>> {
                let t = optional(self.txn.open_table(self.t.ended_uploads))?;
                due(
                    t.as_ref().map(|t| t.iter()).transpose()?,
                    cutoff_ms,
                    limit,
                    |(ended, id)| (ended, id.to_string()),
                )
            }

            /// Up to `limit` retired revisions retired at or before `cutoff_ms`, oldest first.
            pub fn retired_before(
                &self,
                cutoff_ms: i64,
                limit: usize,
            ) -> MetaResult<Vec<(i64, u64)>> {
                let t = optional(self.txn.open_table(self.t.retired))?;
                due(
                    t.as_ref().map(|t| t.iter()).transpose()?,
                    cutoff_ms,
                    limit,
                    |(ms, rev)| (ms, (ms, rev)),
                )
            }

            /// True once every upload record is covered by the upload indexes.
            pub fn uploads_indexed(&self) -> MetaResult<bool> {
                Ok(self.last_sequence(UPLOAD_INDEX_MARKER)? > 0)
            }

            /// True if some replay record was created before `cutoff_ms` (pruning has work).
            pub fn has_replays_before(&self, cutoff_ms: i64) -> MetaResult<bool> {
                let aged = match optional(self.txn.open_table(self.t.request_age))? {
                    Some(t) => t
                        .range(..(cutoff_ms.max(0) as u64, "", ""))?
                        .next()
                        .is_some(),
                    None => false,
                };
                Ok(aged || !self.self_dated_replays_before(cutoff_ms, 1)?.is_empty())
            }

            /// Up to `limit` replay records created before `cutoff_ms` that may have no
            /// pruning row (see [`super::self_dated`]): per workspace, the request ids that sort
            /// below the time prefix of the cutoff minus the skew, each checked against the
            /// record's own creation time. Returns (workspace, request id, created ms).
            pub fn self_dated_replays_before(
                &self,
                cutoff_ms: i64,
                limit: usize,
            ) -> MetaResult<Vec<(String, String, i64)>> {
                let Some(t) = optional(self.txn.open_table(self.t.requests))? else {
                    return Ok(Vec::new());
                };
                let bound = time_prefix(cutoff_ms.saturating_sub(SELF_DATED_SKEW_MS));
                let mut out = Vec::new();
                let mut next_ws: Option<String> = Some(String::new());
                while let Some(from) = next_ws.take() {
                    // The first workspace at or after `from`.
                    let Some(first) = t.range((from.as_str(), "")..)?.next() else {
                        break;
                    };
                    let ws = first?.0.value().0.to_string();
                    for item in t.range((ws.as_str(), "")..(ws.as_str(), bound.as_str()))? {
                        if out.len() == limit {
                            return Ok(out);
                        }
                        let (k, v) = item?;
                        let created = decode::<ReplayRecord>(v.value())?.created_ms;
                        if created < cutoff_ms {
                            out.push((ws.clone(), k.value().1.to_string(), created));
                        }
                    }
                    // Every key of `ws` sorts below `ws` followed by NUL.
                    next_ws = Some(format!("{ws}\0"));
                }
                Ok(out)
            }

            /// The fencing epoch this shard's data was last owned under (0 if never raised).
            pub fn epoch(&self) -> MetaResult<u64> {
                match optional(self.txn.open_table(self.t.ownership))? {
                    Some(t) => Ok(t.get(EPOCH_KEY)?.map(|v| v.value()).unwrap_or(0)),
                    None => Ok(0),
                }
            }

            /// The last value a named sequence issued (0 if none yet).
            pub fn last_sequence(&self, name: &str) -> MetaResult<u64> {
                let t = self.txn.open_table(self.t.sequences)?;
                Ok(t.get(name)?.map(|v| v.value()).unwrap_or(0))
            }

            /// Counters for health. Table lengths (constant cost) except the unknown-guard
            /// count: open uploads come from their index, never from the upload history.
            pub fn counts(&self) -> MetaResult<Counts> {
                let open = match optional(self.txn.open_table(self.t.open_uploads))? {
                    Some(t) => t.len()?,
                    None => 0,
                };
                // Guards are few (one per unsettled attempt): counting by kind is a short scan.
                let mut unknown_guards = 0;
                let mut guarded_uploads = std::collections::HashSet::new();
                for item in self.txn.open_table(self.t.guards)?.iter()? {
                    let g: GuardRecord = decode(item?.1.value())?;
                    unknown_guards += u64::from(g.writer == WriterState::Unknown as i32);
                    guarded_uploads.insert(g.upload_id);
                }
                // A claimed upload stays `Deleting` exactly while a guard awaiting cleanup names it (see the
                // reconciler), so the guarded uploads are the only candidates.
                let mut deleting_uploads = 0;
                let uploads = self.txn.open_table(self.t.uploads)?;
                for id in &guarded_uploads {
                    if let Some(v) = uploads.get(id.as_str())? {
                        let u: UploadRecord = decode(v.value())?;
                        deleting_uploads += u64::from(u.state == UploadState::Deleting as i32);
                    }
                }
                let mut operations = [0u64; 7];
                let mut oldest_unresolved_ms = None;
                if let Some(t) = optional(self.txn.open_table(self.t.op_states))? {
                    for (i, st) in OpState::ALL.iter().enumerate() {
                        operations[i] = t.get(st.name())?.map_or(0, |v| v.value());
                    }
                }
                if let Some(t) = optional(self.txn.open_table(self.t.unresolved_ops))?
                    && let Some(first) = t.first()?
                {
                    oldest_unresolved_ms = Some(first.0.value().0);
                }
                Ok(Counts {
                    operations,
                    oldest_unresolved_ms,
                    unknown_guards,
                    deleting_uploads,
                    entries: self.txn.open_table(self.t.entries)?.len()?,
                    uploads: open,
                    guards: self.txn.open_table(self.t.guards)?.len()?,
                    collectable: self.txn.open_table(self.t.collectable)?.len()?,
                    upload_records: self.txn.open_table(self.t.uploads)?.len()?,
                })
            }
        }
    };
}

readable!(ReadView);
readable!(WriteView<'_>);

/// Reads of the workspace-deletion state, shared by both views.
macro_rules! workspace_reads {
    ($view:ty) => {
        impl $view {
            pub fn workspace(&self, ws: &str) -> MetaResult<Option<WorkspaceRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.workspaces))? else {
                    return Ok(None);
                };
                t.get(ws)?.map(|v| decode(v.value())).transpose()
            }

            /// Up to `limit` workspaces with a record (all of them being deleted), by name.
            pub fn workspace_records(
                &self,
                limit: usize,
            ) -> MetaResult<Vec<(String, WorkspaceRecord)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.workspaces))? else {
                    return Ok(out);
                };
                for item in t.iter()?.take(limit) {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), decode(v.value())?));
                }
                Ok(out)
            }

            /// Up to `limit` retired revisions in (retired ms, revision) order, strictly after
            /// `after` when given.
            pub fn retired_after(
                &self,
                after: Option<(i64, u64)>,
                limit: usize,
            ) -> MetaResult<Vec<(i64, u64)>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.retired))? else {
                    return Ok(out);
                };
                let start = match after {
                    Some(a) => Bound::Excluded(a),
                    None => Bound::Unbounded,
                };
                for item in t
                    .range::<(i64, u64)>((start, Bound::Unbounded))?
                    .take(limit)
                {
                    out.push(item?.0.value());
                }
                Ok(out)
            }
        }
    };
}

workspace_reads!(ReadView);
workspace_reads!(WriteView<'_>);

/// Reads of the operations ledger, shared by both views.
macro_rules! ledger_reads {
    ($view:ty) => {
        impl $view {
            pub fn operation(&self, id: u64) -> MetaResult<Option<OperationRecord>> {
                let Some(t) = optional(self.txn.open_table(self.t.operations))? else {
                    return Ok(None);
                };
                t.get(id)?.map(|v| decode(v.value())).transpose()
            }

            /// The ledger row of operation `id` (an upload's row is read from its record).
            pub fn ledger_row(&self, id: u64) -> MetaResult<Option<LedgerRow>> {
                let Some(op) = self.operation(id)? else {
                    return Ok(None);
                };
                if op.is_upload() {
                    return Ok(self
                        .upload(&op.upload_id)?
                        .map(|u| LedgerRow::of_upload(id, &u)));
                }
                Ok(Some(LedgerRow::of_delete(id, &op)))
            }

            /// Up to `limit` ledger rows with an id above `after` whose state `keep`
            /// accepts, in id order, reading at most `scan` rows (a filtered page over a
            /// large history stops early; the caller resumes after the returned position).
            /// Returns the rows and the id of the last row read.
            pub fn ledger_page(
                &self,
                after: u64,
                keep: &dyn Fn(OpState) -> bool,
                limit: usize,
                scan: usize,
            ) -> MetaResult<(Vec<LedgerRow>, Option<u64>)> {
                let mut out = Vec::new();
                let mut last = None;
                let Some(t) = optional(self.txn.open_table(self.t.operations))? else {
                    return Ok((out, last));
                };
                for (read, item) in t
                    .range::<u64>((Bound::Excluded(after), Bound::Unbounded))?
                    .enumerate()
                {
                    if out.len() == limit || read == scan {
                        break;
                    }
                    let (k, v) = item?;
                    let id = k.value();
                    last = Some(id);
                    let op: OperationRecord = decode(v.value())?;
                    let row = if op.is_upload() {
                        match self.upload(&op.upload_id)? {
                            Some(u) => LedgerRow::of_upload(id, &u),
                            None => continue,
                        }
                    } else {
                        LedgerRow::of_delete(id, &op)
                    };
                    if keep(row.state) {
                        out.push(row);
                    }
                }
                Ok((out, last))
            }

            /// Up to `limit` queued deletes (collectable key, operation id), in key order.
            pub fn collectable_ops(&self, limit: usize) -> MetaResult<Vec<(String, u64)>> {
                let t = self.txn.open_table(self.t.collectable)?;
                let mut out = Vec::new();
                for item in t.iter()?.take(limit) {
                    let (k, v) = item?;
                    out.push((k.value().to_string(), v.value()));
                }
                Ok(out)
            }

            /// The keys of every dead-lettered delete (accounting: still delete intents).
            pub fn dead_letter_keys(&self) -> MetaResult<Vec<String>> {
                let mut out = Vec::new();
                let Some(t) = optional(self.txn.open_table(self.t.dead_letters))? else {
                    return Ok(out);
                };
                for item in t.iter()? {
                    out.push(item?.0.value().to_string());
                }
                Ok(out)
            }

            /// Up to `limit` deleted delete operations that ended at or before `cutoff_ms`,
            /// oldest first.
            pub fn deleted_ops_before(&self, cutoff_ms: i64, limit: usize) -> MetaResult<Vec<u64>> {
                let t = optional(self.txn.open_table(self.t.deleted_ops))?;
                due(
                    t.as_ref().map(|t| t.iter()).transpose()?,
                    cutoff_ms,
                    limit,
                    |(ms, id)| (ms, id),
                )
            }
        }
    };
}

ledger_reads!(ReadView);
ledger_reads!(WriteView<'_>);
