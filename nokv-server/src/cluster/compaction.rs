//! Checkpoints and compaction of the provider log (`--metadata-durability provider`, issue
//! 45): what keeps a failover's replay short, the shard records the same size forever and the
//! log's objects bounded.
//!
//! **When a shard is checkpointed.** Once the record bytes this node has sent for it since its
//! last checkpoint exceed that checkpoint's size (at least
//! [`MIN_CHECKPOINT_LOG_BYTES`]) — so a takeover
//! replays at most about one checkpoint's worth of log — or once `--checkpoint-interval` has
//! passed with anything written. The checkpoint is the shard's consistent export, uploaded
//! under a unique key; it covers every batch numbered below the sequence its export job saw
//! ([`crate::shard::gate::Gate::snapshot_covering`]), and one etcd transaction guarded by the
//! owner key records it with the log now starting there. Then the superseded checkpoint is
//! deleted.
//!
//! An idle shard (nothing sent for it since its checkpoint) is not checkpointed again; its
//! log start is moved up to the stream's end instead once it lags by [`IDLE_LAG`] — one etcd
//! write — so it does not pin the stream's old segments.
//!
//! **What is deleted, and why it is safe.**
//! * Segments of this node's current stream below the lowest `from_seq` any record naming the
//!   stream still holds ([`super::ShardLog`]: the shards it holds, and those it released
//!   without a checkpoint, whose record keeps naming the log). The stream's last segment is
//!   always kept: a fence must collide with the writer's next one.
//! * Whole streams no record names that can never be named again: a *fenced* stream (its
//!   writer was deposed and writes under a new incarnation from then on) — all but its fence,
//!   which stays for good: a writer that was paused rather than dead learns it was deposed
//!   only by colliding with it — and this node's own *earlier* incarnations. A record stops
//!   naming a stream only when a checkpoint replaced it (by the owner, or by a taker after
//!   replaying it), and only a stream's writer ever names it, in its current incarnation — so
//!   "unnamed now" stays true. Streams of other
//!   live incarnations are never deleted whole: their writer may name them at its next load.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Cluster;
use crate::config::MIN_CHECKPOINT_LOG_BYTES;
use crate::control::etcd::{CheckpointRef, LogRef};
use crate::error::Result;
use crate::provider_log::{IDLE_LAG, LogWriter, stream};
use crate::shard::checkpoint;

/// How often the compaction pass runs.
const PASS: Duration = Duration::from_secs(1);
/// Passes between two sweeps of unneeded streams (each lists the whole log folder).
const SWEEP_EVERY: u32 = 30;

/// What this node knows of the log of a shard whose record names its current stream.
#[derive(Debug, Clone)]
pub struct ShardLog {
    /// The record's `log.from_seq`.
    pub from_seq: u64,
    /// The record's checkpoint (`None`: the shard's base is empty).
    pub base: Option<CheckpointRef>,
    /// When `base` was recorded (or the log began).
    pub since: Instant,
    /// False once the shard was released without a checkpoint: its record still names the
    /// log, so its segments stay, but this node no longer checkpoints it.
    pub held: bool,
}

