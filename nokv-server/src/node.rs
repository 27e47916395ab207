//! A node: the shards it owns and how requests find them.
//!
//! In the embedded default the node owns every shard locally. Shard ids are stable, so a
//! shard's tables in the node file (`DATA_DIR/shards/node.redb`, one namespace per shard, see
//! [`crate::meta::Tables`]) always hold the same workspaces. One committer writes that file
//! for every shard the node holds (see [`crate::shard::gate`]).
//!
//! **Layering**: the node sits below the cluster runtime and above the metrics registry.
//! * The cluster runtime ([`crate::cluster`]) owns the node and drives it (installs, drains and
//!   removes shards, replaces its routes). The node never names the cluster type: the little it
//!   asks of the runtime — the cluster view and a graceful shard move, for the admin service —
//!   goes through the narrow [`Coordinator`] trait, which the runtime implements and attaches
//!   ([`Node::attach_coordinator`]). So the arrow points one way, cluster → node.
//! * The metrics registry ([`crate::metrics`]) imports nothing above it; the node registers
//!   itself as the [`HealthCollector`] of the per-shard health gauges. So the arrow points one
//!   way, node → metrics.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::RwLock;
use std::time::Instant;

use crate::bulk::Bulk;
use crate::control::etcd::{ClusterView, NodeRecord, OwnerKey, ShardRecord, ShardState, ShardView};
use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::memory::BlockMemory;
use crate::meta::{MetaStore, Tables};
use crate::metrics::HealthCollector;
use crate::object::ObjectProvider;
use crate::placement::shard_of;
use crate::route::{LocalRoutes, Route, Routes};
use crate::shard::fence::Fence;
use crate::shard::gate::{Committer, Gate};
use crate::shard::{Shard, ShardConfig};
use crate::token::Signer;

pub struct Node {
    /// One slot per shard id of the placement.
    slots: Vec<RwLock<Slot>>,
    pub signer: Signer,
    pub provider: ObjectProvider,
    /// The node-wide budget of block bytes held in memory (see [`crate::memory`]).
    pub memory: BlockMemory,
    pub name: String,
    pub started: Instant,
    /// Who owns which shard (embedded: this node, epoch 0).
    routes: Box<dyn Routes>,
    /// What a shard needs when it is opened later (cluster mode loads shards as it takes them).
    dir: PathBuf,
    cfg: ShardConfig,
    bulk: Arc<Bulk>,
    /// The single writer of the node file, shared by every shard the node holds.
    committer: Arc<Committer>,
    /// The cluster runtime, in cluster mode (weak: the runtime holds the node).
    coordinator: OnceLock<Weak<dyn Coordinator>>,
    /// The node's audit events (`DATA_DIR/events.jsonl`, see [`crate::events`]).
    pub events: EventLog,
    /// Wakes the inventory driver when `admin inventory start` started scans.
    pub inventory_wake: tokio::sync::Notify,
}

/// What the node asks of the cluster runtime that drives it (cluster mode only): implemented
/// by [`crate::cluster::Cluster`], which owns the node, so the node never names the cluster
/// type (see the module doc).
#[async_trait::async_trait]
pub trait Coordinator: Send + Sync {
    /// The cluster as its control plane holds it now.
    async fn view(&self) -> Result<ClusterView>;

    /// Hands `shard` to node `to` gracefully; answers once `to` serves it, with its epoch.
    async fn move_shard(&self, shard: u32, to: &str) -> Result<u64>;
}

/// A shard id as this node holds it.
#[derive(Clone, Default)]
enum Slot {
    /// Not held here (another node's, or not loaded yet).
    #[default]
    Empty,
    /// Served: requests get it.
    Serving(Arc<Shard>),
    /// Being handed off: new requests are turned away (hint or retry) while the ones holding
    /// the shard finish.
    Draining(Arc<Shard>),
}

/// What a node is built from, in either mode.
pub struct NodeParts {
    pub shard_count: u32,
    pub cfg: ShardConfig,
    /// Bulk work: (parallel jobs, optional MiB/s cap).
    pub bulk: (usize, Option<f64>),
    pub memory: BlockMemory,
    pub provider: ObjectProvider,
    pub signer: Signer,
    /// The node's name (its cluster node id in cluster mode).
    pub name: String,
    /// `--metadata-durability provider`: the node's log stream writer (see
    /// [`crate::provider_log`]); `None` for local durability.
    pub replica: Option<Arc<crate::provider_log::LogWriter>>,
}

