//! `nokv bench cluster`: what cluster mode costs, measured side by side in one run.
//!
//! * **put**: the 4 KiB durable write loop of the other put benchmarks against an embedded
//!   daemon and a one-node cluster. Both share everything but `--etcd`/`--cluster`: the same
//!   cluster TLS directory (certificate and token secret), the same moto server (one bucket
//!   each, since a cluster records its bucket), the same flags. Rounds alternate
//!   embedded/cluster/embedded/cluster so that drift (page cache, the other tenants of the
//!   machine) hits both sides; each side's rounds are pooled before its percentiles are taken.
//!   The claim under test: no etcd round trip on the request path, so the ratio is about 1.0.
//!   Both sides use local durability (what provider durability costs is measured by
//!   `put-vs-etcd --metadata-durability provider`).
//! * **handoff**: a second node joins; a few hundred small files go into workspaces of one
//!   shard so its checkpoint is not empty; the shard then moves back and forth between the two
//!   nodes with MoveShard, sent to the current owner. The RPC answers once the target serves
//!   the shard, so its client-side duration is the handoff as a caller sees it; the server's own
//!   figure is reported next to it. Before every move the cluster is let settle (every shard
//!   serving under a live owner, balanced), so the balancer's hand-off of the surplus shard a
//!   move creates is never timed as part of the next move.
//!
//! Nothing here asserts a timing; figures are printed and written as JSON.

use std::collections::BTreeMap;
use std::time::Instant;

use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::{Value, json};

use super::cluster_dir::{CLUSTER_BUCKET, ClusterDir, local, settled, start_daemon, wait_view};
use super::compare::{cpu_header, cpu_row};
use super::cpu::{CpuMeter, CpuTicks};
use super::harness::{
    Daemon, Etcd, Moto, Result, Scratch, Summary, f2, percentile, summarize, table,
};
use super::load::{BenchEnv, load_samples, nokv_clients, small_write};

/// Size of each file written into the moved shard.
const HANDOFF_FILE_BYTES: usize = 1024;
/// Workspaces of the moved shard the files are spread over.
const HANDOFF_WORKSPACES: usize = 4;

/// What to measure (flags of `nokv bench cluster`).
pub struct ClusterBench {
    /// Concurrent clients per put measurement.
    pub clients: Vec<usize>,
    /// Rounds per side and client count (each `env.seconds` long).
    pub rounds: u32,
    /// Shard moves to time.
    pub moves: u32,
    /// Small files written into the moved shard before the moves.
    pub files: u32,
    /// Owners to kill -9 in the failover measurement (0: skip it).
    pub kills: u32,
    /// Files written into the killed owners' shard first.
    pub kill_files: u32,
}

/// One side of the put comparison: its clients, their pooled latencies and time, and each
/// round's p50.
struct Side {
    conns: Vec<(Client, String)>,
    lat_ms: Vec<f64>,
    seconds: f64,
    round_p50_ms: Vec<f64>,
    /// The daemon measured, and the CPU it and this process spent over all rounds.
    pid: u32,
    cpu: CpuTicks,
}

impl Side {
    async fn new(d: &Daemon, clients: usize) -> Result<Side> {
        let conns = nokv_clients(d, clients).await?;
        // Warm-up: TLS handshakes and each workspace's first write are not measured.
        for (c, ws) in &conns {
            c.write(small_write(ws.clone(), 0)).await?;
        }
        Ok(Side {
            conns,
            lat_ms: Vec::new(),
            seconds: 0.0,
            round_p50_ms: Vec::new(),
            pid: d.pid(),
            cpu: CpuTicks::default(),
        })
    }

    async fn round(&mut self, seconds: f64) {
        let meter = CpuMeter::start(self.pid);
        let (mut lat, elapsed) = load_samples(
            self.conns.clone(),
            seconds,
            |(c, ws): (Client, String), i| async move { c.write(small_write(ws, i)).await.is_ok() },
        )
        .await;
        self.cpu.add(meter.spent());
        lat.sort_by(|a, b| a.total_cmp(b));
        self.round_p50_ms.push(percentile(&lat, 50.0));
        self.lat_ms.extend(lat);
        self.seconds += elapsed;
    }

    fn summary(&self) -> Summary {
        summarize(self.lat_ms.clone(), self.seconds)
    }
}

