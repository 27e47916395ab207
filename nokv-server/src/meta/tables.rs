//! The shard's tables, and the namespaces that let many shards share one redb file.
//!
//! A node keeps every shard it holds in one file (`DATA_DIR/shards/node.redb`, see
//! [`crate::shard::gate`] for why: one committer and one fsync serve the write sessions of all
//! of them). Each shard's tables carry its prefix (`s0003/entries`), so a shard's state is
//! still its own set of tables: it is copied out on its own (a checkpoint, see
//! [`super::MetaStore::export`]) and copied in on its own (a load, [`super::MetaStore::import`])
//! without touching another shard's rows. A standalone file — a checkpoint, a test's store,
//! a data dir from before the node file — uses the unprefixed *canonical* names, so a
//! checkpoint opens like any single-shard store.
//!
//! Invariant: every table of a shard is in [`Tables`]; the copy and delete below go over the
//! whole list, so a table added here is moved with its shard by construction.

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;
use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use super::undo::SessionTxn;
use super::{Bytes, MetaResult, optional};

/// One shard's table definitions, named within its namespace.
pub type Namespace = &'static Tables;

macro_rules! tables {
    ($( $(#[$doc:meta])* $field:ident : $k:ty => $v:ty = $name:literal ;)*) => {
        /// The definitions of every table of one shard, named within one namespace.
        pub struct Tables {
            $( $(#[$doc])* pub(super) $field: TableDefinition<'static, $k, $v>, )*
        }

        impl Tables {
            fn named(prefix: &str) -> Tables {
                Tables { $( $field: TableDefinition::new(leak(prefix, $name)), )* }
            }

            /// Creates every table of the namespace that does not exist yet (in a session:
            /// creating a table changes no row, so it needs no capture).
            pub(super) fn create_all(&self, txn: SessionTxn<'_>) -> MetaResult<()> {
                $( txn.open_table(self.$field)?; )*
                Ok(())
            }

            /// Deletes every table of the namespace (absent ones are fine).
            pub(super) fn delete_all(&self, txn: &WriteTransaction) -> MetaResult<()> {
                $( txn.delete_table(self.$field)?; )*
                Ok(())
            }

            /// Applies one row effect of a redo record to the table called `name` in this
            /// namespace; false if no table has that name.
            pub(super) fn apply(
                &self,
                txn: &WriteTransaction,
                name: &str,
                key: &[u8],
                value: Option<&[u8]>,
            ) -> MetaResult<bool> {
                $( if name == $name { apply(txn, self.$field, key, value)?; return Ok(true); } )*
                Ok(false)
            }

            /// The key order of the table called `name` in this namespace, over encoded keys
            /// (what the memtable sorts a batch's rows by, see [`super::overlay`]).
            pub(super) fn compare(&self, name: &str) -> Option<fn(&[u8], &[u8]) -> std::cmp::Ordering> {
                $( if name == $name { return Some(<$k as redb::Key>::compare); } )*
                None
            }

            /// Every table of the namespace, by name, as `read` reads it: what a test compares
            /// to prove two views hold the same state, with no table left out (see
            /// [`super::model`]).
            #[cfg(test)]
            pub(super) fn dump(
                &self,
                read: &mut impl DumpTable,
            ) -> MetaResult<Vec<(&'static str, TableDump)>> {
                Ok(vec![ $( ($name, read.table(self.$field)?), )* ])
            }

            /// Copies every table of this namespace in `src` into namespace `to` of `dst`
            /// (tables absent from `src` are skipped: files from before they existed).
            pub(super) fn copy_all(
                &self,
                src: &ReadTransaction,
                to: &Tables,
                dst: &WriteTransaction,
            ) -> MetaResult<()> {
                $( copy(src, self.$field, dst, to.$field)?; )*
                Ok(())
            }
        }
    };
}

tables! {
    /// (workspace, path) -> EntryRecord
    entries: (&'static str, &'static str) => Bytes = "entries";
    /// (workspace, path) -> inline body of a small file
    inline: (&'static str, &'static str) => Bytes = "inline";
    /// (workspace, path) -> last generation ever issued; kept after delete so generations are
    /// never reused.
    generations: (&'static str, &'static str) => u64 = "generations";
    /// (workspace, request id) -> ReplayRecord
    requests: (&'static str, &'static str) => Bytes = "requests";
    /// (created ms, workspace, request id) -> () : the pruning order of REQUESTS.
    request_age: (u64, &'static str, &'static str) => () = "request_age";
    /// upload id -> UploadRecord
    uploads: &'static str => Bytes = "uploads";
    /// (upload id, block index) -> BlockRecord
    blocks: (&'static str, u32) => Bytes = "blocks";
    /// revision -> RevisionRecord
    revisions: u64 => Bytes = "revisions";
    /// object key -> GuardRecord
    guards: &'static str => Bytes = "guards";
    /// object key -> revision or 0: keys no longer referenced, waiting for deletion.
    collectable: &'static str => u64 = "collectable";
    /// sequence name -> last issued value
    sequences: &'static str => u64 = "sequences";
    /// (lease expiry ms, upload id) -> () for every open upload: health counts open uploads and
    /// the reconciler finds expired ones without reading the upload history.
    open_uploads: (i64, &'static str) => () = "open_uploads";
    /// (ended ms, upload id) -> () for every terminal upload: the pruning order of UPLOADS.
    ended_uploads: (i64, &'static str) => () = "ended_uploads";
    /// (workspace, receipt) -> ReceiptRecord: stable receipts of resumable publications.
    receipts: (&'static str, &'static str) => Bytes = "receipts";
    /// (retired ms, revision) -> () : revisions no entry points at any more. They stay readable
    /// (a restore that started before an overwrite completes) until the retired grace has
    /// passed; then the reconciler releases their block keys to COLLECTABLE.
    retired: (i64, u64) => () = "retired";
    /// workspace -> WorkspaceRecord, only for workspaces being deleted (see
    /// [`crate::shard::workspaces`]).
    workspaces: &'static str => Bytes = "workspaces";
    /// "epoch" -> the fencing epoch under which this shard's data was last owned (absent: 0, the
    /// embedded default). Raised only when a node takes the shard at a higher epoch; every write
    /// session compares it with the epoch the node may acknowledge under (see
    /// [`crate::shard::fence`]), so a store that a deposed owner still holds rejects its sessions.
    ownership: &'static str => u64 = "ownership";
    /// operation id -> OperationRecord: the shard's operations ledger (see
    /// [`crate::shard::operations`]). Upload operations' rows only name their upload record.
    operations: u64 => Bytes = "operations";
    /// ledger state name -> operations in that state. Changed by the same `put_*`/`remove_*`
    /// that changes an operation's state, so health never scans the ledger.
    op_states: &'static str => u64 = "op_states";
    /// (created ms, operation id) -> () for every unresolved operation (open, deleting, dead
    /// letter): the oldest unresolved age is its first entry.
    unresolved_ops: (i64, u64) => () = "unresolved_ops";
    /// (deleted ms, operation id) -> () for every deleted delete operation: the pruning order of
    /// delete history (upload history is pruned through ENDED_UPLOADS).
    deleted_ops: (i64, u64) => () = "deleted_ops";
    /// object key -> operation id of every dead-lettered delete: out of the automatic queue,
    /// still accounted for.
    dead_letters: &'static str => u64 = "dead_letters";
    /// "scan" -> InventoryRecord.
    inventory: &'static str => Bytes = "inventory";
    /// object key -> QuarantineRecord.
    quarantine: &'static str => Bytes = "quarantine";
    /// (last seen ms, object key) -> (): the pruning order of QUARANTINE.
    quarantine_seen: (i64, &'static str) => () = "quarantine_seen";
    /// workspace -> UsageRecord; absent reads as empty (no quota, nothing counted) and a row
    /// that becomes empty is removed, so deleted workspaces leave nothing behind.
    usage: &'static str => Bytes = "workspace_usage";
    /// counter name -> value: the shard's totals of the USAGE rows.
    usage_totals: &'static str => u64 = "usage_totals";
}

impl Tables {
    /// The unprefixed names of a standalone single-shard file.
    pub fn canonical() -> Namespace {
        static CANONICAL: OnceLock<Tables> = OnceLock::new();
        CANONICAL.get_or_init(|| Tables::named(""))
    }

    /// Shard `id`'s namespace in a node file. Names are made once per shard id and kept for
    /// the life of the process (a few hundred bytes per shard the node ever held).
    pub fn shard(id: u32) -> Namespace {
        static SHARDS: OnceLock<Mutex<HashMap<u32, Namespace>>> = OnceLock::new();
        let mut shards = SHARDS.get_or_init(Default::default).lock();
        shards
            .entry(id)
            .or_insert_with(|| Box::leak(Box::new(Tables::named(&format!("s{id:04}/")))))
    }

    /// The shard a full table name belongs to (`s0003/entries` -> 3); `None` for a canonical
    /// name.
    pub(super) fn shard_of(table: &str) -> Option<u32> {
        table.split_once('/')?.0.strip_prefix('s')?.parse().ok()
    }

    /// The namespace a full table name belongs to, and the name within it (`s0003/entries`
    /// -> shard 3's, `entries`; an unprefixed name is canonical).
    pub(super) fn by_name(table: &str) -> Option<(Namespace, &str)> {
        match table.split_once('/') {
            None => Some((Tables::canonical(), table)),
            Some((shard, name)) => {
                let id = shard.strip_prefix('s')?.parse().ok()?;
                Some((Tables::shard(id), name))
            }
        }
    }

    /// True if the namespace's tables exist in the snapshot `txn` (a shard that was never
    /// held here, or whose tables were removed, has none).
    pub(super) fn exists_in(&self, txn: &ReadTransaction) -> MetaResult<bool> {
        Ok(optional(txn.open_table(self.entries))?.is_some())
    }
}

/// One table as a view reads it (tests, see [`Tables::dump`]).
#[cfg(test)]
#[derive(PartialEq, Eq, Default)]
pub(super) struct TableDump {
    /// The row count the view reports (its own code path: not the length of `rows`).
    pub(super) len: u64,
    /// Every row as (encoded key, encoded value), in the table's key order.
    pub(super) rows: Vec<(Vec<u8>, Vec<u8>)>,
}

#[cfg(test)]
impl std::fmt::Debug for TableDump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "len {}", self.len)?;
        for (k, v) in &self.rows {
            writeln!(f, "  {} => {}", k.escape_ascii(), v.escape_ascii())?;
        }
        Ok(())
    }
}

/// A view that can read any table of a namespace (tests, see [`Tables::dump`]).
#[cfg(test)]
pub(super) trait DumpTable {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: TableDefinition<'static, K, V>,
    ) -> MetaResult<TableDump>;
}

/// A table name that lives as long as the process (redb definitions borrow their name).
fn leak(prefix: &str, name: &str) -> &'static str {
    if prefix.is_empty() {
        return Box::leak(name.to_string().into_boxed_str());
    }
    Box::leak(format!("{prefix}{name}").into_boxed_str())
}

/// Puts one row as a redo record describes it (see [`super::durability`]).
fn apply<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &WriteTransaction,
    def: TableDefinition<K, V>,
    key: &[u8],
    value: Option<&[u8]>,
) -> MetaResult<()> {
    let mut t = txn.open_table(def)?;
    match value {
        Some(v) => drop(t.insert(K::from_bytes(key), V::from_bytes(v))?),
        None => drop(t.remove(K::from_bytes(key))?),
    }
    Ok(())
}

fn copy<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &ReadTransaction,
    from: TableDefinition<K, V>,
    dst: &WriteTransaction,
    to: TableDefinition<K, V>,
) -> MetaResult<()> {
    let Some(source) = optional(src.open_table(from))? else {
        return Ok(());
    };
    let mut dest = dst.open_table(to)?;
    for item in source.iter()? {
        let (k, v) = item?;
        dest.insert(k.value(), v.value())?;
    }
    Ok(())
}
