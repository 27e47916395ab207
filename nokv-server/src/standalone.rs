//! The embedded default with `--metadata-durability provider` (issue 45): a single node whose
//! every acknowledged write is in the bucket, so it can be rebuilt on an empty data dir from
//! the bucket alone.
//!
//! Without etcd there is no shard record; the node keeps a **manifest** instead, under
//! `<prefix>/meta/node/<name>/<generation, 20 digits>` (JSON): its current log stream and, per
//! shard, the checkpoint the shard's log starts from and the sequence it starts at — what a
//! cluster's shard record says. Each manifest is a new key written create-if-absent; the
//! highest generation is the current one.
//!
//! **Start** ([`prepare`] then [`start`]):
//! 1. A new data dir (no node file yet) with a manifest in the bucket is **rebuilt**: the old
//!    stream is fenced (its writer, an earlier process of this node, is gone or must be
//!    stopped), and every shard is restored from its checkpoint plus its records up to the
//!    fence ([`crate::takeover::read_log`], [`crate::meta::MetaStore::restore`]) before the
//!    node opens its shards. An existing data dir is the newer copy (a batch is fsynced
//!    locally before it is sent) and is used as it is.
//! 2. The node begins a new stream, checkpoints every shard and writes the next manifest
//!    generation naming them and the new stream — before it serves. Only then are the old
//!    stream and the checkpoints the old manifest named deleted.
//!
//! **Invariant**: the current manifest's checkpoints plus its stream's records (from each
//! shard's start, up to the stream's end or fence) hold every acknowledged write: a batch is
//! acknowledged only once its segment is in the current stream, and a manifest replaces the
//! previous one only after checkpoints covering everything before the new stream exist.
//!
//! **One process per node name and prefix.** The data dir's LOCK guards one machine only. The
//! manifest's create-if-absent catches a second process starting with the same name (its
//! generation is taken: it refuses to start), and a fence deposes an older one that still runs
//! — but two machines must never be given the same `--advertise` name and bucket prefix.
//!
//! **Compaction** while running follows the cluster's rules (`cluster/compaction.rs`) with the
//! manifest in place of etcd ([`Standalone::compact_loop`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{Durability, MIN_CHECKPOINT_LOG_BYTES};
use crate::control::etcd::CheckpointRef;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::object::{ObjectProvider, PutOutcome};
use crate::provider_log::{IDLE_LAG, StreamId, stream};
use crate::shard::checkpoint::{self, Checkpoint};

/// Listing page size while looking for the newest manifest.
const LIST_PAGE: usize = 1000;

/// One generation of a node's manifest (see the module doc).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    /// The log stream of the process that wrote it (`provider_log::StreamId::name`).
    stream: String,
    /// Per shard: the checkpoint its log starts from and the first sequence of its log.
    shards: BTreeMap<u32, Base>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Base {
    checkpoint: CheckpointRef,
    from_seq: u64,
}

/// What a rebuild restores into the node file before its shards open: per shard, the
/// downloaded checkpoint file and the shard's redo payloads.
pub struct Rebuild {
    pub shards: Vec<(u32, std::path::PathBuf, Vec<Vec<u8>>)>,
}

/// The folder of node `name`'s manifests, relative to the prefix.
fn folder(name: &str) -> String {
    format!("meta/node/{name}")
}

fn key(provider: &ObjectProvider, name: &str, generation: u64) -> String {
    let rel = format!("{}/{generation:020}", folder(name));
    match provider.prefix() {
        "" => rel,
        p => format!("{p}/{rel}"),
    }
}

/// Every manifest generation of `name` in the bucket, ascending.
async fn generations(provider: &ObjectProvider, name: &str) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = provider
            .list_page(&folder(name), after.as_deref(), LIST_PAGE)
            .await?;
        out.extend(
            page.objects
                .iter()
                .filter_map(|(k, _)| k.rsplit('/').next()?.parse::<u64>().ok()),
        );
        if page.last || page.objects.is_empty() {
            break;
        }
        after = page.objects.last().map(|(k, _)| k.clone());
    }
    out.sort_unstable();
    Ok(out)
}

async fn read(provider: &ObjectProvider, name: &str, generation: u64) -> Result<Manifest> {
    let key = key(provider, name, generation);
    let bytes = provider.get(&key).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::DataCorrupted(format!(
            "node manifest {key} does not parse: {e}; refusing to start"
        ))
    })
}

