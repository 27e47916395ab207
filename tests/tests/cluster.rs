//! Cluster mode end to end (issue 10, "Tests that must exist"): real etcd, moto and several
//! `nokv-server` processes on loopback, driven only through the `nokv` CLI (and, for a cached
//! route, the SDK). The harness is `nokv_tests::cluster`; tests learn ownership by polling
//! `nokv admin cluster --json`, never by sleeping.
//!
//! Balance arithmetic the tests rely on: 16 shards over three nodes is 6/5/5, so moving one
//! shard from a node with 6 to a node with 5 leaves the spread balanced and the balancer has
//! no reason to move it again behind the test's back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nokv_tests::cluster::{Cluster, ClusterView, Node, path_str};
use nokv_tests::pseudo_random_bytes;
use serde_json::Value;

/// Artifact size: more than the inline limit would need, one 4 MiB block, small enough to
/// keep 20 workspaces quick.
const ARTIFACT_LEN: usize = 96 * 1024;
/// Bound on waiting for the client loop to report progress (a wedged loop fails the test).
const LOOP_PROGRESS_DEADLINE: Duration = Duration::from_secs(120);

/// One cluster test at a time: three nodes with 3 s leases per test is load enough for two
/// cores; two clusters at once would make lapsed keep-alives (and so spurious handoffs) likely.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the [`SERIAL`] turn (a failed test before this one does not poison the rest).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a test wrote to one workspace and expects to read back byte for byte.
struct Written {
    ws: String,
    file: Vec<u8>,
    artifact: Vec<u8>,
}

/// Puts a small file (`notes/a.txt`) and publishes an artifact (`art/blob.bin`) in `ws`
/// through exactly `via`; both must be acknowledged.
fn write_workspace(c: &Cluster, via: &[String], ws: &str, seed: u64) -> Written {
    let file = format!("small file of {ws}, seed {seed}\n").into_bytes();
    c.cli_stdin(via, &["put", &format!("{ws}:notes/a.txt")], Some(&file))
        .assert_ok();
    let artifact = pseudo_random_bytes(seed, ARTIFACT_LEN);
    let src = c.root().join(format!("src-{ws}-{seed}.bin"));
    std::fs::write(&src, &artifact).unwrap();
    c.cli(
        via,
        &[
            "publish",
            "-q",
            path_str(&src),
            &format!("{ws}:art/blob.bin"),
        ],
    )
    .assert_ok();
    std::fs::remove_file(&src).unwrap();
    Written {
        ws: ws.to_string(),
        file,
        artifact,
    }
}

/// Reads `w` back through exactly `via`: `get` of the file and `restore` of the artifact, both
/// byte-identical to what was acknowledged.
#[track_caller]
fn assert_reads_back(c: &Cluster, via: &[String], w: &Written) {
    static RESTORES: AtomicU64 = AtomicU64::new(0);
    let got = c.cli(via, &["get", &format!("{}:notes/a.txt", w.ws)]);
    assert!(
        got.assert_ok().stdout == w.file,
        "file of {} differs through {via:?}",
        w.ws
    );
    let n = RESTORES.fetch_add(1, Ordering::Relaxed);
    let dest = c.root().join(format!("restore-{}-{n}.bin", w.ws));
    c.cli(
        via,
        &[
            "restore",
            "-q",
            &format!("{}:art/blob.bin", w.ws),
            path_str(&dest),
        ],
    )
    .assert_ok();
    let restored = std::fs::read(&dest).unwrap();
    assert!(
        restored == w.artifact,
        "artifact of {} differs through {via:?} ({} bytes restored, {} written)",
        w.ws,
        restored.len(),
        w.artifact.len()
    );
    std::fs::remove_file(&dest).unwrap();
}

fn refs(nodes: &[Node]) -> Vec<&Node> {
    nodes.iter().collect()
}

fn only(node: &Node) -> Vec<String> {
    vec![node.endpoint()]
}

fn all(nodes: &[&Node]) -> Vec<String> {
    nodes.iter().map(|n| n.endpoint()).collect()
}

/// A node serving 6 shards and one serving 5 in a balanced three-node view (see the module
/// doc): moving a shard from the first to the second keeps the cluster balanced.
fn six_and_five<'a>(view: &ClusterView, nodes: &'a [Node]) -> (&'a Node, &'a Node) {
    let counts = view.counts();
    let with = |k: usize| {
        nodes
            .iter()
            .find(|n| counts.get(n.id()) == Some(&k))
            .unwrap_or_else(|| panic!("no node serves {k} shards:\n{view}"))
    };
    (with(6), with(5))
}

/// `(shard, owned, entries)` of every shard a node's `admin health --json` lists.
fn health_shards(health: &Value) -> Vec<(u64, bool, u64)> {
    health["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("health has no shards: {health}"))
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().expect("shard"),
                s["owned"].as_bool().expect("owned"),
                s["entries"].as_u64().expect("entries"),
            )
        })
        .collect()
}

