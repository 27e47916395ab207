//! Taking a shard ([`Cluster::load`]): the balance step acquired it in etcd at epoch `e`.
//! Where its data comes from depends on the record the acquisition replaced ([`Source`]):
//! nothing (a new shard), a checkpoint (a graceful handoff, or an owner that lapsed without
//! changing anything since its checkpoint), this node's own file (it owned the shard last
//! and comes back with its data dir), or — provider durability — a checkpoint plus the
//! previous owner's log, read behind a fence ([`crate::takeover`]). A checkpoint is verified
//! (size, sha256, and the epoch stored inside it); a local file must hold the epoch the record
//! says it was served at. Then the store records epoch `e`
//! ([`crate::shard::Shard::adopt_epoch`]) and the node serves.

use std::sync::Arc;
use std::time::Instant;

use super::compaction::ShardLog;
use super::{Cluster, Source};
use crate::control::etcd::{CheckpointRef, EtcdControl, LogRef, ShardRecord};
use crate::control::{Epoch, Ownership};
use crate::error::{Error, Result};
use crate::meta::{MetaStore, Tables};
use crate::shard::Shard;
use crate::shard::checkpoint::{self, Checkpoint};
use crate::shard::fence::Fence;

impl Cluster {
    /// Loads shard `shard`, acquired at `epoch`, and serves it (see the module doc).
    pub(super) async fn load(
        &self,
        control: &Arc<EtcdControl>,
        shard: u32,
        epoch: Epoch,
    ) -> Result<()> {
        let started = Instant::now();
        // Peeked, not taken: a load that fails (a provider or etcd error) is retried by the
        // next balance step and must see the same record, not the one that already names
        // this node's epoch (its log would be checked against the wrong epoch).
        let previous = match control.previous(shard) {
            Some(previous) => previous,
            // Adopted without an acquisition of this process: only its own record is known,
            // so accept the local file if it is not newer than the record.
            None => control.record(shard).await?.0.map(|mut r| {
                r.changed = false;
                r.checkpoint = None;
                r
            }),
        };
        let source = Source::of(previous.as_ref());
        if previous.as_ref().and_then(|r| r.target.as_deref()) == Some(control.node_id()) {
            self.pinned.lock().insert(shard);
        } else {
            self.pinned.lock().remove(&shard);
        }
        let committer = self.node.committer().clone();
        let replica = committer.replica();
        let ns = Tables::shard(shard);
        match &source {
            Source::New => {
                if committer.holds(ns)? {
                    let stored = committer.read(ns, |r| Ok(r.epoch()?))?;
                    if stored != 0 {
                        return Err(Error::FailedPrecondition(format!(
                            "the node file holds shard {shard} at epoch {stored} of an earlier \
                             ownership, but the cluster has no record of this shard: this data \
                             dir belongs to another cluster; move it away"
                        )));
                    }
                }
                committer.exclusive(move |m| Ok(m.prepare(ns)?)).await?;
            }
            Source::Checkpoint(c) => {
                let scratch = self.node.scratch_path(shard);
                checkpoint::restore(&self.node.provider, &to_checkpoint(c), &scratch).await?;
                let imported = match verify_epoch(&scratch, c, shard) {
                    Ok(()) => {
                        let from = scratch.clone();
                        committer.exclusive(move |m| Ok(m.import(ns, &from)?)).await
                    }
                    Err(e) => Err(e),
                };
                let _ = std::fs::remove_file(&scratch);
                imported?;
            }
            Source::Local {
                epoch: expected,
                exact,
            } => {
                if !committer.holds(ns)? {
                    return Err(Error::FailedPrecondition(format!(
                        "shard {shard} was last served here at epoch {expected}, but the node \
                         file holds no tables for it: this is not the data dir it was served from"
                    )));
                }
                let stored = committer.read(ns, |r| Ok(r.epoch()?))?;
                if stored > *expected || (*exact && stored != *expected) {
                    return Err(Error::FailedPrecondition(format!(
                        "the local data of shard {shard} holds epoch {stored} but the shard was \
                         last served at epoch {expected}: it is not this shard's latest data"
                    )));
                }
            }
            Source::Provider { checkpoint, log } => {
                let own = replica.and_then(|r| r.stream()).map(|s| s.name());
                let replay = crate::takeover::read_log(
                    &self.node.provider,
                    &log.stream,
                    log.from_seq,
                    (control.node_id(), shard, epoch),
                    log.epoch,
                    own.as_deref() != Some(log.stream.as_str()),
                )
                .await?;
                let scratch = self.node.scratch_path(shard);
                let restored = async {
                    let base = match checkpoint {
                        Some(c) => {
                            checkpoint::restore(&self.node.provider, &to_checkpoint(c), &scratch)
                                .await?;
                            verify_epoch(&scratch, c, shard)?;
                            Some(scratch.clone())
                        }
                        None => None,
                    };
                    let records = replay.records;
                    committer
                        .exclusive(move |m| {
                            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                            Ok(m.restore(ns, base.as_deref(), &refs)?)
                        })
                        .await
                }
                .await;
                let _ = std::fs::remove_file(&scratch);
                restored?;
                tracing::info!(
                    shard,
                    stream = %log.stream,
                    from_seq = log.from_seq,
                    fenced_at = replay.end,
                    segments = replay.segments,
                    "replayed the previous owner's provider log"
                );
            }
        };
        if let Some(r) = replica {
            r.hold(shard, epoch);
        }
        let fence = Fence::new(shard, Ownership::Etcd(control.clone()));
        let opened = self.node.open_shard(shard, fence);
        opened.adopt_epoch().await?;
        self.record_state(control, &opened, shard, epoch, &source, previous.as_ref())
            .await?;
        self.node.install(shard, opened);
        control.take_previous(shard);
        tracing::info!(
            shard,
            epoch,
            ?source,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "serving shard"
        );
        Ok(())
    }

