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
        let m = crate::metrics::metrics();
        m.bulk_bytes.inc_by(bytes);
        let Some((rate, next)) = &self.pace else {
            return;
        };
        let waiting = std::time::Instant::now();
        let start = {
            let mut next = next.lock();
            let (start, following) = schedule(*next, tokio::time::Instant::now(), bytes, *rate);
            *next = following;
            start
        };
        tokio::time::sleep_until(start).await;
        m.bulk_admission_wait
            .observe(waiting.elapsed().as_secs_f64());
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
        let waiting = std::time::Instant::now();
        let permit = self.permits.clone().acquire_owned().await.expect("open");
        crate::metrics::metrics()
            .bulk_admission_wait
            .observe(waiting.elapsed().as_secs_f64());
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

/// When a block of `bytes` may start given the budget's next free instant, and the next free
/// instant after it. Idle time is not banked: a budget never allows a burst.
fn schedule<I>(next: I, now: I, bytes: u64, bytes_per_s: f64) -> (I, I)
where
    I: Ord + Copy + std::ops::Add<Duration, Output = I>,
{
    let start = next.max(now);
    (
        start,
        start + Duration::from_secs_f64(bytes as f64 / bytes_per_s),
    )
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
    use std::time::Instant;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_bandwidth_budget_spaces_blocks_by_their_share_of_the_rate() {
        let (t0, rate) = (Instant::now(), 4.0 * MIB as f64);
        let (start, next) = schedule(t0, t0, 2 * MIB, rate);
        assert_eq!(start, t0, "the first block starts at once");
        let (start, next) = schedule(next, t0, 2 * MIB, rate);
        assert_eq!(start, t0 + Duration::from_millis(500));
        let (start, _) = schedule(next, t0, 2 * MIB, rate);
        assert_eq!(start, t0 + Duration::from_secs(1));
    }

    #[test]
    fn idle_time_is_not_banked_into_a_burst() {
        let (t0, rate) = (Instant::now(), 4.0 * MIB as f64);
        let later = t0 + Duration::from_secs(10);
        let (start, next) = schedule(t0, later, 4 * MIB, rate);
        assert_eq!(start, later);
        assert_eq!(next, later + Duration::from_secs(1));
    }

    #[tokio::test]
    async fn without_a_budget_blocks_are_admitted_without_waiting() {
        let bulk = Bulk::new(1, None).unwrap();
        for _ in 0..10 {
            // Would hang on a budget-less admission that waited; returns at once.
            bulk.admit(4 * MIB).await;
        }
        assert!(bulk.pace.is_none());
    }
}