/// Whether a node's health lists `shard` as owned.
fn owns(health: &Value, shard: u32) -> bool {
    health_shards(health)
        .iter()
        .any(|&(s, owned, _)| s == u64::from(shard) && owned)
}

/// `nokv admin shard move S NODE`, sent to the shard's current owner `from`; it answers once
/// NODE serves the shard.
fn move_shard(c: &Cluster, from: &Node, shard: u32, to: &Node) -> Value {
    c.cli(
        &only(from),
        &[
            "--json",
            "admin",
            "shard",
            "move",
            &shard.to_string(),
            to.id(),
        ],
    )
    .assert_ok()
    .json()
}

#[test]
fn three_nodes_spread_16_shards_5_or_6_each_and_put_get_publish_restore_on_20_workspaces_work_through_any_single_endpoint()
 {
    let _turn = serial();
    let c = Cluster::new("spread");
    let nodes = c.start_nodes(3);
    let view = c.wait_balanced(&refs(&nodes));
    for n in &nodes {
        let served = view.served_by(n.id()).len();
        assert!(
            (5..=6).contains(&served),
            "{} serves {served}:\n{view}",
            n.id()
        );
        assert!(
            view.nodes
                .iter()
                .any(|v| v.id == n.id() && v.endpoint == n.endpoint() && v.alive),
            "{} listed with its advertised endpoint:\n{view}",
            n.id()
        );
    }
    assert_eq!(view.cluster.as_deref(), Some("spread"));

    let names: Vec<String> = (0..20).map(|i| format!("spread-{i}")).collect();
    // The workspaces land on shards of every node, so each single endpoint is a non-owner for
    // some of them and the CLI must follow hints.
    let owners: std::collections::BTreeSet<String> = c
        .shards_of(&nodes[0], &names)
        .into_iter()
        .filter_map(|s| view.shard(s).owner.clone())
        .collect();
    assert_eq!(owners.len(), 3, "owners of the 20 workspaces: {owners:?}");

    let mut written = Vec::new();
    for (i, ws) in names.iter().enumerate() {
        let w = write_workspace(&c, &only(&nodes[i % 3]), ws, i as u64);
        assert_reads_back(&c, &only(&nodes[(i + 1) % 3]), &w);
        written.push(w);
    }
    for (i, w) in written.iter().enumerate() {
        assert_reads_back(&c, &only(&nodes[(i + 2) % 3]), w);
    }
}

#[test]
fn sigterm_on_a_node_hands_its_shards_to_the_others_while_a_client_loop_through_another_node_sees_no_failed_operation()
 {
    let _turn = serial();
    let c = Cluster::new("drain");
    let mut nodes = c.start_nodes(3);
    let before = c.wait_balanced(&refs(&nodes));
    let victim = nodes.pop().expect("three nodes");
    let victim_shards = before.served_by(victim.id());
    assert!(!victim_shards.is_empty(), "{before}");
    let via = only(&nodes[0]);

    // Workspaces on the victim's shards (they move) and on the others' (they stay).
    let names: Vec<String> = (0..48).map(|i| format!("drain-{i}")).collect();
    let shards = c.shards_of(&nodes[0], &names);
    let (on_victim, elsewhere): (Vec<_>, Vec<_>) = names
        .iter()
        .zip(&shards)
        .partition(|(_, s)| victim_shards.contains(s));
    let on_victim: Vec<String> = on_victim
        .into_iter()
        .take(5)
        .map(|(w, _)| w.clone())
        .collect();
    let elsewhere: Vec<String> = elsewhere
        .into_iter()
        .take(3)
        .map(|(w, _)| w.clone())
        .collect();
    assert!(
        on_victim.len() >= 3,
        "workspaces on the victim's shards: {on_victim:?}"
    );
    let written: Vec<Written> = on_victim
        .iter()
        .chain(&elsewhere)
        .enumerate()
        .map(|(i, ws)| write_workspace(&c, &via, ws, 1000 + i as u64))
        .collect();

    // The loop writes and reads back small files through node 1 alone, mostly in workspaces
    // whose shard is about to move.
    let loop_ws: Vec<String> = on_victim[..3]
        .iter()
        .chain(&elsewhere[..1])
        .cloned()
        .collect();
    let stop = AtomicBool::new(false);
    let (progress, rounds) = mpsc::channel::<()>();
    let (ops, failures, longest, after) = thread::scope(|s| {
        let looper = s.spawn(|| {
            let mut failures = Vec::new();
            let mut longest = Duration::ZERO;
            let mut k = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let ws = &loop_ws[k % loop_ws.len()];
                let target = format!("{ws}:loop/{k}.txt");
                let body = format!("loop write {k} to {ws}");
                let t = Instant::now();
                let put = c.cli_stdin(&via, &["put", &target], Some(body.as_bytes()));
                longest = longest.max(t.elapsed());
                if put.status != 0 {
                    failures.push(format!("put {target}: {}", put.stderr.trim()));
                }
                let t = Instant::now();
                let get = c.cli(&via, &["get", &target]);
                longest = longest.max(t.elapsed());
                if get.status != 0 || get.stdout != body.as_bytes() {
                    failures.push(format!(
                        "get {target}: exit {} {:?} stderr {}",
                        get.status,
                        get.stdout_str(),
                        get.stderr.trim()
                    ));
                }
                k += 1;
                // The receiver is gone only once the test stopped waiting for rounds.
                let _ = progress.send(());
            }
            (k, failures, longest)
        });
        let _stop = nokv_tests::StopOnDrop(&stop);
        let round = |what: &str| {
            rounds
                .recv_timeout(LOOP_PROGRESS_DEADLINE)
                .unwrap_or_else(|e| panic!("client loop made no progress {what}: {e}"));
        };
        for _ in 0..4 {
            round("before SIGTERM");
        }
        let (status, _spec, log) = c.terminate(victim);
        assert!(
            status.success(),
            "SIGTERMed node exited {status}\nits log:\n{log}"
        );
        let after = c.wait_until(
            "the victim gone and its shards served by the two others, balanced",
            |v| !v.node_alive("n3") && v.balanced_over(&["n1", "n2"]),
        );
        // Some rounds against the new owners before the loop stops.
        for _ in 0..4 {
            round("after the handoff");
        }
        stop.store(true, Ordering::SeqCst);
        let (ops, failures, longest) = looper.join().expect("client loop");
        (ops, failures, longest, after)
    });

    println!("client loop: {ops} rounds of put + get");
    println!("longest stall: {} ms", longest.as_millis());
    assert!(
        failures.is_empty(),
        "the client loop saw failed operations ({} of {ops} rounds):\n{}",
        failures.len(),
        failures.join("\n")
    );
    for s in &victim_shards {
        let (was, now) = (before.shard(*s), after.shard(*s));
        assert!(now.epoch > was.epoch, "shard {s}: {was:?} -> {now:?}");
        assert!(
            now.checkpoint_size.is_some(),
            "shard {s} moved through a recorded checkpoint: {now:?}"
        );
    }
    for w in &written {
        assert_reads_back(&c, &only(&nodes[1]), w);
    }
}

