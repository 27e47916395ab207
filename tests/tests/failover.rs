//! Crash failover with provider durability (issue 45, "Tests that must exist"): real etcd,
//! moto and three `nokv-server` processes on loopback, in the cluster default
//! `--metadata-durability provider`.
//!
//! * An owner is killed (-9) while eight clients write small files and one publishes
//!   artifacts: the other nodes take its shards over (fencing its log stream and replaying
//!   it), every write a client saw acknowledged reads back identical, every artifact
//!   published before the kill restores identical, and `nokv admin audit` settles to 0
//!   unaccounted on every node — with the dead node's data dir kept, and deleted.
//! * An owner paused (SIGSTOP) past its lease and resumed acknowledges nothing after the
//!   fence: its next segment is refused, it drops its shards, and clients are redirected.
//!
//! Ownership is learned by polling `nokv admin cluster --json` (etcd sends the test no
//! signal); nothing waits by sleeping.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nokv_client::Client;
use nokv_tests::cluster::{Cluster, Node, path_str};
use nokv_tests::{StopOnDrop, pseudo_random_bytes};
use serde_json::Value;

/// Writing clients.
const WRITERS: usize = 8;
/// Acknowledged writes before the kill, and again after the failover.
const WRITES_BEFORE: usize = 120;
const WRITES_AFTER: usize = 120;
/// Two blocks: an artifact is more than one provider write.
const ARTIFACT_LEN: usize = 5 * 1024 * 1024;
/// Bound on one client write: a write that gets no answer counts as unknown (not
/// acknowledged) instead of blocking its writer — and the test — for good.
const WRITE_DEADLINE: Duration = Duration::from_secs(60);
/// Bound on the dead node's shards serving writes again after the kill (a failing failover
/// fails the test with what it saw instead of hanging it).
const RESUME_DEADLINE: Duration = Duration::from_secs(240);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn endpoints(nodes: &[&Node]) -> Vec<String> {
    nodes.iter().map(|n| n.endpoint()).collect()
}

/// A runtime with workers (the client's connections are driven while test threads block on
/// calls) and a client of every node in `nodes`.
fn connect(c: &Cluster, nodes: &[Node]) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(Client::connect(
            &c.admin_config(&nodes.iter().collect::<Vec<_>>()),
        ))
        .expect("connect");
    (rt, client)
}

/// Every acknowledged write reads back byte-identical through `nodes` (on failure, the nodes'
/// last log lines are printed first).
fn assert_read_back(c: &Cluster, nodes: &[Node], acked: &[Acked]) {
    let (rt, client) = connect(c, nodes);
    for a in acked {
        let got = rt
            .block_on(client.read(&a.ws, &a.path))
            .unwrap_or_else(|e| {
                for n in nodes {
                    let log = n.daemon().stderr();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    eprintln!(
                        "--- {} (last lines, newest first)\n{}",
                        n.id(),
                        tail.join("\n")
                    );
                }
                let wall = a
                    .wall
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                panic!(
                    "acknowledged {}:{} is gone: {e:?} (acknowledged at {}.{:03} s since the \
                     epoch)",
                    a.ws,
                    a.path,
                    wall.as_secs(),
                    wall.subsec_millis()
                )
            });
        assert!(
            got.data == a.body,
            "acknowledged {}:{} reads back different bytes",
            a.ws,
            a.path
        );
    }
}

/// A write some client saw acknowledged.
struct Acked {
    at: Instant,
    /// The same moment on the wall clock, to find it in the daemons' logs.
    wall: std::time::SystemTime,
    ws: String,
    path: String,
    body: Vec<u8>,
}

