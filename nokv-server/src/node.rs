//! A node: the shards it owns and how requests find them.
//!
//! In the embedded default the node owns every shard locally. Shard ids are stable, so a
//! shard's redb file (`DATA_DIR/shards/NNNN.redb`) always holds the same workspaces.

use std::sync::Arc;
use std::time::Instant;

use crate::bulk::Bulk;
use crate::error::{Error, Result};
use crate::memory::BlockMemory;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::placement::shard_of;
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
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        data_dir: &std::path::Path,
        shard_count: u32,
        cfg: &ShardConfig,
        bulk: (usize, Option<f64>),
        memory: BlockMemory,
        provider: ObjectProvider,
        signer: Signer,
        name: String,
    ) -> Result<Node> {
        let dir = data_dir.join("shards");
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Internal(format!("{}: {e}", dir.display())))?;
        check_shard_count(&dir, shard_count)?;
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
            memory,
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

/// The shard count is fixed when a data directory is created: placement hashes workspaces
/// modulo the count, so starting with another count would silently hide every workspace.
fn check_shard_count(dir: &std::path::Path, shard_count: u32) -> Result<()> {
    let path = dir.join("COUNT");
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(n) if n == shard_count => Ok(()),
            Ok(n) => Err(Error::InvalidArgument(format!(
                "{} was created with {n} shards; start with --shards {n}",
                dir.display()
            ))),
            Err(_) => Err(Error::Internal(format!(
                "{} is not a number",
                path.display()
            ))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, format!("{shard_count}\n"))
                .map_err(|e| Error::Internal(format!("{}: {e}", path.display())))
        }
        Err(e) => Err(Error::Internal(format!("{}: {e}", path.display()))),
    }
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
