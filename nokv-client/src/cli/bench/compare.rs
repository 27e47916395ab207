//! Side-by-side benchmarks: each starts what it compares on this machine, in one work
//! directory, measures both sides in the same run and prints the ratio. Nothing here asserts
//! a timing; figures are printed and written as JSON.

use std::path::Path;
use std::time::Instant;

use nokv_client::Client;
use nokv_client::publish::PublishOptions;
use serde_json::{Value, json};
use tonic::Request;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, Endpoint};

use super::cpu::{self, CpuMeter, CpuPerOp};
use super::durability::{Durability, ProviderNode, provider_fields};
use super::harness::{Daemon, Etcd, Moto, Result, Scratch, Summary, f2, print_table};
use super::load::{BenchEnv, load, nokv_writes, small_write};
use super::loops::random_data;

/// `n` etcd clients (one HTTP/2 connection each) putting 4 KiB values for `seconds`, with the
/// CPU etcd and this process spent.
async fn etcd_writes(etcd: &Etcd, n: usize, seconds: f64) -> Result<(Summary, CpuPerOp)> {
    let chans = etcd_channels(etcd, n, None).await?;
    Ok(etcd_puts_on(etcd, chans, seconds).await)
}

/// `n` etcd clients, one HTTP/2 connection each (TLS trusting `ca` when given), each
/// connected and warmed with one put before any clock starts, so connection set-up and the
/// TLS handshake are never part of a measurement.
pub(super) async fn etcd_channels(
    etcd: &Etcd,
    n: usize,
    ca: Option<&Certificate>,
) -> Result<Vec<Channel>> {
    let mut chans = Vec::new();
    for _ in 0..n {
        let ch = match ca {
            Some(ca) => nokv_client::sdk::tls_channel(&etcd.endpoint, ca.clone())?,
            None => Endpoint::from_shared(etcd.endpoint.clone())
                .map_err(|e| nokv_client::ClientError::local(e.to_string()))?
                .connect_lazy(),
        };
        if !etcd_put(ch.clone(), b"bench/warm-up".to_vec()).await {
            return Err(nokv_client::ClientError::local(format!(
                "etcd at {} refused a put",
                etcd.endpoint
            )));
        }
        chans.push(ch);
    }
    Ok(chans)
}

/// etcd puts over the given channels (one client each) for `seconds`, with the CPU etcd and
/// this process spent.
pub(super) async fn etcd_puts_on(
    etcd: &Etcd,
    chans: Vec<Channel>,
    seconds: f64,
) -> (Summary, CpuPerOp) {
    let cpu = CpuMeter::start(etcd.pid());
    let s = load(chans, seconds, |ch: Channel, i| async move {
        etcd_put(ch, format!("bench/file-{}", i % 64).into_bytes()).await
    })
    .await;
    (s, cpu.finish(s.ops))
}