/// Eight clients writing a new file each turn (so an acknowledged file can only ever hold
/// its one body), through every node, with the SDK's retries.
struct Writers {
    stop: Arc<AtomicBool>,
    acks: mpsc::Receiver<Acked>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Writers {
    /// `rt` is the multi-threaded runtime the client was connected on (its connections are
    /// driven by that runtime's workers while these threads block on calls).
    fn start(rt: &tokio::runtime::Runtime, client: &Client, names: &[String]) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, acks) = mpsc::channel();
        let threads = (0..WRITERS)
            .map(|w| {
                let (client, stop, tx) = (client.clone(), stop.clone(), tx.clone());
                let ws = names[w % names.len()].clone();
                let rt = rt.handle().clone();
                thread::spawn(move || {
                    let mut k = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let path = format!("w{w}/{k}.txt");
                        let body = format!("writer {w} write {k} to {ws}").into_bytes();
                        let write = client.write(nokv_proto::v1::WriteRequest {
                            workspace: ws.clone(),
                            path: path.clone(),
                            data: body.clone().into(),
                            ..Default::default()
                        });
                        let written = rt
                            .block_on(async { tokio::time::timeout(WRITE_DEADLINE, write).await });
                        if written.is_err() {
                            // Printed with the failure, if any: a server that never answers
                            // is a finding of its own.
                            eprintln!("failover: {ws}:{path} got no answer in {WRITE_DEADLINE:?}");
                        }
                        if matches!(written, Ok(Ok(_))) {
                            let acked = Acked {
                                at: Instant::now(),
                                wall: std::time::SystemTime::now(),
                                ws: ws.clone(),
                                path,
                                body,
                            };
                            if tx.send(acked).is_err() {
                                return;
                            }
                        }
                        k += 1;
                    }
                })
            })
            .collect();
        Writers {
            stop,
            acks,
            threads,
        }
    }

    /// Blocks until `n` more writes were acknowledged; returns them.
    fn take(&self, n: usize) -> Vec<Acked> {
        (0..n)
            .map(|_| {
                self.acks
                    .recv_timeout(Duration::from_secs(120))
                    .expect("the writers make progress")
            })
            .collect()
    }

    fn finish(mut self) -> Vec<Acked> {
        self.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.threads) {
            t.join().unwrap();
        }
        self.acks.try_iter().collect()
    }
}

impl Drop for Writers {
    /// A failing test stops its writers too (they would otherwise write until the process
    /// ends).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Publishes artifacts one after the other through the CLI until told to stop; returns
/// those whose publish succeeded (workspace, path, bytes).
fn publisher(
    c: &Cluster,
    via: Vec<String>,
    ws: String,
    stop: &AtomicBool,
) -> Vec<(String, String, Vec<u8>)> {
    let mut published = Vec::new();
    let mut k = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let bytes = pseudo_random_bytes(9000 + k, ARTIFACT_LEN);
        let src = c.root().join(format!("pub-{k}.bin"));
        std::fs::write(&src, &bytes).unwrap();
        let path = format!("art/{k}.bin");
        let out = c.cli(
            &via,
            &["publish", "-q", path_str(&src), &format!("{ws}:{path}")],
        );
        if out.status == 0 {
            published.push((ws.clone(), path, bytes));
        }
        std::fs::remove_file(&src).unwrap();
        k += 1;
    }
    published
}

