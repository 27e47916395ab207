//! A node's log stream in the object provider: append a segment, read a stream from a
//! sequence number to its end, fence it.
//!
//! Keys: `<prefix>/meta/log/<node>.<incarnation>/<first sequence, 20 digits>`. Every write is
//! create-if-absent ([`crate::object::ObjectProvider::create`]), and that is the whole safety
//! argument: the writer and a fencer race for the same key, the provider lets exactly one
//! create it, and the loser learns it from the answer. No clock is involved.
//!
//! **Invariants.** (1) A stream has no gaps: a segment's first sequence is the previous one's
//! last + 1, so "the highest contiguous sequence N" is well defined and the writer's next
//! segment is exactly at N + 1. (2) A fence at sequence F ends the stream: the writer's
//! segment at F can no longer be created, the writer acknowledges nothing at or after F (its
//! acknowledgements are strictly in sequence order, each after its own segment was created),
//! and a reader never returns a segment at or after F. (3) A segment is replayed only whole
//! and only if its digest matches ([`Segment::decode`]).

use bytes::Bytes;
use futures::StreamExt;

use super::segment::{Kind, Segment, SegmentError};
use crate::object::{ObjectError, ObjectProvider, PutOutcome};

/// Listing page size while reading a stream's keys.
const LIST_PAGE: usize = 1000;
/// Segments a read fetches at once (a takeover's replay of a long tail is round trips).
const READ_AHEAD: usize = 8;

/// Names one stream: the node and its incarnation (new every time the node joins).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StreamId {
    pub node: String,
    pub incarnation: u64,
}

impl StreamId {
    /// `<node>.<incarnation, 16 hex digits>`: how a shard's record names the stream
    /// ([`StreamId::parse`] reads it back).
    pub fn name(&self) -> String {
        format!("{}.{:016x}", self.node, self.incarnation)
    }

    /// The stream a [`StreamId::name`] names; `None` if it is not one.
    pub fn parse(name: &str) -> Option<StreamId> {
        let (node, incarnation) = name.rsplit_once('.')?;
        if node.is_empty() || incarnation.len() != 16 {
            return None;
        }
        Some(StreamId {
            node: node.to_string(),
            incarnation: u64::from_str_radix(incarnation, 16).ok()?,
        })
    }

    /// The stream's folder, relative to the provider prefix.
    fn within(&self) -> String {
        format!("meta/log/{}", self.name())
    }

    /// The full key of the segment that starts at `first`.
    pub fn key(&self, provider: &ObjectProvider, first: u64) -> String {
        let rel = format!("{}/{first:020}", self.within());
        match provider.prefix() {
            "" => rel,
            p => format!("{p}/{rel}"),
        }
    }
}

/// Why a stream operation did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The stream was fenced at `at` by `by`: the writer must acknowledge nothing more.
    #[error("log stream {stream} was fenced at sequence {at} by node {by}")]
    Fenced { stream: String, at: u64, by: String },
    /// The create was refused before it reached the provider: nothing was written.
    #[error("log segment {key} was not written: {why}")]
    NotWritten { key: String, why: String },
    /// The create may or may not have landed: the segment is not durable as far as anyone
    /// knows, and nothing that depends on it may be acknowledged.
    #[error("log segment {key}: outcome unknown: {why}")]
    Unknown { key: String, why: String },
    /// Another segment than ours holds our key: two writers share one stream id.
    #[error("log segment {key} holds another writer's records")]
    Conflict { key: String },
    /// A segment object is not a valid segment.
    #[error("log segment {key} is damaged: {error}")]
    Damaged { key: String, error: SegmentError },
    /// The stream does not reach back to the sequence asked for (compacted, or never written).
    #[error("log stream {stream} has no segment holding sequence {from} (its first is {first})")]
    Missing {
        stream: String,
        from: u64,
        first: u64,
    },
    #[error(transparent)]
    Provider(#[from] ObjectError),
}

/// What reading a stream from a sequence number found.
#[derive(Debug, Default)]
pub struct Tail {
    /// The records segments, in sequence order, contiguous, the first one holding the
    /// sequence asked for (if any segment does).
    pub segments: Vec<Segment>,
    /// The sequence after the last segment returned.
    pub next: u64,
    /// The fence the stream ends at, if it is fenced: (sequence, fencing node).
    pub fenced: Option<(u64, String)>,
}