#[test]
fn an_owner_paused_past_its_lease_loses_the_shard_to_a_node_that_takes_it_from_the_checkpoint_and_after_resuming_acknowledges_nothing_for_it()
 {
    let _turn = serial();
    let c = Cluster::new("fence");
    let nodes = c.start_nodes(3);
    let view = c.wait_balanced(&refs(&nodes));
    let (source, victim) = six_and_five(&view, &nodes);
    let shard = view.served_by(source.id())[0];
    let ws = c.workspaces_in_shard(source, "fence", shard, 1).remove(0);
    let written = write_workspace(&c, &only(source), &ws, 7);

    // The shard reaches the victim through a graceful move (checkpoint recorded), and nothing
    // is written through the victim afterwards: the checkpoint is the shard's whole state.
    let e0 = view.shard(shard).epoch;
    let answer = move_shard(&c, source, shard, victim);
    assert_eq!(answer["node"], victim.id(), "{answer}");
    let moved = c.wait_until("the shard served by the victim", |v| {
        v.shard(shard).served_by(victim.id()) && v.shard(shard).epoch > e0
    });
    let e1 = moved.shard(shard).epoch;
    assert_eq!(answer["epoch"].as_u64(), Some(e1), "{answer}\n{moved}");
    assert!(moved.shard(shard).checkpoint_size.is_some(), "{moved}");
    // The victim really serves it (its own health lists it), before the pause.
    c.wait_until_health(victim, "the victim lists the moved shard", |h| {
        owns(h, shard)
    });

    c.pause(victim);
    c.wait_until("the paused owner's lease has lapsed", |v| {
        let s = v.shard(shard);
        !s.owner_alive || s.owner.as_deref() != Some(victim.id())
    });
    let taken = c.wait_until("another node serves the shard", |v| {
        let s = v.shard(shard);
        s.owner.as_deref() != Some(victim.id()) && s.state == "serving" && s.owner_alive
    });
    let s = taken.shard(shard);
    assert_eq!(
        s.epoch,
        e1 + 1,
        "taken from the checkpoint at epoch + 1: {s:?}"
    );
    let new_owner = nodes
        .iter()
        .find(|n| s.owner.as_deref() == Some(n.id()))
        .unwrap_or_else(|| panic!("owner of shard {shard} is no test node:\n{taken}"));
    assert_reads_back(&c, &only(new_owner), &written);
    c.cli_stdin(
        &only(new_owner),
        &["put", &format!("{ws}:after.txt")],
        Some(b"written through the new owner"),
    )
    .assert_ok();

    c.resume(victim);
    // Sent to the old owner alone: answered through its hint by the new owner.
    c.cli_stdin(
        &only(victim),
        &["put", &format!("{ws}:late.txt")],
        Some(b"sent to the old owner after it resumed"),
    )
    .assert_ok();
    let health = c.health(victim);
    assert!(
        !owns(&health, shard),
        "the resumed old owner lists shard {shard} as owned: {health}"
    );

    // The new owner has everything: what came through the checkpoint, what it acknowledged,
    // and the write the old owner passed on.
    for (path, body) in [
        ("after.txt", &b"written through the new owner"[..]),
        ("late.txt", &b"sent to the old owner after it resumed"[..]),
    ] {
        let got = c.cli(&only(new_owner), &["get", &format!("{ws}:{path}")]);
        assert_eq!(got.assert_ok().stdout, body, "{path}");
    }
    assert_reads_back(&c, &only(new_owner), &written);
    let ls = c.cli(&only(new_owner), &["--json", "ls", &format!("{ws}:")]);
    ls.assert_ok();
    let listing = ls.stdout_str();
    for path in ["notes/a.txt", "art/blob.bin", "after.txt", "late.txt"] {
        assert!(listing.contains(path), "{path} missing: {listing}");
    }
}

