//! The writing end of a node's log stream: the acknowledger hands it the redo records it has
//! just made durable locally, and it creates them in the provider as one segment — the batches
//! are acknowledged only once it returns `Ok` (`--metadata-durability provider`).
//!
//! **Invariants.**
//! * Segments of one stream are contiguous: a segment's `first` is the previous one's
//!   `last + 1` (the first segment of an incarnation starts at 0), whatever sequence numbers
//!   its records carry (they lie inside `first..=last`). So the stream never has a gap, and
//!   a fence at its end collides with this writer's next segment.
//! * A segment is never skipped: an attempt whose outcome is unknown is sent again with the
//!   same key and the same bytes until it is known created ([`stream::append`] takes "already
//!   there, same bytes" for success) or the stream is known fenced. While the provider is
//!   down the acknowledgements wait; nothing behind the missing segment is acknowledged.
//! * After a fence (or a foreign segment at our key) the writer acknowledges nothing more
//!   until the node begins a new incarnation ([`LogWriter::begin`]), which starts a new
//!   stream: a fenced stream is never written again.
//!
//! Segments are prepared by one caller at a time — the acknowledger thread (the committer never
//! answers a batch itself in this mode) — in sequence order, so each one's range follows the
//! previous one's; several may then be in flight at once, and the acknowledger answers them
//! strictly in that order, each only after it and every earlier one was created.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::segment::{Kind, Segment, encode_records};
use super::stream::{self, LogError, StreamId};
use crate::object::ObjectProvider;

/// First and longest pause between two attempts at a segment the provider did not take.
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Sequence numbers an idle shard's log start may lag the stream's end before compaction
/// moves it up (no checkpoint needed, see [`LogWriter::idle_from`]): an idle shard must not
/// pin the whole stream.
pub const IDLE_LAG: u64 = 1024;

/// One redo record handed to the writer: its sequence, its payload and the shards it touches.
pub struct Outgoing<'a> {
    pub seq: u64,
    pub payload: &'a [u8],
    pub shards: Vec<u32>,
}

/// Why records were not made durable in the provider (nothing that depends on them may be
/// acknowledged).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The node has no stream yet (it has not joined).
    #[error("the provider log has no stream yet: the node has not joined")]
    NoStream,
    /// The stream was fenced by a node that took over: this node is deposed.
    #[error("deposed: {0}")]
    Fenced(LogError),
    /// The node is shutting down while the provider did not take the segment.
    #[error("the provider log is closed (shutting down) with a segment not known durable")]
    Closed,
}

/// What the writer has sent, for `admin health` and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Segments created (each one create-if-absent PUT that succeeded).
    pub segments: u64,
    /// PUT attempts, including those retried.
    pub puts: u64,
    /// Bytes of the segments created.
    pub bytes: u64,
}

struct State {
    stream: Option<StreamId>,
    /// The `first` of the next segment.
    next: u64,
    /// The epoch this node holds (or last held) each shard at, named in every segment touching
    /// it.
    epochs: HashMap<u32, u64>,
    /// Record bytes sent per shard since its last checkpoint ([`LogWriter::checkpointed`]):
    /// what decides when a shard is checkpointed and its log compacted.
    since: HashMap<u32, u64>,
    fenced: bool,
}

/// The node's writer (see the module doc).
pub struct LogWriter {
    provider: ObjectProvider,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Bumped each time the stream is found fenced: the cluster runtime drops every shard and
    /// begins a new incarnation.
    fenced: watch::Sender<u64>,
    closed: AtomicBool,
    flush_interval: Duration,
    in_flight: usize,
    segments: AtomicU64,
    puts: AtomicU64,
    bytes: AtomicU64,
}

impl LogWriter {
    /// A writer that sends through `provider` on `runtime` (it blocks the calling thread, which
    /// must not be one of the runtime's workers). `flush_interval` is how long the
    /// acknowledger gathers batches before sending a segment (`--log-flush-interval`).
    pub fn new(
        provider: ObjectProvider,
        runtime: tokio::runtime::Handle,
        flush_interval: Duration,
    ) -> LogWriter {
        LogWriter::with_in_flight(provider, runtime, flush_interval, 1)
    }