impl Node {
    /// The embedded default: opens (or creates) the node file with every shard's tables and
    /// serves them all.
    pub fn open(data_dir: &Path, parts: NodeParts) -> Result<Node> {
        let dir = data_dir.join("shards");
        let store = open_node_file(&dir, parts.shard_count, true)?;
        let node = Self::empty(data_dir, parts, store)?;
        for id in 0..node.shard_count() {
            let shard = node.open_shard(id, Fence::local(id));
            node.install(id, shard);
        }
        Ok(node)
    }

    /// True if `data_dir` holds no node yet (its first start, or a wiped disk): what a node
    /// with provider durability rebuilds from the bucket (see [`crate::standalone`]).
    pub fn is_new_data_dir(data_dir: &Path) -> Result<bool> {
        Ok(recorded_shard_count(&data_dir.join("shards"))?.is_none())
    }

    /// [`Node::open`] of a new data dir whose shards are first restored — each from a
    /// checkpoint file plus redo payloads, in one durable transaction per shard — before any
    /// shard opens (a rebuild from the bucket, see [`crate::standalone`]). The checkpoint
    /// files are removed afterwards.
    pub fn open_restoring(
        data_dir: &Path,
        parts: NodeParts,
        restore: Vec<(u32, PathBuf, Vec<Vec<u8>>)>,
    ) -> Result<Node> {
        let dir = data_dir.join("shards");
        let store = open_node_file(&dir, parts.shard_count, true)?;
        for (shard, file, records) in restore {
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            store.restore(Tables::shard(shard), Some(&file), &refs)?;
            let _ = std::fs::remove_file(&file);
        }
        let node = Self::empty(data_dir, parts, store)?;
        for id in 0..node.shard_count() {
            let shard = node.open_shard(id, Fence::local(id));
            node.install(id, shard);
        }
        Ok(node)
    }

    /// Cluster mode: a node that holds no shard yet; the cluster runtime loads the shards it
    /// takes ([`Node::install`]). The data dir's shard count is checked (or recorded) now.
    pub fn open_cluster(data_dir: &Path, parts: NodeParts) -> Result<Node> {
        let dir = data_dir.join("shards");
        let store = open_node_file(&dir, parts.shard_count, false)?;
        Self::empty(data_dir, parts, store)
    }

    /// The interactive pressure this node's bulk work yields to (see [`crate::bulk`]).
    pub fn pressure(&self) -> Arc<crate::pressure::Pressure> {
        self.bulk.pressure()
    }

    fn empty(data_dir: &Path, parts: NodeParts, store: MetaStore) -> Result<Node> {
        crate::backup::sweep_scratch(&data_dir.join("shards"));
        let (parallel, cap) = parts.bulk;
        let bulk = Arc::new(
            Bulk::new(parallel, cap).map_err(|e| Error::Internal(format!("bulk runtime: {e}")))?,
        );
        Ok(Node {
            slots: (0..parts.shard_count)
                .map(|_| RwLock::new(Slot::Empty))
                .collect(),
            signer: parts.signer,
            provider: parts.provider,
            memory: parts.memory,
            name: parts.name,
            started: Instant::now(),
            routes: Box::new(LocalRoutes::new(String::new())),
            dir: data_dir.join("shards"),
            cfg: parts.cfg,
            bulk,
            committer: Committer::start_with(store, "nokv-committer".into(), parts.replica),
            coordinator: OnceLock::new(),
            events: EventLog::open(data_dir).map_err(|e| {
                Error::Internal(format!(
                    "{}: {e}",
                    data_dir.join(crate::events::EVENTS_FILE).display()
                ))
            })?,
            inventory_wake: tokio::sync::Notify::new(),
        })
    }

    /// Replaces the node's source of routes (embedded: [`LocalRoutes`] with the advertised
    /// endpoint; a cluster: its ownership records).
    pub fn with_routes(mut self, routes: Box<dyn Routes>) -> Node {
        self.routes = routes;
        self
    }

    /// Attaches the cluster runtime (cluster mode only, once).
    pub fn attach_coordinator(&self, coordinator: &Arc<dyn Coordinator>) {
        let _ = self.coordinator.set(Arc::downgrade(coordinator));
    }