#[test]
fn under_local_durability_a_node_killed_with_sigkill_leaves_its_shards_unowned_until_it_restarts_on_its_data_dir_and_takes_them_back_at_higher_epochs_with_every_acknowledged_write()
 {
    let _turn = serial();
    // Local durability: the dead node's disk is the only copy of what it acknowledged.
    let c = Cluster::new("crash").with_node_flags(&["--metadata-durability", "local"]);
    let mut nodes = c.start_nodes(3);
    let before = c.wait_balanced(&refs(&nodes));
    let victim = nodes.remove(1);
    let victim_id = victim.id().to_string();
    let victim_shards = before.served_by(&victim_id);

    // Every shard of the victim acknowledges a write after it arrived there (through its
    // checkpoint), so none is clean: a clean shard of a lapsed owner may be taken from its
    // checkpoint (the fencing test), a written one must wait for its node.
    let mut names = c.workspaces_in_shards(&nodes[0], "crash", &victim_shards, 1);
    names.extend((0..4).map(|i| format!("crash-other-{i}")));
    let written: Vec<Written> = names
        .iter()
        .enumerate()
        .map(|(i, ws)| write_workspace(&c, &only(&nodes[0]), ws, 2000 + i as u64))
        .collect();

    let spec = c.kill9(victim);
    // A move to the dead node is answered at once, naming it (not after a handoff nobody
    // completes). Still listed until its lease lapses, it is found down by a connect; after
    // that it is not a member.
    let mine = before.served_by(nodes[0].id())[0];
    let started = Instant::now();
    let out = c.cli(
        &only(&nodes[0]),
        &["admin", "shard", "move", &mine.to_string(), &victim_id],
    );
    eprintln!(
        "move to the killed node answered in {:?}: {}",
        started.elapsed(),
        out.stderr.trim()
    );
    assert_ne!(out.status, 0, "{}", out.stderr);
    assert!(
        (out.stderr.contains("FailedPrecondition") && out.stderr.contains("is down"))
            || (out.stderr.contains("InvalidArgument") && out.stderr.contains("not a live member")),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains(&victim_id), "{}", out.stderr);
    // ... and changes nothing: the shard was never handed off towards it.
    let after = c.view().expect("cluster view");
    assert!(
        after.shard(mine).served_by(nodes[0].id())
            && after.shard(mine).epoch == before.shard(mine).epoch,
        "shard {mine} was handed off towards a dead node: {:?} -> {:?}",
        before.shard(mine),
        after.shard(mine)
    );

    let down = c.wait_until("the crashed node's lease has lapsed", |v| {
        victim_shards.iter().all(|&s| !v.shard(s).owner_alive)
    });
    // Moving one of its shards is refused at once: the owner is down and the shard waits for it.
    let out = c.cli(
        &only(&nodes[0]),
        &[
            "admin",
            "shard",
            "move",
            &victim_shards[0].to_string(),
            nodes[1].id(),
        ],
    );
    out.assert_fails_with("FailedPrecondition");
    assert!(
        out.stderr
            .contains(&format!("its owner {victim_id:?} is down"))
            && out.stderr.contains("waits for it to restart"),
        "{}",
        out.stderr
    );
    for &s in &victim_shards {
        let sv = down.shard(s);
        assert!(
            sv.owner.is_none() || sv.owner.as_deref() == Some(victim_id.as_str()),
            "shard {s} was taken by another node after a crash: {sv:?}\n{down}"
        );
        assert_eq!(sv.state, "serving", "shard {s}: {sv:?}");
    }

    let restarted = c.start(spec);
    let back = c.wait_until(
        "the restarted node serves its shards at higher epochs",
        |v| {
            victim_shards.iter().all(|&s| {
                v.shard(s).served_by(&victim_id) && v.shard(s).epoch > before.shard(s).epoch
            })
        },
    );
    for &s in &victim_shards {
        assert!(back.shard(s).epoch > before.shard(s).epoch);
    }
    for w in &written {
        assert_reads_back(&c, &only(&restarted), w);
        assert_reads_back(&c, &only(&nodes[1]), w);
    }
}

