//! The node's block-memory budget: a byte semaphore over every artifact block the daemon holds
//! in memory, for readers and writers alike (`--block-memory`, default 256 MiB).
//!
//! **What is bounded.** A permit for `n` bytes is taken *before* the bytes exist and travels
//! with them: [`Reservation::hold`] turns a reservation and a buffer into one [`Bytes`] whose
//! last clone (or slice) releases the permit when it is dropped. So the budget covers
//! * `ReadBlock`: from before the provider fetch until the last chunk of the block has been
//!   handed to the transport (the response stream is made of slices of the held buffer);
//! * `PutBlock`: from before tonic decodes the request body (the reservation is taken by
//!   [`crate::service::body_admission`] while the body is still unread in HTTP/2 flow
//!   control) until the body is dropped after the provider write.
//!
//! Work past the budget *waits* for bytes to come back, up to the budget's wait deadline
//! (`--block-memory-wait`, default 10 s), and is then refused with the typed, retryable
//! `ResourceExhausted` — it never allocates past the budget.
//!
//! **What is not bounded by it.** Transport buffers, which are bounded per connection instead
//! (see [`crate::server`]): request bodies not yet admitted sit in HTTP/2 receive buffers,
//! at most one connection window (4 blocks) per connection; response bytes already encoded sit
//! in HTTP/2 send buffers, at most hyper's per-stream send buffer plus one 1 MiB chunk per
//! stream, and a connection carries at most `MAX_STREAMS_PER_CONNECTION` streams. The number of
//! connections is not limited here. Small-file bodies (`Write`, `Read`, ≤ `--inline-max`) are
//! not block bytes and are not counted.
//!
//! **Measured** by `tests/tests/memory_bound.rs` (debug build, 16 MiB budget, peak RSS growth
//! over the phase's start): 64 concurrent PutBlocks over 2 connections +38-54 MiB (221 MiB
//! with the budget off); 160 ReadBlock streams opened and never read, over 8 connections,
//! +21-34 MiB (798-914 MiB with the budget off). The test prints its figures.
//!
//! **Caveat.** A reader that opens a stream and never reads keeps its block's bytes — and so
//! its share of the budget — until the stream ends; the budget makes such readers cost a
//! bounded amount of memory (others wait or are refused), not nothing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// Default budget: 256 MiB of block bytes per node.
pub const DEFAULT_BLOCK_MEMORY: u64 = 256 * 1024 * 1024;
/// Default time a request waits for block memory before it is refused.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// A node-wide budget of block bytes held in memory. Cheap to clone; clones share the budget.
#[derive(Debug, Clone)]
pub struct BlockMemory {
    permits: Arc<Semaphore>,
    capacity: usize,
    wait: Duration,
}

/// Bytes of the budget reserved for one block; released when dropped, or carried by the
/// block's bytes once [`Reservation::hold`] attaches it to them.
#[derive(Debug)]
pub struct Reservation {
    permit: OwnedSemaphorePermit,
}

/// A buffer and the permit that pays for it: the owner behind a held [`Bytes`].
struct Held {
    bytes: Bytes,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl BlockMemory {
    /// A budget of `capacity` bytes; requests wait at most `wait` for their share.
    pub fn new(capacity: u64, wait: Duration) -> BlockMemory {
        let capacity = usize::try_from(capacity)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        BlockMemory {
            permits: Arc::new(Semaphore::new(capacity)),
            capacity,
            wait,
        }
    }

    /// Reserves `bytes` of the budget, waiting for other holders to release theirs. A request
    /// larger than the whole budget reserves the whole budget (so it can still run, alone).
    /// Past the wait deadline the request is refused with `ResourceExhausted`, having
    /// allocated nothing.
    pub async fn reserve(&self, bytes: u64) -> Result<Reservation> {
        let n = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(self.capacity)
            .min(u32::MAX as usize) as u32;
        let acquire = self.permits.clone().acquire_many_owned(n);
        let waiting = std::time::Instant::now();
        let m = crate::metrics::metrics();
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(permit) => {
                m.block_memory_wait.observe(waiting.elapsed().as_secs_f64());
                Ok(Reservation {
                    permit: permit.expect("the budget's semaphore is never closed"),
                })
            }
            Err(_) => {
                m.block_memory_refused.inc();
                tracing::warn!(
                    bytes,
                    budget = self.capacity,
                    wait = ?self.wait,
                    "block memory budget exhausted; request refused"
                );
                Err(Error::ResourceExhausted(format!(
                    "block memory budget of {} MiB is in use; retry later",
                    self.capacity / (1024 * 1024)
                )))
            }
        }
    }

    /// Bytes of the budget not reserved right now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Reservation {
    /// Bytes this reservation pays for.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Attaches the reservation to `bytes`: the returned buffer (and every clone or slice of
    /// it) keeps the reservation alive, and the last one dropped returns it to the budget.
    pub fn hold(self, bytes: Bytes) -> Bytes {
        Bytes::from_owner(Held {
            bytes,
            _permit: self.permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    const MIB: u64 = 1024 * 1024;

    #[tokio::test]
    async fn held_bytes_return_their_reservation_when_the_last_slice_is_dropped() {
        let budget = BlockMemory::new(8 * MIB, DEFAULT_WAIT);
        let r = budget.reserve(4 * MIB).await.unwrap();
        assert_eq!(r.bytes() as u64, 4 * MIB);
        let held = r.hold(Bytes::from(vec![7u8; 4 * MIB as usize]));
        let chunks: Vec<Bytes> = (0..4)
            .map(|i| held.slice(i * MIB as usize..(i + 1) * MIB as usize))
            .collect();
        drop(held);
        assert_eq!(budget.available() as u64, 4 * MIB, "slices still hold it");
        let mut chunks = chunks.into_iter();
        for _ in 0..3 {
            drop(chunks.next());
            assert_eq!(budget.available() as u64, 4 * MIB);
        }
        drop(chunks);
        assert_eq!(budget.available() as u64, 8 * MIB);
    }

    #[tokio::test]
    async fn work_past_the_budget_waits_until_bytes_are_released() {
        let budget = BlockMemory::new(4 * MIB, Duration::from_secs(600));
        let first = budget.reserve(4 * MIB).await.unwrap();
        let mut waiting = Box::pin(budget.reserve(4 * MIB));
        // The second reservation cannot complete while the first is held...
        assert!((&mut waiting).now_or_never().is_none());
        assert_eq!(budget.available(), 0);
        // ...and completes as soon as it is released.
        drop(first);
        assert_eq!(waiting.await.unwrap().bytes() as u64, 4 * MIB);
    }

    #[tokio::test]
    async fn work_that_cannot_get_memory_before_the_deadline_is_refused_with_resource_exhausted() {
        let budget = BlockMemory::new(4 * MIB, Duration::from_millis(1));
        let _held = budget.reserve(3 * MIB).await.unwrap();
        let err = budget.reserve(2 * MIB).await.unwrap_err();
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err:?}");
        assert_eq!(budget.available() as u64, MIB, "a refusal reserves nothing");
    }

    #[tokio::test]
    async fn a_request_larger_than_the_budget_runs_alone_instead_of_waiting_forever() {
        let budget = BlockMemory::new(MIB, Duration::from_secs(600));
        let r = budget.reserve(4 * MIB).await.unwrap();
        assert_eq!(r.bytes() as u64, MIB);
    }
}
