//! TEMPORARY shim until the checkpoint module lands (replaced at merge).
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::object::{ObjectProvider, PutOutcome};
use crate::shard::Shard;

pub struct Checkpoint {
    pub key: String,
    pub sha256: String,
    pub size: u64,
}

pub async fn take(
    _shard: &Arc<Shard>,
    provider: &ObjectProvider,
    shard: u32,
    epoch: u64,
    scratch: &Path,
) -> Result<Checkpoint> {
    let src = scratch.with_extension("redb");
    let data = Bytes::from(std::fs::read(&src).map_err(|e| Error::Internal(e.to_string()))?);
    let sha256 = hex::encode(Sha256::digest(&data));
    let key = format!(
        "{}/meta/{shard}/ckpt/{epoch}-{}",
        "nokv",
        crate::ids::random_hex(8)
    );
    let size = data.len() as u64;
    match provider.create(&key, data).await {
        PutOutcome::Written => Ok(Checkpoint { key, sha256, size }),
        other => Err(Error::Unavailable(format!("{other:?}"))),
    }
}

pub async fn restore(provider: &ObjectProvider, c: &Checkpoint, dest: &Path) -> Result<()> {
    let data = provider
        .get(&c.key)
        .await
        .map_err(|e| Error::Unavailable(e.to_string()))?;
    if hex::encode(Sha256::digest(&data)) != c.sha256 {
        return Err(Error::DataCorrupted("checkpoint digest".into()));
    }
    std::fs::write(dest, &data).map_err(|e| Error::Internal(e.to_string()))
}

pub async fn discard(provider: &ObjectProvider, key: &str) {
    let _ = provider.delete(key).await;
}
