//! A node: the shards it owns and how requests find them.
//!
//! In the embedded default the node owns every shard locally. Shard ids are stable, so a
//! shard's redb file (`DATA_DIR/shards/NNNN.redb`) always holds the same workspaces.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::bulk::Bulk;
use crate::control::etcd::{ClusterView, NodeRecord, OwnerKey, ShardRecord, ShardState, ShardView};
use crate::error::{Error, Result};
use crate::memory::BlockMemory;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::placement::shard_of;
use crate::route::{LocalRoutes, Route, Routes};
use crate::shard::{Shard, ShardConfig};
use crate::token::Signer;

pub struct Node {
    shards: Vec<Arc<Shard>>,
    pub signer: Signer,
    pub provider: ObjectProvider,
    /// The node-wide budget of block bytes held in memory (see [`crate::memory`]).
    pub memory: BlockMemory,
    pub name: String,
    pub started: Instant,
    /// Who owns which shard (embedded: this node, epoch 0).
    routes: Box<dyn Routes>,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        data_dir: &Path,
        shard_count: u32,
        cfg: &ShardConfig,
        bulk: (usize, Option<f64>),
        memory: BlockMemory,
        provider: ObjectProvider,
        signer: Signer,
        name: String,
    ) -> Result<Node> {
        let dir = data_dir.join("shards");
        let bulk = Arc::new(
            Bulk::new(bulk.0, bulk.1).map_err(|e| Error::Internal(format!("bulk runtime: {e}")))?,
        );
        let stores = open_shard_files(&dir, shard_count)?;
        let shards = stores
            .into_iter()
            .zip(0..)
            .map(|(meta, id)| {
                Shard::open(
                    id,
                    meta,
                    provider.clone(),
                    bulk.clone(),
                    signer.clone(),
                    cfg.clone(),
                )
            })
            .collect();
        Ok(Node {
            shards,
            signer,
            provider,
            memory,
            name,
            started: Instant::now(),
            routes: Box::new(LocalRoutes::new(String::new())),
        })
    }

    /// Replaces the node's source of routes (embedded: [`LocalRoutes`] with the advertised
    /// endpoint; a cluster: its ownership records).
    pub fn with_routes(mut self, routes: Box<dyn Routes>) -> Node {
        self.routes = routes;
        self
    }

    /// The route of `workspace` (validated by the caller): its shard, owner and epoch.
    pub fn route(&self, workspace: &str) -> Route {
        self.routes
            .route(shard_of(workspace, self.shards.len() as u32))
    }

    /// The shards this node holds right now (in cluster mode: the ones it owns and has
    /// loaded), in shard order.
    pub fn shards(&self) -> Vec<Arc<Shard>> {
        self.shards.clone()
    }

    /// Number of shards of the node's placement (the cluster's, in cluster mode).
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// The shard holding `workspace` (validated by the caller), or `NotOwner` with a hint.
    pub fn shard_for(&self, workspace: &str) -> Result<Arc<Shard>> {
        self.shard(shard_of(workspace, self.shard_count()))
    }

    /// Shard `id` if this node serves it, else `NotOwner` with the owner hint.
    pub fn shard(&self, id: u32) -> Result<Arc<Shard>> {
        self.shards
            .get(id as usize)
            .cloned()
            .ok_or(Error::NotOwner {
                shard: id,
                hint: String::new(),
                epoch: 0,
            })
    }

    /// The cluster as this node sees it: config, live nodes, and every shard's ownership.
    /// The embedded default reports itself as the only node, owning every shard at epoch 0.
    pub async fn cluster_view(&self) -> Result<ClusterView> {
        let endpoint = self.routes.route(0).endpoint;
        Ok(ClusterView {
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
    /// to `to`. Answers once `to` serves the shard.
    pub async fn move_shard(&self, shard: u32, to: &str) -> Result<()> {
        let _ = (shard, to);
        Err(Error::InvalidArgument(
            "shard moves need cluster mode (--etcd); this node serves every shard itself".into(),
        ))
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
