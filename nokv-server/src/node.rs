//! A node: the shards it owns and how requests find them.
//!
//! In the embedded default the node owns every shard locally. Shard ids are stable, so a
//! shard's redb file (`DATA_DIR/shards/NNNN.redb`) always holds the same workspaces.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::RwLock;
use std::time::Instant;

use crate::bulk::Bulk;
use crate::cluster::Cluster;
use crate::control::etcd::{ClusterView, NodeRecord, OwnerKey, ShardRecord, ShardState, ShardView};
use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::memory::BlockMemory;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::placement::shard_of;
use crate::route::{LocalRoutes, Route, Routes};
use crate::shard::fence::Fence;
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
    /// The cluster runtime, in cluster mode (weak: the runtime holds the node).
    cluster: OnceLock<Weak<Cluster>>,
    /// The node's audit events (`DATA_DIR/events.jsonl`, see [`crate::events`]).
    pub events: EventLog,
    /// Wakes the inventory driver when `admin inventory start` started scans.
    pub inventory_wake: tokio::sync::Notify,
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
}

impl Node {
    /// The embedded default: opens (or creates) every shard file and serves them all.
    pub fn open(data_dir: &Path, parts: NodeParts) -> Result<Node> {
        let node = Self::empty(data_dir, parts)?;
        let stores = open_shard_files(&node.dir, node.shard_count())?;
        for (meta, id) in stores.into_iter().zip(0..) {
            let shard = Shard::open(
                id,
                meta,
                node.provider.clone(),
                node.bulk.clone(),
                node.signer.clone(),
                node.cfg.clone(),
            );
            node.install(id, shard);
        }
        Ok(node)
    }

    /// Cluster mode: a node that holds no shard yet; the cluster runtime loads the shards it
    /// takes ([`Node::install`]). The data dir's shard count is checked (or recorded) now.
    pub fn open_cluster(data_dir: &Path, parts: NodeParts) -> Result<Node> {
        let node = Self::empty(data_dir, parts)?;
        std::fs::create_dir_all(&node.dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", node.dir.display())))?;
        check_shard_count(&node.dir, node.shard_count())?;
        Ok(node)
    }

    /// The interactive pressure this node's bulk work yields to (see [`crate::bulk`]).
    pub fn pressure(&self) -> Arc<crate::pressure::Pressure> {
        self.bulk.pressure()
    }

    fn empty(data_dir: &Path, parts: NodeParts) -> Result<Node> {
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
            cluster: OnceLock::new(),
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
    pub fn attach_cluster(&self, cluster: &Arc<Cluster>) {
        let _ = self.cluster.set(Arc::downgrade(cluster));
    }

    /// True for the embedded default (no cluster runtime attached).
    pub fn is_embedded(&self) -> bool {
        self.cluster.get().is_none()
    }

    fn cluster(&self) -> Option<Arc<Cluster>> {
        self.cluster.get().and_then(Weak::upgrade)
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

    /// The local file of shard `id`.
    pub fn shard_path(&self, id: u32) -> PathBuf {
        shard_file(&self.dir, id)
    }

    /// Opens a shard (cluster mode) whose store is at [`Node::shard_path`], fenced by `fence`.
    pub fn open_shard(&self, id: u32, meta: MetaStore, fence: Fence) -> Arc<Shard> {
        Shard::open_fenced(
            id,
            meta,
            self.provider.clone(),
            self.bulk.clone(),
            self.signer.clone(),
            self.cfg.clone(),
            fence,
        )
    }

    /// The cluster as this node sees it: config, live nodes, and every shard's ownership.
    /// The embedded default reports itself as the only node, owning every shard at epoch 0.
    pub async fn cluster_view(&self) -> Result<ClusterView> {
        if let Some(cluster) = self.cluster() {
            return cluster.view().await;
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
        match self.cluster() {
            Some(cluster) => cluster.move_shard(shard, to).await,
            None => Err(Error::InvalidArgument(
                "shard moves need cluster mode (--etcd); this node serves every shard itself"
                    .into(),
            )),
        }
    }
}

fn shard_file(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:04}.redb"))
}

/// Opens every shard file of the data dir, or creates them on its first start.
///
/// Invariant: `shards/COUNT` is written only after every shard file was created, so it
/// records that the directory is complete and which files it must hold (`0000.redb` up to
/// COUNT − 1). With COUNT present a missing or empty shard file is refused by name — serving
/// it empty would silently lose its workspaces and orphan their blocks. Without COUNT the
/// directory is new (or its first start was interrupted) and the files are created.
fn open_shard_files(dir: &Path, shard_count: u32) -> Result<Vec<MetaStore>> {
    let open = |id| -> Result<MetaStore> { Ok(MetaStore::open(&shard_file(dir, id))?) };
    match recorded_shard_count(dir)? {
        Some(_) => {
            check_shard_count(dir, shard_count)?;
            (0..shard_count).map(open).collect()
        }
        None => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
            let stores = (0..shard_count)
                .map(|id| Ok(MetaStore::create(&shard_file(dir, id))?))
                .collect::<Result<Vec<_>>>()?;
            record_shard_count(dir, shard_count)?;
            Ok(stores)
        }
    }
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
                "{} is not a number (it records how many shard files this data dir holds)",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Internal(format!("{}: {e}", path.display()))),
    }
}

/// Writes COUNT durably (temporary file, fsync, rename).
fn record_shard_count(dir: &Path, shard_count: u32) -> Result<()> {
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
