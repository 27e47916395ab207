//! A model-based test of the memtable ([`super::overlay`]) and of the capture it is built from
//! ([`super::undo`], [`super::durability`]).
//!
//! Random sessions over every kind of [`WriteView`] writer (entries and generations, inline
//! bodies, request outcomes and their pruning, uploads with their receipts, blocks and
//! indexes, revisions and the retired index, guards, the delete ledger and its queues,
//! workspaces, usage, the inventory and quarantine, epochs and sequences), in two namespaces
//! of one node file. Some sessions fail after they wrote (on purpose, or because a writer
//! refuses, as an epoch regression does). The batches are held in the open transaction
//! ([`Batch::log`]) or committed ([`Batch::commit_logged`]) at random — and always once the
//! transaction is full, as the gate's `run_batch` does — and now and then the held
//! transaction is committed and the file made durable with the log started over, as the
//! gate's checkpoint does.
//!
//! The model is the replay: a replica that starts from the same state and gets nothing but
//! each batch's redo record, applied as a replay applies it. After every batch, each
//! namespace must read the same, table by table (every row in key order, and the table's
//! length), through
//! * (a) the snapshot readers are shown ([`Logged::snapshot`]: the last commit through the
//!   held batches' layers; point reads of every key ever written must agree with its scans),
//! * (b) the write transaction's own view (a read-only session in the transaction the next
//!   batch runs in), and
//! * (c) the replica;
//!
//! and a few times, and at the end, (d) a copy of the store's file and log as a crash would
//! leave them, reopened (redb's last durable commit and the log's replay), must read as (c).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::overlay::Stored;
use super::records::*;
use super::tables::{DumpTable, TableDump};
use super::undo::SessionTxn;
use super::{Batch, Logged, MetaError, MetaResult, MetaStore, Namespace, Snapshot, Tables};
use super::{OPERATION_SEQ, UsageDelta, WriteView, optional};

const WS: [&str; 3] = ["a", "ab", "b"];
const PATHS: [&str; 5] = ["x", "y/1", "y/2", "yy", "z"];
const UPLOADS: [&str; 4] = ["u0", "u1", "u2", "u10"];
const KEYS: [&str; 5] = ["k0", "k1", "k2", "blk-0", "blk-1"];
const ROUNDS: usize = 300;
const SEED: u64 = 0x6e6f_6b76;

use super::dice::Dice;

/// The two namespaces the sessions write (shards of one node file, so the replay also routes
/// every row by its table's full name).
fn namespaces() -> [Namespace; 2] {
    [Tables::shard(901), Tables::shard(902)]
}

/// One writer call, drawn before its session runs: which writer (`kind`), and three numbers
/// that pick its arguments.
#[derive(Clone, Copy, Debug)]
struct Op {
    kind: usize,
    a: usize,
    b: usize,
    c: usize,
}

const KINDS: usize = 17;

impl Op {
    fn draw(dice: &mut Dice) -> Op {
        Op {
            kind: dice.roll(KINDS),
            a: dice.roll(16),
            b: dice.roll(16),
            c: dice.roll(16),
        }
    }