    /// True for the embedded default (no cluster runtime attached).
    pub fn is_embedded(&self) -> bool {
        self.coordinator.get().is_none()
    }

    fn coordinator(&self) -> Option<Arc<dyn Coordinator>> {
        self.coordinator.get().and_then(Weak::upgrade)
    }

    /// The route of `workspace` (validated by the caller): its shard, owner and epoch.
    pub fn route(&self, workspace: &str) -> Route {
        self.routes.route(shard_of(workspace, self.shard_count()))
    }

    /// The shards this node serves right now, in shard order.
    pub fn shards(&self) -> Vec<Arc<Shard>> {
        self.slots
            .iter()
            .filter_map(|slot| match &*slot.read() {
                Slot::Serving(shard) => Some(shard.clone()),
                _ => None,
            })
            .collect()
    }

    /// Number of shards of the node's placement (the cluster's, in cluster mode).
    pub fn shard_count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The shard holding `workspace` (validated by the caller), or `NotOwner` with a hint.
    pub fn shard_for(&self, workspace: &str) -> Result<Arc<Shard>> {
        self.shard(shard_of(workspace, self.shard_count()))
    }

    /// Shard `id` if this node serves it. Otherwise `NotOwner` with the owner's endpoint and
    /// epoch when another node serves it, or `Unavailable` (retry) while it is moving or its
    /// owner is unknown — `NotOwner` always carries a usable hint.
    pub fn shard(&self, id: u32) -> Result<Arc<Shard>> {
        let Some(slot) = self.slots.get(id as usize) else {
            return Err(Error::InvalidArgument(format!(
                "shard {id} does not exist (the placement has {} shards)",
                self.shard_count()
            )));
        };
        if let Slot::Serving(shard) = &*slot.read() {
            return Ok(shard.clone());
        }
        let route = self.routes.route(id);
        let here = self.routes.own_endpoint();
        if !route.endpoint.is_empty() && route.endpoint != here {
            return Err(Error::NotOwner {
                shard: id,
                hint: route.endpoint,
                epoch: route.epoch,
            });
        }
        Err(Error::Unavailable(format!(
            "shard {id} is moving between nodes; retry"
        )))
    }

    /// Serves `shard` from now on (it was loaded and its epoch adopted).
    pub fn install(&self, id: u32, shard: Arc<Shard>) {
        *self.slots[id as usize].write() = Slot::Serving(shard);
    }

    /// Starts handing off shard `id`: new requests are turned away; returns the shard so the
    /// caller can wait for the requests holding it and take its checkpoint.
    pub fn begin_drain(&self, id: u32) -> Option<Arc<Shard>> {
        let mut slot = self.slots.get(id as usize)?.write();
        let shard = match &*slot {
            Slot::Serving(shard) | Slot::Draining(shard) => shard.clone(),
            Slot::Empty => return None,
        };
        *slot = Slot::Draining(shard.clone());
        Some(shard)
    }

    /// Forgets shard `id` (handed off, or its ownership lapsed); returns what was held.
    pub fn remove(&self, id: u32) -> Option<Arc<Shard>> {
        let mut slot = self.slots.get(id as usize)?.write();
        match std::mem::take(&mut *slot) {
            Slot::Serving(shard) | Slot::Draining(shard) => Some(shard),
            Slot::Empty => None,
        }
    }

    /// Ids of every shard held (serving or draining).
    pub fn held(&self) -> Vec<u32> {
        (0..self.shard_count())
            .filter(|id| !matches!(&*self.slots[*id as usize].read(), Slot::Empty))
            .collect()
    }

    /// `DATA_DIR/shards`: the node file and the scratch files of checkpoints and backups.
    pub fn shards_dir(&self) -> &Path {
        &self.dir
    }