/// Creates `segment` in `stream`. An answer other than `Ok` means it is not known durable.
/// If the key already holds exactly these bytes (an earlier attempt whose answer was lost),
/// that is success; if it holds a fence, the stream is fenced.
pub async fn append(
    provider: &ObjectProvider,
    stream: &StreamId,
    segment: &Segment,
) -> Result<(), LogError> {
    append_encoded(
        provider,
        stream,
        segment.first,
        &Bytes::from(segment.encode()),
    )
    .await
}

/// [`append`] of a segment already encoded (`bytes`, starting at `first`): what the writer
/// sends again, byte for byte, after an attempt whose outcome is unknown.
pub async fn append_encoded(
    provider: &ObjectProvider,
    stream: &StreamId,
    first: u64,
    bytes: &Bytes,
) -> Result<(), LogError> {
    let key = stream.key(provider, first);
    match provider.create(&key, bytes.clone()).await {
        PutOutcome::Written => Ok(()),
        PutOutcome::NotWritten(why) => Err(LogError::NotWritten { key, why }),
        PutOutcome::Unknown(why) => Err(LogError::Unknown { key, why }),
        PutOutcome::Exists => {
            let there = provider.get(&key).await?;
            if there.as_ref() == bytes.as_ref() {
                return Ok(());
            }
            let found = Segment::decode(&there).map_err(|error| LogError::Damaged {
                key: key.clone(),
                error,
            })?;
            match found.kind {
                Kind::Fence => Err(LogError::Fenced {
                    stream: stream.within(),
                    at: found.first,
                    by: found.node,
                }),
                Kind::Records => Err(LogError::Conflict { key }),
            }
        }
    }
}