/// Every node's audit: 0 unaccounted and 0 violations, polled (bounded) while the
/// reconcilers settle — nothing signals the end of a pass.
fn assert_audits_settle(c: &Cluster, nodes: &[&Node]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let audits: Vec<Value> = nodes
            .iter()
            .map(|n| {
                let out = c.cli(&[n.endpoint()], &["--json", "admin", "audit"]);
                serde_json::from_slice(&out.assert_ok().stdout).expect("audit JSON")
            })
            .collect();
        let bad = audits
            .iter()
            .any(|a| a["unaccounted"] != 0 || a["violations"] != 0);
        if !bad {
            eprintln!("failover: audits settled: {audits:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the audits never settled: {audits:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// The provider fault schedule of the chaos variant (`NOKV_TEST_FAULTS`): creates refused
/// before sending and creates landing with their answer lost — log segments, blocks and
/// checkpoints alike. `NOKV_CHAOS_SEED` picks the seed (`scripts/chaos.sh` runs many).
fn provider_faults() -> String {
    let seed = std::env::var("NOKV_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(45);
    format!("seed={seed},refuse=10,lose=10")
}

fn kill_owner_while_writing_and_publishing(wipe: bool) {
    kill_owner_under(wipe, None)
}

fn kill_owner_under(wipe: bool, faults: Option<&str>) {
    let _turn = serial();
    let name = match (wipe, faults.is_some()) {
        (_, true) => "failchaos",
        (true, false) => "failwipe",
        (false, false) => "failover",
    };
    let mut c = Cluster::new(name);
    if let Some(schedule) = faults {
        eprintln!("failover: provider faults {schedule}");
        c = c.with_node_env("NOKV_TEST_FAULTS", schedule);
    }
    let mut nodes = c.start_nodes(3);
    let view = c.wait_balanced(&nodes.iter().collect::<Vec<_>>());
    let victim_id = nodes[1].id().to_string();
    let victim_shards = view.served_by(&victim_id);
    // Writers on the victim's shards and on the others'.
    let other = view.served_by(nodes[0].id())[0];
    let mut shards = victim_shards.clone();
    shards.push(other);
    let names = c.workspaces_in_shards(&nodes[0], "fo", &shards, 1);
    let artifact_ws = names[0].clone();

    let all_endpoints = endpoints(&nodes.iter().collect::<Vec<_>>());
    let (rt, client) = connect(&c, &nodes);
    let writers = Writers::start(&rt, &client, &names);
    let stop_publishing = AtomicBool::new(false);
    let (acked, published_before, published_after, failover) = thread::scope(|s| {
        let via = all_endpoints.clone();
        let publishing = s.spawn(|| publisher(&c, via, artifact_ws.clone(), &stop_publishing));
        let _stop = StopOnDrop(&stop_publishing);
        let mut acked = writers.take(WRITES_BEFORE);
        // One committed artifact at least before the kill, and one in flight across it.
        let first = Instant::now();
        while c
            .cli(
                &all_endpoints,
                &["--json", "ls", &format!("{artifact_ws}:art/")],
            )
            .stdout_str()
            .matches(".bin")
            .count()
            < 1
        {
            assert!(
                first.elapsed() < Duration::from_secs(120),
                "nothing published"
            );
            thread::sleep(Duration::from_millis(100));
        }
        let listed = c
            .cli(
                &all_endpoints,
                &["--json", "ls", &format!("{artifact_ws}:art/")],
            )
            .stdout_str();

        let victim = nodes.remove(1);
        let spec = c.kill9(victim);
        let killed = Instant::now();
        if wipe {
            std::fs::remove_dir_all(&spec.data_dir).expect("delete the dead node's data dir");
        }
        eprintln!("failover: killed {victim_id} (data dir deleted: {wipe})");
        c.wait_until("every shard is served by a live node", |v| {
            (0..16).all(|s| {
                let shard = v.shard(s);
                shard.owner.as_deref() != Some(victim_id.as_str())
                    && shard.owner_alive
                    && shard.state == "serving"
            })
        });
        // Writes resumed on every one of the dead node's shards: take acknowledgements until
        // each of its workspaces has had WRITES_AFTER / names more since the kill.
        let shard_of: BTreeMap<String, u32> = names
            .iter()
            .cloned()
            .zip(c.shards_of(&nodes[0], &names))
            .collect();
        let on_victim = |ws: &str| victim_shards.contains(&shard_of[ws]);
        let mut since: BTreeMap<String, usize> = BTreeMap::new();
        let mut after = Vec::new();
        while names
            .iter()
            .filter(|ws| on_victim(ws))
            .any(|ws| since.get(ws).copied().unwrap_or(0) < WRITES_AFTER / names.len())
        {
            assert!(
                killed.elapsed() < RESUME_DEADLINE,
                "the dead node's workspaces did not resume writing within {RESUME_DEADLINE:?}: \
                 acknowledged since the kill per workspace {since:?}, victim shards {victim_shards:?}"
            );
            let a = writers.take(1).pop().expect("one");
            if a.at > killed {
                *since.entry(a.ws.clone()).or_default() += 1;
            }
            after.push(a);
        }
        // The first write acknowledged on one of the dead node's shards after the kill.
        let failover = after
            .iter()
            .filter(|a| on_victim(&a.ws) && a.at > killed)
            .map(|a| a.at - killed)
            .min();
        acked.extend(after);
        stop_publishing.store(true, Ordering::SeqCst);
        let published = publishing.join().unwrap();
        // Split by what the listing before the kill showed as committed.
        let (before, after): (Vec<_>, Vec<_>) = published
            .into_iter()
            .partition(|(_, path, _)| listed.contains(path.as_str()));
        (acked, before, after, failover)
    });
    let mut acked = acked;
    acked.extend(writers.finish());
    eprintln!(
        "failover: {} writes acknowledged, {} artifacts committed before the kill and {} after, \
         first write on a dead node's shard acknowledged {:?} after the kill",
        acked.len(),
        published_before.len(),
        published_after.len(),
        failover
    );
    assert!(
        failover.is_some(),
        "no write on the dead node's shards was acknowledged after the kill"
    );
    assert!(!published_before.is_empty());

    assert_read_back(&c, &nodes, &acked);
    let live: Vec<&Node> = nodes.iter().collect();
    for (n, (ws, path, bytes)) in published_before.iter().chain(&published_after).enumerate() {
        let dest = c.root().join(format!("restored-{n}.bin"));
        c.cli(
            &endpoints(&live),
            &["restore", "-q", &format!("{ws}:{path}"), path_str(&dest)],
        )
        .assert_ok();
        assert!(
            std::fs::read(&dest).unwrap() == *bytes,
            "artifact {ws}:{path} restores different bytes"
        );
    }
    assert_audits_settle(&c, &live);
}

#[test]
fn a_killed_owners_shards_are_taken_over_with_every_acknowledged_write_and_committed_artifact() {
    kill_owner_while_writing_and_publishing(false);
}

#[test]
fn a_killed_owners_shards_are_taken_over_with_nothing_lost_even_after_its_data_dir_is_deleted() {
    kill_owner_while_writing_and_publishing(true);
}

// The chaos schedule of issue 45: kill -9 + wipe while every provider create (segments
// included) may be refused before sending or land with its answer lost.
#[test]
fn a_killed_and_wiped_owner_loses_nothing_while_segment_puts_fail_or_lose_their_answers() {
    kill_owner_under(true, Some(&provider_faults()));
}

/// Live segments per log stream in the bucket (`<prefix>/meta/log/<stream>/<first>`).
fn segments_per_stream(c: &Cluster) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for key in c.moto().list_keys(c.bucket(), "nokv/meta/log/") {
        let stream = key.rsplit('/').nth(1).unwrap_or_default().to_string();
        *out.entry(stream).or_default() += 1;
    }
    out
}

fn health(c: &Cluster, node: &Node) -> Value {
    let out = c.cli(&[node.endpoint()], &["--json", "admin", "health"]);
    serde_json::from_slice(&out.assert_ok().stdout).expect("health JSON")
}

#[test]
fn checkpoints_keep_each_log_stream_bounded_and_a_takeover_replays_only_the_tail() {
    let _turn = serial();
    // Checkpoints every 16 KiB of a shard's log: many compactions in a short run.
    let c = Cluster::new("compact").with_node_flags(&["--checkpoint-log-bytes", "16KiB"]);
    let mut nodes = c.start_nodes(3);
    let view = c.wait_balanced(&nodes.iter().collect::<Vec<_>>());
    let victim_id = nodes[1].id().to_string();
    let victim_shards = view.served_by(&victim_id);
    let names = c.workspaces_in_shards(&nodes[0], "cp", &victim_shards, 1);
    let (rt, client) = connect(&c, &nodes);
    let writers = Writers::start(&rt, &client, &names);
    let mut acked = Vec::new();
    // Live segments per stream, sampled every 250 acknowledged writes: once compaction runs,
    // the count levels off while the segments created keep growing.
    let mut samples = Vec::new();
    for _ in 0..32 {
        acked.extend(writers.take(250));
        let live = segments_per_stream(&c);
        samples.push(live.values().copied().max().unwrap_or(0));
    }
    let largest = samples.iter().copied().max().unwrap_or(0);
    let late = samples[16..].iter().copied().max().unwrap_or(0);
    let created: u64 = nodes
        .iter()
        .map(|n| {
            health(&c, n)["log_segments"]
                .as_u64()
                .expect("log_segments")
        })
        .sum();
    let victim_health = health(&c, &nodes[1]);
    let victim_stream = victim_health["log_stream"].as_str().unwrap().to_string();
    let victim_live = segments_per_stream(&c)
        .get(&victim_stream)
        .copied()
        .unwrap_or(0);
    eprintln!(
        "compaction: {} writes acknowledged, {created} segments created, largest live count \
         of one stream {largest} (second half {late}; samples {samples:?}), the victim's \
         stream {victim_stream} holds {victim_live} of its {} (PUTs {}, {:.1}/s)",
        acked.len(),
        victim_health["log_segments"],
        victim_health["log_puts"],
        victim_health["log_puts_per_s"].as_f64().unwrap_or(0.0),
    );
    // Without compaction every segment created would still be there, and the count would
    // keep growing through the second half.
    assert!(
        (late as u64) * 3 < created,
        "the log was not compacted: {late} live segments in one stream of {created} created"
    );

    // A takeover reads the victim's stream from its shards' log starts: the live tail only.
    let victim = nodes.remove(1);
    let spec = c.kill9(victim);
    std::fs::remove_dir_all(&spec.data_dir).unwrap();
    c.wait_until("every shard is served by a live node", |v| {
        (0..16).all(|s| {
            let shard = v.shard(s);
            shard.owner.as_deref() != Some(victim_id.as_str())
                && shard.owner_alive
                && shard.state == "serving"
        })
    });
    acked.extend(writers.finish());
    c.wait_loaded(&nodes.iter().collect::<Vec<_>>());
    assert_read_back(&c, &nodes, &acked);
}

/// A single node with provider durability on moto, in `dir` (restarted by calling again).
fn single_node(dir: &std::path::Path, moto: &nokv_tests::Moto) -> nokv_tests::Daemon {
    let endpoint = moto.endpoint();
    let args = [
        "--provider",
        "s3",
        "--s3-endpoint",
        endpoint.as_str(),
        "--s3-bucket",
        "single",
        "--metadata-durability",
        "provider",
        // Compaction after every few writes: the rebuild must work from a moved log start.
        "--checkpoint-log-bytes",
        "2KiB",
    ];
    nokv_tests::Daemon::start_in_with_env(
        dir,
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    )
}

// Catches: a single node that acknowledges writes its bucket cannot give back (a rebuild that
// skips the log, or a start that names a new stream before checkpointing every shard).
#[test]
fn a_single_node_with_provider_durability_is_rebuilt_from_the_bucket_on_an_empty_data_dir() {
    let moto = nokv_tests::Moto::start();
    moto.create_bucket("single");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = single_node(&data, &moto);
    let health = d.cli(&["--json", "admin", "health"]).json();
    assert_eq!(health["metadata_durability"], "provider");
    let files: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("ws{}:notes/{i}.txt", i % 5),
                format!("note {i}\n").into_bytes(),
            )
        })
        .collect();
    for (path, body) in &files {
        d.cli_stdin(&["put", path], body).assert_ok();
    }
    d.cli(&["rm", "ws0:notes/0.txt"]).assert_ok();
    let artifact = pseudo_random_bytes(45, 5 * 1024 * 1024);
    let src = dir.path().join("a.bin");
    std::fs::write(&src, &artifact).unwrap();
    d.cli(&["publish", "-q", path_str(&src), "ws1:art/a.bin"])
        .assert_ok();
    // Compaction ran (a later manifest generation than the start's first one): polled, the
    // node signals nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while moto
        .list_keys("single", "nokv/meta/node/")
        .iter()
        .all(|k| k.ends_with("/00000000000000000001"))
    {
        assert!(std::time::Instant::now() < deadline, "no compaction ran");
        thread::sleep(Duration::from_millis(100));
    }
    d.kill9();

    // The disk is lost: a new data dir, the same bucket.
    std::fs::remove_dir_all(&data).unwrap();
    let d = single_node(&data, &moto);
    let check = |d: &nokv_tests::Daemon| {
        for (path, body) in &files[1..] {
            let got = d.cli(&["get", path]);
            assert!(
                got.assert_ok().stdout == *body,
                "{path} differs after the rebuild"
            );
        }
        d.cli(&["stat", "ws0:notes/0.txt"])
            .assert_fails_with("NotFound");
        let dest = dir.path().join("restored.bin");
        let _ = std::fs::remove_file(&dest);
        d.cli(&["restore", "-q", "ws1:art/a.bin", path_str(&dest)])
            .assert_ok();
        assert!(
            std::fs::read(&dest).unwrap() == artifact,
            "the artifact differs"
        );
    };
    check(&d);
    // Written after the rebuild, then a restart on the kept data dir and a second rebuild.
    d.cli_stdin(&["put", "ws2:after.txt"], b"after").assert_ok();
    d.kill9();
    let d = single_node(&data, &moto);
    check(&d);
    d.kill9();
    std::fs::remove_dir_all(&data).unwrap();
    let d = single_node(&data, &moto);
    check(&d);
    assert_eq!(
        d.cli(&["get", "ws2:after.txt"]).assert_ok().stdout,
        b"after"
    );
    let audit = d.cli(&["--json", "admin", "audit"]).json();
    assert_eq!(
        (audit["unaccounted"].as_u64(), audit["violations"].as_u64()),
        (Some(0), Some(0)),
        "{audit}"
    );
    assert_eq!(audit["node_manifests"].as_u64(), Some(1), "{audit}");
}

