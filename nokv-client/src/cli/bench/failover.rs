//! `nokv bench cluster --kills N`: crash failover with provider durability (issue 45), timed.
//!
//! Three nodes (the cluster default, provider durability, `--node-ttl 3s`). A client writes a
//! 4 KiB file into one workspace in a loop through every node, one attempt per write (the
//! loop is the retry, 20 ms apart), so each success is timed to within a loop turn. Each
//! round: wait until the cluster is settled, note a success, kill -9 the node that owns the
//! workspace's shard, and measure the time from the kill to the first write acknowledged after
//! it — the node's lease lapsing (the TTL), another node fencing its log, restoring the
//! checkpoint and replaying the log, uploading a checkpoint and serving. Then the killed node
//! is restarted on an **empty** data dir (its disk counts as lost) and the next round begins.
//!
//! `--kill-files N` first writes N 4 KiB files into the workspace, so the failover time can be
//! read against the size of the shard the taker restores and checkpoints before serving.
//!
//! Nothing here asserts a timing; the figures are printed and written as JSON.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nokv_client::sdk::RetryPolicy;
use serde_json::{Value, json};

use super::cluster_dir::{ClusterDir, settled, start_daemon, wait_view};
use super::harness::{Daemon, Etcd, Result, Scratch, percentile};
use super::load::{BenchEnv, small_write};

/// The lease TTL of the bench nodes: failover time is this plus the takeover.
pub const NODE_TTL: &str = "3";
const WORKSPACE: &str = "failover-ws";
/// Bound on one failover: past it the bench fails rather than wait for ever.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(120);

/// Kills the owner of one workspace's shard `kills` times (module doc); `nodes` are the
/// running daemons by id, restarted in place.
pub(super) async fn failovers(
    env: &BenchEnv,
    scratch: &Scratch,
    c: &ClusterDir,
    etcd: &Etcd,
    provider: &[String],
    nodes: &mut Vec<(String, Daemon)>,
    (kills, files): (u32, u32),
) -> Result<Value> {
    let ids: Vec<String> = nodes.iter().map(|(id, _)| id.clone()).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    if files > 0 {
        let endpoints: Vec<String> = nodes.iter().map(|(_, d)| d.endpoint.clone()).collect();
        let admin = c.admin(&endpoints.join(",")).await?;
        wait_view(&admin, "every node settled", |v| settled(v, &id_refs)).await?;
        fill(&admin, files).await?;
        eprintln!("failover: {files} files of 4 KiB written into the shard");
    }
    let mut times_ms = Vec::new();
    for round in 0..kills {
        let endpoints: Vec<String> = nodes.iter().map(|(_, d)| d.endpoint.clone()).collect();
        let admin = c.admin(&endpoints.join(",")).await?;
        wait_view(&admin, "every node settled", |v| settled(v, &id_refs)).await?;
        // The restarted node may still be taking its share (a handoff in progress): the
        // owner is asked, and the loop's first write made, once the shard is still.
        let owner = settled_owner(&admin).await?;
        let client = c
            .admin(&endpoints.join(","))
            .await?
            .with_retry(RetryPolicy {
                attempts: 1,
                first_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(20),
            });
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, mut acks) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        let looper = {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 1;
                while !stop.load(Ordering::SeqCst) {
                    if client.write(small_write(WORKSPACE.into(), i)).await.is_ok() {
                        let _ = tx.send(Instant::now());
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    i += 1;
                }
            })
        };
        let at = nodes
            .iter()
            .position(|(_, d)| d.endpoint == owner)
            .ok_or_else(|| nokv_client::ClientError::local(format!("no node at {owner}")))?;
        let (id, victim) = nodes.remove(at);
        drop(victim); // SIGKILL
        let killed = Instant::now();
        let first = loop {
            let next = tokio::time::timeout(FAILOVER_DEADLINE, acks.recv()).await;
            match next {
                Ok(Some(t)) if t > killed => break t,
                Ok(Some(_)) => continue,
                Ok(None) => return Err(nokv_client::ClientError::local("the write loop ended")),
                Err(_) => {
                    return Err(nokv_client::ClientError::local(format!(
                        "no write acknowledged within {FAILOVER_DEADLINE:?} of killing {id}"
                    )));
                }
            }
        };
        stop.store(true, Ordering::SeqCst);
        let _ = looper.await;
        let ms = (first - killed).as_secs_f64() * 1000.0;
        eprintln!(
            "failover {}: killed {id}, first write acknowledged after {ms:.0} ms",
            round + 1
        );
        times_ms.push(ms);
        let dir = scratch.0.join(&id);
        std::fs::remove_dir_all(&dir)
            .map_err(|e| nokv_client::ClientError::local(format!("{}: {e}", dir.display())))?;
        let mut args = provider.to_vec();
        args.extend(["--node-ttl".to_string(), NODE_TTL.to_string()]);
        let restarted = start_daemon(env, scratch, c, &id, args, Some(etcd))?;
        nodes.insert(at, (id, restarted));
    }
    let mut sorted = times_ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Ok(json!({
        "kills": kills,
        "shard_files": files,
        "node_ttl_s": NODE_TTL.parse::<u64>().unwrap_or(0),
        "failover_ms": times_ms,
        "min_ms": sorted.first().copied().unwrap_or(f64::NAN),
        "median_ms": percentile(&sorted, 50.0),
        "max_ms": sorted.last().copied().unwrap_or(f64::NAN),
    }))
}

/// Writes `files` 4 KiB files into the workspace, 8 at a time (the SDK retries a shard still
/// settling).
async fn fill(client: &nokv_client::Client, files: u32) -> Result<()> {
    use futures::StreamExt;
    let writes = futures::stream::iter(0..files).map(|k| {
        let client = client.clone();
        async move {
            let mut req = small_write(WORKSPACE.into(), 0);
            req.path = format!("fill/{k}.txt");
            client.write(req).await.map(|_| ())
        }
    });
    let results: Vec<_> = writes.buffer_unordered(8).collect().await;
    results
        .into_iter()
        .collect::<std::result::Result<(), _>>()?;
    Ok(())
}

/// The endpoint of the workspace's owner once a write there succeeds (bounded by
/// [`FAILOVER_DEADLINE`]; a shard between owners answers a retryable error meanwhile).
async fn settled_owner(admin: &nokv_client::Client) -> Result<String> {
    let deadline = Instant::now() + FAILOVER_DEADLINE;
    loop {
        let attempt = async {
            let owner = admin.route(WORKSPACE).await?.endpoint;
            admin.write(small_write(WORKSPACE.into(), 0)).await?;
            Ok::<_, nokv_client::ClientError>(owner)
        };
        match attempt.await {
            Ok(owner) => return Ok(owner),
            Err(e) if Instant::now() >= deadline => return Err(e),
            // Polling a cluster that sends no signal when a handoff ends.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
