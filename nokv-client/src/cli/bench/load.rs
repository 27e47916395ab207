//! The load every put benchmark shares: the bench settings, clients writing 4 KiB files in a
//! closed loop for a while, and what they measured.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nokv_client::Client;
use nokv_proto::v1 as pb;

use super::cpu::{CpuMeter, CpuPerOp};
use super::harness::{Daemon, Result, Scratch, Summary, summarize};

/// Settings shared by the self-hosted benchmarks.
pub struct BenchEnv {
    pub server_bin: PathBuf,
    pub work_dir: PathBuf,
    pub seconds: f64,
}

impl BenchEnv {
    pub(super) fn daemon(&self, scratch: &Scratch, extra: &[String]) -> Result<Daemon> {
        let dir = scratch.0.join("nokv");
        Daemon::start(&self.server_bin, &dir, extra)
    }
}

/// Runs `op` in a loop on every connection for `seconds`, collecting latencies.
pub(super) async fn load<C, F, Fut>(conns: Vec<C>, seconds: f64, op: F) -> Summary
where
    C: Clone + Send + 'static,
    F: Fn(C, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let (lat_ms, elapsed) = load_samples(conns, seconds, op).await;
    summarize(lat_ms, elapsed)
}

/// [`load`]'s raw figures: every successful operation's latency in ms and the seconds the
/// run took (so rounds can be pooled before summarising).
pub(super) async fn load_samples<C, F, Fut>(conns: Vec<C>, seconds: f64, op: F) -> (Vec<f64>, f64)
where
    C: Clone + Send + 'static,
    F: Fn(C, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|c| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    if op(c.clone(), i).await {
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    (all, started.elapsed().as_secs_f64())
}

/// The 4 KiB durable write every put benchmark measures (64 paths per workspace, rewritten).
pub(super) fn small_write(ws: String, i: u64) -> pb::WriteRequest {
    pb::WriteRequest {
        workspace: ws,
        path: format!("bench/file-{}", i % 64),
        data: vec![b'x'; 4096].into(),
        ..Default::default()
    }
}

/// `n` clients of `d`, each with its own workspace `bench-w<i>` and a write token for it.
pub(super) async fn nokv_clients(d: &Daemon, n: usize) -> Result<Vec<(Client, String)>> {
    let mut out = Vec::new();
    for i in 0..n {
        let ws = format!("bench-w{i}");
        let client = Client::connect(&d.config(&d.token(&ws)?)).await?;
        out.push((client, ws));
    }
    Ok(out)
}

/// `n` nokv clients writing for `seconds`, with the CPU the daemon and this process spent.
/// Connections are made before the CPU clocks start, so only the writes are counted.
pub(super) async fn nokv_writes(d: &Daemon, n: usize, seconds: f64) -> Result<(Summary, CpuPerOp)> {
    let conns = nokv_clients(d, n).await?;
    let cpu = CpuMeter::start(d.pid());
    let s = load(conns, seconds, |(c, ws): (Client, String), i| async move {
        c.write(small_write(ws, i)).await.is_ok()
    })
    .await;
    Ok((s, cpu.finish(s.ops)))
}
