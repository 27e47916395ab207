//! `nokv bench limits`: where a 4 KiB durable put's cost goes, and what bounds it on this
//! machine, at each client count in one run.
//!
//! First the **store alone** (`nokv-server store-bench`: the shard write path and the node
//! committer driven from tasks inside one process, no gRPC, TLS or client) at every client
//! count: the ceiling of any put the daemon can serve here. Then five loads per client count,
//! one after the other against processes started here (same disk, same cores):
//! * **bare TLS RPC** — `grpc.health.v1.Health/Check` on the nokv daemon: TLS + HTTP/2 +
//!   one unary call and nothing else. No request over gRPC and TLS can be cheaper, so its
//!   ops/s is the ceiling of any put on this transport, and its server CPU per call the floor
//!   of the daemon's.
//! * **refused write** — a 4 KiB `Write` whose path the daemon refuses (`..`): the same
//!   payload, decoding, authentication and error path as a put, but no store work. The
//!   difference to a put is what the store costs.
//! * **durable RPC, writer thread** and **durable RPC, inline** — the same 4 KiB `Write` to
//!   `nokv-server rpc-floor` beside the daemon: the daemon's transport, TLS identity and token
//!   checks, then only a durable write of the body into a scratch file — on one writer thread
//!   that fsyncs once for every body waiting (as the node committer does), or on the async
//!   worker that received the call (no hand-off: at one client the least any design on this
//!   transport pays). Measured, not summed: what a put costs above these rows is the store.
//! * **nokv put** — the 4 KiB durable write of `put-vs-etcd`.
//! * **etcd put**, plaintext gRPC (as `put-vs-etcd` compares against), and **etcd put over
//!   TLS** with the nokv daemon's own certificate: etcd paying the transport nokv always pays.
//!
//! Before them, once, a **durable 4 KiB write alone**: `write` + `fdatasync` of a 4 KiB slot
//! of a preallocated file on the same disk, on one thread of this process, nothing else —
//! the least a durable write costs here (an overwrite that changes no file size, so no
//! metadata journal). A put at `n` clients shares one such write with at most `n - 1` others,
//! so **bare RPC + durable write / n** is a floor of the daemon's CPU per put at `n` clients
//! that no store design goes below on this transport and disk.
//!
//! Both sides' CPU is measured (the bench's clients share the machine's cores with the
//! servers), so a bar that asks nokv for more ops/s than the bare RPC reaches is shown to be
//! out of reach on this transport and machine, not tuned away.

use nokv_client::Client;
use nokv_client::sdk;
use nokv_proto::v1 as pb;
use serde_json::{Value, json};
use tonic::transport::Certificate;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::compare::{cpu_header, cpu_row, etcd_channels, etcd_puts_on};
use super::cpu::{CpuClock, CpuMeter, CpuPerOp, ms_per_op, ticks_per_second};
use super::harness::{Daemon, Etcd, Result, Scratch, Summary, print_table, summarize};
use super::load::{BenchEnv, load, nokv_clients, nokv_writes};

/// One measured load: what it was, its latencies and throughput, and both sides' CPU.
struct Row {
    name: &'static str,
    summary: Summary,
    cpu: CpuPerOp,
}

impl Row {
    /// The printed line of this load at `clients`: the shared CPU columns, then the total.
    fn table_row(&self, clients: usize) -> Vec<String> {
        let mut row = cpu_row(self.name, clients, &self.summary, &self.cpu);
        row.push(super::cpu::cell(total_cpu(&self.cpu)));
        row
    }

    fn json(&self) -> Value {
        json!({
            "summary": self.summary,
            "server_cpu_ms_per_op": self.cpu.server_cpu_ms_per_op,
            "client_cpu_ms_per_op": self.cpu.client_cpu_ms_per_op,
            "total_cpu_ms_per_op": total_cpu(&self.cpu),
        })
    }
}

/// Server + client CPU per operation: what one operation costs the machine.
fn total_cpu(cpu: &CpuPerOp) -> Option<f64> {
    Some(cpu.server_cpu_ms_per_op? + cpu.client_cpu_ms_per_op?)
}

