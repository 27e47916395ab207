//! Histories of contended keys under faults, checked for linearizability by the independent
//! checker in `nokv_tests::linearizability` (issue 45).
//!
//! Six clients run reads, upserts, conditional writes (`if_generation`) and deletes, conditional
//! or not, on three keys of one workspace. Every operation is recorded with its invocation and
//! response instants; one that got no answer (a kill, a transport error, a pause, a timeout) is
//! unknown. The whole history is then checked key by key, and the test prints what it
//! checked: operations, keys, faults, unknown outcomes and the largest memo of the search.
//!
//! * The embedded daemon: killed (-9) and restarted on its data dir three times.
//! * A 3-node cluster with provider durability (the cluster default): the workspace's shard
//!   is moved gracefully, its owner is paused (SIGSTOP) past its lease and resumed (another
//!   node fences its log and takes the shard over), then killed (-9), its data dir deleted, and
//!   restarted empty; the clients reach every node and follow the owner hints.
//!
//! `NOKV_LIN_DEBUG=1` prints every error taken as an unknown outcome (why a run stalls).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nokv_client::sdk::RetryPolicy;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use nokv_tests::cluster::{Cluster, ClusterView};
use nokv_tests::linearizability::{self, Call, Op, Outcome, Value};
use nokv_tests::{Daemon, SplitMix64};

const WS: &str = "lin";
const KEYS: usize = 3;
const CLIENTS: usize = 6;
/// Operations (answered or not) per daemon lifetime before the kill.
const OPS_PER_LIFE: usize = 250;
/// Lifetimes: every one but the last ends with kill -9.
const LIVES: usize = 4;
/// An operation not answered within this is unknown: a paused node accepts connections and
/// answers nothing, and the client must not wait for it for ever.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Acknowledged operations between two faults of the cluster run.
const OPS_BETWEEN_FAULTS: usize = 150;

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
        _ => {
            if std::env::var_os("NOKV_LIN_DEBUG").is_some() {
                eprintln!("unknown: {e:?}");
            }
            Outcome::Unknown
        }
    }
}

fn value_of(data: &[u8]) -> Value {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.strip_prefix('v'))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a value no client wrote: {data:?}"))
}

/// `call`, or a transport error once [`OP_TIMEOUT`] passed (an unknown outcome).
async fn within<T>(
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(OP_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(ClientError {
                reason: nokv_client::Reason::Transport,
                code: None,
                message: format!("no answer within {OP_TIMEOUT:?}"),
            })
        })
}

