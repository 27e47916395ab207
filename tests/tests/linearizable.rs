//! Histories of contended keys under kill -9, checked for linearizability by the independent
//! checker in `nokv_tests::linearizability` (issue 45).
//!
//! Six clients run reads, upserts, conditional writes (`if_generation`) and deletes, conditional
//! or not, on three keys of one workspace against the embedded daemon. A nemesis kills the
//! daemon (-9) after a number of operations, restarts it on the same data dir, and the clients
//! go on against the new process; every operation is recorded with its invocation and response
//! instants, an operation that got no answer (the kill, a transport error) as unknown. The
//! whole history is then checked key by key. The test prints what it checked: operations,
//! keys, kills, unknown outcomes and the largest memo of the search (its memory).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use nokv_client::sdk::RetryPolicy;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use nokv_tests::linearizability::{self, Call, Op, Outcome, Value};
use nokv_tests::{Daemon, SplitMix64};

const WS: &str = "lin";
const KEYS: usize = 3;
const CLIENTS: usize = 6;
/// Operations (answered or not) per daemon lifetime before the kill.
const OPS_PER_LIFE: usize = 250;
/// Lifetimes: every one but the last ends with kill -9.
const LIVES: usize = 4;

/// A generator per client, seeded by its number: the plan is reproducible, the interleaving
/// is whatever the machine makes of it.
type Rng = SplitMix64;

/// What every client shares: the clock origin, the value numbering and the history.
struct Shared {
    origin: Instant,
    values: AtomicU64,
    history: Mutex<Vec<Op>>,
}

impl Shared {
    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

fn server_reason(e: &ClientError) -> Option<&str> {
    match &e.reason {
        nokv_client::error::Reason::Server(r) => Some(r.as_str()),
        _ => None,
    }
}

/// The outcome of a failed call: definite refusals the model knows, anything else unknown
/// (a transport error, or the server's Unavailable while the process dies or starts).
fn refused(e: &ClientError) -> Outcome {
    match server_reason(e) {
        Some("GenerationMismatch") => Outcome::Mismatch,
        Some("NotFound") => Outcome::NotFound,
        _ => Outcome::Unknown,
    }
}

fn value_of(data: &[u8]) -> Value {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.strip_prefix('v'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a value no client wrote: {data:?}"))
}

/// One operation against `client`, recorded in `shared`; returns a generation it learned.
async fn one_op(client: &Client, shared: &Shared, rng: &mut Rng, known: &mut [u64]) {
    let k = (rng.next_u64() % KEYS as u64) as usize;
    let key = format!("k{k}");
    let dice = rng.next_u64() % 100;
    let value = || shared.values.fetch_add(1, Ordering::Relaxed) + 1;
    let write = |value: Value, mode: pb::WriteMode, if_generation: u64| pb::WriteRequest {
        workspace: WS.into(),
        path: key.clone(),
        data: format!("v{value}").into_bytes().into(),
        mode: mode as i32,
        if_generation,
        ..Default::default()
    };
    let invoked = shared.now();
    let (call, outcome) = if dice < 35 {
        let outcome = match client.read(WS, &key).await {
            Ok(r) => {
                let g = r.entry.as_ref().map_or(0, |e| e.generation);
                known[k] = g;
                Outcome::Read(Some((value_of(&r.data), g)))
            }
            Err(e) if server_reason(&e) == Some("NotFound") => Outcome::Read(None),
            Err(_) => Outcome::Unknown,
        };
        (Call::Read, outcome)
    } else if dice < 65 {
        let v = value();
        let outcome = match client.write(write(v, pb::WriteMode::Upsert, 0)).await {
            Ok(e) => {
                known[k] = e.generation;
                Outcome::Written(e.generation)
            }
            Err(e) => refused(&e),
        };
        (Call::Write { value: v }, outcome)
    } else if dice < 85 {
        let v = value();
        let expected = known[k].max(1);
        let outcome = match client
            .write(write(v, pb::WriteMode::IfGeneration, expected))
            .await
        {
            Ok(e) => {
                known[k] = e.generation;
                Outcome::Written(e.generation)
            }
            Err(e) => refused(&e),
        };
        (Call::WriteIf { expected, value: v }, outcome)
    } else {
        let expected = if rng.chance(50) { 0 } else { known[k] };
        let outcome = match client
            .delete(pb::DeleteRequest {
                workspace: WS.into(),
                path: key.clone(),
                if_generation: expected,
                ..Default::default()
            })
            .await
        {
            Ok(g) => Outcome::Deleted(g),
            Err(e) => refused(&e),
        };
        (Call::Delete { expected }, outcome)
    };
    let answered = shared.now();
    shared.history.lock().unwrap().push(Op {
        key,
        call,
        outcome,
        invoked,
        answered,
    });
}

#[test]
fn histories_of_reads_writes_conditional_writes_and_deletes_under_kill_9_are_linearizable() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shared = Arc::new(Shared {
        origin: Instant::now(),
        values: AtomicU64::new(0),
        history: Mutex::new(Vec::new()),
    });
    let mut kills = 0;
    for life in 0..LIVES {
        let d = Daemon::start_in(dir.path(), &[]);
        let client = rt.block_on(d.sdk()).with_retry(RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (tick, ticks) = std::sync::mpsc::channel::<()>();
        let workers: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (client, shared, stop, tick) =
                    (client.clone(), shared.clone(), stop.clone(), tick.clone());
                rt.spawn(async move {
                    let mut rng: Rng = SplitMix64((life * CLIENTS + c) as u64 + 1);
                    let mut known = [0u64; KEYS];
                    while !stop.load(Ordering::SeqCst) {
                        one_op(&client, &shared, &mut rng, &mut known).await;
                        let _ = tick.send(());
                    }
                })
            })
            .collect();
        drop(tick);
        for _ in 0..OPS_PER_LIFE {
            ticks.recv().expect("the clients run");
        }
        stop.store(true, Ordering::SeqCst);
        let last = life + 1 == LIVES;
        // Operations in flight at the kill get no answer: unknown outcomes.
        let survivor = if last {
            Some(d)
        } else {
            d.kill9();
            kills += 1;
            None
        };
        for w in workers {
            rt.block_on(w).unwrap();
        }
        if let Some(d) = survivor {
            assert!(d.terminate().success());
        }
    }

    let history = shared.history.lock().unwrap().clone();
    let unknown = history
        .iter()
        .filter(|o| o.outcome == Outcome::Unknown)
        .count();
    let written = history
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Written(_)))
        .count();
    let started = Instant::now();
    let checked = linearizability::check(&history).unwrap_or_else(|v| panic!("{v}"));
    eprintln!(
        "linearizable: {} operations on {} keys ({written} writes acknowledged, {unknown} \
         unknown outcomes), {kills} kill -9s, largest memo {} states, checked in {:?}",
        checked.operations,
        checked.keys,
        checked.largest_memo,
        started.elapsed()
    );
    assert_eq!(checked.keys, KEYS);
    assert!(written > 0 && kills == LIVES - 1);
}