// Catches: a deposed owner that keeps its stream (it would write past the fence) or keeps
// serving its old shards after it resumes.
#[test]
fn an_owner_paused_past_its_lease_is_fenced_and_resumes_on_a_new_stream_without_its_shards() {
    let _turn = serial();
    let c = Cluster::new("deposed");
    let nodes = c.start_nodes(3);
    let view = c.wait_balanced(&nodes.iter().collect::<Vec<_>>());
    let victim = &nodes[1];
    let victim_id = victim.id().to_string();
    let victim_shards = view.served_by(&victim_id);
    let ws = c.workspaces_in_shards(&nodes[0], "dep", &victim_shards[..1], 1)[0].clone();
    c.cli_stdin(
        &[victim.endpoint()],
        &["put", &format!("{ws}:before.txt")],
        Some(b"before"),
    )
    .assert_ok();
    let old_stream = health(&c, victim)["log_stream"]
        .as_str()
        .unwrap()
        .to_string();

    c.pause(victim);
    c.wait_until("the paused node's shards are served by the others", |v| {
        victim_shards.iter().all(|&s| {
            let shard = v.shard(s);
            shard.owner.as_deref() != Some(victim_id.as_str())
                && shard.owner_alive
                && shard.state == "serving"
        })
    });
    // The takers fenced its stream: its last segment is a fence (kind byte 2 after the magic).
    // A taker records itself the owner before it loads the shard (fence, replay), so the view
    // can show the new owner a moment before the fence exists: polled, bounded.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let keys = c
            .moto()
            .list_keys(c.bucket(), &format!("nokv/meta/log/{old_stream}/"));
        let last = keys.last().expect("the paused node's stream has segments");
        let (status, bytes) = c.moto().s3("GET", &format!("/{}/{last}", c.bucket()), b"");
        assert_eq!(status, 200);
        assert_eq!(&bytes[..8], b"NKVLOGS1", "{last} is not a log segment");
        if bytes[8] == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{last} is not a fence: the takers never fenced the paused node's stream"
        );
        thread::sleep(Duration::from_millis(100));
    }

    // Once no record names the fenced stream, a sweep deletes it — all but the fence, which a
    // paused writer must still collide with (polled: the sweep runs every 30 passes).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let keys = c
            .moto()
            .list_keys(c.bucket(), &format!("nokv/meta/log/{old_stream}/"));
        assert!(
            !keys.is_empty(),
            "the sweep deleted the fenced stream's fence: a resumed writer could write past it"
        );
        if keys.len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fenced stream was never swept: {keys:?}"
        );
        thread::sleep(Duration::from_millis(250));
    }

    c.resume(victim);
    // It rejoins under a new incarnation (a new stream) and serves none of its old shards at
    // their old epochs; polled, nothing signals the rejoin.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = health(&c, victim);
        if h["log_stream"].as_str() != Some(old_stream.as_str()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the resumed node kept its fenced stream"
        );
        thread::sleep(Duration::from_millis(100));
    }
    // A write sent to it is redirected to the new owner and reads back everywhere.
    c.cli_stdin(
        &[victim.endpoint()],
        &["put", &format!("{ws}:after.txt")],
        Some(b"after"),
    )
    .assert_ok();
    for n in &nodes {
        for (path, body) in [("before.txt", &b"before"[..]), ("after.txt", &b"after"[..])] {
            let got = c.cli(&[n.endpoint()], &["get", &format!("{ws}:{path}")]);
            assert!(got.assert_ok().stdout == body, "{path} via {}", n.id());
        }
    }
}