/// `n` health-check calls in flight at a time, each client on its own TLS connection.
async fn bare_rpcs(d: &Daemon, n: usize, seconds: f64) -> Result<(Summary, CpuPerOp)> {
    let ca = read_ca(d)?;
    let mut conns = Vec::new();
    for _ in 0..n {
        let ch = sdk::tls_channel(&d.endpoint, ca.clone())?;
        let mut h = HealthClient::new(ch);
        // Connect (and handshake) before the clocks start, as the put loads do.
        h.check(HealthCheckRequest::default()).await?;
        conns.push(h);
    }
    let cpu = CpuMeter::start(d.pid());
    let s = load(conns, seconds, |mut h: HealthClient<_>, _| async move {
        h.check(HealthCheckRequest::default()).await.is_ok()
    })
    .await;
    Ok((s, cpu.finish(s.ops)))
}

/// `n` clients sending 4 KiB writes the daemon must refuse (a `..` path), counted when the
/// refusal arrives as the expected `InvalidArgument`.
async fn refused_writes(d: &Daemon, n: usize, seconds: f64) -> Result<(Summary, CpuPerOp)> {
    let conns = nokv_clients(d, n).await?;
    let cpu = CpuMeter::start(d.pid());
    let s = load(conns, seconds, |(c, ws): (Client, String), _| async move {
        let req = pb::WriteRequest {
            workspace: ws,
            path: "../outside".into(),
            data: vec![b'x'; 4096].into(),
            ..Default::default()
        };
        matches!(c.write(req).await, Err(e) if e.code == Some(tonic::Code::InvalidArgument))
    })
    .await;
    Ok((s, cpu.finish(s.ops)))
}

/// Slots of the durable-write file: written and synced once before the clock starts, so
/// every measured write overwrites allocated blocks.
const DURABLE_SLOTS: u64 = 256;

/// One thread writing a 4 KiB slot and `fdatasync`ing it, back to back, for `seconds`; its
/// own CPU per write is reported as the server column (the work a daemon's durable write
/// cannot avoid), the client column is 0.
fn durable_writes(dir: &std::path::Path, seconds: f64) -> std::io::Result<(Summary, CpuPerOp)> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("durable-write-alone");
    let file = std::fs::File::create(&path)?;
    let block = vec![b'x'; 4096];
    for slot in 0..DURABLE_SLOTS {
        file.write_all_at(&block, slot * 4096)?;
    }
    file.sync_all()?;
    let clock = CpuClock::of_this_thread();
    let (began, ticks) = (std::time::Instant::now(), clock.ticks());
    let mut lat_ms = Vec::new();
    while began.elapsed().as_secs_f64() < seconds {
        let t = std::time::Instant::now();
        let slot = lat_ms.len() as u64 % DURABLE_SLOTS;
        file.write_all_at(&block, slot * 4096)?;
        file.sync_data()?;
        lat_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let spent = clock.ticks().zip(ticks).and_then(|(b, a)| b.checked_sub(a));
    let elapsed = began.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    let summary = summarize(lat_ms, elapsed);
    let cpu = CpuPerOp {
        server_cpu_ms_per_op: spent.and_then(|t| ms_per_op(t, ticks_per_second(), summary.ops)),
        client_cpu_ms_per_op: Some(0.0),
    };
    Ok((summary, cpu))
}

/// The least server CPU a put can cost at `clients`: a bare RPC, plus the durable write
/// shared by at most `clients` puts.
fn server_cpu_floor(bare: &CpuPerOp, durable: &CpuPerOp, clients: usize) -> Option<f64> {
    Some(bare.server_cpu_ms_per_op? + durable.server_cpu_ms_per_op? / clients.max(1) as f64)
}

fn read_ca(d: &Daemon) -> Result<Certificate> {
    let pem = std::fs::read(&d.ca).map_err(|e| local(format!("{}: {e}", d.ca.display())))?;
    Ok(Certificate::from_pem(pem))
}

