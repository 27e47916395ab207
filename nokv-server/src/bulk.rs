//! Bulk work — hashing artifact blocks and writing them to the provider — runs on its own
//! small runtime whose threads have a lower CPU priority (nice 10) and the idle-ish I/O
//! class, so that on a busy machine interactive requests (stat, small writes) get the CPU
//! and the disk first. When nothing else competes, bulk work still runs at full speed: nice
//! only matters under contention. The metadata sessions of an upload stay on the shard's
//! committer like every other write session; only the byte-heavy step moves here.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// Niceness of bulk threads: a weight of ~1/10 against default-priority threads.
const BULK_NICE: libc::c_int = 10;

pub struct Bulk {
    runtime: Option<tokio::runtime::Runtime>,
    /// Optional bandwidth budget: the instant the next block may start, advanced by each
    /// block's share (`bytes / rate`). Pacing, not bursting: a node never moves bulk bytes
    /// faster than the budget, whatever the number of uploaders.
    pace: Option<(f64, parking_lot::Mutex<tokio::time::Instant>)>,
    /// Admission: blocks hashed or written at once. Past the machine's spare cores more
    /// parallel bulk work only steals CPU and disk from interactive requests.
    permits: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Bulk {
    /// `parallel` bounds how many blocks are hashed and written at once on this node;
    /// `mib_per_s` (when set) caps the node's bulk bandwidth.
    pub fn new(parallel: usize, mib_per_s: Option<f64>) -> std::io::Result<Bulk> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nokv-bulk")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(Bulk {
            runtime: Some(runtime),
            pace: mib_per_s.filter(|r| *r > 0.0).map(|r| {
                (
                    r * 1024.0 * 1024.0,
                    parking_lot::Mutex::new(tokio::time::Instant::now()),
                )
            }),
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(parallel.max(1))),
        })
    }

    /// Waits until the bandwidth budget admits `bytes` more (immediately without a budget).
    pub async fn admit(&self, bytes: u64) {
        let Some((rate, next)) = &self.pace else {
            return;
        };
        let start = {
            let mut next = next.lock();
            let start = (*next).max(tokio::time::Instant::now());
            *next = start + Duration::from_secs_f64(bytes as f64 / rate);
            start
        };
        tokio::time::sleep_until(start).await;
    }

    /// Runs `work` on a bulk thread and waits for it.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let rt = self
            .runtime
            .as_ref()
            .expect("bulk runtime lives until drop");
        let permit = self.permits.clone().acquire_owned().await.expect("open");
        rt.spawn(async move {
            let _p = permit;
            work.await
        })
        .await
        .map_err(|e| Error::Internal(format!("bulk task failed: {e}")))
    }
}

impl Drop for Bulk {
    fn drop(&mut self) {
        // Dropping a runtime inside async context panics; let it wind down in the background.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Applies to the calling thread only: on Linux, nice and I/O priority are per thread.
fn lower_priority() {
    // SAFETY: plain syscalls on the current thread with valid constant arguments.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, BULK_NICE) != 0 {
            tracing::debug!("could not lower bulk thread priority");
        }
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_BE level 7): lowest best-effort.
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_BE: libc::c_long = 2;
        let prio = (IOPRIO_CLASS_BE << 13) | 7;
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            prio,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on tokio's paused clock: time advances only by the sleeps themselves, so the
    /// assertions are exact, not timing thresholds.
    #[tokio::test(start_paused = true)]
    async fn a_bandwidth_budget_spaces_blocks_by_their_share_of_the_rate() {
        let bulk = Bulk::new(1, Some(4.0)).unwrap();
        let t0 = tokio::time::Instant::now();
        let block = 2 * 1024 * 1024;
        bulk.admit(block).await;
        assert_eq!(
            t0.elapsed(),
            Duration::ZERO,
            "the first block starts at once"
        );
        bulk.admit(block).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(500));
        bulk.admit(block).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_budget_blocks_are_admitted_at_once() {
        let bulk = Bulk::new(1, None).unwrap();
        let t0 = tokio::time::Instant::now();
        for _ in 0..10 {
            bulk.admit(4 << 20).await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }
}