/// The first sequences of the stream's segments (and fences), ascending.
async fn firsts(provider: &ObjectProvider, stream: &StreamId) -> Result<Vec<u64>, LogError> {
    let within = stream.within();
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = provider
            .list_page(&within, after.as_deref(), LIST_PAGE)
            .await?;
        for (key, _) in &page.objects {
            if let Some(first) = key.rsplit('/').next().and_then(|n| n.parse().ok()) {
                out.push(first);
            }
        }
        if page.last || page.objects.is_empty() {
            break;
        }
        after = page.objects.last().map(|(k, _)| k.clone());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

async fn fetch(
    provider: &ObjectProvider,
    stream: &StreamId,
    first: u64,
) -> Result<Segment, LogError> {
    let key = stream.key(provider, first);
    let bytes = provider.get(&key).await?;
    let segment = Segment::decode(&bytes).map_err(|error| LogError::Damaged {
        key: key.clone(),
        error,
    })?;
    if segment.first != first {
        return Err(LogError::Damaged {
            key,
            error: SegmentError::Range {
                first: segment.first,
                last: segment.last,
            },
        });
    }
    Ok(segment)
}

/// Reads `stream` from sequence `from` to its end: the contiguous records segments from the
/// one holding `from`, stopping at the first gap (segments in flight when the writer died
/// may have landed out of order; nothing after a gap was acknowledged) or at a fence.
pub async fn read(
    provider: &ObjectProvider,
    stream: &StreamId,
    from: u64,
) -> Result<Tail, LogError> {
    let firsts = firsts(provider, stream).await?;
    let Some(start) = firsts.iter().rev().find(|&&f| f <= from).copied() else {
        return match firsts.first() {
            Some(&first) => Err(LogError::Missing {
                stream: stream.within(),
                from,
                first,
            }),
            None => Ok(Tail {
                next: from,
                ..Tail::default()
            }),
        };
    };
    let mut tail = Tail {
        next: start,
        ..Tail::default()
    };
    // The listed segments from `start` are fetched READ_AHEAD at a time but taken in order,
    // and the chain is followed exactly as one fetch at a time would: a listed segment that
    // starts past where the previous one ended lies beyond a gap and ends the read before its
    // own answer is looked at (a damaged segment past a gap is never an error). A takeover's
    // replay then costs a round trip to the provider per READ_AHEAD segments, not per one.
    let mut listed = futures::stream::iter(firsts.iter().copied().filter(|&f| f >= start))
        .map(|first| async move { (first, fetch(provider, stream, first).await) })
        .buffered(READ_AHEAD);
    while let Some((first, fetched)) = listed.next().await {
        if first < tail.next {
            // Inside the previous segment's range: never on the chain.
            continue;
        }
        if first > tail.next {
            break;
        }
        let segment = fetched?;
        if segment.kind == Kind::Fence {
            tail.fenced = Some((segment.first, segment.node));
            break;
        }
        tail.next = segment.last + 1;
        tail.segments.push(segment);
    }
    // Segments wholly below `from` were only read to follow the chain; `next` stays the
    // stream's true end (a fence belongs there even when it is below `from`).
    tail.segments.retain(|s| s.last >= from);
    Ok(tail)
}

/// Fences `stream` for good: creates a fence segment at the sequence after its highest
/// contiguous one (from `from` when the stream is empty), on behalf of `by` taking `shard` at
/// `epoch`. Returns the fence's sequence. If a segment of the writer wins a key first, the
/// fence moves past it (that segment may have been acknowledged: the taker replays it); if
/// another fence is there, the stream already ends at it.
pub async fn fence(
    provider: &ObjectProvider,
    stream: &StreamId,
    from: u64,
    by: &str,
    shard: u32,
    epoch: u64,
) -> Result<u64, LogError> {
    let tail = read(provider, stream, from).await;
    let mut at = match tail {
        Ok(Tail {
            fenced: Some((at, _)),
            ..
        }) => return Ok(at),
        Ok(t) => t.next,
        // Compacted below `from`: the stream starts at its first segment.
        Err(LogError::Missing { first, .. }) => read(provider, stream, first).await?.next,
        Err(e) => return Err(e),
    };
    loop {
        let fence = Segment {
            kind: Kind::Fence,
            node: by.to_string(),
            incarnation: 0,
            first: at,
            last: at,
            shards: vec![(shard, epoch)],
            body: Vec::new(),
        };
        match append(provider, stream, &fence).await {
            Ok(()) => return Ok(at),
            Err(LogError::Fenced { at, .. }) => return Ok(at),
            Err(LogError::Conflict { .. }) => {
                // The writer's segment landed first at `at`: it may be acknowledged, so the
                // stream goes on past it.
                let segment = fetch(provider, stream, at).await?;
                at = segment.last + 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Every stream in the provider, with the first sequences of its segments (ascending): what
/// the sweep of unneeded streams looks at.
pub async fn streams(provider: &ObjectProvider) -> Result<Vec<(StreamId, Vec<u64>)>, LogError> {
    let mut out: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut after: Option<String> = None;
    loop {
        let page = provider
            .list_page("meta/log", after.as_deref(), LIST_PAGE)
            .await?;
        for (key, _) in &page.objects {
            let mut parts = key.rsplit('/');
            if let (Some(first), Some(stream)) = (parts.next(), parts.next())
                && let Ok(first) = first.parse()
            {
                out.entry(stream.to_string()).or_default().push(first);
            }
        }
        if page.last || page.objects.is_empty() {
            break;
        }
        after = page.objects.last().map(|(k, _)| k.clone());
    }
    Ok(out
        .into_iter()
        .filter_map(|(name, mut firsts)| {
            firsts.sort_unstable();
            Some((StreamId::parse(&name)?, firsts))
        })
        .collect())
}

/// True if the segment at `first` of `stream` is a fence (the stream's last one, for a fenced
/// stream).
pub async fn is_fence(
    provider: &ObjectProvider,
    stream: &StreamId,
    first: u64,
) -> Result<bool, LogError> {
    Ok(fetch(provider, stream, first).await?.kind == Kind::Fence)
}

/// Deletes every segment of a stream nothing needs any more (see the sweep in the cluster's
/// compaction); `firsts` are its segments. Returns how many it deleted.
pub async fn delete_all(
    provider: &ObjectProvider,
    stream: &StreamId,
    firsts: &[u64],
) -> Result<usize, LogError> {
    let keys = firsts.iter().map(|f| stream.key(provider, *f)).collect();
    provider.delete_many(keys).await?;
    Ok(firsts.len())
}

/// Deletes the stream's segments that end below sequence `below` (compaction: every shard
/// that needed them has a newer checkpoint). The last segment is always kept: it anchors the
/// stream's end, where the writer's next segment and any fence go. Returns how many it
/// deleted.
pub async fn delete_below(
    provider: &ObjectProvider,
    stream: &StreamId,
    below: u64,
) -> Result<usize, LogError> {
    let firsts = firsts(provider, stream).await?;
    // A segment ends right before the next one starts (no gaps below the end).
    let doomed: Vec<String> = firsts
        .windows(2)
        .take_while(|pair| pair[1] <= below)
        .map(|pair| stream.key(provider, pair[0]))
        .collect();
    let deleted = doomed.len();
    if deleted > 0 {
        provider.delete_many(doomed).await?;
    }
    Ok(deleted)
}