/// The store alone, at each session count: `nokv-server store-bench` on its own data dir.
/// Its CPU column is the whole process's (no client exists), reported as server CPU.
fn store_alone(env: &BenchEnv, scratch: &Scratch, counts: &[usize]) -> Result<Vec<Row>> {
    let list = counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let out = std::process::Command::new(&env.server_bin)
        .arg("store-bench")
        .arg("--data-dir")
        .arg(scratch.0.join("store-alone"))
        .args(["--sessions", &list, "--seconds", &env.seconds.to_string()])
        .output()
        .map_err(|e| local(format!("{}: {e}", env.server_bin.display())))?;
    if !out.status.success() {
        return Err(local(format!(
            "store-bench failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .map_err(|e| local(format!("store-bench printed {line:?}: {e}")))?;
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            Ok(Row {
                name: "nokv store alone (in-process)",
                summary: Summary {
                    ops: v["ops"].as_u64().unwrap_or(0) as usize,
                    ops_per_s: f("ops_per_s"),
                    p50_ms: f("p50_ms"),
                    p90_ms: f64::NAN,
                    p99_ms: f("p99_ms"),
                },
                cpu: CpuPerOp {
                    server_cpu_ms_per_op: v["cpu_ms_per_op"].as_f64(),
                    client_cpu_ms_per_op: Some(0.0),
                },
            })
        })
        .collect()
}

fn local(msg: impl Into<String>) -> nokv_client::ClientError {
    nokv_client::ClientError::local(msg)
}

pub async fn limits(env: &BenchEnv, client_counts: &[usize]) -> Result<Value> {
    let scratch = Scratch::new(&env.work_dir, "limits")?;
    let mut alone = store_alone(env, &scratch, client_counts)?.into_iter();
    let dir = scratch.0.clone();
    let seconds = env.seconds;
    let durable = tokio::task::spawn_blocking(move || durable_writes(&dir, seconds))
        .await
        .map_err(|e| local(format!("durable-write thread: {e}")))?
        .map_err(|e| local(format!("durable write alone: {e}")))?;
    let durable = Row {
        name: "durable 4 KiB write alone (fdatasync)",
        summary: durable.0,
        cpu: durable.1,
    };
    let daemon = env.daemon(&scratch, &[])?;
    let writer_floor = daemon.floor(&scratch.0.join("floor-writer"), "writer")?;
    let inline_floor = daemon.floor(&scratch.0.join("floor-inline"), "inline")?;
    let etcd = Etcd::start(&scratch.0)?;
    let tls = daemon.data_dir.join("tls");
    let etcd_tls = Etcd::start_tls(&scratch.0, &tls.join("server.pem"), &tls.join("server.key"))?;
    let ca = read_ca(&daemon)?;
    println!(
        "nokv-server pid {}, etcd pid {}, etcd (TLS) pid {} (server CPU = utime+stime of that \
         pid from /proc; client CPU = this bench process)",
        daemon.pid(),
        etcd.pid(),
        etcd_tls.pid()
    );
    let mut table = vec![durable.table_row(1)];
    let mut results = Vec::new();
    for &n in client_counts {
        let s = env.seconds;
        let mut rows = Vec::new();
        rows.push(
            alone
                .next()
                .ok_or_else(|| local("store-bench printed too few lines"))?,
        );
        let (summary, cpu) = bare_rpcs(&daemon, n, s).await?;
        rows.push(Row {
            name: "bare TLS RPC (health check)",
            summary,
            cpu,
        });
        let (summary, cpu) = refused_writes(&daemon, n, s).await?;
        rows.push(Row {
            name: "nokv 4 KiB write, refused",
            summary,
            cpu,
        });
        for (floor, name) in [
            (&writer_floor, "durable RPC, writer thread"),
            (&inline_floor, "durable RPC, inline"),
        ] {
            let (summary, cpu) = nokv_writes(floor, n, s).await?;
            rows.push(Row { name, summary, cpu });
        }
        let (summary, cpu) = nokv_writes(&daemon, n, s).await?;
        rows.push(Row {
            name: "nokv 4 KiB put",
            summary,
            cpu,
        });
        let (summary, cpu) = etcd_puts_on(&etcd, etcd_channels(&etcd, n, None).await?, s).await;
        rows.push(Row {
            name: "etcd put (plaintext)",
            summary,
            cpu,
        });
        let chans = etcd_channels(&etcd_tls, n, Some(&ca)).await?;
        let (summary, cpu) = etcd_puts_on(&etcd_tls, chans, s).await;
        rows.push(Row {
            name: "etcd put (TLS)",
            summary,
            cpu,
        });
        table.extend(rows.iter().map(|r| r.table_row(n)));
        let [
            store,
            bare,
            refused,
            writer_row,
            inline_row,
            put,
            etcd_plain,
            etcd_tls_row,
        ] = &rows[..]
        else {
            unreachable!("eight rows per client count")
        };
        let ops = |r: &Row| r.summary.ops_per_s;
        results.push(json!({
            "clients": n,
            "store_alone": store.json(),
            "bare_rpc": bare.json(),
            "refused_write": refused.json(),
            "durable_rpc_writer": writer_row.json(),
            "durable_rpc_inline": inline_row.json(),
            "nokv_put": put.json(),
            "etcd_put": etcd_plain.json(),
            "etcd_tls_put": etcd_tls_row.json(),
            "bare_rpc_ops_over_etcd_put": ops(bare) / ops(etcd_plain),
            "store_alone_ops_over_etcd_put": ops(store) / ops(etcd_plain),
            "nokv_put_ops_over_bare_rpc": ops(put) / ops(bare),
            "nokv_put_ops_over_etcd_put": ops(put) / ops(etcd_plain),
            "nokv_put_ops_over_etcd_tls_put": ops(put) / ops(etcd_tls_row),
            "nokv_put_p50_over_etcd_put": put.summary.p50_ms / etcd_plain.summary.p50_ms,
            "nokv_put_p50_over_etcd_tls_put":
                put.summary.p50_ms / etcd_tls_row.summary.p50_ms,
            "server_cpu_floor_ms_per_put": server_cpu_floor(&bare.cpu, &durable.cpu, n),
        }));
    }
    print_table(
        "limits: what bounds a 4 KiB durable put here (one run, same disk and cores)",
        &[cpu_header("load"), vec!["total CPU ms/op"]].concat(),
        &table,
    );
    for r in &results {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "  {} client(s): ceilings over etcd put ops/s: store alone {:.2}, bare TLS RPC {:.2}; \
             nokv put / bare RPC {:.2}; nokv / etcd ops/s {:.2}, vs etcd over TLS {:.2}; \
             p50 nokv / etcd {:.2}, vs etcd over TLS {:.2}; server CPU per put at least {} ms \
             (bare RPC + durable write / {}); measured: durable RPC {} ms with a writer thread, \
             {} ms inline, nokv put {} ms",
            r["clients"],
            f("store_alone_ops_over_etcd_put"),
            f("bare_rpc_ops_over_etcd_put"),
            f("nokv_put_ops_over_bare_rpc"),
            f("nokv_put_ops_over_etcd_put"),
            f("nokv_put_ops_over_etcd_tls_put"),
            f("nokv_put_p50_over_etcd_put"),
            f("nokv_put_p50_over_etcd_tls_put"),
            super::cpu::cell(r["server_cpu_floor_ms_per_put"].as_f64()),
            r["clients"],
            super::cpu::cell(r["durable_rpc_writer"]["server_cpu_ms_per_op"].as_f64()),
            super::cpu::cell(r["durable_rpc_inline"]["server_cpu_ms_per_op"].as_f64()),
            super::cpu::cell(r["nokv_put"]["server_cpu_ms_per_op"].as_f64()),
        );
    }
    Ok(json!({
        "bench": "limits",
        "seconds": env.seconds,
        "durable_write_alone": durable.json(),
        "results": results,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_write_alone_is_timed_on_its_own_thread_and_leaves_no_file_behind() {
        let dir = std::env::temp_dir().join(format!("nokv-durable-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (summary, cpu) = durable_writes(&dir, 0.2).unwrap();
        assert!(summary.ops > 0 && summary.p50_ms > 0.0, "{summary:?}");
        assert_eq!(cpu.client_cpu_ms_per_op, Some(0.0));
        if std::path::Path::new("/proc/thread-self/stat").exists() {
            assert!(cpu.server_cpu_ms_per_op.is_some_and(|ms| ms >= 0.0));
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn a_put_shares_its_durable_write_with_at_most_the_other_clients() {
        let cpu = |ms| CpuPerOp {
            server_cpu_ms_per_op: Some(ms),
            client_cpu_ms_per_op: Some(0.0),
        };
        let floor = |n| server_cpu_floor(&cpu(0.25), &cpu(0.5), n).unwrap();
        assert_eq!(floor(1), 0.75);
        assert_eq!(floor(2), 0.5);
        assert_eq!(floor(0), 0.75);
        let unknown = CpuPerOp {
            server_cpu_ms_per_op: None,
            client_cpu_ms_per_op: None,
        };
        assert_eq!(server_cpu_floor(&unknown, &cpu(0.5), 1), None);
    }
}