/// Before the node file opens: if the data dir is new and the bucket holds a manifest of
/// `name`, fences its stream and downloads what every shard needs (module doc, step 1).
/// `scratch` is where checkpoint files go (`DATA_DIR/shards`).
pub async fn prepare(
    provider: &ObjectProvider,
    name: &str,
    new_data_dir: bool,
    scratch: &Path,
) -> Result<Option<Rebuild>> {
    let Some(&generation) = generations(provider, name).await?.last() else {
        return Ok(None);
    };
    if !new_data_dir {
        return Ok(None);
    }
    let manifest = read(provider, name, generation).await?;
    std::fs::create_dir_all(scratch)
        .map_err(|e| Error::Internal(format!("{}: {e}", scratch.display())))?;
    let mut shards = Vec::new();
    for (&shard, base) in &manifest.shards {
        let replay = crate::takeover::read_log(
            provider,
            &manifest.stream,
            base.from_seq,
            (name, shard, 0),
            0,
            true,
        )
        .await?;
        let file = scratch.join(format!("{shard:04}.rebuild"));
        let c = &base.checkpoint;
        checkpoint::restore(
            provider,
            &Checkpoint {
                key: c.key.clone(),
                sha256: c.sha256.clone(),
                size: c.size,
                covers: 0,
            },
            &file,
        )
        .await?;
        tracing::info!(
            shard,
            stream = %manifest.stream,
            records = replay.records.len(),
            segments = replay.segments,
            "rebuilding shard from the bucket"
        );
        shards.push((shard, file, replay.records));
    }
    Ok(Some(Rebuild { shards }))
}

/// Once the node's shards are open and before it serves: a new stream, a checkpoint of every
/// shard, the next manifest generation; then the old stream and checkpoints are deleted
/// (module doc, step 2).
pub async fn start(node: &Node) -> Result<Arc<Standalone>> {
    let replica = node
        .committer()
        .replica()
        .cloned()
        .ok_or_else(|| Error::Internal("provider durability without a log writer".into()))?;
    let provider = &node.provider;
    let name = node.name.clone();
    let existing = generations(provider, &name).await?;
    let current = existing.last().copied();
    let old = match current {
        Some(g) => Some(read(provider, &name, g).await?),
        None => None,
    };
    let stream_id = StreamId {
        node: name.clone(),
        incarnation: u64::from_le_bytes(
            crate::ids::random_bytes(8)
                .try_into()
                .expect("eight random bytes"),
        ),
    };
    replica.begin(stream_id.clone());
    let mut shards = BTreeMap::new();
    for shard in node.shards() {
        replica.hold(shard.id, 0);
        let c = checkpoint::take(&shard, provider, 0, &node.scratch_path(shard.id)).await?;
        shards.insert(shard.id, base_of(c));
        replica.checkpointed(shard.id, u64::MAX);
    }
    let manifest = Manifest {
        stream: stream_id.name(),
        shards,
    };
    let next = current.map_or(1, |g| g + 1);
    write(provider, &name, next, &manifest).await?;
    tracing::info!(generation = next, stream = %manifest.stream, "node manifest written");
    // Everything the old manifest needed is covered by the new one now.
    if let Some(old) = old {
        for base in old.shards.values() {
            if let Err(e) = checkpoint::discard(provider, &base.checkpoint.key).await {
                tracing::warn!(error = %e, "could not delete a superseded checkpoint");
            }
        }
        if let Some(id) = StreamId::parse(&old.stream) {
            let firsts = stream::streams(provider)
                .await
                .map_err(|e| Error::Unavailable(e.to_string()))?
                .into_iter()
                .find(|(s, _)| *s == id)
                .map(|(_, f)| f)
                .unwrap_or_default();
            if let Err(e) = stream::delete_all(provider, &id, &firsts).await {
                tracing::warn!(error = %e, "could not delete the previous log stream");
            }
        }
    }
    for g in existing.into_iter().filter(|g| *g < next) {
        if let Err(e) = provider.delete(&self::key(provider, &name, g)).await {
            tracing::warn!(error = %e, "could not delete an old node manifest");
        }
    }
    let now = Instant::now();
    Ok(Arc::new(Standalone {
        current: tokio::sync::Mutex::new((next, manifest)),
        since: parking_lot::Mutex::new(manifest_shards_since(now, node)),
    }))
}

fn manifest_shards_since(now: Instant, node: &Node) -> HashMap<u32, Instant> {
    node.shards().iter().map(|s| (s.id, now)).collect()
}

