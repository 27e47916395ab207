//! `nokv-server provider-bench`: direct block PUTs to the configured provider, measured with
//! the same create path (one attempt, create-if-absent) that the upload sequencer uses, so
//! the comparison with an owner-mediated publish isolates what the owner adds.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;

use crate::config::Settings;
use crate::ids::{random_bytes, random_hex};
use crate::object::{ObjectProvider, PutOutcome};

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub provider: &'static str,
    pub blocks: u32,
    pub block_size: u64,
    pub parallel: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
}

pub async fn run(settings: &Settings, blocks: u32, parallel: usize) -> Result<Report, String> {
    let provider =
        ObjectProvider::open(&settings.provider, &settings.prefix).map_err(|e| e.to_string())?;
    provider.check().await.map_err(|e| e.to_string())?;
    let block_size = settings.shard.block_size;
    let base = Bytes::from(random_bytes(block_size as usize));
    let run_id = format!("bench-direct-{}", random_hex(8));
    let keys: Vec<String> = (0..blocks)
        .map(|i| provider.block_key(9999, &run_id, i, "direct"))
        .collect();
    let provider = Arc::new(provider);
    let started = Instant::now();
    let outcomes: Vec<PutOutcome> = futures::stream::iter(keys.iter().enumerate())
        .map(|(i, key)| {
            // Distinct bytes per block (a provider may deduplicate identical bodies).
            let mut body = base.to_vec();
            body[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let p = provider.clone();
            async move { p.create(key, Bytes::from(body)).await }
        })
        .buffer_unordered(parallel.max(1))
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    for key in &keys {
        let _ = provider.delete(key).await;
    }
    if let Some(bad) = outcomes.iter().find(|o| **o != PutOutcome::Written) {
        return Err(format!("a direct PUT failed: {bad:?}"));
    }
    let bytes = u64::from(blocks) * block_size;
    Ok(Report {
        provider: provider.kind(),
        blocks,
        block_size,
        parallel,
        bytes,
        seconds,
        mib_per_s: bytes as f64 / (1024.0 * 1024.0) / seconds,
    })
}