    /// A scratch file for shard `id`'s checkpoint on its way in or out.
    pub fn scratch_path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("{id:04}.ckpt"))
    }

    /// The single writer of the node file (cluster loads run their imports on it).
    pub fn committer(&self) -> &Arc<Committer> {
        &self.committer
    }

    /// Opens shard `id` from its namespace of the node file, fenced by `fence` (its tables
    /// must have been prepared or imported).
    pub fn open_shard(&self, id: u32, fence: Fence) -> Arc<Shard> {
        Shard::on(
            id,
            Gate::on(self.committer.clone(), Tables::shard(id), fence),
            self.provider.clone(),
            self.bulk.clone(),
            self.signer.clone(),
            self.cfg.clone(),
        )
    }

    /// The cluster as this node sees it: config, live nodes, and every shard's ownership.
    /// The embedded default reports itself as the only node, owning every shard at epoch 0.
    pub async fn cluster_view(&self) -> Result<ClusterView> {
        if let Some(coordinator) = self.coordinator() {
            return coordinator.view().await;
        }
        let endpoint = self.routes.own_endpoint();
        Ok(ClusterView {
            cluster: String::new(),
            config: None,
            nodes: vec![(
                self.name.clone(),
                NodeRecord {
                    endpoint: endpoint.clone(),
                },
            )],
            shards: (0..self.shard_count())
                .map(|shard| ShardView {
                    shard,
                    record: Some(ShardRecord {
                        epoch: 0,
                        state: ShardState::Serving,
                        owner: Some(self.name.clone()),
                        endpoint: Some(endpoint.clone()),
                        checkpoint: None,
                        changed: true,
                        target: None,
                        log: None,
                    }),
                    owner: Some(OwnerKey {
                        node: self.name.clone(),
                        epoch: 0,
                    }),
                })
                .collect(),
        })
    }

    /// Hands `shard` to node `to` gracefully (cluster mode only): drain, checkpoint, release
    /// to `to`. Answers once `to` serves the shard, with its epoch.
    pub async fn move_shard(&self, shard: u32, to: &str) -> Result<u64> {
        match self.coordinator() {
            Some(coordinator) => coordinator.move_shard(shard, to).await,
            None => Err(Error::InvalidArgument(
                "shard moves need cluster mode (--etcd); this node serves every shard itself"
                    .into(),
            )),
        }
    }
}

/// The per-shard health gauges of the metrics endpoint: every shard served, in shard order.
#[async_trait::async_trait]
impl HealthCollector for Node {
    async fn shard_health(&self) -> Vec<(u32, nokv_proto::v1::ShardHealth)> {
        let mut out = Vec::new();
        for shard in self.shards() {
            // A failed read shows the shard as not serving, with zero counts.
            out.push((shard.id, shard.health().await.unwrap_or_default()));
        }
        out
    }
}

/// The node file: every shard's tables, each in its namespace.
pub(crate) const NODE_FILE: &str = "node.redb";

/// The node file of the data dir `data_dir` (its redo log is beside it).
pub fn node_file(data_dir: &Path) -> PathBuf {
    data_dir.join("shards").join(NODE_FILE)
}

/// A per-shard file of a data dir from before the node file.
fn legacy_shard_file(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:04}.redb"))
}

/// Opens the data dir's node file, or creates it on the dir's first start (with every
/// shard's tables when `embedded`: that node serves them all).
///
/// Invariant: `shards/COUNT` is written only after the node file was created (and, embedded,
/// every shard's tables made), so it records that the directory is complete. With COUNT
/// present a missing, empty or damaged node file is refused by name — serving it empty would
/// silently lose every workspace and orphan their blocks — and so is an embedded node file
/// lacking a shard's tables. Without COUNT the directory is new (or its first start was
/// interrupted) and the file is created.
///
/// A data dir from before the node file (per-shard `NNNN.redb` files) is moved into it once
/// ([`migrate_legacy`]).
fn open_node_file(dir: &Path, shard_count: u32, embedded: bool) -> Result<MetaStore> {
    let path = dir.join(NODE_FILE);
    let store = match recorded_shard_count(dir)? {
        Some(_) => {
            check_shard_count(dir, shard_count)?;
            migrate_legacy(dir, shard_count)?;
            let store = MetaStore::open_node(&path)?;
            if embedded {
                for id in 0..shard_count {
                    if !store.holds(Tables::shard(id))? {
                        return Err(Error::Internal(format!(
                            "{}: the tables of shard {id} are missing: this data dir was \
                             created with them and nokv never recreates a shard (its entries \
                             would be lost silently); restore the file from a backup",
                            path.display()
                        )));
                    }
                }
            }
            store
        }
        None => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
            let store = MetaStore::create_node(&path)?;
            if embedded {
                for id in 0..shard_count {
                    store.prepare(Tables::shard(id))?;
                }
            }
            record_shard_count(dir, shard_count)?;
            store
        }
    };
    // Existing namespaces are brought to the current layout before any session runs.
    for id in 0..shard_count {
        if store.holds(Tables::shard(id))? {
            store.prepare(Tables::shard(id))?;
        }
    }
    Ok(store)
}

