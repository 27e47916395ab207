//! A node: the shards it owns and how requests find them.
//!
//! In the embedded default the node owns every shard locally. Shard ids are stable, so a
//! shard's redb file (`DATA_DIR/shards/NNNN.redb`) always holds the same workspaces.

use std::sync::Arc;
use std::time::Instant;

use crate::bulk::Bulk;
use crate::error::{Error, Result};
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::placement::shard_of;
use crate::shard::{Shard, ShardConfig};
use crate::token::Signer;

pub struct Node {
    shards: Vec<Arc<Shard>>,
    pub signer: Signer,
    pub provider: ObjectProvider,
    pub name: String,
    pub started: Instant,
}

impl Node {
    pub fn open(
        data_dir: &std::path::Path,
        shard_count: u32,
        cfg: &ShardConfig,
        bulk: (usize, Option<f64>),
        provider: ObjectProvider,
        signer: Signer,
        name: String,
    ) -> Result<Node> {
        let dir = data_dir.join("shards");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
        let bulk = Arc::new(
            Bulk::new(bulk.0, bulk.1).map_err(|e| Error::Internal(format!("bulk runtime: {e}")))?,
        );
        let shards = (0..shard_count)
            .map(|id| {
                let meta = MetaStore::open(&dir.join(format!("{id:04}.redb")))?;
                Ok(Shard::open(
                    id,
                    meta,
                    provider.clone(),
                    bulk.clone(),
                    signer.clone(),
                    cfg.clone(),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Node {
            shards,
            signer,
            provider,
            name,
            started: Instant::now(),
        })
    }

    pub fn shards(&self) -> &[Arc<Shard>] {
        &self.shards
    }

    /// The shard holding `workspace` (validated by the caller).
    pub fn shard_for(&self, workspace: &str) -> &Arc<Shard> {
        &self.shards[shard_of(workspace, self.shards.len() as u32) as usize]
    }

    pub fn shard(&self, id: u32) -> Result<&Arc<Shard>> {
        self.shards.get(id as usize).ok_or(Error::NotOwner {
            shard: id,
            hint: String::new(),
        })
    }
}