/// A running single node's manifest, for compaction (see [`Standalone::compact_loop`]).
pub struct Standalone {
    /// The current generation and its manifest.
    current: tokio::sync::Mutex<(u64, Manifest)>,
    /// When each shard's base was last checkpointed.
    since: parking_lot::Mutex<HashMap<u32, Instant>>,
}

impl Standalone {
    /// Compaction passes until `stop` flips, by the cluster's rules
    /// (`cluster/compaction.rs`) with the manifest in place of etcd: a shard is checkpointed
    /// once its log outgrows its checkpoint (or `--checkpoint-interval` passed), an idle
    /// shard's log start moves up; the next manifest generation names them before the
    /// superseded checkpoints and the segments below every start are deleted.
    pub async fn compact_loop(
        self: Arc<Self>,
        node: Arc<Node>,
        durability: Durability,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if let Err(e) = self.compact_once(&node, &durability).await {
                tracing::warn!(error = %e, "provider log compaction failed; will retry");
            }
        }
    }

    async fn compact_once(&self, node: &Node, durability: &Durability) -> Result<()> {
        let Some(replica) = node.committer().replica().cloned() else {
            return Ok(());
        };
        let provider = &node.provider;
        let mut current = self.current.lock().await;
        let (generation, mut manifest) = (current.0, current.1.clone());
        let mut superseded = Vec::new();
        for shard in node.shards() {
            let Some(base) = manifest.shards.get_mut(&shard.id) else {
                continue;
            };
            let written = replica.bytes_since(shard.id);
            let threshold = durability
                .checkpoint_log_bytes
                .unwrap_or_else(|| base.checkpoint.size.max(MIN_CHECKPOINT_LOG_BYTES));
            let age = self.since.lock().get(&shard.id).map(|t| t.elapsed());
            let due = written > 0
                && (written >= threshold
                    || age.is_some_and(|a| a >= durability.checkpoint_interval));
            if due {
                let c = checkpoint::take(&shard, provider, 0, &node.scratch_path(shard.id)).await?;
                superseded.push(std::mem::replace(base, base_of(c)).checkpoint.key);
                replica.checkpointed(shard.id, written);
                self.since.lock().insert(shard.id, Instant::now());
            } else if let Some(from) = replica.idle_from(shard.id)
                && from > base.from_seq + IDLE_LAG
            {
                base.from_seq = from;
            } else {
                continue;
            }
        }
        if manifest.shards == current.1.shards {
            return Ok(());
        }
        let next = generation + 1;
        write(provider, &node.name, next, &manifest).await?;
        if let Err(e) = provider
            .delete(&key(provider, &node.name, generation))
            .await
        {
            tracing::warn!(error = %e, "could not delete an old node manifest");
        }
        for old in superseded {
            if let Err(e) = checkpoint::discard(provider, &old).await {
                tracing::warn!(error = %e, "could not delete a superseded checkpoint");
            }
        }
        let floor = manifest.shards.values().map(|b| b.from_seq).min();
        if let (Some(floor), Some(id)) = (floor, StreamId::parse(&manifest.stream)) {
            stream::delete_below(provider, &id, floor)
                .await
                .map_err(|e| Error::Unavailable(e.to_string()))?;
        }
        *current = (next, manifest);
        Ok(())
    }
}

/// A manifest entry for a checkpoint just taken (its log starts at what it covers).
fn base_of(c: Checkpoint) -> Base {
    Base {
        from_seq: c.covers,
        checkpoint: CheckpointRef {
            key: c.key,
            sha256: c.sha256,
            size: c.size,
            epoch: 0,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        },
    }
}

/// Writes manifest generation `generation` of `name` (create-if-absent: a taken generation
/// means another process writes this node).
async fn write(
    provider: &ObjectProvider,
    name: &str,
    generation: u64,
    manifest: &Manifest,
) -> Result<()> {
    let key = key(provider, name, generation);
    let body = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
    match provider.create(&key, body.into()).await {
        PutOutcome::Written => Ok(()),
        PutOutcome::Exists => Err(Error::FailedPrecondition(format!(
            "node manifest {key} already exists: another process writes node {name:?} under \
             this bucket prefix; stop it (two nodes must never share a name and prefix)"
        ))),
        PutOutcome::NotWritten(e) | PutOutcome::Unknown(e) => Err(Error::Unavailable(format!(
            "writing node manifest {key}: {e}"
        ))),
    }
}
