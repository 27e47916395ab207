//! A fault-injecting object store — a fake for tests, named as such. It wraps a real store
//! (usually in-memory) and can hold every create until released, lose the response of a
//! create that did land, or fail a create before sending it; it can also fail the next
//! deletes and reads (nothing reaches the inner store then). It counts creates and deletes
//! that reached the inner store so tests can prove "the provider received no write" or "the
//! key was deleted once".
//!
//! Unit tests drive those switches by hand. Black-box tests cannot reach into the daemon, so
//! they describe a seeded random [`Schedule`] in the test-only environment variable
//! [`SCHEDULE_ENV`]; the daemon then wraps its provider in this store (see
//! `server::run`) and logs a warning. The variable is deliberately not a flag and not
//! documented for operators: a production daemon never has it set.

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::sync::{Notify, Semaphore};

/// One in-memory provider seen with and without the fault layer (a fake for unit tests):
/// what a test writes through [`MemoryFake::faulty`] a clean view reads back, so a test can
/// fail the daemon's calls and still inspect what the provider holds. Lives here so that no
/// module outside `object` names object_store, even in tests.
#[cfg(test)]
pub struct MemoryFake {
    mem: Arc<dyn ObjectStore>,
    faults: Faults,
}

#[cfg(test)]
impl MemoryFake {
    /// An empty store whose faulty views draw from `faults`.
    pub fn new(faults: Faults) -> MemoryFake {
        MemoryFake {
            mem: Arc::new(object_store::memory::InMemory::new()),
            faults,
        }
    }

    /// Writes, reads and deletes all pass the fault layer.
    pub fn faulty(&self) -> super::ObjectProvider {
        let faulty = self.through_faults();
        super::ObjectProvider::from_stores("memory", "t".into(), faulty.clone(), faulty)
    }

    /// Writes pass the fault layer; reads and deletes reach the store directly.
    pub fn faulty_writes(&self) -> super::ObjectProvider {
        super::ObjectProvider::from_stores(
            "memory",
            "t".into(),
            self.through_faults(),
            self.mem.clone(),
        )
    }

    /// The store itself, no faults.
    pub fn clean(&self) -> super::ObjectProvider {
        super::ObjectProvider::from_stores("memory", "t".into(), self.mem.clone(), self.mem.clone())
    }

    fn through_faults(&self) -> Arc<dyn ObjectStore> {
        Arc::new(FaultyStore::new(self.mem.clone(), self.faults.clone()))
    }
}

/// Shared switches of a [`FaultyStore`]; clone freely.
#[derive(Clone, Default)]
pub struct Faults {
    inner: Arc<FaultState>,
}

struct FaultState {
    hold: AtomicBool,
    release: Semaphore,
    arrived: Notify,
    held_now: AtomicUsize,
    creates: AtomicUsize,
    lose_next_response: AtomicBool,
    refuse_next: AtomicBool,
    /// Deletes still to fail before they reach the inner store.
    failing_deletes: AtomicUsize,
    deletes: AtomicUsize,
    /// Reads still to fail before they reach the inner store.
    failing_reads: AtomicUsize,
    /// Deletes of keys containing this text fail, every time (a permanent outage for them).
    failing_keys: parking_lot::Mutex<Option<String>>,
    /// Random faults drawn per call, if a schedule was installed.
    schedule: Option<Scheduled>,
}

/// The test-only environment variable that makes the daemon inject a [`Schedule`].
pub const SCHEDULE_ENV: &str = "NOKV_TEST_FAULTS";

/// A seeded random fault schedule, written `key=value` pairs separated by commas, e.g.
/// `seed=7,refuse=10,lose=10,hold=5:3s,delete_outage=4s,slow_get=20:200ms`. Percentages are
/// per call; every key but `seed` is optional and absent means "never".
///
/// * `refuse=P` — a create fails before anything is sent (connection refused);
/// * `lose=P` — a create lands but its caller gets an error (unknown outcome);
/// * `hold=P:D` — a create waits `D` before it is sent, then lands (a PUT held past the
///   upload lease lands late);
/// * `delete_outage=D` — every delete fails for `D` after the store is built;
/// * `slow_get=P:D` — a read waits `D` first;
/// * `delete_fail=N` — the first `N` deletes fail (nothing deleted): a count, not a time, so
///   a test can fail exactly `--delete-attempts` deletes of one key;
/// * `refuse_keys=TEXT` — every create of a key containing `TEXT` fails before anything is
///   sent (a provider that refuses one kind of object, e.g. `/ckpt/`: every checkpoint).
///
/// Invariant: the same seed and the same sequence of calls draw the same faults (a splitmix64
/// generator behind a lock; concurrent calls may interleave differently from run to run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub refuse: u8,
    pub lose: u8,
    pub hold: Option<(u8, Duration)>,
    pub delete_outage: Duration,
    pub slow_get: Option<(u8, Duration)>,
    pub delete_fail: usize,
    pub refuse_keys: Option<String>,
}

