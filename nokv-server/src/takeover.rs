//! Taking over a shard whose durable state is in the provider (`--metadata-durability
//! provider`, issue 45): its record names a checkpoint (or none: empty) and the log of its
//! previous owner from a sequence number; this module reads that log, fenced, for one shard.
//!
//! **Why this is safe without clocks.** The previous owner acknowledged a batch only after
//! the segment holding it — and every segment before it — was created in its stream. The
//! taker creates a *fence* at the sequence after the stream's highest contiguous one
//! (`provider_log::stream::fence`): from then on the owner's next segment cannot be created,
//! so it acknowledges nothing more, and everything it did acknowledge lies below the fence,
//! which is exactly what the taker reads. The lease only told the taker that the owner
//! looked dead; if it was only paused, the fence deposes it all the same.
//!
//! **Why the taker checkpoints before serving** (the design's choice between "upload a
//! checkpoint before the first write" and "keep the replayed range in the record"): the
//! record names one log, and the new owner's writes go to its own stream, so the replayed
//! range would need a second pointer — and a third after the next failover, until a
//! checkpoint. Uploading the restored state as the new base first keeps the record one
//! checkpoint plus one log, always; its cost is part of the failover time (an export of one
//! shard's tables and one PUT, measured in the closing note of issue 45).
//!
//! A node that takes back a shard whose log is its *own current* stream (a handoff whose
//! checkpoint failed, taken back in the same incarnation) reads without fencing: it is the
//! writer, and since it let the shard go it wrote nothing for it but, after a load that
//! stopped half way, that load's adoption of the epoch being taken (see [`read_log`]).

use crate::error::{Error, Result};
use crate::object::ObjectProvider;
use crate::provider_log::{LogError, StreamId, stream};

/// What the previous owner's log holds for one shard.
#[derive(Debug)]
pub struct Replay {
    /// The shard's redo payloads, in sequence order (each may carry other shards' rows too,
    /// which the restore skips).
    pub records: Vec<Vec<u8>>,
    /// Where the stream ends for this takeover (the fence, or the stream's end when read
    /// unfenced).
    pub end: u64,
    /// Segments read.
    pub segments: usize,
}

/// Reads shard `shard`'s records of `stream` from `from_seq`, after fencing the stream on
/// behalf of `me` taking the shard at `epoch` (unless `fence` is false: our own stream). Every
/// segment that touches the shard must name it at an epoch from `logged_at` (the epoch the
/// log was recorded at) to `epoch`; anything else is refused, as is a damaged segment or a
/// stream that no longer reaches back to `from_seq`.
///
/// Why a range and not the one epoch the log was recorded at: an acquisition carries the
/// record's log over unchanged, and only a completed load replaces it. A load adopts the new
/// epoch (a write, so a segment naming it in the loader's stream) before it records a log of
/// its own; when the loader's own stream is the record's log (it took back a shard it had
/// released without a checkpoint) and the load stops in between — a checkpoint the provider
/// refused, a crash — that stream names the shard at the later epoch from then on. Its
/// retry, and any node taking the shard after it, must accept that segment: it was written
/// by an owner of this log, and it is below the fence. An epoch below `logged_at` is still
/// refused (the log would reach back into an ownership a checkpoint covers), and one above
/// `epoch` cannot have been written by anyone entitled to.
pub async fn read_log(
    provider: &ObjectProvider,
    stream_name: &str,
    from_seq: u64,
    (me, shard, epoch): (&str, u32, u64),
    logged_at: u64,
    fence: bool,
) -> Result<Replay> {
    let stream = StreamId::parse(stream_name).ok_or_else(|| {
        Error::DataCorrupted(format!(
            "shard {shard}'s record names log stream {stream_name:?}, which is not a stream name"
        ))
    })?;
    let fenced_at = if fence {
        Some(
            stream::fence(provider, &stream, from_seq, me, shard, epoch)
                .await
                .map_err(|e| log_error(shard, e))?,
        )
    } else {
        None
    };
    let tail = stream::read(provider, &stream, from_seq)
        .await
        .map_err(|e| log_error(shard, e))?;
    if let Some(at) = fenced_at
        && tail.next != at
    {
        return Err(Error::Unavailable(format!(
            "log stream {stream_name} of shard {shard} ends at {} but was fenced at {at}; \
             will retry",
            tail.next
        )));
    }
    let mut records = Vec::new();
    for segment in &tail.segments {
        let Some(&(_, named)) = segment.shards.iter().find(|(s, _)| *s == shard) else {
            continue;
        };
        if !(logged_at..=epoch).contains(&named) {
            return Err(Error::DataCorrupted(format!(
                "log segment {}..={} of stream {stream_name} names shard {shard} at epoch \
                 {named}, but the shard's record says its log was recorded at epoch \
                 {logged_at} and the shard is taken at epoch {epoch}; refusing to replay it",
                segment.first, segment.last
            )));
        }
        let inner = segment.records().map_err(|e| {
            Error::DataCorrupted(format!(
                "log segment {}..={} of stream {stream_name}: {e}",
                segment.first, segment.last
            ))
        })?;
        records.extend(
            inner
                .into_iter()
                .filter(|(seq, _)| *seq >= from_seq)
                .map(|(_, payload)| payload.to_vec()),
        );
    }
    Ok(Replay {
        records,
        end: tail.next,
        segments: tail.segments.len(),
    })
}