#[test]
fn a_node_whose_shard_count_or_bucket_differs_from_the_cluster_record_refuses_to_start_naming_the_field()
 {
    let _turn = serial();
    let c = Cluster::new("mismatch");
    let first = c.start(c.spec(1));
    c.wait_until("the first node serves every shard", |v| {
        v.balanced_over(&[first.id()])
    });
    let spec = c.spec(2);

    let (status, stderr) = c.start_refused(&spec, &["--shards", "8"]);
    assert!(!status.success(), "{status}\n{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line:\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("shards = 16"))
        .unwrap_or_else(|| panic!("no line names the shard count:\n{stderr}"));
    assert!(line.contains("this node has 8"), "{line}");

    c.moto().create_bucket("nokv-other");
    let (status, stderr) = c.start_refused(&spec, &["--s3-bucket", "nokv-other"]);
    assert!(!status.success(), "{status}\n{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line:\n{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("bucket"))
        .unwrap_or_else(|| panic!("no line names the bucket:\n{stderr}"));
    assert!(
        line.contains(c.bucket()) && line.contains("nokv-other"),
        "{line}"
    );

    // Neither refused start joined the cluster or disturbed it.
    let view = c.view().expect("cluster view");
    assert!(!view.nodes.iter().any(|n| n.id == spec.id), "{view}");
    assert!(view.balanced_over(&[first.id()]), "{view}");
}

#[test]
fn a_client_whose_cached_route_names_the_old_owner_is_corrected_by_the_hint_and_never_writes_through_it()
 {
    let _turn = serial();
    let c = Cluster::new("stale");
    let nodes = c.start_nodes(3);
    let view = c.wait_balanced(&refs(&nodes));
    let (old, new) = six_and_five(&view, &nodes);
    let shard = view.served_by(old.id())[0];
    let ws = c.workspaces_in_shard(old, "stale", shard, 1).remove(0);
    let e0 = view.shard(shard).epoch;

    // An SDK client learns the route (old owner, e0) and writes through it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = nokv_client::config::ResolvedConfig {
        endpoint: all(&refs(&nodes)).join(","),
        ca: c.root().join("tls/ca.pem"),
        token: Some(
            std::fs::read_to_string(c.root().join("tls/admin.token"))
                .unwrap()
                .trim()
                .to_string(),
        ),
    };
    let write = |client: &nokv_client::Client, path: &str, data: &[u8]| {
        runtime
            .block_on(client.write(nokv_proto::v1::WriteRequest {
                workspace: ws.clone(),
                path: path.into(),
                data: data.to_vec().into(),
                ..Default::default()
            }))
            .unwrap_or_else(|e| panic!("write {ws}:{path}: {e:?}"))
    };
    let client = runtime
        .block_on(nokv_client::Client::connect(&cfg))
        .expect("connect");
    let route = runtime.block_on(client.route(&ws)).expect("route");
    assert_eq!(
        (route.endpoint.as_str(), route.epoch),
        (old.endpoint().as_str(), e0)
    );
    write(&client, "first.txt", b"through the owner of the time");

    let answer = move_shard(&c, old, shard, new);
    let moved = c.view().expect("cluster view");
    let e1 = moved.shard(shard).epoch;
    assert_eq!(answer["epoch"].as_u64(), Some(e1), "{answer}\n{moved}");
    assert!(moved.shard(shard).served_by(new.id()) && e1 > e0, "{moved}");
    // What the old owner has loaded can trail what the records say it serves (an acquired
    // shard is recorded as serving before its owner loaded it): its state is taken once it
    // holds exactly the shards the cluster says it serves.
    let mut serves: Vec<u64> = moved
        .served_by(old.id())
        .into_iter()
        .map(u64::from)
        .collect();
    serves.sort_unstable();
    let loaded = c.wait_until_health(old, "the old owner loaded what it serves", |h| {
        let mut held: Vec<u64> = health_shards(h).iter().map(|&(s, _, _)| s).collect();
        held.sort_unstable();
        held == serves
    });
    let old_health = health_shards(&loaded);

    // The SDK's cached route is older than the move: the old owner answers NotOwner with a
    // hint at e1, which the client follows.
    write(&client, "sdk.txt", b"written with a stale cached route");
    // A CLI that knows only the old owner's endpoint: the same correction.
    c.cli_stdin(
        &only(old),
        &["put", &format!("{ws}:cli.txt")],
        Some(b"written through the old owner's endpoint"),
    )
    .assert_ok();

    for (path, body) in [
        ("first.txt", &b"through the owner of the time"[..]),
        ("sdk.txt", &b"written with a stale cached route"[..]),
        ("cli.txt", &b"written through the old owner's endpoint"[..]),
    ] {
        let got = c.cli(&only(new), &["get", &format!("{ws}:{path}")]);
        assert_eq!(got.assert_ok().stdout, body, "{path} through the new owner");
    }
    // The old owner acknowledged neither write: it does not hold the workspace's shard, and
    // every shard it held right after the move and still holds has the entries it had then.
    // (Balancing may have moved other shards to or from it meanwhile; the writes could only
    // have landed in `shard`.)
    let health = c.health(old);
    assert!(!owns(&health, shard), "{health}");
    let now = health_shards(&health);
    let unchanged: Vec<_> = old_health
        .iter()
        .filter(|(s, _, _)| now.iter().any(|(n, _, _)| n == s))
        .copied()
        .collect();
    let still: Vec<_> = now
        .iter()
        .filter(|(s, _, _)| old_health.iter().any(|(o, _, _)| o == s))
        .copied()
        .collect();
    assert_eq!(still, unchanged, "{health}");
    assert!(
        !unchanged.is_empty(),
        "the old owner kept none of its shards: {health}"
    );
}

/// How long etcd stays down in the outage test: the 20 s, several node TTLs (3 s), so
/// every node's acknowledge deadline lapses and every node goes through losing its lease.
const ETCD_OUTAGE: Duration = Duration::from_secs(20);
/// What a node logs when it waits for an earlier lease holding its id to expire.
const WAITED_FOR_EARLIER_LEASE: &str = "node id held by an earlier lease";
/// What a node logs once it has a new lease after losing one.
const REJOINED: &str = "rejoined the cluster with a new lease";

/// One acknowledged write of the outage test's loop.
struct Acked {
    at: Instant,
    ws: String,
    path: String,
    body: Vec<u8>,
}

#[test]
fn after_a_20_s_etcd_outage_every_node_revokes_its_own_earlier_lease_instead_of_waiting_for_it_and_writes_resume_with_no_acknowledged_write_lost()
 {
    let _turn = serial();
    let c = Cluster::new("outage");
    let nodes = c.start_nodes(3);
    let view = c.wait_balanced(&refs(&nodes));
    // One workspace on a shard of each node: writes must resume on every node.
    let shards: Vec<u32> = nodes.iter().map(|n| view.served_by(n.id())[0]).collect();
    let names = c.workspaces_in_shards(&nodes[0], "outage", &shards, 1);

    // An SDK client over every node, one attempt per write: the loop itself is the retry, so
    // each acknowledgement is timed to within one loop turn.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = nokv_client::config::ResolvedConfig {
        endpoint: all(&refs(&nodes)).join(","),
        ca: c.root().join("tls/ca.pem"),
        token: Some(
            std::fs::read_to_string(c.root().join("tls/admin.token"))
                .unwrap()
                .trim()
                .to_string(),
        ),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime
        .block_on(nokv_client::Client::connect(&cfg))
        .expect("connect")
        .with_retry(nokv_client::sdk::RetryPolicy {
            attempts: 1,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(50),
        });

    let stop = AtomicBool::new(false);
    let (acks, acked_rx) = mpsc::channel::<Acked>();
    let (outcome, refusals) = thread::scope(|s| {
        let looper = s.spawn(|| {
            let mut refusals = 0u64;
            let mut k = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let ws = &names[k % names.len()];
                let path = format!("loop/{k}.txt");
                let body = format!("outage loop write {k} to {ws}").into_bytes();
                let written = runtime.block_on(client.write(nokv_proto::v1::WriteRequest {
                    workspace: ws.clone(),
                    path: path.clone(),
                    data: body.clone().into(),
                    ..Default::default()
                }));
                match written {
                    Ok(_) => {
                        let acked = Acked {
                            at: Instant::now(),
                            ws: ws.clone(),
                            path,
                            body,
                        };
                        // The receiver lives until the loop is joined.
                        let _ = acks.send(acked);
                    }
                    Err(_) => {
                        refusals += 1;
                        // Polling the cluster for its return: it sends no signal.
                        thread::sleep(Duration::from_millis(20));
                    }
                }
                k += 1;
            }
            refusals
        });
        // Failures below are returned so the logs can be printed, but a panic (etcd that
        // cannot restart on its ports) must stop the loop too, or the scope waits for it forever.
        let _stop = nokv_tests::StopOnDrop(&stop);
        let outage = || -> Result<Instant, String> {
            for _ in 0..3 * names.len() {
                acked_rx
                    .recv_timeout(LOOP_PROGRESS_DEADLINE)
                    .map_err(|e| format!("no acknowledged write before the outage: {e}"))?;
            }
            c.etcd().kill();
            // The outage itself: a span of time, not a wait for an event.
            thread::sleep(ETCD_OUTAGE);
            c.etcd().restart();
            let etcd_back = Instant::now();
            // Writes resume on every node: each workspace is acknowledged again after etcd's
            // return (earlier acknowledgements stay in the channel for the final check).
            let deadline = etcd_back + LOOP_PROGRESS_DEADLINE;
            let mut again = std::collections::BTreeSet::new();
            let mut seen = Vec::new();
            while again.len() < names.len() {
                let left = deadline.saturating_duration_since(Instant::now());
                let a = acked_rx.recv_timeout(left).map_err(|_| {
                    format!(
                        "writes did not resume on every node within {LOOP_PROGRESS_DEADLINE:?} \
                         of etcd's return: acknowledged again only {again:?} of {names:?}"
                    )
                })?;
                if a.at >= etcd_back {
                    again.insert(a.ws.clone());
                }
                seen.push(a);
            }
            // Back into the channel, in order, for the final check.
            for a in seen {
                let _ = acks.send(a);
            }
            Ok(etcd_back)
        };
        let outcome = outage();
        stop.store(true, Ordering::SeqCst);
        let refusals = looper.join().expect("write loop");
        (outcome, refusals)
    });
    let etcd_back = outcome.unwrap_or_else(|e| {
        let logs: Vec<String> = nodes
            .iter()
            .map(|n| {
                let log = n.daemon().stderr();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("--- last lines of {} ---\n{tail}", n.id())
            })
            .collect();
        panic!("{e}\n{}", logs.join("\n"))
    });
    let acked: Vec<Acked> = acked_rx.try_iter().collect();
    let first = acked
        .iter()
        .filter(|a| a.at >= etcd_back)
        .map(|a| a.at - etcd_back)
        .min()
        .expect("a write acknowledged after etcd came back");
    let every = names
        .iter()
        .map(|ws| {
            acked
                .iter()
                .filter(|a| &a.ws == ws && a.at >= etcd_back)
                .map(|a| a.at - etcd_back)
                .min()
                .expect("every workspace acknowledged after etcd came back")
        })
        .max()
        .unwrap_or_default();
    println!(
        "etcd outage {} s, node TTL {} s: first acknowledged write {} ms after etcd came back, \
         a write on every node {} ms after; {} acknowledged, {refusals} refused",
        ETCD_OUTAGE.as_secs(),
        nokv_tests::cluster::NODE_TTL,
        first.as_millis(),
        every.as_millis(),
        acked.len(),
    );

    // Every acknowledged write reads back, byte for byte.
    for a in &acked {
        let read = runtime
            .block_on(
                client
                    .clone()
                    .with_retry(Default::default())
                    .read(&a.ws, &a.path),
            )
            .unwrap_or_else(|e| panic!("read {}:{}: {e:?}", a.ws, a.path));
        assert!(read.data == a.body, "{}:{} differs", a.ws, a.path);
    }
    // The nodes rejoined by taking their ids over from their own earlier leases, never by
    // waiting for those leases to expire (each of them would be kept alive meanwhile).
    for n in &nodes {
        let log = n.daemon().stderr();
        let waited: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(WAITED_FOR_EARLIER_LEASE))
            .collect();
        assert!(
            waited.is_empty(),
            "{} waited for an earlier lease holding its id:\n{}",
            n.id(),
            waited.join("\n")
        );
        assert!(
            log.contains(REJOINED),
            "{} never lost its lease and rejoined in the outage:\n{log}",
            n.id()
        );
    }
}