/// A schedule that cannot be understood; the daemon refuses to start rather than run with
/// faults other than the ones the test asked for.
#[derive(Debug, thiserror::Error)]
#[error("{SCHEDULE_ENV}: {0}")]
pub struct ScheduleError(String);

impl Schedule {
    /// The schedule in [`SCHEDULE_ENV`], if it is set.
    pub fn from_env() -> Result<Option<Schedule>, ScheduleError> {
        match std::env::var(SCHEDULE_ENV) {
            Ok(text) => Schedule::parse(&text).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(ScheduleError(e.to_string())),
        }
    }

    pub fn parse(text: &str) -> Result<Schedule, ScheduleError> {
        let mut s = Schedule::default();
        let mut seeded = false;
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| ScheduleError(format!("`{pair}` is not key=value")))?;
            match key {
                "seed" => {
                    s.seed = value
                        .parse()
                        .map_err(|_| ScheduleError(format!("seed `{value}` is not a number")))?;
                    seeded = true;
                }
                "refuse" => s.refuse = percent(value)?,
                "lose" => s.lose = percent(value)?,
                "hold" => s.hold = Some(percent_and_duration(value)?),
                "delete_outage" => s.delete_outage = duration(value)?,
                "slow_get" => s.slow_get = Some(percent_and_duration(value)?),
                "delete_fail" => {
                    s.delete_fail = value.parse().map_err(|_| {
                        ScheduleError(format!("delete_fail `{value}` is not a count"))
                    })?
                }
                "refuse_keys" if !value.is_empty() => s.refuse_keys = Some(value.to_string()),
                other => return Err(ScheduleError(format!("unknown fault `{other}`"))),
            }
        }
        if !seeded {
            return Err(ScheduleError("a schedule needs `seed=N`".into()));
        }
        Ok(s)
    }
}

fn percent(v: &str) -> Result<u8, ScheduleError> {
    match v.parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(ScheduleError(format!("`{v}` is not a percentage 0..=100"))),
    }
}

fn duration(v: &str) -> Result<Duration, ScheduleError> {
    crate::token::parse_duration(v).map_err(|e| ScheduleError(format!("`{v}`: {e}")))
}

fn percent_and_duration(v: &str) -> Result<(u8, Duration), ScheduleError> {
    let (p, d) = v
        .split_once(':')
        .ok_or_else(|| ScheduleError(format!("`{v}` is not PERCENT:DURATION")))?;
    Ok((percent(p)?, duration(d)?))
}

/// An installed schedule and its generator.
struct Scheduled {
    schedule: Schedule,
    rng: Mutex<u64>,
    since: Instant,
}

impl Scheduled {
    /// True with probability `percent`/100 (splitmix64).
    fn draw(&self, percent: u8) -> bool {
        if percent == 0 {
            return false;
        }
        let mut state = self.rng.lock().expect("not poisoned");
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 100 < u64::from(percent)
    }

    fn delay(&self, fault: Option<(u8, Duration)>) -> Option<Duration> {
        fault.and_then(|(p, d)| self.draw(p).then_some(d))
    }

    fn deletes_out(&self) -> bool {
        self.since.elapsed() < self.schedule.delete_outage
    }
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            hold: AtomicBool::new(false),
            release: Semaphore::new(0),
            arrived: Notify::new(),
            held_now: AtomicUsize::new(0),
            creates: AtomicUsize::new(0),
            lose_next_response: AtomicBool::new(false),
            refuse_next: AtomicBool::new(false),
            failing_deletes: AtomicUsize::new(0),
            deletes: AtomicUsize::new(0),
            failing_reads: AtomicUsize::new(0),
            failing_keys: parking_lot::Mutex::new(None),
            schedule: None,
        }
    }
}

impl Faults {
    /// Faults drawn at random from `schedule` on every call, from now on.
    pub fn scheduled(schedule: Schedule) -> Faults {
        let rng = Mutex::new(schedule.seed);
        Faults {
            inner: Arc::new(FaultState {
                failing_deletes: AtomicUsize::new(schedule.delete_fail),
                schedule: Some(Scheduled {
                    schedule,
                    rng,
                    since: Instant::now(),
                }),
                ..FaultState::default()
            }),
        }
    }