/// etcd's `KV/Put`, declared by hand (two fields) to call etcd's own gRPC API without a
/// code-generation step.
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdPut {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EtcdPutResponse {}

async fn etcd_put(ch: Channel, key: Vec<u8>) -> bool {
    let mut grpc = tonic::client::Grpc::new(ch);
    if grpc.ready().await.is_err() {
        return false;
    }
    let req = EtcdPut {
        key,
        value: vec![b'x'; 4096],
    };
    let codec = tonic_prost::ProstCodec::<EtcdPut, EtcdPutResponse>::default();
    grpc.unary(
        Request::new(req),
        PathAndQuery::from_static("/etcdserverpb.KV/Put"),
        codec,
    )
    .await
    .is_ok()
}

pub(super) fn summary_row(name: &str, clients: usize, s: &Summary) -> Vec<String> {
    vec![
        name.into(),
        clients.to_string(),
        f2(s.p50_ms),
        f2(s.p99_ms),
        format!("{:.0}", s.ops_per_s),
    ]
}

/// [`summary_row`] followed by the CPU per operation of the serving process and of this one.
pub(super) fn cpu_row(name: &str, clients: usize, s: &Summary, cpu: &CpuPerOp) -> Vec<String> {
    let mut row = summary_row(name, clients, s);
    row.push(cpu::cell(cpu.server_cpu_ms_per_op));
    row.push(cpu::cell(cpu.client_cpu_ms_per_op));
    row
}

/// The columns of [`cpu_row`], the first naming what the row measured.
pub(super) fn cpu_header(first: &'static str) -> Vec<&'static str> {
    vec![
        first,
        "clients",
        "p50 ms",
        "p99 ms",
        "ops/s",
        "server CPU ms/op",
        "client CPU ms/op",
    ]
}

/// Says which processes the CPU columns measure, so a profiler can be attached to them.
pub(super) fn print_pids(daemon: &Daemon, etcd: &Etcd) {
    println!(
        "nokv-server pid {}, etcd pid {} (server CPU = utime+stime of that pid from /proc; \
         client CPU = this bench process)",
        daemon.pid(),
        etcd.pid()
    );
}

pub async fn put_vs_etcd(
    env: &BenchEnv,
    client_counts: &[usize],
    durability: Durability,
) -> Result<Value> {
    let scratch = Scratch::new(&env.work_dir, "put-vs-etcd")?;
    let daemon = env.daemon(&scratch, &[])?;
    let etcd = Etcd::start(&scratch.0)?;
    let provider = match durability {
        Durability::Provider => Some(ProviderNode::start(env, &scratch, &etcd).await?),
        Durability::Local => None,
    };
    print_pids(&daemon, &etcd);
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for &clients in client_counts {
        let (nokv, nokv_cpu) = nokv_writes(&daemon, clients, env.seconds).await?;
        let (etcd_s, etcd_cpu) = etcd_writes(&etcd, clients, env.seconds).await?;
        rows.push(cpu_row("nokv", clients, &nokv, &nokv_cpu));
        let mut result = json!({
            "clients": clients, "nokv": nokv, "etcd": etcd_s,
            "p50_ratio_nokv_over_etcd": nokv.p50_ms / etcd_s.p50_ms,
            "p99_ratio_nokv_over_etcd": nokv.p99_ms / etcd_s.p99_ms,
            "ops_ratio_nokv_over_etcd": nokv.ops_per_s / etcd_s.ops_per_s,
            "server_cpu_ms_per_op": nokv_cpu.server_cpu_ms_per_op,
            "client_cpu_ms_per_op": nokv_cpu.client_cpu_ms_per_op,
            "etcd_cpu_ms_per_op": etcd_cpu.server_cpu_ms_per_op,
            "etcd_client_cpu_ms_per_op": etcd_cpu.client_cpu_ms_per_op,
        });
        if let Some(p) = &provider {
            let (s, cpu, puts) = p.writes(clients, env.seconds).await?;
            rows.push(cpu_row(
                &format!("nokv provider ({puts:.0} PUT/s)"),
                clients,
                &s,
                &cpu,
            ));
            merge(&mut result, provider_fields(&nokv, &s, puts));
        }
        rows.push(cpu_row("etcd", clients, &etcd_s, &etcd_cpu));
        results.push(result);
    }
    print_table(
        "put-vs-etcd: 4 KiB durable writes (nokv over TLS, etcd plaintext gRPC; same disk)",
        &cpu_header("system"),
        &rows,
    );
    for r in &results {
        println!(
            "  {} client(s): nokv/etcd p50 ratio {:.2}, p99 ratio {:.2}, ops/s ratio {:.2}",
            r["clients"],
            r["p50_ratio_nokv_over_etcd"].as_f64().unwrap_or(f64::NAN),
            r["p99_ratio_nokv_over_etcd"].as_f64().unwrap_or(f64::NAN),
            r["ops_ratio_nokv_over_etcd"].as_f64().unwrap_or(f64::NAN)
        );
        print_provider_ratio(r);
    }
    Ok(json!({"bench": "put-vs-etcd", "seconds": env.seconds, "results": results}))
}

/// The provider line of one result, if it was measured.
fn print_provider_ratio(r: &Value) {
    if let Some(ratio) = r["ops_ratio_provider_over_local"].as_f64() {
        println!(
            "    provider/local ops/s ratio {ratio:.2}, p50 ratio {:.2}; provider PUTs {:.0}/s",
            r["p50_ratio_provider_over_local"]
                .as_f64()
                .unwrap_or(f64::NAN),
            r["provider_puts_per_s"].as_f64().unwrap_or(f64::NAN)
        );
    }
}

/// Adds the fields of `extra` (an object) to `into` (an object).
fn merge(into: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(extra)) = (into.as_object_mut(), extra) {
        into.extend(extra);
    }
}

pub async fn stat_vs_rpc(env: &BenchEnv) -> Result<Value> {
    let scratch = Scratch::new(&env.work_dir, "stat-vs-rpc")?;
    let daemon = env.daemon(&scratch, &[])?;
    let cfg = daemon.config(&daemon.admin_token);
    let channel = nokv_client::sdk::channel(&cfg)?;
    let client = Client::from_channel(channel.clone(), cfg.token.as_deref());
    client.write(small_write("bench".into(), 0)).await?;
    let stat = load(vec![client], env.seconds, |c: Client, _| async move {
        c.stat("bench", "bench/file-0").await.is_ok()
    })
    .await;
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    let rpc = load(vec![health], env.seconds, |mut h, _| async move {
        let req = tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        };
        h.check(req).await.is_ok()
    })
    .await;
    let ratio = stat.p50_ms / rpc.p50_ms;
    print_table(
        "stat-vs-rpc: one client, sequential calls over the same TLS channel",
        &["call", "clients", "p50 ms", "p99 ms", "ops/s"],
        &[
            summary_row("nokv Stat", 1, &stat),
            summary_row("grpc.health Check", 1, &rpc),
        ],
    );
    println!("  Stat p50 / bare RPC p50 = {ratio:.2}");
    Ok(json!({"bench": "stat-vs-rpc", "stat": stat, "bare_rpc": rpc, "p50_ratio": ratio}))
}