/// A node asked to stop while etcd is unreachable exits cleanly: its lease lapsed, so it
/// holds nothing to hand off, and it stops trying to rejoin. (It used to retry forever: SIGTERM
/// closed its listener and left the process running until etcd came back.)
#[test]
fn a_node_asked_to_stop_while_etcd_is_down_exits_cleanly_instead_of_retrying_to_rejoin_forever() {
    let _turn = serial();
    let c = Cluster::new("stop-no-etcd");
    let mut a = c.start(c.spec(1));
    c.wait_balanced(&[&a]);
    c.etcd().kill();
    // In the rejoin loop: the lease lapsed and a rejoin found etcd gone.
    a.wait_for_log_line("rejoining failed");
    let (status, _, log) = c.terminate(a);
    assert!(status.success(), "exit {status}:\n{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
}

/// A node asked to stop while etcd answers nothing (stopped: a partition, where calls hang
/// rather than fail) exits once its lease has lapsed: from then on it owns nothing, so no
/// handoff is left to wait for, and the shards are left as a crashed node's.
#[test]
fn a_node_asked_to_stop_while_etcd_hangs_exits_once_its_lease_has_lapsed() {
    let _turn = serial();
    let c = Cluster::new("stop-hung-etcd");
    let a = c.start(c.spec(1));
    c.wait_balanced(&[&a]);
    c.etcd().signal("STOP");
    let (status, _, log) = c.terminate(a);
    c.etcd().signal("CONT");
    assert!(status.success(), "exit {status}:\n{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
}

/// A one-node cluster whose provider refuses every checkpoint (and whose node n1 also gets
/// `extra_env`), a file written to shard 0, node n2 joined, and a move of shard 0 to n2 that n1
/// answered with the reason: the node, the joined node, the view before, the file.
struct RefusedMove {
    c: Cluster,
    a: Node,
    b: Node,
    before: ClusterView,
    file: String,
}

fn refuse_a_move(name: &str, extra_env: &[(&str, &str)]) -> RefusedMove {
    let c = Cluster::new(name);
    let mut env = vec![("NOKV_TEST_FAULTS", "seed=1,refuse_keys=/ckpt/")];
    env.extend_from_slice(extra_env);
    let a = c.start_with_env(c.spec(1), &[], &env);
    let before = c.wait_balanced(&[&a]);
    let ws = c.workspaces_in_shard(&a, name, 0, 1).remove(0);
    let file = format!("{ws}:notes/a.txt");
    c.cli_stdin(&only(&a), &["put", &file], Some(b"before the move\n"))
        .assert_ok();

    let b = c.start(c.spec(2));
    c.wait_until("n2 listed alive", |v| v.node_alive(b.id()));
    let moved = c.cli(&only(&a), &["admin", "shard", "move", "0", b.id()]);
    assert!(
        moved.status != 0 && moved.stderr.contains("could not be checkpointed"),
        "the move is refused with the reason: exit {}, {}",
        moved.status,
        moved.stderr
    );
    RefusedMove {
        c,
        a,
        b,
        before,
        file,
    }
}

impl RefusedMove {
    /// Every shard is still n1's at the epoch it had before the move.
    fn assert_every_shard_kept(&self, after: &ClusterView) {
        for s in 0..16 {
            let (was, is) = (self.before.shard(s), after.shard(s));
            assert_eq!(
                (is.owner.as_deref(), is.epoch),
                (Some(self.a.id()), was.epoch),
                "shard {s} stays with {} at epoch {}:\n{after}",
                self.a.id(),
                was.epoch
            );
        }
    }
}

/// A handoff whose checkpoint the provider refuses is given up, not released without one: the
/// owner answers the move with the reason and keeps serving the shard at the same epoch — and
/// every other shard too. (Released without a checkpoint, the shard was any node's to take by
/// fencing the owner's log stream, which deposed the owner from all sixteen.) The balance step
/// gives up its own handoffs the same way, so the refusing owner keeps all of them.
#[test]
fn a_move_whose_checkpoint_the_provider_refuses_is_given_up_and_the_owner_keeps_every_shard_at_its_epoch()
 {
    let _turn = serial();
    let refused = refuse_a_move("refused-ckpt", &[]);
    let RefusedMove {
        c,
        a,
        b,
        before,
        file,
    } = &refused;

    let after = c.view().expect("cluster view");
    refused.assert_every_shard_kept(&after);
    assert_eq!(after.shard(0).state, "serving", "{after}");
    // Through the other node (the hint leads to the owner): the shard answers reads and
    // acknowledges writes as before.
    let got = c.cli(&only(b), &["get", file]);
    assert_eq!(got.assert_ok().stdout, b"before the move\n");
    c.cli_stdin(&only(b), &["put", file], Some(b"after the move\n"))
        .assert_ok();
    let got = c.cli(&only(a), &["get", file]);
    assert_eq!(got.assert_ok().stdout, b"after the move\n");
    assert_eq!(
        c.view().expect("cluster view").shard(0).epoch,
        before.shard(0).epoch
    );
}

/// A given-up move whose `serving` mark etcd did not take (etcd failing exactly then, injected
/// by `NOKV_TEST_FAIL_MARK_SERVING`) is marked again by a later balance step: until then the
/// other nodes route the shard as moving, so without the retry it would stay unreachable
/// through them for good (nothing else touches shard 0's record here: the balance step hands
/// off the highest shard). The CLI sends a refused move up to 8 times (the SDK's attempts),
/// each giving up and marking shard 0 again, so the fault fails 12 marks: more than the move
/// alone makes, so only the balance step's retries can end with the mark taken.
#[test]
fn a_given_up_move_whose_serving_mark_etcd_did_not_take_is_marked_again_by_the_next_balance_step() {
    let _turn = serial();
    let refused = refuse_a_move("unmarked", &[("NOKV_TEST_FAIL_MARK_SERVING", "0:12")]);
    let RefusedMove { c, a, b, file, .. } = &refused;
    // The injected failure happened (else this test proves nothing).
    let log = a.daemon().stderr();
    assert!(
        log.contains("could not mark the shard serving again"),
        "n1 never failed to mark shard 0 serving:\n{log}"
    );

    let after = c.wait_until("every shard serving again on n1", |v| {
        (0..16).all(|s| v.shard(s).state == "serving")
    });
    refused.assert_every_shard_kept(&after);
    // Through the other node, which routed shard 0 as moving until the mark landed.
    let got = c.cli(&only(b), &["get", file]);
    assert_eq!(got.assert_ok().stdout, b"before the move\n");
    c.cli_stdin(&only(b), &["put", file], Some(b"after the move\n"))
        .assert_ok();
}