    /// From now on every create waits until [`Faults::release`] lets it through.
    pub fn hold_creates(&self) {
        self.inner.hold.store(true, Ordering::SeqCst);
    }

    /// Lets `n` held creates proceed and stops holding new ones.
    pub fn release(&self, n: usize) {
        self.inner.hold.store(false, Ordering::SeqCst);
        self.inner.release.add_permits(n);
    }

    /// Waits until at least `n` creates are being held.
    pub async fn wait_held(&self, n: usize) {
        loop {
            let notified = self.inner.arrived.notified();
            if self.inner.held_now.load(Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }

    /// Creates that reached the inner store.
    pub fn creates(&self) -> usize {
        self.inner.creates.load(Ordering::SeqCst)
    }

    /// The next create lands but its caller gets an error (an unknown outcome).
    pub fn lose_next_response(&self) {
        self.inner.lose_next_response.store(true, Ordering::SeqCst);
    }

    /// The next create fails as if the connection was refused (nothing sent).
    pub fn refuse_next(&self) {
        self.inner.refuse_next.store(true, Ordering::SeqCst);
    }

    /// The next `n` deletes fail as if the connection was refused (nothing deleted).
    pub fn fail_next_deletes(&self, n: usize) {
        self.inner.failing_deletes.store(n, Ordering::SeqCst);
    }

    /// From now on every delete of a key containing `text` fails (nothing deleted).
    pub fn fail_deletes_of_keys_containing(&self, text: &str) {
        *self.inner.failing_keys.lock() = Some(text.to_string());
    }

    /// Deletes that reached the inner store.
    pub fn deletes(&self) -> usize {
        self.inner.deletes.load(Ordering::SeqCst)
    }

    /// The next `n` reads (GET, HEAD, ranges) fail as if the connection was refused.
    pub fn fail_next_reads(&self, n: usize) {
        self.inner.failing_reads.store(n, Ordering::SeqCst);
    }
}

/// Takes one injected failure from `counter` if any is left.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Faults,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, faults: Faults) -> FaultyStore {
        FaultyStore { inner, faults }
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn refused() -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
    }
}