/// One operation against `client`, recorded in `shared`. True if its outcome is known.
async fn one_op(client: &Client, shared: &Shared, rng: &mut Rng, known: &mut [u64]) -> bool {
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
        let outcome = match within(client.read(WS, &key)).await {
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
        let outcome = match within(client.write(write(v, pb::WriteMode::Upsert, 0))).await {
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
        let outcome =
            match within(client.write(write(v, pb::WriteMode::IfGeneration, expected))).await {
                Ok(e) => {
                    known[k] = e.generation;
                    Outcome::Written(e.generation)
                }
                Err(e) => refused(&e),
            };
        (Call::WriteIf { expected, value: v }, outcome)
    } else {
        let expected = if rng.chance(50) { 0 } else { known[k] };
        let outcome = match within(client.delete(pb::DeleteRequest {
            workspace: WS.into(),
            path: key.clone(),
            if_generation: expected,
            ..Default::default()
        }))
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
    outcome != Outcome::Unknown
}

/// Six clients running [`one_op`] until stopped; a tick per operation with a known outcome.
struct Clients {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    ticks: std::sync::mpsc::Receiver<()>,
}

impl Clients {
    fn start(
        rt: &tokio::runtime::Runtime,
        client: &Client,
        shared: &Arc<Shared>,
        seed: u64,
    ) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let (tick, ticks) = std::sync::mpsc::channel::<()>();
        let workers = (0..CLIENTS)
            .map(|c| {
                let (client, shared, stop, tick) =
                    (client.clone(), shared.clone(), stop.clone(), tick.clone());
                rt.spawn(async move {
                    let mut rng: Rng = SplitMix64(seed * CLIENTS as u64 + c as u64 + 1);
                    let mut known = [0u64; KEYS];
                    while !stop.load(Ordering::SeqCst) {
                        if one_op(&client, &shared, &mut rng, &mut known).await {
                            let _ = tick.send(());
                        }
                    }
                })
            })
            .collect();
        Clients {
            stop,
            workers,
            ticks,
        }
    }

    /// Blocks until `n` more operations were answered.
    fn answered(&self, n: usize) {
        for _ in 0..n {
            self.ticks.recv().expect("the clients run");
        }
    }

    /// Tells the clients to stop (operations in flight finish or time out).
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn join(self, rt: &tokio::runtime::Runtime) {
        self.stop();
        for w in self.workers {
            rt.block_on(w).unwrap();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn new_shared() -> Arc<Shared> {
    Arc::new(Shared {
        origin: Instant::now(),
        values: AtomicU64::new(0),
        history: Mutex::new(Vec::new()),
    })
}

/// Checks the history and prints what was checked; panics with the violation.
fn check(shared: &Shared, faults: &str) {
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
    let checked = linearizability::check(&history).unwrap_or_else(|v| {
        if let Some(file) = std::env::var_os("NOKV_LIN_DUMP") {
            let all: Vec<String> = v.ops.iter().map(|o| format!("{o:?}")).collect();
            let _ = std::fs::write(file, all.join("\n"));
        }
        panic!("{v}")
    });
    eprintln!(
        "linearizable: {} operations on {} keys ({written} writes acknowledged, {unknown} \
         unknown outcomes), faults: {faults}; largest memo {} states, checked in {:?}",
        checked.operations,
        checked.keys,
        checked.largest_memo,
        started.elapsed()
    );
    assert_eq!(checked.keys, KEYS);
    assert!(written > 0);
}

#[test]
fn histories_of_reads_writes_conditional_writes_and_deletes_under_kill_9_are_linearizable() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let shared = new_shared();
    for life in 0..LIVES {
        let d = Daemon::start_in(dir.path(), &[]);
        let client = rt.block_on(d.sdk()).with_retry(RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        });
        let clients = Clients::start(&rt, &client, &shared, life as u64);
        clients.answered(OPS_PER_LIFE);
        clients.stop();
        // Operations in flight at the kill get no answer: unknown outcomes.
        let last = life + 1 == LIVES;
        let survivor = if last {
            Some(d)
        } else {
            d.kill9();
            None
        };
        clients.join(&rt);
        if let Some(d) = survivor {
            assert!(d.terminate().success());
        }
    }
    check(
        &shared,
        &format!("{} kill -9s of the embedded daemon", LIVES - 1),
    );
}

#[test]
fn histories_on_a_three_node_provider_durability_cluster_through_a_move_a_pause_past_the_lease_and_a_kill_9_with_its_disk_deleted_are_linearizable()
 {
    let rt = runtime();
    let c = Cluster::new("lin");
    let mut nodes = c.start_nodes(3);
    let ids: Vec<String> = nodes.iter().map(|n| n.id().to_string()).collect();
    c.wait_balanced(&nodes.iter().collect::<Vec<_>>());
    let shard = c.shards_of(&nodes[0], &[WS.to_string()])[0];
    let owner_of = |v: &ClusterView| v.shard(shard).owner.clone().unwrap_or_default();
    let index = |id: &str| ids.iter().position(|i| i == id).expect("a test node");
    let cfg = c.admin_config(&nodes.iter().collect::<Vec<_>>());
    // The SDK's own retries (same request id) are what moves a client from an owner that
    // handed the shard off to the next one; an operation is still one invocation and its
    // final answer.
    let client = rt.block_on(Client::connect(&cfg)).unwrap();
    let shared = new_shared();
    let clients = Clients::start(&rt, &client, &shared, 100);
    clients.answered(OPS_BETWEEN_FAULTS);

    eprintln!(
        "linearizable: {:?} moving the shard",
        shared.origin.elapsed()
    );
    // 1. A graceful move of the workspace's shard to another node.
    let view = c.view().unwrap();
    let from = index(&owner_of(&view));
    let to = (from + 1) % 3;
    let endpoints: Vec<String> = nodes.iter().map(|n| n.endpoint()).collect();
    c.cli(
        &endpoints,
        &["admin", "shard", "move", &shard.to_string(), &ids[to]],
    )
    .assert_ok();
    clients.answered(OPS_BETWEEN_FAULTS);

    eprintln!(
        "linearizable: {:?} pausing the owner",
        shared.origin.elapsed()
    );
    // 2. Its owner paused past its lease, then resumed.
    let owner = index(&owner_of(&c.view().unwrap()));
    c.pause(&nodes[owner]);
    c.wait_until("the paused owner's lease has lapsed", |v| {
        !v.shard(shard).owner_alive || owner_of(v) != ids[owner]
    });
    c.resume(&nodes[owner]);
    c.wait_until("the shard is served again", |v| {
        v.shard(shard).owner_alive && v.shard(shard).state == "serving"
    });
    clients.answered(OPS_BETWEEN_FAULTS);

    eprintln!(
        "linearizable: {:?} killing the owner",
        shared.origin.elapsed()
    );
    // 3. Its owner killed (-9), its data dir deleted, and restarted empty: the shard's state
    // comes back from the provider alone.
    let owner = index(&owner_of(&c.view().unwrap()));
    let spec = c.kill9(nodes.remove(owner));
    std::fs::remove_dir_all(&spec.data_dir).expect("wipe the killed owner's data dir");
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    nodes.insert(owner, c.start(spec));
    c.wait_until("the shard is served again after the kill", |v| {
        v.shard(shard).owner_alive && v.shard(shard).state == "serving"
    });
    clients.answered(OPS_BETWEEN_FAULTS);
    clients.join(&rt);
    check(
        &shared,
        "a shard move, its owner paused past the lease and resumed, its owner killed -9 and its \
         data dir deleted",
    );
}
