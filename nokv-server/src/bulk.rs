//! Bulk work — hashing artifact blocks, writing them to the provider, reading them back for
//! commit verification and restore — is scheduled **interactive-first**.
//!
//! Where it runs: on its own small runtime whose threads have a lower CPU priority (nice 10)
//! and the lowest best-effort I/O class, at most `--bulk-parallel` blocks at a time. The
//! metadata sessions of an upload stay on the node's committer like every other write
//! session; only the byte-heavy steps move here.
//!
//! When it runs: every block step first passes [`Bulk::admit`], which reads the node's
//! interactive pressure ([`crate::pressure`]: the Workspace small-file RPCs in flight, counted
//! by a tower layer, plus a short quiet window after the last one ended).
//! * **Quiet node** (depth 0): admitted at once. An upload alone runs at full speed — nothing
//!   but the permits bounds it, exactly as with no budget at all.
//! * **Pressured node** (depth d >= 1): blocks are paced node-wide at
//!   [`pressured_rate`]`(d)` = `PRESSURED_MIB_PER_CPU` x CPUs / d, never below
//!   `FLOOR_MIB_PER_CPU` x CPUs: admission shrinks as the interactive queue deepens. A
//!   waiting block goes as soon as the node turns quiet, so bulk does not linger behind a burst
//!   that has passed.
//!
//! Why nice alone is not enough: the bytes of an upload cost CPU outside the bulk threads too
//! (TLS and HTTP/2 decoding of the PutBlock bodies on the serving runtime, the uploading
//! client itself), so the only lever that reaches all of it is how fast blocks are admitted —
//! the uploader has a few blocks in flight and sends the next one only when one is answered.
//!
//! Why bulk cannot be starved: under any pressure the pace never drops below the floor, so a
//! block waits at most its place in a queue that drains at `FLOOR_MIB_PER_CPU` x CPUs (8 MiB/s
//! on 2 CPUs, one 4 MiB block every 0.5 s), however many interactive requests arrive; a lease
//! (renewed at a third of 60 s) outlives that wait many times over.
//!
//! Why bulk cannot starve interactive requests: while any is in flight (or ended within the
//! quiet window), bulk moves at most `pressured_rate(d)` bytes per second — a bounded share of
//! the machine that shrinks with the queue — and the CPU it does use is at nice 10.
//!
//! `--bulk-mib-per-s` remains an optional hard cap (default off) on top of this: when set,
//! a block also waits for the cap's pace, pressured or not.
//!
//! **Alternatives measured (issue 46).** The open-loop probe
//! (`scripts/owner_upload_interference_probe.py --open-loop`: 32 sessions x 10 stat/put pairs
//! per second beside an unpaced uploader, local provider, 2 cores), uploader speed beside the
//! sessions as a share of its speed alone in the same run, and put p50 / p99 beside the upload
//! over the no-upload window:
//! * presence pacing (this doc, kept): share 0.09-0.15, p50 1.06-1.11x, p99 2.7-3.4x;
//! * `SCHED_IDLE` bulk threads, no pacing: share 0.89, p50 4.1x, p99 6.5x. The spare CPU does
//!   go to bulk at once, but the interactive path suffers anyway: what an upload costs outside
//!   the bulk threads (the loopback TCP and TLS receive of the bodies, the page cache and
//!   writeback of 170 MiB/s, the uploading client) is not governed by thread priority. The
//!   same with the idle I/O class, with the uploading client itself at `SCHED_IDLE`, with 6
//!   serving threads, or without the blocks' fsync: no better;
//! * `SCHED_IDLE` plus a delay-based (LEDBAT-style AIMD) governor on the interactive median
//!   service time: it cut to its floor (share 0.05-0.09, p50 1.12x, p99 3.2x). Even 2 blocks a
//!   second lift put p50 by ~10 % and p99 ~2x here, so a controller on interactive latency
//!   finds no rate that keeps the target: the cost is per block, not per byte per second;
//! * a data-plane listener served on the `SCHED_IDLE` runtime (the uploader's connection —
//!   TLS, HTTP/2, decoding — handled entirely at idle priority), no pacing: share 0.89, stat
//!   p50 1.18x but put p50 3.6x, p99 9.5x. With the data dir on tmpfs instead of the disk the
//!   same gives put p50 1.02x (share 0.45, p99 still ~10x): the disk was the rest — the small
//!   writes' fsyncs queued behind the upload's writeback, which no thread priority reaches.
//!
//! That last finding is now built in: the local provider writes blocks around the page cache
//! (`object/direct.rs`), so they reach the disk from the bulk thread, at its I/O priority, in
//! 256 KiB requests. With it, the same probe at one pressured rate after another (one run
//! each): this schedule (16 MiB/s per CPU) share 0.11, put p50 1.06x, p99 2.6x; 32 MiB/s per
//! CPU 0.26, 1.09-1.15x, 2.6-2.7x; 48 MiB/s per CPU 0.43, 1.20x, 2.7x; unpaced 0.83, 2.1x,
//! 5.7x (with `SCHED_IDLE` bulk threads 1.7x, 4.2x; the uploading client at `SCHED_IDLE` too,
//! no better). The put median rises with the upload's bytes per second, ~1 % per 4 MiB/s;
//! the p99 (2.6-2.7x at every paced rate) with each block's arrival, whatever the rate. Reading
//! PutBlock bodies frame by frame at the pace, through 256 KiB stream windows, so a block
//! arrives as a trickle instead of a 4 MiB burst (experiment, not kept): stat p99 2.0x and put
//! p99 1.8x, but put p50 1.09x at 15 MiB/s and more daemon CPU per operation — not enough to
//! keep 256 KiB windows, which would also cap a distant uploader at one window per round trip.
//!
//! The data-plane listener measured again with blocks written direct (scratch build, one or
//! two runs each): unpaced with `SCHED_IDLE` bulk threads, share 0.95-1.01 and stat p50
//! 1.06-1.14x, but put p50 1.7x and p99 3.3-3.7x (nice 10 bulk threads: put p50 2.1x; the data
//! dir on tmpfs: 1.16x, p99 8.6x); paced at 48 MiB/s per CPU, share 0.33 with put p50 1.10x —
//! the same curve as presence pacing without it. Idle priority hands the upload the spare CPU,
//! but what a put pays beside an upload at full speed is not CPU time the scheduler takes back.
//!
//! Where a put's extra cost comes from, measured against moto, which keeps blocks in memory
//! (one run each, scratch builds): with *every* consumer of an upload's CPU at `SCHED_IDLE` —
//! the data-plane listener and the bulk threads, the uploading client and moto itself — and
//! no pacing, share 0.61-0.66 and stat p50 0.94-1.03x, but put p50 1.39-1.62x and put p99
//! 2.5-4.0x; the same with the daemon's data dir on tmpfs: put p50 1.13x, share 0.73, p99
//! still 4.5x. The put median pays at the disk — a put's fsync and the upload's own per-block
//! durable sessions share one device — and the tail pays for what no priority reaches: this
//! VM's kernel is `PREEMPT_NONE`, so a thread inside a system call is not preempted, and a
//! 32-byte ping-pong between two normal-priority processes goes from p99 0.10 ms to 1.56 ms
//! beside an idle-priority loopback sender of 4 MiB writes (0.58 ms at 256 KiB, 0.20 ms at
//! 16 KiB). Handing provider PUTs to HTTP in 16 KiB or 4 KiB slices (each `writev` at most
//! 256 KiB or 64 KiB instead of 4 MiB) moved neither tail beyond noise, so it was not kept.
//! What did move the stat tail: the serving runtime itself. An uploader's connection task
//! decrypted and framed up to tokio's cooperative budget (~2 MiB) per turn while agents'
//! requests queued on that worker; its reads now yield every 64 KiB (`crate::fair_read`):
//! stat p99 1.99-2.06x against 2.45-3.29x (moto, presence pacing, three runs each,
//! alternating); put p99 1.52-1.66x against 1.59-1.85x, within noise. The other way round —
//! reading each connection's socket in 256 KiB gulps under TLS, one `recv` where rustls makes
//! ~16 (experiment, not kept) — cut the daemon's CPU per MiB published on moto by 4-6 %, but
//! worsened the tails beside the agents (moto, open loop, three alternating pairs: stat p99
//! 2.17-2.55x against 2.09-2.30x, put p99 1.66-2.15x against 1.47-1.89x): a worker inside a
//! 256 KiB copy is a worker an agent's request waits for.
//!
//! So on 2 cores, with the agents, the uploader and the daemon sharing them, the bars of
//! issue 46 (uploader >= 50 % of alone with put p50 <= 1.1x and p99 <= 1.5x) are out of
//! reach for every schedule measured: p50 <= 1.1x holds up to ~40 MiB/s beside 32 agents,
//! while half of the uploader's speed alone is 115-185 MiB/s (local; the machine's speed
//! varies). Presence pacing at its rate stays because it keeps the interactive median, which
//! is what an agent's tool loop feels; what changed is what each admitted byte costs. Beside
//! the same 32 agents the uploader now moves ~25 MiB/s against ~13 at the start, with
//! the local put p99 1.32x against 1.90x (medians of three runs of `7297de0` and `ac1dd20`,
//! one session; `docs/benchmarks.md`).

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::pressure::Pressure;