/// Moves the per-shard files of a data dir from before the node file into a new node file:
/// all of them are imported into `node.redb.new`, which is then renamed into place, so a
/// crash leaves either the old files or the complete node file; the old files are removed
/// only once the node file is in place. Does nothing when there are no old files.
fn migrate_legacy(dir: &Path, shard_count: u32) -> Result<()> {
    let legacy: Vec<u32> = (0..shard_count)
        .filter(|id| legacy_shard_file(dir, *id).exists())
        .collect();
    if legacy.is_empty() {
        return Ok(());
    }
    let path = dir.join(NODE_FILE);
    let io = |p: &Path, e: std::io::Error| Error::Internal(format!("{}: {e}", p.display()));
    if !path.exists() {
        let fresh = dir.join("node.redb.new");
        match std::fs::remove_file(&fresh) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&fresh, e)),
            _ => {}
        }
        let store = MetaStore::create_node_plain(&fresh)?;
        for id in &legacy {
            // Opening it replays any redo log of its own before it is copied.
            drop(MetaStore::open(&legacy_shard_file(dir, *id))?);
            store.import(Tables::shard(*id), &legacy_shard_file(dir, *id))?;
        }
        drop(store);
        std::fs::rename(&fresh, &path).map_err(|e| io(&path, e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(dir, e))?;
        tracing::info!(
            shards = legacy.len(),
            file = %path.display(),
            "moved the per-shard files into the node file"
        );
    }
    for id in legacy {
        let old = legacy_shard_file(dir, id);
        // The node file is in place, so every old file was imported whole before it; one
        // left over (a crash between the rename and here) opens cleanly. One that does not
        // — emptied, damaged, planted — is not a file nokv left: it is refused by name,
        // never deleted, since nothing proves its bytes are elsewhere.
        if let Err(e) = MetaStore::open_plain(&old) {
            return Err(Error::Internal(format!(
                "{}: a per-shard metadata file beside {NODE_FILE}, which holds every shard of \
                 this data dir, and it is not whole ({e}); nokv neither serves nor deletes it: \
                 move it out of the data dir (or restore it from a backup if it is yours) and \
                 start again",
                old.display()
            )));
        }
        std::fs::remove_file(&old).map_err(|e| io(&old, e))?;
        let _ = std::fs::remove_file(old.with_extension("redo"));
    }
    Ok(())
}

/// The shard count is fixed when a data directory is created: placement hashes workspaces
/// modulo the count, so starting with another count would silently hide every workspace.
fn check_shard_count(dir: &Path, shard_count: u32) -> Result<()> {
    match recorded_shard_count(dir)? {
        Some(n) if n == shard_count => Ok(()),
        Some(n) => Err(Error::InvalidArgument(format!(
            "{} was created with {n} shards; start with --shards {n}",
            dir.display()
        ))),
        None => record_shard_count(dir, shard_count),
    }
}