/// The put comparison at each client count (module doc).
async fn put_side_by_side(
    env: &BenchEnv,
    bench: &ClusterBench,
    embedded: &Daemon,
    node: &Daemon,
) -> Result<(Vec<Value>, Vec<Vec<String>>)> {
    let (mut results, mut rows) = (Vec::new(), Vec::new());
    for &clients in &bench.clients {
        eprintln!("put: {clients} client(s), {} rounds per side", bench.rounds);
        let mut a = Side::new(embedded, clients).await?;
        let mut b = Side::new(node, clients).await?;
        for _ in 0..bench.rounds {
            a.round(env.seconds).await;
            b.round(env.seconds).await;
        }
        let (sa, sb) = (a.summary(), b.summary());
        let (ca, cb) = (a.cpu.per_op(sa.ops), b.cpu.per_op(sb.ops));
        rows.push(cpu_row("embedded", clients, &sa, &ca));
        rows.push(cpu_row("cluster node", clients, &sb, &cb));
        results.push(json!({
            "clients": clients,
            "embedded": sa,
            "cluster": sb,
            "embedded_round_p50_ms": a.round_p50_ms,
            "cluster_round_p50_ms": b.round_p50_ms,
            "p50_ratio_cluster_over_embedded": sb.p50_ms / sa.p50_ms,
            "p99_ratio_cluster_over_embedded": sb.p99_ms / sa.p99_ms,
            "ops_ratio_cluster_over_embedded": sb.ops_per_s / sa.ops_per_s,
            "embedded_server_cpu_ms_per_op": ca.server_cpu_ms_per_op,
            "embedded_client_cpu_ms_per_op": ca.client_cpu_ms_per_op,
            "cluster_server_cpu_ms_per_op": cb.server_cpu_ms_per_op,
            "cluster_client_cpu_ms_per_op": cb.client_cpu_ms_per_op,
        }));
    }
    Ok((results, rows))
}

/// Workspaces `handoff-<i>` that route to one shard (the shard of the first).
async fn one_shards_workspaces(admin: &Client) -> Result<(u32, Vec<String>)> {
    let shard = admin.route("handoff-0").await?.shard;
    let mut found = vec!["handoff-0".to_string()];
    for i in 1..10_000 {
        if found.len() == HANDOFF_WORKSPACES {
            break;
        }
        let ws = format!("handoff-{i}");
        if admin.route(&ws).await?.shard == shard {
            found.push(ws);
        }
    }
    Ok((shard, found))
}