/// Bulk bandwidth per CPU while exactly one interactive request is pending; deeper queues
/// divide it (see [`pressured_rate`]).
pub const PRESSURED_MIB_PER_CPU: f64 = 16.0;

/// The least bulk bandwidth per CPU under any pressure: what keeps bulk progressing.
pub const FLOOR_MIB_PER_CPU: f64 = 4.0;

const MIB: f64 = 1024.0 * 1024.0;

/// Niceness of bulk threads: a weight of ~1/10 against default-priority threads.
const BULK_NICE: libc::c_int = 10;

pub struct Bulk {
    runtime: Option<tokio::runtime::Runtime>,
    /// Optional bandwidth budget: the instant the next block may start, advanced by each
    /// block's share (`bytes / rate`). Pacing, not bursting: a node never moves bulk bytes
    /// faster than the budget, whatever the number of uploaders.
    pace: Option<(f64, parking_lot::Mutex<tokio::time::Instant>)>,
    /// The node's interactive pressure, which bulk yields to.
    pressure: std::sync::Arc<Pressure>,
    /// The pace under pressure: the instant the next pressured block may start.
    pressured_next: parking_lot::Mutex<tokio::time::Instant>,
    /// CPUs the pressured rates are scaled by.
    cpus: usize,
    /// Admission: blocks hashed or written at once. Past the machine's spare cores more
    /// parallel bulk work only steals CPU and disk from interactive requests.
    permits: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Bulk {
    /// `parallel` bounds how many blocks are hashed and written at once on this node;
    /// `mib_per_s` (when set) caps the node's bulk bandwidth.
    pub fn new(parallel: usize, mib_per_s: Option<f64>) -> std::io::Result<Bulk> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_pressure(parallel, mib_per_s, Pressure::new(), cpus)
    }