fn log_error(shard: u32, e: LogError) -> Error {
    match e {
        LogError::Damaged { .. } | LogError::Missing { .. } | LogError::Conflict { .. } => {
            Error::DataCorrupted(format!("shard {shard}'s provider log: {e}"))
        }
        other => Error::Unavailable(format!("shard {shard}'s provider log: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ProviderConfig;
    use crate::provider_log::segment::encode_records;
    use crate::provider_log::{Kind, Segment};

    const SHARD: u32 = 12;

    /// Node `b`'s stream in a local provider, one segment per `(seq, epoch)`: a record of
    /// shard 12 named at that epoch.
    async fn stream_naming(dir: &tempfile::TempDir, epochs: &[(u64, u64)]) -> ObjectProvider {
        let p = ObjectProvider::open(
            &ProviderConfig::Local {
                root: dir.path().to_path_buf(),
            },
            "pfx",
        )
        .unwrap();
        let id = StreamId::parse("b.0000000000000009").unwrap();
        for &(seq, epoch) in epochs {
            let segment = Segment {
                kind: Kind::Records,
                node: id.node.clone(),
                incarnation: id.incarnation,
                first: seq,
                last: seq,
                shards: vec![(SHARD, epoch)],
                body: encode_records([(seq, format!("record {seq}").as_bytes())]),
            };
            stream::append(&p, &id, &segment).await.unwrap();
        }
        p
    }

    /// The records `a` replays when it takes the shard at `epoch` from a log recorded at
    /// `logged_at`, or the refusal.
    async fn take(p: &ObjectProvider, logged_at: u64, epoch: u64) -> Result<Vec<String>> {
        let replay = read_log(
            p,
            "b.0000000000000009",
            1,
            ("a", SHARD, epoch),
            logged_at,
            true,
        )
        .await?;
        Ok(replay
            .records
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect())
    }

    /// Seed 9108 of the provider chaos schedule: `b` recorded the log at epoch 3, released
    /// the shard without a checkpoint, took it back at 4 and stopped after adopting 4 (seq 3)
    /// but before recording a log of its own. The record then says epoch 4 and still names
    /// the log of epoch 3; the next owner must replay both.
    #[tokio::test]
    async fn a_log_whose_writer_took_the_shard_back_and_stopped_mid_load_is_replayed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = stream_naming(&dir, &[(1, 3), (2, 3), (3, 4)]).await;
        assert_eq!(
            take(&p, 3, 5).await.expect("replayed"),
            ["record 1", "record 2", "record 3"]
        );
    }

    #[tokio::test]
    async fn a_segment_naming_the_shard_below_the_logs_epoch_or_above_the_taken_one_is_refused() {
        // Taken at 5 from a log recorded at 3: a segment naming 2 or 6 is not this log's.
        for (outside, what) in [(2, "an epoch before the log's"), (6, "one after the taken")] {
            let dir = tempfile::tempdir().unwrap();
            let p = stream_naming(&dir, &[(1, 3), (2, outside)]).await;
            let e = take(&p, 3, 5).await.expect_err(what);
            let named = format!("names shard 12 at epoch {outside}");
            assert!(
                matches!(&e, Error::DataCorrupted(m) if m.contains(&named)),
                "{what}: {e}"
            );
        }
    }
}