impl Cluster {
    /// Runs compaction passes until `stop` flips (provider durability only).
    pub(super) async fn compact_loop(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let Some(replica) = self.node.committer().replica().cloned() else {
            return;
        };
        let mut pass = 0u32;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(PASS) => {}
            }
            if let Err(e) = self.compact_once(&replica).await {
                tracing::warn!(error = %e, "provider log compaction failed; will retry");
            }
            pass += 1;
            if pass.is_multiple_of(SWEEP_EVERY)
                && let Err(e) = self.sweep_streams(&replica).await
            {
                tracing::warn!(error = %e, "sweeping unneeded log streams failed; will retry");
            }
        }
    }

    /// One pass: checkpoints every shard that is due, then deletes the current stream's
    /// segments no record needs (see the module doc).
    pub(super) async fn compact_once(&self, replica: &Arc<LogWriter>) -> Result<()> {
        let _one = self.moving.lock().await;
        let control = self.control();
        if !control.deadline().allows() {
            return Ok(());
        }
        let Some(current) = replica.stream() else {
            return Ok(());
        };
        let interval = self.durability.checkpoint_interval;
        let fixed = self.durability.checkpoint_log_bytes;
        let due: Vec<u32> = self
            .logs
            .lock()
            .iter()
            .filter(|(shard, l)| {
                let written = replica.bytes_since(**shard);
                let size = fixed.unwrap_or_else(|| {
                    l.base
                        .as_ref()
                        .map_or(0, |c| c.size)
                        .max(MIN_CHECKPOINT_LOG_BYTES)
                });
                l.held && written > 0 && (written >= size || l.since.elapsed() >= interval)
            })
            .map(|(shard, _)| *shard)
            .collect();
        for shard in due {
            let Some((_, epoch)) = control.owned().into_iter().find(|(s, _)| *s == shard) else {
                continue;
            };
            let Ok(held) = self.node.shard(shard) else {
                continue;
            };
            let written = replica.bytes_since(shard);
            let (c, covers) = self.take_checkpoint_covering(&held, shard, epoch).await?;
            let log = LogRef {
                stream: current.name(),
                from_seq: covers,
                epoch,
            };
            control
                .record_state(shard, Some(c.clone()), Some(log))
                .await?;
            replica.checkpointed(shard, written);
            let old = self.logs.lock().insert(
                shard,
                ShardLog {
                    from_seq: covers,
                    base: Some(c),
                    since: Instant::now(),
                    held: true,
                },
            );
            tracing::info!(
                shard,
                covers,
                log_bytes = written,
                "checkpointed shard; its log now starts there"
            );
            if let Some(old) = old.and_then(|o| o.base)
                && let Err(e) = checkpoint::discard(&self.node.provider, &old.key).await
            {
                tracing::warn!(shard, error = %e, "could not delete the superseded checkpoint");
            }
        }
        // Idle shards: nothing sent since the checkpoint, so the log may start at the stream's
        // end as it is now (see `LogWriter::idle_from`).
        let idle: Vec<(u32, u64)> = self
            .logs
            .lock()
            .iter()
            .filter(|(_, l)| l.held)
            .filter_map(|(shard, l)| {
                let from = replica.idle_from(*shard)?;
                (from > l.from_seq + IDLE_LAG).then_some((*shard, from))
            })
            .collect();
        for (shard, from_seq) in idle {
            let Some((_, epoch)) = control.owned().into_iter().find(|(s, _)| *s == shard) else {
                continue;
            };
            let log = LogRef {
                stream: current.name(),
                from_seq,
                epoch,
            };
            control.record_state(shard, None, Some(log)).await?;
            if let Some(l) = self.logs.lock().get_mut(&shard) {
                l.from_seq = from_seq;
            }
        }
        let floor = self
            .logs
            .lock()
            .values()
            .map(|l| l.from_seq)
            .min()
            .unwrap_or_else(|| replica.next());
        let deleted = stream::delete_below(&self.node.provider, &current, floor)
            .await
            .map_err(|e| crate::error::Error::Unavailable(e.to_string()))?;
        if deleted > 0 {
            tracing::debug!(deleted, floor, "compacted the provider log");
        }
        Ok(())
    }

    /// Deletes whole streams nothing needs any more (see the module doc). Returns how many
    /// segments it deleted.
    pub(super) async fn sweep_streams(&self, replica: &Arc<LogWriter>) -> Result<usize> {
        let provider = &self.node.provider;
        let unavailable = |e: crate::provider_log::LogError| {
            crate::error::Error::Unavailable(format!("provider log: {e}"))
        };
        let current = replica.stream();
        // Listing first, records after: a stream named by no record read after the listing
        // can never be named again (module doc), whatever happened in between.
        let streams = stream::streams(provider).await.map_err(unavailable)?;
        let view = self.control().cluster_view().await?;
        let named: HashSet<String> = view
            .shards
            .iter()
            .filter_map(|s| s.record.as_ref()?.log.as_ref().map(|l| l.stream.clone()))
            .collect();
        let me = self.control().node_id().to_string();
        let mut deleted = 0;
        for (id, firsts) in streams {
            if Some(&id) == current.as_ref() || named.contains(&id.name()) {
                continue;
            }
            let Some(&last) = firsts.last() else {
                continue;
            };
            // Our own earlier incarnation: we know we moved on, so all of it goes. Another
            // node's fenced stream: all but the fence. Its writer may be paused, not dead,
            // and learns it was deposed only when its next segment collides with the fence;
            // without it that segment would land and be acknowledged for a shard it no
            // longer owns. So the fence (one small object per deposed incarnation) stays.
            let doomed: &[u64] = if id.node == me {
                &firsts
            } else if stream::is_fence(provider, &id, last)
                .await
                .map_err(unavailable)?
            {
                &firsts[..firsts.len() - 1]
            } else {
                &[]
            };
            if !doomed.is_empty() {
                deleted += stream::delete_all(provider, &id, doomed)
                    .await
                    .map_err(unavailable)?;
                tracing::info!(stream = %id.name(), segments = doomed.len(), "deleted an unneeded log stream");
            }
        }
        Ok(deleted)
    }
}
