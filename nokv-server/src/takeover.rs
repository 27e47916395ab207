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
//! writer, and it wrote nothing for the shard since it let it go.

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
/// segment that touches the shard must name it at `owner_epoch`, the ownership the record
/// describes; anything else is refused, as is a damaged segment or a stream that no longer
/// reaches back to `from_seq`.
pub async fn read_log(
    provider: &ObjectProvider,
    stream_name: &str,
    from_seq: u64,
    (me, shard, epoch): (&str, u32, u64),
    owner_epoch: u64,
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
        if named != owner_epoch {
            return Err(Error::DataCorrupted(format!(
                "log segment {}..={} of stream {stream_name} names shard {shard} at epoch \
                 {named}, but the shard's record says its log is of epoch {owner_epoch}; \
                 refusing to replay it",
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