    /// Runs the writer in session `w` at shard time `now`.
    fn run(self, w: &mut WriteView, now: i64) -> MetaResult<()> {
        let Op { kind, a, b, c } = self;
        let ws = WS[a % WS.len()];
        let path = PATHS[b % PATHS.len()];
        let upload = UPLOADS[a % UPLOADS.len()];
        let key = KEYS[b % KEYS.len()];
        match kind {
            0 => {
                let generation = w.next_generation(ws, path)?;
                let rec = EntryRecord {
                    kind: KIND_FILE,
                    size: c as u64,
                    generation,
                    modified_ms: now,
                    ..Default::default()
                };
                w.put_entry(ws, path, &rec)?;
            }
            1 => w.remove_entry(ws, path)?,
            2 if c % 3 == 0 => w.remove_inline(ws, path)?,
            2 => w.put_inline(ws, path, format!("{now}:{c}").as_bytes())?,
            3 => {
                // Self-dated ids (no pruning row) and custom ones (with one).
                let id = match c % 3 {
                    0 => format!("{:012x}{}", now - 1000 * b as i64, "ab".repeat(10)),
                    1 => format!("req-{b}"),
                    _ => format!("{:012x}{}", 0x1000 + b, "cd".repeat(10)),
                };
                let rec = ReplayRecord {
                    created_ms: now - 1000 * b as i64,
                    response: vec![c as u8],
                    ..Default::default()
                };
                w.put_replay(ws, &id, &rec)?;
            }
            4 => w
                .prune_replays(now - 4000 * c as i64, 1 + b % 3)
                .map(drop)?,
            5 => {
                let mut rec = UploadRecord::open(ws, path, c as u64, 2, now, 1000 * b as i64, "");
                rec.state = [
                    UploadState::Open,
                    UploadState::Committed,
                    UploadState::Aborted,
                    UploadState::Deleting,
                    UploadState::Reclaimed,
                ][c % 5] as i32;
                if rec.is_ended() {
                    rec.ended_ms = now;
                }
                rec.reserved = b % 2 == 0;
                if c % 2 == 0 {
                    rec.receipt = format!("r{}", b % 2);
                }
                w.put_upload(upload, &rec)?;
            }
            6 => w.remove_upload(upload)?,
            7 if c % 3 == 0 => w.remove_receipts(ws, 1 + b % 2).map(drop)?,
            7 => {
                let rec = ReceiptRecord {
                    path: path.to_string(),
                    upload_id: UPLOADS[c % UPLOADS.len()].to_string(),
                    created_ms: now,
                    ..Default::default()
                };
                w.put_receipt(ws, &format!("r{}", b % 2), &rec)?;
            }
            8 if c % 3 == 0 => w.remove_blocks(upload)?,
            8 => {
                let rec = BlockRecord {
                    length: c as u64,
                    key: format!("blk-{a}-{b}"),
                    ..Default::default()
                };
                w.put_block(upload, (b % 3) as u32, &rec)?;
            }
            9 => {
                let rev = 1 + (a % 4) as u64;
                match c % 4 {
                    0 => {
                        let rec = RevisionRecord {
                            workspace: ws.to_string(),
                            path: path.to_string(),
                            blocks: vec![RevisionBlock {
                                length: c as u64,
                                key: key.to_string(),
                                ..Default::default()
                            }],
                            created_ms: now,
                            ..Default::default()
                        };
                        w.put_revision(rev, &rec)?;
                    }
                    1 => w.remove_revision(rev)?,
                    2 => w.retire_revision(rev, now - 1000 * b as i64)?,
                    _ => {
                        if let Some(&(ms, rev)) = w.retired_before(i64::MAX, 1 + b % 3)?.last() {
                            w.remove_retired(ms, rev)?;
                        }
                    }
                }
            }
            10 => match c % 3 {
                0 => {
                    let rec = GuardRecord {
                        upload_id: upload.to_string(),
                        writer: (b % 3) as i32,
                        created_ms: now,
                        bytes: c as u64,
                        ..Default::default()
                    };
                    w.put_guard(key, &rec)?;
                }
                1 => w.remove_guard(key)?,
                _ => w.guard_operation(key, now).map(drop)?,
            },
            11 => match c % 3 {
                0 => w.queue_delete(key, ws, c as u64, now).map(drop)?,
                1 => w.add_collectable(key, c as u64)?,
                _ => w.remove_collectable(key)?,
            },
            12 => {
                let ops = w.last_sequence(OPERATION_SEQ)?;
                if ops == 0 {
                    return Ok(());
                }
                let id = 1 + (a * 16 + b) as u64 % ops;
                let Some(mut op) = w.operation(id)? else {
                    return Ok(());
                };
                if op.is_upload() {
                    return Ok(());
                }
                if c % 4 == 0 && op.op_state() == OpState::Deleted {
                    w.remove_operation(id)?;
                } else {
                    op.state = [
                        DeleteState::Deleting,
                        DeleteState::Deleted,
                        DeleteState::DeadLetter,
                    ][c % 3] as i32;
                    op.updated_ms = now;
                    op.attempts += 1;
                    w.put_operation(id, &op)?;
                }
            }
            13 if c % 3 == 0 => w.remove_workspace(ws)?,
            13 => {
                let rec = WorkspaceRecord {
                    state: 1,
                    deleting_since_ms: now,
                    entries_removed: c as u64,
                    ..Default::default()
                };
                w.put_workspace(ws, &rec)?;
            }
            14 if c % 4 == 0 => w
                .set_quota(ws, (b % 2 == 0).then_some(c as u64))
                .map(drop)?,
            14 => {
                let d = UsageDelta {
                    used_bytes: c as i64 - 6,
                    reserved_bytes: b as i64 - 8,
                    reservations: (c % 3) as i64 - 1,
                };
                w.change_usage(ws, d).map(drop)?;
            }
            15 => match c % 4 {
                0 => {
                    let rec = InventoryRecord {
                        scan: c as u64,
                        cursor: key.to_string(),
                        started_ms: now,
                        ..Default::default()
                    };
                    w.put_inventory(&rec)?;
                }
                1 => w.forget_observation(key).map(drop)?,
                2 => w
                    .prune_observations(now - 2000 * b as i64, 1 + a % 3)
                    .map(drop)?,
                _ => w.observe(key, c as u64, now - 1000 * a as i64, b as u64)?,
            },
            // An epoch below the stored one is refused: a session that fails by itself.
            _ if c % 2 == 0 => w.set_epoch((b % 6) as u64)?,
            _ => w.next_sequence("model").map(drop)?,
        }
        Ok(())
    }
}