/// Writes `files` small files spread over `workspaces`, one writer per workspace.
async fn fill(admin: &Client, workspaces: &[String], files: u32) -> Result<()> {
    let tasks: Vec<_> = workspaces
        .iter()
        .enumerate()
        .map(|(w, ws)| {
            let (c, ws, n) = (admin.clone(), ws.clone(), workspaces.len() as u32);
            tokio::spawn(async move {
                for i in (w as u32..files).step_by(n as usize) {
                    c.write(pb::WriteRequest {
                        workspace: ws.clone(),
                        path: format!("handoff/file-{i}.txt"),
                        data: super::loops::random_data(HANDOFF_FILE_BYTES).into(),
                        ..Default::default()
                    })
                    .await?;
                }
                Ok::<(), ClientError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| local(e.to_string()))??;
    }
    Ok(())
}

/// Min, median (nearest rank) and max.
fn spread(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    json!({
        "min": s.first().copied().unwrap_or(f64::NAN),
        "median": percentile(&s, 50.0),
        "max": s.last().copied().unwrap_or(f64::NAN),
    })
}

/// The handoff measurement (module doc): `nodes` are the two node daemons by id.
async fn handoffs(
    bench: &ClusterBench,
    c: &ClusterDir,
    nodes: &[(&str, &Daemon)],
) -> Result<Value> {
    let ids: Vec<&str> = nodes.iter().map(|(id, _)| *id).collect();
    let all = nodes
        .iter()
        .map(|(_, d)| d.endpoint.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let admin = c.admin(&all).await?;
    eprintln!("handoff: waiting for {} nodes to balance", ids.len());
    wait_view(&admin, "a balanced two-node cluster", |v| settled(v, &ids)).await?;
    let (shard, workspaces) = one_shards_workspaces(&admin).await?;
    eprintln!(
        "handoff: writing {} files into shard {shard} ({})",
        bench.files,
        workspaces.join(", ")
    );
    fill(&admin, &workspaces, bench.files).await?;
    // One client per node: each move goes straight to the current owner (no hint hop).
    let mut direct = BTreeMap::new();
    for (id, d) in nodes {
        direct.insert(id.to_string(), c.admin(&d.endpoint).await?);
    }
    let (mut moves, mut client_ms, mut server_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut checkpoint_size = 0;
    for m in 0..bench.moves {
        let view = wait_view(&admin, "a settled cluster", |v| settled(v, &ids)).await?;
        let owner = view
            .shards
            .iter()
            .find(|s| s.shard == shard)
            .map(|s| s.owner.clone())
            .unwrap_or_default();
        let to = ids
            .iter()
            .find(|id| **id != owner)
            .expect("two nodes")
            .to_string();
        let from = direct
            .get(&owner)
            .ok_or_else(|| local(format!("shard {shard} is owned by unknown node {owner:?}")))?;
        let t = Instant::now();
        let r = from.move_shard(shard, &to).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let view = admin.cluster().await?;
        let size = view
            .shards
            .iter()
            .find(|s| s.shard == shard && s.has_checkpoint)
            .map(|s| s.checkpoint_size)
            .unwrap_or(0);
        checkpoint_size = size;
        eprintln!(
            "handoff: move {}/{}: shard {shard} {owner} -> {to} in {ms:.1} ms (server {} ms, epoch {}, checkpoint {size} B)",
            m + 1,
            bench.moves,
            r.elapsed_ms,
            r.epoch
        );
        client_ms.push(ms);
        server_ms.push(r.elapsed_ms as f64);
        moves.push(json!({
            "from": owner, "to": to, "client_ms": ms, "server_ms": r.elapsed_ms,
            "epoch": r.epoch, "checkpoint_size": size,
        }));
    }
    // The moved data is intact: every file is still there at the end.
    let entries = count_files(&admin, &workspaces, bench.files).await?;
    Ok(json!({
        "shard": shard,
        "workspaces": workspaces,
        "files": bench.files,
        "file_bytes": HANDOFF_FILE_BYTES,
        "files_found_after_moves": entries,
        "checkpoint_size": checkpoint_size,
        "moves": moves,
        "client_ms": spread(&client_ms),
        "server_ms": spread(&server_ms),
    }))
}

/// How many of the `files` written by [`fill`] the owner finds now.
async fn count_files(admin: &Client, workspaces: &[String], files: u32) -> Result<u32> {
    let mut found = 0;
    for i in 0..files {
        let ws = &workspaces[i as usize % workspaces.len()];
        match admin.stat(ws, &format!("handoff/file-{i}.txt")).await {
            Ok(_) => found += 1,
            Err(e) if e.is("NotFound") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// Runs both measurements (module doc) and returns the report and its human text.
pub async fn run(env: &BenchEnv, bench: &ClusterBench) -> Result<(Value, String)> {
    let scratch = Scratch::new(&env.work_dir, "cluster")?;
    let etcd = Etcd::start(&scratch.0)?;
    let moto = Moto::start()?;
    moto.create_bucket(CLUSTER_BUCKET)?;
    let c = ClusterDir::init(&env.server_bin, scratch.0.join("cluster"))?;
    let embedded = start_daemon(env, &scratch, &c, "embedded", moto.server_args(), None)?;
    // Local durability on both sides: this measures what cluster mode itself costs
    // (provider durability is `put-vs-etcd --metadata-durability provider`).
    let local_durability = |mut args: Vec<String>| {
        args.extend(["--metadata-durability".to_string(), "local".to_string()]);
        args
    };
    let n1 = start_daemon(
        env,
        &scratch,
        &c,
        "n1",
        local_durability(moto.server_args_for(CLUSTER_BUCKET)),
        Some(&etcd),
    )?;
    let admin = c.admin(&n1.endpoint).await?;
    eprintln!("put: waiting for node n1 to serve every shard");
    wait_view(&admin, "n1 serving every shard", |v| settled(v, &["n1"])).await?;
    let (put, put_rows) = put_side_by_side(env, bench, &embedded, &n1).await?;
    drop(embedded);

    let n2 = start_daemon(
        env,
        &scratch,
        &c,
        "n2",
        local_durability(moto.server_args_for(CLUSTER_BUCKET)),
        Some(&etcd),
    )?;
    let handoff = handoffs(bench, &c, &[("n1", &n1), ("n2", &n2)]).await?;
    drop((n1, n2));

    let failover = if bench.kills > 0 {
        // A cluster of its own (etcd, bucket), three nodes with a short lease.
        let etcd = Etcd::start(&scratch.0.join("failover-etcd"))?;
        let bucket = "nokv-bench-failover";
        moto.create_bucket(bucket)?;
        let provider = moto.server_args_for(bucket);
        let mut nodes = Vec::new();
        for id in ["f1", "f2", "f3"] {
            let mut args = provider.clone();
            args.extend([
                "--node-ttl".to_string(),
                super::failover::NODE_TTL.to_string(),
            ]);
            nodes.push((
                id.to_string(),
                start_daemon(env, &scratch, &c, id, args, Some(&etcd))?,
            ));
        }
        eprintln!("failover: {} kills of a shard owner", bench.kills);
        super::failover::failovers(
            env,
            &scratch,
            &c,
            &etcd,
            &provider,
            &mut nodes,
            (bench.kills, bench.kill_files),
        )
        .await?
    } else {
        Value::Null
    };

    let report = json!({
        "bench": "cluster",
        "seconds": env.seconds,
        "rounds": bench.rounds,
        "put": put,
        "handoff": handoff,
        "failover": failover,
    });
    Ok((report.clone(), text(env, bench, &report, &put_rows)))
}

fn text(env: &BenchEnv, bench: &ClusterBench, report: &Value, put_rows: &[Vec<String>]) -> String {
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let mut out = table(
        &format!(
            "cluster put: 4 KiB durable writes, embedded vs one-node cluster (same TLS, flags, moto), \
             {} x {}s rounds per side, alternating",
            bench.rounds, env.seconds
        ),
        &cpu_header("daemon"),
        put_rows,
    );
    for r in report["put"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} client(s): cluster/embedded p50 ratio {:.2}, p99 ratio {:.2}, ops/s ratio {:.2}\n",
            r["clients"],
            num(&r["p50_ratio_cluster_over_embedded"]),
            num(&r["p99_ratio_cluster_over_embedded"]),
            num(&r["ops_ratio_cluster_over_embedded"]),
        ));
    }
    let h = &report["handoff"];
    let rows = ["client_ms", "server_ms"]
        .iter()
        .map(|k| {
            vec![
                if *k == "client_ms" {
                    "MoveShard (client)".to_string()
                } else {
                    "MoveShard (server)".to_string()
                },
                f2(num(&h[k]["min"])),
                f2(num(&h[k]["median"])),
                f2(num(&h[k]["max"])),
            ]
        })
        .collect::<Vec<_>>();
    out.push_str(&table(
        &format!(
            "cluster handoff: shard {} moved {} times between n1 and n2 ({} files of {} B in {} workspaces)",
            h["shard"],
            h["moves"].as_array().map(Vec::len).unwrap_or(0),
            h["files"],
            HANDOFF_FILE_BYTES,
            h["workspaces"].as_array().map(Vec::len).unwrap_or(0),
        ),
        &["timing", "min ms", "median ms", "max ms"],
        &rows,
    ));
    out.push_str(&format!(
        "  checkpoint size {} B; {} of {} files found after the moves\n",
        h["checkpoint_size"], h["files_found_after_moves"], h["files"]
    ));
    let f = &report["failover"];
    if !f.is_null() {
        out.push_str(&table(
            &format!(
                "cluster failover: kill -9 of a shard's owner ({} times, node TTL {} s, data dir \
                 deleted, {} files of 4 KiB in the shard), time to the first write acknowledged \
                 after the kill",
                f["kills"], f["node_ttl_s"], f["shard_files"]
            ),
            &["timing", "min ms", "median ms", "max ms"],
            &[vec![
                "kill -9 -> first ack".to_string(),
                f2(num(&f["min_ms"])),
                f2(num(&f["median_ms"])),
                f2(num(&f["max_ms"])),
            ]],
        ));
    }
    out
}