    /// [`LogWriter::new`] with up to `in_flight` segments sent at once
    /// (`--log-segments-in-flight`).
    pub fn with_in_flight(
        provider: ObjectProvider,
        runtime: tokio::runtime::Handle,
        flush_interval: Duration,
        in_flight: usize,
    ) -> LogWriter {
        LogWriter {
            provider,
            runtime,
            state: Mutex::new(State {
                stream: None,
                next: 0,
                epochs: HashMap::new(),
                since: HashMap::new(),
                fenced: false,
            }),
            fenced: watch::channel(0).0,
            closed: AtomicBool::new(false),
            flush_interval,
            in_flight: in_flight.max(1),
            segments: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Begins a new stream (a new incarnation of the node): from now on segments go there,
    /// starting at 0. Forgets every shard epoch (the node holds nothing at a new join).
    pub fn begin(&self, stream: StreamId) {
        let mut s = self.state.lock();
        tracing::info!(stream = %stream.name(), "provider log: new stream");
        s.stream = Some(stream);
        s.next = 0;
        s.epochs.clear();
        s.since.clear();
        s.fenced = false;
    }

    /// The stream segments go to now.
    pub fn stream(&self) -> Option<StreamId> {
        self.state.lock().stream.clone()
    }

    /// Records that this node now holds `shard` at `epoch`.
    pub fn hold(&self, shard: u32, epoch: u64) {
        let mut s = self.state.lock();
        s.epochs.insert(shard, epoch);
        s.since.insert(shard, 0);
    }

    /// Records that this node no longer holds `shard`: nothing sent for it counts towards a
    /// checkpoint any more. Its epoch stays named — a record of the shard committed before the
    /// release but sent after it is of that ownership, and a takeover refuses a segment
    /// naming the shard below the epoch its log was recorded at (`crate::takeover`), as it
    /// would a 0. [`LogWriter::hold`] replaces it; a new stream forgets it.
    pub fn release(&self, shard: u32) {
        self.state.lock().since.remove(&shard);
    }

    /// Record bytes touching `shard` sent since its last checkpoint.
    pub fn bytes_since(&self, shard: u32) -> u64 {
        self.state.lock().since.get(&shard).copied().unwrap_or(0)
    }

    /// A checkpoint of `shard` now covers `bytes` of what [`LogWriter::bytes_since`] counted.
    pub fn checkpointed(&self, shard: u32, bytes: u64) {
        if let Some(n) = self.state.lock().since.get_mut(&shard) {
            *n = n.saturating_sub(bytes);
        }
    }

    /// If nothing touching `shard` was sent since its last checkpoint: the `first` of the
    /// next segment, read at the same moment. Every record of the shard not sent yet has a
    /// sequence at least that (a segment's records lie inside its range, and ranges follow
    /// each other), so the shard's log may start there without a new checkpoint.
    pub fn idle_from(&self, shard: u32) -> Option<u64> {
        let s = self.state.lock();
        (s.since.get(&shard).copied() == Some(0)).then_some(s.next)
    }

    /// The `first` of the next segment of the current stream: every segment below it is
    /// written.
    pub fn next(&self) -> u64 {
        self.state.lock().next
    }

    /// Changes each time the stream is found fenced.
    pub fn fenced(&self) -> watch::Receiver<u64> {
        self.fenced.subscribe()
    }

    /// Stops retrying: a segment not yet known durable fails with [`WriteError::Closed`].
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn flush_interval(&self) -> Duration {
        self.flush_interval
    }

    /// Segments the acknowledger may have in flight at once.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn stats(&self) -> WriterStats {
        WriterStats {
            segments: self.segments.load(Ordering::Acquire),
            puts: self.puts.load(Ordering::Acquire),
            bytes: self.bytes.load(Ordering::Acquire),
        }
    }

    /// Makes `records` (consecutive batches, in sequence order, already durable locally)
    /// durable in the provider as one segment; blocks until it is, or until the stream is
    /// known fenced (see the module doc). [`LogWriter::prepare`] then [`LogWriter::send`].
    pub fn append(&self, records: &[Outgoing<'_>]) -> Result<(), WriteError> {
        match self.prepare(records)? {
            None => Ok(()),
            Some(segment) => self.runtime.block_on(self.send(segment)),
        }
    }

    /// Frames `records` as the stream's next segment and reserves its range: the next
    /// segment starts after it whether or not this one is sent yet, so several may be in
    /// flight (the acknowledger answers them strictly in order). Counts the records against
    /// their shards now ([`LogWriter::bytes_since`]), so a record in flight is never taken
    /// for an idle shard's. `None` for no records.
    ///
    /// Once the stream is fenced even a round with no records is refused: its sessions wrote
    /// nothing, but they may have read rows of a refused round, which stay in the local store
    /// until the shard is reloaded — a retried write finds its own replay record there — and
    /// answering them would acknowledge what no taker will ever replay.
    pub fn prepare(&self, records: &[Outgoing<'_>]) -> Result<Option<Prepared>, WriteError> {
        let mut s = self.state.lock();
        if s.fenced {
            return Err(WriteError::Fenced(LogError::Fenced {
                stream: s.stream.as_ref().map(StreamId::name).unwrap_or_default(),
                at: s.next,
                by: "(earlier)".into(),
            }));
        }
        let Some(last) = records.last().map(|r| r.seq) else {
            return Ok(None);
        };
        let stream = s.stream.clone().ok_or(WriteError::NoStream)?;
        let touched: BTreeSet<u32> = records.iter().flat_map(|r| r.shards.clone()).collect();
        let segment = Segment {
            kind: Kind::Records,
            node: stream.node.clone(),
            incarnation: stream.incarnation,
            first: s.next,
            last: last.max(s.next),
            shards: touched
                .into_iter()
                .map(|shard| (shard, s.epochs.get(&shard).copied().unwrap_or(0)))
                .collect(),
            body: encode_records(records.iter().map(|r| (r.seq, r.payload))),
        };
        s.next = segment.last + 1;
        for r in records {
            for shard in &r.shards {
                if let Some(n) = s.since.get_mut(shard) {
                    *n += r.payload.len() as u64;
                }
            }
        }
        Ok(Some(Prepared {
            stream,
            first: segment.first,
            bytes: Bytes::from(segment.encode()),
        }))
    }

    /// Sends a prepared segment until it is known created (an attempt whose outcome is
    /// unknown is sent again, byte for byte) or the stream is known fenced, or the writer is
    /// closed meanwhile.
    pub async fn send(&self, segment: Prepared) -> Result<(), WriteError> {
        let Prepared {
            stream,
            first,
            bytes,
        } = segment;
        let mut pause = RETRY_FIRST;
        let metrics = crate::metrics::metrics();
        loop {
            self.puts.fetch_add(1, Ordering::AcqRel);
            metrics.provider_log_puts.inc();
            match stream::append_encoded(&self.provider, &stream, first, &bytes).await {
                Ok(()) => {
                    self.segments.fetch_add(1, Ordering::AcqRel);
                    self.bytes.fetch_add(bytes.len() as u64, Ordering::AcqRel);
                    metrics.provider_log_segments.inc();
                    metrics.provider_log_bytes.inc_by(bytes.len() as u64);
                    return Ok(());
                }
                Err(e @ (LogError::Fenced { .. } | LogError::Conflict { .. })) => {
                    tracing::warn!(error = %e, "provider log fenced: acknowledging nothing more on this stream");
                    let mut s = self.state.lock();
                    if s.stream.as_ref() == Some(&stream) {
                        s.fenced = true;
                    }
                    drop(s);
                    self.fenced.send_modify(|n| *n += 1);
                    return Err(WriteError::Fenced(e));
                }
                Err(e) => {
                    if self.closed.load(Ordering::Acquire) {
                        return Err(WriteError::Closed);
                    }
                    tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "provider log segment not known durable; sending it again");
                    // A retry backoff against a provider that did not answer, not a wait for
                    // an event: there is no signal for "the provider is back".
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// The runtime segments are sent on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}

/// A segment framed and given its range by [`LogWriter::prepare`], to be sent by
/// [`LogWriter::send`].
pub struct Prepared {
    stream: StreamId,
    first: u64,
    bytes: Bytes,
}