/// Every key written so far, by full table name: what point reads through the memtable are
/// checked on (a removed row must read as absent, not only scan as absent).
type Probes = BTreeMap<String, BTreeSet<Vec<u8>>>;

/// A namespace's tables as one view read them, by table name.
type Dump = Vec<(&'static str, TableDump)>;

/// Every row of a scan as (encoded key, encoded value).
fn collect<K: redb::Key + 'static, V: redb::Value + 'static>(
    rows: impl Iterator<Item = Result<(impl Stored<K>, impl Stored<V>), redb::StorageError>>,
) -> MetaResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for row in rows {
        let (k, v) = row?;
        out.push((
            K::as_bytes(&k.stored()).as_ref().to_vec(),
            V::as_bytes(&v.stored()).as_ref().to_vec(),
        ));
    }
    Ok(out)
}

/// (a) What readers are shown: a snapshot read through its memtable layers.
struct Shown<'s> {
    snapshot: &'s Snapshot,
    probes: &'s Probes,
}

impl DumpTable for Shown<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: TableDefinition<'static, K, V>,
    ) -> MetaResult<TableDump> {
        let Some(t) = optional(self.snapshot.open_table(def))? else {
            return Ok(TableDump::default());
        };
        let rows = collect::<K, V>(t.iter()?)?;
        let scanned: HashMap<&[u8], &[u8]> = rows.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let name = redb::TableHandle::name(&def);
        let probes = self.probes.get(name).into_iter().flatten();
        for key in probes.chain(rows.iter().map(|(k, _)| k)) {
            let got = t.get(K::from_bytes(key))?;
            let got = got
                .as_ref()
                .map(|v| V::as_bytes(&v.value()).as_ref().to_vec());
            assert_eq!(
                got.as_deref(),
                scanned.get(&key[..]).copied(),
                "{name}: a point read of {} disagrees with the scan",
                key.escape_ascii()
            );
        }
        Ok(TableDump {
            len: t.len()?,
            rows,
        })
    }
}

/// (b) The write transaction's own view, read in a session.
impl DumpTable for SessionTxn<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: TableDefinition<'static, K, V>,
    ) -> MetaResult<TableDump> {
        let t = self.open_table(def)?;
        Ok(TableDump {
            len: t.len()?,
            rows: collect::<K, V>(t.iter()?)?,
        })
    }
}

/// (c) The replica, and (d) a reopened crash copy: a plain redb snapshot.
impl DumpTable for redb::ReadTransaction {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: TableDefinition<'static, K, V>,
    ) -> MetaResult<TableDump> {
        let Some(t) = optional(self.open_table(def))? else {
            return Ok(TableDump::default());
        };
        Ok(TableDump {
            len: t.len()?,
            rows: collect::<K, V>(t.iter()?)?,
        })
    }
}