/// Runs `nokv-server provider-bench` against the daemon's provider settings.
fn direct_put(
    env: &BenchEnv,
    data_dir: &Path,
    extra: &[String],
    blocks: u32,
    parallel: usize,
) -> Result<f64> {
    let out =
        super::harness::with_test_credentials(&mut std::process::Command::new(&env.server_bin))
            .arg("provider-bench")
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .args(["--blocks", &blocks.to_string()])
            .args(["--parallel", &parallel.to_string()])
            .output()
            .map_err(|e| nokv_client::ClientError::local(e.to_string()))?;
    if !out.status.success() {
        return Err(nokv_client::ClientError::local(
            String::from_utf8_lossy(&out.stderr).to_string(),
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| nokv_client::ClientError::local(e.to_string()))?;
    Ok(v["mib_per_s"].as_f64().unwrap_or(f64::NAN))
}

pub async fn upload_vs_direct(
    env: &BenchEnv,
    size_mib: u64,
    providers: &[String],
    rounds: u32,
    parallel: usize,
) -> Result<Value> {
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for provider in providers {
        let scratch = Scratch::new(&env.work_dir, "upload-vs-direct")?;
        let moto = if provider == "s3" {
            Some(Moto::start()?)
        } else {
            None
        };
        let extra = moto.as_ref().map(|m| m.server_args()).unwrap_or_default();
        // Uncapped: this measures what the owner path costs against a direct PUT, not the
        // node's bulk bandwidth budget.
        let mut daemon_args = extra.clone();
        daemon_args.extend(["--bulk-mib-per-s".to_string(), "0".to_string()]);
        let daemon = env.daemon(&scratch, &daemon_args)?;
        let client = Client::connect(&daemon.config(&daemon.admin_token)).await?;
        let size = size_mib * 1024 * 1024;
        let src = scratch.0.join("artifact.bin");
        std::fs::write(&src, random_data(size as usize))
            .map_err(|e| nokv_client::ClientError::local(e.to_string()))?;
        let blocks = size.div_ceil(4 * 1024 * 1024) as u32;
        let (mut publish, mut restore, mut direct) = (Vec::new(), Vec::new(), Vec::new());
        // The daemon's CPU per MiB moved (its process, all threads), per direction, and this
        // process's — the client that publishes and restores, on the same cores.
        let daemon_cpu = cpu::CpuClock::of_pid(daemon.pid());
        let client_cpu = cpu::CpuClock::of_self();
        let per_s = cpu::ticks_per_second();
        let ms_per_mib =
            |ticks: Option<u64>| ticks.map(|t| 1000.0 * t as f64 / per_s / size_mib.max(1) as f64);
        let (mut publish_cpu, mut restore_cpu) = (Vec::new(), Vec::new());
        let (mut publish_client, mut restore_client) = (Vec::new(), Vec::new());
        let spent = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| b.saturating_sub(a));
        for round in 0..rounds {
            let cpu0 = daemon_cpu.ticks();
            let own0 = client_cpu.ticks();
            let t = Instant::now();
            client
                .publish_file(
                    "bench",
                    &format!("artifact-{round}"),
                    &src,
                    PublishOptions {
                        parallel,
                        ..PublishOptions::default()
                    },
                )
                .await?;
            publish.push(size_mib as f64 / t.elapsed().as_secs_f64());
            let (cpu1, own1) = (daemon_cpu.ticks(), client_cpu.ticks());
            publish_cpu.extend(ms_per_mib(spent(cpu0, cpu1)));
            publish_client.extend(ms_per_mib(spent(own0, own1)));
            let dest = scratch.0.join(format!("restored-{round}"));
            let t = Instant::now();
            client
                .restore("bench", &format!("artifact-{round}"), &dest, parallel, None)
                .await?;
            restore.push(size_mib as f64 / t.elapsed().as_secs_f64());
            let (cpu2, own2) = (daemon_cpu.ticks(), client_cpu.ticks());
            restore_cpu.extend(ms_per_mib(spent(cpu1, cpu2)));
            restore_client.extend(ms_per_mib(spent(own1, own2)));
            let _ = std::fs::remove_file(&dest);
            direct.push(direct_put(env, &daemon.data_dir, &extra, blocks, parallel)?);
        }
        let best = |v: &[f64]| v.iter().cloned().fold(f64::NAN, f64::max);
        let least = |v: &[f64]| v.iter().cloned().fold(f64::NAN, f64::min);
        let (p, r, d) = (best(&publish), best(&restore), best(&direct));
        let (pc, rc) = (least(&publish_cpu), least(&restore_cpu));
        let (pcc, rcc) = (least(&publish_client), least(&restore_client));
        rows.push(vec![
            provider.clone(),
            f2(p),
            f2(r),
            f2(d),
            f2(p / d),
            f2(pc),
            f2(rc),
            f2(pcc),
            f2(rcc),
        ]);
        results.push(json!({
            "provider": provider, "size_mib": size_mib, "rounds": rounds, "parallel": parallel,
            "publish_mib_s": publish, "restore_mib_s": restore, "direct_put_mib_s": direct,
            "best_publish_mib_s": p, "best_restore_mib_s": r, "best_direct_put_mib_s": d,
            "publish_over_direct": p / d,
            "daemon_cpu_ms_per_mib_published": publish_cpu,
            "daemon_cpu_ms_per_mib_restored": restore_cpu,
            "client_cpu_ms_per_mib_published": publish_client,
            "client_cpu_ms_per_mib_restored": restore_client,
        }));
    }
    print_table(
        &format!(
            "upload-vs-direct: {size_mib} MiB, 4 MiB blocks, {parallel} in flight, no bulk cap (best of {rounds}; CPU: least of {rounds})"
        ),
        &[
            "provider",
            "publish MiB/s",
            "restore MiB/s",
            "direct PUT MiB/s",
            "publish/direct",
            "daemon CPU ms/MiB published",
            "restored",
            "client CPU ms/MiB published",
            "restored",
        ],
        &rows,
    );
    Ok(json!({"bench": "upload-vs-direct", "results": results}))
}

/// Small-write ops/s at 1, 8 and 64 sessions, nokv and etcd at each count in the same run
/// (nokv first, then etcd, per count), with the nokv/etcd ratio per count.
pub async fn scaling(env: &BenchEnv, durability: Durability) -> Result<Value> {
    let scratch = Scratch::new(&env.work_dir, "scaling")?;
    let daemon = env.daemon(&scratch, &[])?;
    let etcd = Etcd::start(&scratch.0)?;
    let provider = match durability {
        Durability::Provider => Some(ProviderNode::start(env, &scratch, &etcd).await?),
        Durability::Local => None,
    };
    print_pids(&daemon, &etcd);
    let mut rows = Vec::new();
    let mut results = Vec::new();
    let (mut base, mut etcd_base) = (f64::NAN, f64::NAN);
    for sessions in [1usize, 8, 64] {
        let (s, cpu) = nokv_writes(&daemon, sessions, env.seconds).await?;
        let (e, etcd_cpu) = etcd_writes(&etcd, sessions, env.seconds).await?;
        if sessions == 1 {
            base = s.ops_per_s;
            etcd_base = e.ops_per_s;
        }
        let mut row = summary_row("nokv", sessions, &s);
        row.push(f2(s.ops_per_s / base));
        row.push(cpu::cell(cpu.server_cpu_ms_per_op));
        row.push(cpu::cell(cpu.client_cpu_ms_per_op));
        rows.push(row);
        let mut extra = json!({});
        if let Some(p) = &provider {
            let (ps, pcpu, puts) = p.writes(sessions, env.seconds).await?;
            let mut row = summary_row(&format!("nokv provider ({puts:.0} PUT/s)"), sessions, &ps);
            row.push(f2(ps.ops_per_s / s.ops_per_s));
            row.push(cpu::cell(pcpu.server_cpu_ms_per_op));
            row.push(cpu::cell(pcpu.client_cpu_ms_per_op));
            rows.push(row);
            extra = provider_fields(&s, &ps, puts);
        }
        let mut row = summary_row("etcd", sessions, &e);
        row.push(f2(e.ops_per_s / etcd_base));
        row.push(cpu::cell(etcd_cpu.server_cpu_ms_per_op));
        row.push(cpu::cell(etcd_cpu.client_cpu_ms_per_op));
        rows.push(row);
        let mut result = json!({
            "sessions": sessions, "summary": s, "ops_ratio_vs_1": s.ops_per_s / base,
            "server_cpu_ms_per_op": cpu.server_cpu_ms_per_op,
            "client_cpu_ms_per_op": cpu.client_cpu_ms_per_op,
            "etcd": e, "etcd_ops_ratio_vs_1": e.ops_per_s / etcd_base,
            "etcd_cpu_ms_per_op": etcd_cpu.server_cpu_ms_per_op,
            "etcd_client_cpu_ms_per_op": etcd_cpu.client_cpu_ms_per_op,
            "ops_ratio_nokv_over_etcd": s.ops_per_s / e.ops_per_s,
            "p50_ratio_nokv_over_etcd": s.p50_ms / e.p50_ms,
        });
        merge(&mut result, extra);
        results.push(result);
    }
    print_table(
        "scaling: 4 KiB small writes, one workspace per session (etcd: one connection per session)",
        &[
            "system",
            "sessions",
            "p50 ms",
            "p99 ms",
            "ops/s",
            "x vs 1",
            "server CPU ms/op",
            "client CPU ms/op",
        ],
        &rows,
    );
    for r in &results {
        println!(
            "  {} session(s): nokv/etcd ops/s ratio {:.2}, p50 ratio {:.2}",
            r["sessions"],
            r["ops_ratio_nokv_over_etcd"].as_f64().unwrap_or(f64::NAN),
            r["p50_ratio_nokv_over_etcd"].as_f64().unwrap_or(f64::NAN)
        );
        print_provider_ratio(r);
    }
    Ok(json!({"bench": "scaling", "seconds": env.seconds, "results": results}))
}