    /// Records in etcd what the shard's durable state is before it is served (see
    /// [`EtcdControl::record_state`]): with provider durability its log from here on, on top
    /// of a checkpoint the provider holds — the one it was loaded from, or, when it was loaded
    /// from a log or from the local file, a new one of the state just loaded (see
    /// [`crate::takeover`] for why). With local durability only a shard restored from a log
    /// needs that new checkpoint (its record must stop naming the old log).
    pub(super) async fn record_state(
        &self,
        control: &Arc<EtcdControl>,
        opened: &Arc<Shard>,
        shard: u32,
        epoch: Epoch,
        source: &Source,
        previous: Option<&ShardRecord>,
    ) -> Result<()> {
        let replica = self.node.committer().replica();
        let needs_base = match source {
            Source::Provider { .. } => true,
            Source::Local { .. } => replica.is_some(),
            Source::New | Source::Checkpoint(_) => false,
        };
        if !needs_base && replica.is_none() {
            return Ok(());
        }
        let base = if needs_base {
            Some(self.take_checkpoint(opened, shard, epoch).await?)
        } else {
            None
        };
        let log = match replica {
            Some(r) => Some(LogRef {
                stream: r
                    .stream()
                    .ok_or_else(|| Error::Unavailable("the provider log has no stream yet".into()))?
                    .name(),
                from_seq: self.node.committer().next_seq(),
                epoch,
            }),
            None => None,
        };
        control
            .record_state(shard, base.clone(), log.clone())
            .await?;
        if let Some(log) = log {
            // What was sent for the shard so far (its epoch's adoption, acknowledged before
            // this) lies below `from_seq`: the log proper starts empty.
            if let Some(r) = replica {
                r.checkpointed(shard, u64::MAX);
            }
            let base = base
                .clone()
                .or_else(|| previous.and_then(|r| r.checkpoint.clone()));
            self.logs.lock().insert(
                shard,
                ShardLog {
                    from_seq: log.from_seq,
                    base,
                    since: Instant::now(),
                    held: true,
                },
            );
        }
        if base.is_some()
            && let Some(old) = previous.and_then(|r| r.checkpoint.as_ref())
            && let Err(e) = checkpoint::discard(&self.node.provider, &old.key).await
        {
            tracing::warn!(shard, error = %e, "could not delete the superseded checkpoint");
        }
        Ok(())
    }
}

/// Refuses a restored checkpoint file whose stored epoch is not the one its record names.
fn verify_epoch(scratch: &std::path::Path, c: &CheckpointRef, shard: u32) -> Result<()> {
    let stored = MetaStore::open_plain(scratch)
        .and_then(|m| m.read(|r| r.epoch()))
        .map_err(Error::from)?;
    if stored != c.epoch {
        return Err(Error::DataCorrupted(format!(
            "checkpoint {} of shard {shard} holds epoch {stored}, its record says {}; refusing it",
            c.key, c.epoch
        )));
    }
    Ok(())
}

fn to_checkpoint(c: &CheckpointRef) -> Checkpoint {
    Checkpoint {
        key: c.key.clone(),
        sha256: c.sha256.clone(),
        size: c.size,
        covers: 0,
    }
}