/// Asserts that two readings of a namespace agree, table by table.
fn same(round: usize, what: &str, left: &Dump, right: &Dump) {
    assert_eq!(left.len(), right.len());
    for ((table, l), (_, r)) in left.iter().zip(right) {
        assert_eq!(l, r, "after batch {round}, table {table}: {what}");
    }
}

/// The write transaction's own view of every namespace, read in a session of `batch` (a
/// session that writes nothing, so it adds nothing to the batch).
fn own_view(batch: &mut Batch) -> Vec<Dump> {
    namespaces()
        .iter()
        .map(|&ns| {
            batch
                .session(ns, |w| {
                    let mut txn = w.txn;
                    ns.dump(&mut txn)
                })
                .unwrap()
        })
        .collect()
}

fn replica_view(replica: &MetaStore) -> Vec<Dump> {
    let mut txn = replica.db.begin_read().unwrap();
    namespaces()
        .iter()
        .map(|ns| ns.dump(&mut txn).unwrap())
        .collect()
}

fn shown_view(snapshot: &Snapshot, probes: &Probes) -> Vec<Dump> {
    let mut shown = Shown { snapshot, probes };
    namespaces()
        .iter()
        .map(|ns| ns.dump(&mut shown).unwrap())
        .collect()
}

/// (d): the store's file and log copied as a crash would leave them, reopened.
fn crash_view(store: &MetaStore, dir: &std::path::Path, n: usize) -> Vec<Dump> {
    let copy = dir.join(format!("crash-{n}.redb"));
    std::fs::copy(store.path(), &copy).unwrap();
    let log = store.path().with_extension("redo");
    if log.exists() {
        std::fs::copy(&log, copy.with_extension("redo")).unwrap();
    }
    let reopened = MetaStore::open_node(&copy).unwrap();
    let mut txn = reopened.db.begin_read().unwrap();
    namespaces()
        .iter()
        .map(|ns| ns.dump(&mut txn).unwrap())
        .collect()
}

/// What the run went through, so that a change to the dice that stops exercising a path
/// shows.
#[derive(Debug, Default)]
struct Tally {
    held: usize,
    committed: usize,
    checkpoints: usize,
    failed_sessions: usize,
    empty_batches: usize,
    kinds: [usize; KINDS],
}