fn recorded_shard_count(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join("COUNT");
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().map(Some).map_err(|_| {
            Error::Internal(format!(
                "{} is not a number (it records how many shards this data dir holds)",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Internal(format!("{}: {e}", path.display()))),
    }
}

/// Writes COUNT durably (temporary file, fsync, rename).
pub(crate) fn record_shard_count(dir: &Path, shard_count: u32) -> Result<()> {
    use std::io::Write;
    let path = dir.join("COUNT");
    let tmp = dir.join("COUNT.tmp");
    let io = |p: &Path, e: std::io::Error| Error::Internal(format!("{}: {e}", p.display()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    writeln!(f, "{shard_count}").map_err(|e| io(&tmp, e))?;
    f.sync_all().map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::fault::{Faults, MemoryFake};

    // Catches: a migration that loses a shard's rows or puts them in another namespace, that
    // keeps the old files (two truths), or that trusts a half-written `node.redb.new`.
    #[test]
    fn per_shard_files_from_before_the_node_file_move_into_it_once_and_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for id in 0..4 {
            let old = MetaStore::create(&legacy_shard_file(d, id)).unwrap();
            old.write(|w| w.put_inline("ws", &format!("f{id}"), format!("body {id}").as_bytes()))
                .unwrap();
        }
        record_shard_count(d, 4).unwrap();
        // A migration that crashed before its rename left a partial file behind.
        std::fs::write(d.join("node.redb.new"), b"partial").unwrap();

        let store = open_node_file(d, 4, true).unwrap();
        for id in 0..4 {
            let ns = Tables::shard(id);
            let mine = store
                .read_in(ns, |r| r.inline("ws", &format!("f{id}")))
                .unwrap();
            assert_eq!(mine, Some(format!("body {id}").into_bytes()), "shard {id}");
            let other = store
                .read_in(ns, |r| r.inline("ws", &format!("f{}", (id + 1) % 4)))
                .unwrap();
            assert_eq!(other, None, "shard {id} holds only its own rows");
            assert!(!legacy_shard_file(d, id).exists(), "old file {id} removed");
        }
        assert!(!d.join("node.redb.new").exists());
        drop(store);
        // A second start opens the node file as it is.
        let again = open_node_file(d, 4, true).unwrap();
        let body = again
            .read_in(Tables::shard(2), |r| r.inline("ws", "f2"))
            .unwrap();
        assert_eq!(body, Some(b"body 2".to_vec()));
    }

    // Catches: a start that refuses the whole file a crash left between the node file's
    // rename and the old files' removal (the directory would never start again by itself).
    // The other side — a file that is not whole is refused and kept — is the black-box test
    // `an_empty_per_shard_file_beside_the_node_file_is_refused_by_name_and_never_deleted`.
    #[test]
    fn an_old_file_left_whole_beside_the_node_file_is_removed_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let old = MetaStore::create(&legacy_shard_file(d, 1)).unwrap();
        old.write(|w| w.put_inline("ws", "f", b"body")).unwrap();
        drop(old);
        record_shard_count(d, 4).unwrap();
        let copy = d.join("0001.copy");
        std::fs::copy(legacy_shard_file(d, 1), &copy).unwrap();
        drop(open_node_file(d, 4, false).unwrap());
        // The crash: the old file is back beside the node file that already holds it.
        std::fs::rename(&copy, legacy_shard_file(d, 1)).unwrap();

        let store = open_node_file(d, 4, false).unwrap();
        assert!(!legacy_shard_file(d, 1).exists(), "leftover removed");
        let body = store
            .read_in(Tables::shard(1), |r| r.inline("ws", "f"))
            .unwrap();
        assert_eq!(body, Some(b"body".to_vec()), "the node file's copy is kept");
    }

    // Catches: a node whose shards each get a committer (and a file) of their own, so that
    // writes to different shards cannot share a batch or an fsync.
    #[tokio::test]
    async fn every_shard_of_a_node_writes_through_the_one_node_committer() {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::open(
            dir.path(),
            NodeParts {
                shard_count: 4,
                cfg: ShardConfig::default(),
                bulk: (1, None),
                memory: BlockMemory::new(1 << 24, std::time::Duration::from_secs(1)),
                provider: MemoryFake::new(Faults::default()).clean(),
                signer: crate::token::Signer::new(b"k"),
                name: "n".into(),
                replica: None,
            },
        )
        .unwrap();
        let before = node.committer().stats().acknowledged;
        for id in 0..4 {
            node.shard(id)
                .unwrap()
                .write(nokv_proto::v1::WriteRequest {
                    workspace: format!("ws{id}"),
                    path: "f".into(),
                    data: b"x".to_vec().into(),
                    request_id: format!("r{id}"),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert_eq!(node.committer().stats().acknowledged - before, 4);
        let files: Vec<_> = std::fs::read_dir(dir.path().join("shards"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".redb"))
            .collect();
        assert_eq!(files, ["node.redb"], "one metadata file for the node");
    }

    // Catches: an embedded start that serves a shard whose tables are gone as an empty shard.
    #[test]
    fn an_embedded_node_file_missing_a_shards_tables_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        drop(open_node_file(d, 4, false).unwrap());
        let err = open_node_file(d, 4, true).err().expect("refused");
        assert!(err.to_string().contains("shard 0 are missing"), "{err}");
    }

    #[test]
    fn a_data_dir_refuses_a_different_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        check_shard_count(dir.path(), 16).unwrap();
        check_shard_count(dir.path(), 16).unwrap();
        let err = check_shard_count(dir.path(), 8).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument(ref m) if m.contains("--shards 16")),
            "{err:?}"
        );
    }
}