#[async_trait::async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let s = &self.faults.inner;
        if s.hold.load(Ordering::SeqCst) {
            s.held_now.fetch_add(1, Ordering::SeqCst);
            s.arrived.notify_waiters();
            let permit = s.release.acquire().await.expect("semaphore open");
            permit.forget();
            s.held_now.fetch_sub(1, Ordering::SeqCst);
        }
        let mut lose = false;
        let mut held = None;
        if let Some(sch) = &s.schedule {
            if let Some(text) = &sch.schedule.refuse_keys
                && location.as_ref().contains(text.as_str())
            {
                tracing::warn!(key = %location, "test fault: create of this kind of key refused");
                return Err(refused());
            }
            if sch.draw(sch.schedule.refuse) {
                tracing::warn!(key = %location, "test fault: create refused before sending");
                return Err(refused());
            }
            held = sch.delay(sch.schedule.hold);
            lose = sch.draw(sch.schedule.lose);
        }
        if s.refuse_next.swap(false, Ordering::SeqCst) {
            return Err(refused());
        }
        s.creates.fetch_add(1, Ordering::SeqCst);
        let r = match held {
            None => self.inner.put_opts(location, payload, opts).await?,
            Some(d) => {
                // Detached, like a request the provider already has: it lands after `d`
                // even if the caller stops waiting (the sequencer's lease timeout).
                tracing::warn!(key = %location, held = ?d, "test fault: create held");
                let (inner, key) = (self.inner.clone(), location.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    let landed = inner.put_opts(&key, payload, opts).await;
                    tracing::warn!(key = %key, ok = landed.is_ok(), "test fault: held create landed");
                    landed
                })
                .await
                .map_err(|e| object_store::Error::Generic {
                    store: "faulty",
                    source: Box::new(e),
                })??
            }
        };
        if lose {
            tracing::warn!(key = %location, "test fault: create landed, response lost");
        }
        if lose || s.lose_next_response.swap(false, Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: "injected: response lost after the write landed".into(),
            });
        }
        Ok(r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if take_one(&self.faults.inner.failing_reads) {
            return Err(refused());
        }
        if let Some(sch) = &self.faults.inner.schedule
            && let Some(d) = sch.delay(sch.schedule.slow_get)
        {
            tokio::time::sleep(d).await;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let (inner, faults) = (self.inner.clone(), self.faults.clone());
        locations
            .then(move |location| {
                let (inner, faults) = (inner.clone(), faults.clone());
                async move {
                    let location = location?;
                    let s = &faults.inner;
                    let doomed = s
                        .failing_keys
                        .lock()
                        .as_deref()
                        .is_some_and(|t| location.as_ref().contains(t));
                    if doomed || take_one(&s.failing_deletes) {
                        return Err(refused());
                    }
                    if s.schedule.as_ref().is_some_and(Scheduled::deletes_out) {
                        tracing::warn!(key = %location, "test fault: delete outage");
                        return Err(refused());
                    }
                    s.deletes.fetch_add(1, Ordering::SeqCst);
                    inner.delete(&location).await?;
                    Ok(location)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{ObjectError, ObjectProvider, PutOutcome};
    use bytes::Bytes;

    fn memory_with(schedule: &str) -> ObjectProvider {
        let m: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        ObjectProvider::from_stores("memory", "t".into(), m.clone(), m)
            .with_fault_schedule(Schedule::parse(schedule).unwrap())
    }

    #[test]
    fn a_fault_schedule_parses_every_fault_and_refuses_anything_it_does_not_know() {
        let s =
            Schedule::parse("seed=7,refuse=10,lose=5,hold=3:2s,delete_outage=4s,slow_get=20:150ms")
                .unwrap();
        assert_eq!(
            s,
            Schedule {
                seed: 7,
                refuse: 10,
                lose: 5,
                hold: Some((3, Duration::from_secs(2))),
                delete_outage: Duration::from_secs(4),
                slow_get: Some((20, Duration::from_millis(150))),
                delete_fail: 0,
                refuse_keys: None,
            }
        );
        assert_eq!(
            Schedule::parse("seed=1,refuse_keys=/ckpt/")
                .unwrap()
                .refuse_keys
                .as_deref(),
            Some("/ckpt/")
        );
        assert_eq!(
            Schedule::parse("seed=1,delete_fail=8").unwrap().delete_fail,
            8
        );
        for bad in [
            "",
            "refuse=10",
            "seed=x",
            "seed=1,refuse=101",
            "seed=1,hold=5",
            "seed=1,explode=1",
            "seed=1,lose",
            "seed=1,refuse_keys=",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn scheduled_faults_refuse_before_sending_lose_responses_of_landed_writes_and_fail_deletes_during_an_outage()
     {
        let p = memory_with("seed=1,refuse=100");
        let key = p.block_key(1, "u", 0, "a");
        let out = p.create(&key, Bytes::from_static(b"x")).await;
        assert!(matches!(out, PutOutcome::NotWritten(_)), "{out:?}");
        assert!(matches!(p.get(&key).await, Err(ObjectError::NotFound(_))));

        let p = memory_with("seed=1,lose=100,delete_outage=1h");
        let out = p.create(&key, Bytes::from_static(b"x")).await;
        assert!(matches!(out, PutOutcome::Unknown(_)), "{out:?}");
        assert_eq!(p.get(&key).await.unwrap(), Bytes::from_static(b"x"));
        assert!(
            p.delete(&key).await.is_err(),
            "deletes fail during the outage"
        );
        assert_eq!(p.get(&key).await.unwrap(), Bytes::from_static(b"x"));

        // Percentages in between draw from the seed: same seed, same faults.
        let outcomes = |seed: u64| async move {
            let p = memory_with(&format!("seed={seed},refuse=50"));
            let mut v = Vec::new();
            for i in 0..32 {
                let k = p.block_key(1, "u", i, "a");
                v.push(matches!(
                    p.create(&k, Bytes::new()).await,
                    PutOutcome::Written
                ));
            }
            v
        };
        let a = outcomes(3).await;
        assert_eq!(a, outcomes(3).await);
        assert!(a.contains(&true) && a.contains(&false), "{a:?}");
    }

    #[tokio::test]
    async fn refused_keys_refuse_every_create_of_that_kind_and_no_other() {
        let p = memory_with("seed=1,refuse_keys=/ckpt/");
        for _ in 0..3 {
            let ckpt = p.checkpoint_key(2, 5);
            assert!(
                p.put_checkpoint(&ckpt, Bytes::from_static(b"c"))
                    .await
                    .is_err()
            );
            assert!(matches!(p.get(&ckpt).await, Err(ObjectError::NotFound(_))));
        }
        let block = p.block_key(1, "u", 0, "a");
        let out = p.create(&block, Bytes::from_static(b"x")).await;
        assert!(matches!(out, PutOutcome::Written), "{out:?}");
    }
}