// Catches (each verified red, one at a time): a layer that ignores removals
// (`Layer::change` returning early on `None`: a removed row still shows); a table left out of
// the layers (`Layer::change` ignoring `quarantine_seen`, which the memtable's own test does
// not write); a point read that ignores a removal in a layer (`OverlaidTable::get` skipping
// `None` changes) and a length that does (`OverlaidTable::len` not counting a stored row a
// layer removed); a failed session's effects kept in the batch's record (`Effects::rewind`
// not called in `Batch::session`: the replay and the layers keep rows its undo took out of
// the transaction); an undo that misses a row (`UndoTable::remove` recording no undo step);
// and a write the capture does not record (`UndoTable::insert` recording no redo effect for
// `u64` values).
#[test]
fn random_batches_read_the_same_through_the_memtable_their_transaction_and_a_replay_of_their_records()
 {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MetaStore::create_node(&dir.path().join("node.redb")).unwrap());
    let replica = MetaStore::create_node(&dir.path().join("replica.redb")).unwrap();
    for ns in namespaces() {
        store.prepare(ns).unwrap();
        replica.prepare(ns).unwrap();
    }
    let mut probes = Probes::new();
    let mut dice = Dice(SEED);
    let mut tally = Tally::default();
    let mut held: Option<Batch> = None;
    let mut shown = store.snapshot().unwrap();
    // Framed records not yet appended: the acknowledger appends several with one fsync.
    let mut pending = Vec::new();
    let mut crashes = 0;
    for round in 0..ROUNDS {
        let now = 1_700_000_000_000 + 1000 * round as i64;
        let mut batch = match held.take() {
            Some(batch) => batch,
            None => store.batch().unwrap(),
        };
        let mut committed = 0;
        for _ in 0..1 + dice.roll(4) {
            let ns = namespaces()[dice.roll(2)];
            let ops: Vec<Op> = (0..1 + dice.roll(4)).map(|_| Op::draw(&mut dice)).collect();
            let fail = dice.roll(6) == 0;
            for op in &ops {
                tally.kinds[op.kind] += 1;
            }
            let out = batch.session(ns, |w| {
                for op in &ops {
                    op.run(w, now)?;
                }
                if fail {
                    return Err(MetaError::Failed("this session fails after writing".into()));
                }
                Ok(())
            });
            match out {
                Ok(()) => committed += 1,
                Err(MetaError::Failed(_) | MetaError::EpochRegression { .. }) => {
                    tally.failed_sessions += 1
                }
                Err(e) => panic!("batch {round}: {e}"),
            }
        }
        if committed == 0 {
            // As `run_batch`: nothing to log; a transaction holding batches stays held.
            tally.empty_batches += 1;
            if batch.holds_batches() {
                held = Some(batch);
            } else {
                drop(batch); // aborted: the next batch begins a transaction of its own
            }
        } else {
            let logged: Logged = if batch.full() || dice.roll(8) == 0 {
                tally.committed += 1;
                batch.commit_logged().unwrap()
            } else {
                tally.held += 1;
                let logged = batch.log().unwrap();
                held = Some(batch);
                logged
            };
            let mut replay = replica.db.begin_write().unwrap();
            // Durability is not what the replica is for: no fsync per batch.
            replay.set_durability(redb::Durability::None).unwrap();
            logged.redo.apply_to(&replay).unwrap();
            replay.commit().unwrap();
            logged
                .redo
                .each_row(|table, key, _| {
                    probes.entry(table.into()).or_default().insert(key.into());
                    Ok(())
                })
                .unwrap();
            shown = logged.snapshot;
            pending.push(logged.redo);
        }
        if dice.roll(10) == 0 && !pending.is_empty() {
            append_all(&store, &mut pending);
        }
        if dice.roll(40) == 0 {
            // The gate's checkpoint: the held transaction committed, the file made durable in a
            // commit that begins a new round of the log, whose marker is then written (records
            // not appended yet are in the file now and are never appended).
            tally.checkpoints += 1;
            if let Some(batch) = held.take() {
                shown = batch.commit().unwrap();
            }
            assert!(store.checkpoint().unwrap());
            pending.clear();
            store.clear_log();
            store.log(&[]).unwrap();
        }

        let truth = replica_view(&replica);
        let mut next = match held.take() {
            Some(batch) => batch,
            None => store.batch().unwrap(),
        };
        let own = own_view(&mut next);
        held = Some(next);
        let through = shown_view(&shown, &probes);
        for (ns, truth) in truth.iter().enumerate() {
            let what = |view| format!("namespace {ns}: {view} vs the replay of the records");
            same(round, &what("the memtable"), &through[ns], truth);
            same(round, &what("the write transaction"), &own[ns], truth);
        }
        if round % 100 == 99 || round + 1 == ROUNDS {
            if !pending.is_empty() {
                append_all(&store, &mut pending);
            }
            crashes += 1;
            let crashed = crash_view(&store, dir.path(), crashes);
            for (ns, truth) in truth.iter().enumerate() {
                let what = format!("namespace {ns}: a reopened crash copy vs the replay");
                same(round, &what, &crashed[ns], truth);
            }
        }
    }
    if let Some(batch) = held.take() {
        batch.commit().unwrap();
    }

    // The dice went everywhere the test is meant to go.
    assert!(tally.kinds.iter().all(|&n| n >= 20), "{tally:?}");
    assert!(tally.held >= 100 && tally.committed >= 10, "{tally:?}");
    assert!(
        tally.failed_sessions >= 50 && tally.empty_batches >= 5,
        "{tally:?}"
    );
    assert!(tally.checkpoints >= 3, "{tally:?}");
    let rows: usize = replica_view(&replica)
        .iter()
        .flatten()
        .filter(|(_, t)| !t.rows.is_empty())
        .count();
    assert!(rows >= 30, "tables with rows at the end: {rows}");
}

/// Appends every pending record to the store's log in one append, as the acknowledger does.
fn append_all(store: &MetaStore, pending: &mut Vec<super::Redo>) {
    let redos: Vec<&super::Redo> = pending.iter().collect();
    store.log(&redos).unwrap();
    pending.clear();
}