    /// As [`Bulk::new`], yielding to `pressure`, with pressured rates scaled by `cpus`.
    pub fn with_pressure(
        parallel: usize,
        mib_per_s: Option<f64>,
        pressure: std::sync::Arc<Pressure>,
        cpus: usize,
    ) -> std::io::Result<Bulk> {
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
            pressure,
            pressured_next: parking_lot::Mutex::new(tokio::time::Instant::now()),
            cpus: cpus.max(1),
        })
    }

    /// The interactive pressure this node's bulk work yields to (counted by
    /// [`crate::pressure::PressureLayer`] in `server.rs`).
    pub fn pressure(&self) -> std::sync::Arc<Pressure> {
        self.pressure.clone()
    }

    /// Waits until bulk work may move `bytes` more: at once on a quiet node, at the pressured
    /// pace while interactive requests are pending (see the module doc), and within the hard
    /// cap when one is set.
    pub async fn admit(&self, bytes: u64) {
        let m = crate::metrics::metrics();
        m.bulk_bytes.inc_by(bytes);
        let waiting = std::time::Instant::now();
        let mut waited = false;
        let depth = self.pressure.depth();
        if depth > 0 {
            let start = {
                let mut next = self.pressured_next.lock();
                let rate = pressured_rate(depth, self.cpus);
                let (start, following) = schedule(*next, tokio::time::Instant::now(), bytes, rate);
                *next = following;
                start
            };
            // Interactive-first, not interactive-only: the slot bounds the wait, and a node
            // that turns quiet meanwhile lets the block go at once.
            if start > tokio::time::Instant::now() {
                tokio::select! {
                    () = tokio::time::sleep_until(start) => {}
                    () = self.pressure.quiet() => {}
                }
                waited = true;
            }
        }
        if let Some((rate, next)) = &self.pace {
            let start = {
                let mut next = next.lock();
                let (start, following) = schedule(*next, tokio::time::Instant::now(), bytes, *rate);
                *next = following;
                start
            };
            if start > tokio::time::Instant::now() {
                tokio::time::sleep_until(start).await;
                waited = true;
            }
        }
        if waited {
            m.bulk_admission_wait
                .observe(waiting.elapsed().as_secs_f64());
        }
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

/// Bulk bytes per second while `depth` interactive requests are pending on a node of `cpus`
/// CPUs: the pressured rate divided by the depth, never below the floor.
pub fn pressured_rate(depth: usize, cpus: usize) -> f64 {
    let cpus = cpus.max(1) as f64;
    let rate = PRESSURED_MIB_PER_CPU * cpus / depth.max(1) as f64;
    rate.max(FLOOR_MIB_PER_CPU * cpus) * MIB
}

/// Applies to the calling thread only: on Linux, the scheduling policy, nice and I/O priority
/// are per thread.
fn lower_priority() {
    // SAFETY: plain syscalls on the current thread with valid arguments.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, BULK_NICE) != 0 {
            tracing::debug!("could not lower bulk thread priority");
        }
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, best-effort class, lowest level 7).
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_BE: libc::c_long = 2;
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            (IOPRIO_CLASS_BE << 13) | 7,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
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

    /// A node of 2 CPUs whose bulk work yields to `pressure`.
    fn bulk(pressure: &std::sync::Arc<Pressure>, cap: Option<f64>) -> Bulk {
        Bulk::with_pressure(2, cap, pressure.clone(), 2).unwrap()
    }

    /// Whether admitting `bytes` more completes without waiting (on its first poll).
    fn admitted_at_once(bulk: &Bulk, bytes: u64) -> bool {
        bulk.admit(bytes).now_or_never().is_some()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn on_a_quiet_node_blocks_are_admitted_without_waiting() {
        let pressure = Pressure::new();
        let bulk = bulk(&pressure, None);
        for _ in 0..10 {
            assert!(admitted_at_once(&bulk, 4 * MIB));
        }
    }

    #[tokio::test]
    async fn while_an_interactive_request_is_in_flight_the_next_block_waits_for_its_slot() {
        let pressure = Pressure::new();
        let bulk = bulk(&pressure, None);
        let _stat = pressure.enter();
        assert!(
            admitted_at_once(&bulk, 4 * MIB),
            "the first block takes the free slot"
        );
        assert!(
            !admitted_at_once(&bulk, 4 * MIB),
            "the second waits for the pace"
        );
    }

    #[test]
    fn pressured_blocks_are_spaced_by_their_share_of_the_pressured_rate() {
        // Depth 1 on 2 CPUs: 32 MiB/s, one 4 MiB block every 125 ms.
        let (t0, rate) = (Instant::now(), pressured_rate(1, 2));
        let (_, next) = schedule(t0, t0, 4 * MIB, rate);
        let (start, _) = schedule(next, t0, 4 * MIB, rate);
        assert_eq!(start, t0 + Duration::from_millis(125));
    }

    #[test]
    fn deeper_interactive_queues_shrink_bulk_admission_down_to_a_floor() {
        let rate = |d| pressured_rate(d, 2) / MIB as f64;
        assert_eq!(rate(1), 32.0);
        assert_eq!(rate(2), 16.0);
        assert_eq!(rate(4), 8.0);
        assert_eq!(
            rate(1000),
            8.0,
            "never below the floor: bulk still progresses"
        );
        assert_eq!(
            pressured_rate(1, 4),
            2.0 * pressured_rate(1, 2),
            "scaled per CPU"
        );
    }

    #[tokio::test]
    async fn a_block_waiting_on_interactive_requests_goes_once_the_node_turns_quiet() {
        let pressure = Pressure::with_quiet(Duration::ZERO);
        let bulk = bulk(&pressure, None);
        let write = pressure.enter();
        // A huge first block pushes the next slot days away: only quiet can release it.
        assert!(admitted_at_once(&bulk, 1 << 43));
        let next = bulk.admit(4 * MIB);
        tokio::pin!(next);
        assert!(next.as_mut().now_or_never().is_none());
        drop(write);
        assert!(next.now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_request_that_just_ended_still_holds_bulk_back_for_the_quiet_window() {
        let pressure = Pressure::with_quiet(HOUR);
        let bulk = bulk(&pressure, None);
        drop(pressure.enter());
        assert!(admitted_at_once(&bulk, 4 * MIB));
        assert!(!admitted_at_once(&bulk, 4 * MIB));
    }

    #[tokio::test]
    async fn a_hard_cap_paces_blocks_even_on_a_quiet_node() {
        let pressure = Pressure::new();
        let bulk = bulk(&pressure, Some(4.0));
        assert!(admitted_at_once(&bulk, 2 * MIB));
        assert!(!admitted_at_once(&bulk, 2 * MIB));
    }
}
