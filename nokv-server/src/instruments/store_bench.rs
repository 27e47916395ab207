//! `nokv-server store-bench`: the store alone — 4 KiB small-file writes through the same shard
//! write path a `Write` call takes (replay record, quota, generation, entry, inline body, the
//! node committer's batch transaction and fsync), from tasks inside this process: no gRPC, no
//! TLS, no authentication, no client.
//!
//! Its ops/s is therefore the ceiling of any put the daemon serves on this machine, and its
//! CPU per write the part of a put's cost that the store itself spends. `nokv bench limits`
//! runs it beside the transport's ceiling and etcd, so a small-write bar that asks for more
//! than the store alone reaches is shown to be out of reach, not tuned away.
//!
//! It opens its own node file under `--data-dir` (which must not be a live daemon's: the data
//! dir lock refuses that) and prints one JSON line per session count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nokv_proto::v1 as pb;

use crate::config::Settings;
use crate::ids::{random_bytes, random_hex};
use crate::memory::BlockMemory;
use crate::node::{Node, NodeParts};
use crate::object::ObjectProvider;
use crate::token::Signer;

/// One measurement: `sessions` concurrent writers for the run's duration.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub sessions: usize,
    pub ops: usize,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU time of this whole process (user + system, every thread) per write.
    pub cpu_ms_per_op: f64,
    /// Batches the node committer ran meanwhile, and writes per batch on average.
    pub batches: u64,
    pub writes_per_batch: f64,
    /// Redo log appends (one fsync each) meanwhile, and writes per fsync on average: above
    /// `writes_per_batch` when one fsync covered several batches.
    pub fsyncs: u64,
    pub writes_per_fsync: f64,
}

/// User + system CPU time of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF has no other
    // precondition.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A request id as the SDK makes them: the millisecond first, then 80 random bits.
pub(crate) fn request_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!("{:012x}{}", ms & 0xffff_ffff_ffff, random_hex(10))
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Locks the data dir of `settings` and opens its node as a measuring instrument does: the
/// shard write path of the daemon, nothing served, a throwaway token key (`name` labels it).
pub(crate) fn open_node(
    settings: &Settings,
    name: &str,
) -> Result<(crate::dir_lock::DirLock, Arc<Node>), String> {
    let lock = crate::dir_lock::DirLock::acquire(&settings.data_dir).map_err(|e| e.to_string())?;
    let provider =
        ObjectProvider::open(&settings.provider, &settings.prefix).map_err(|e| e.to_string())?;
    let parts = NodeParts {
        shard_count: settings.shards,
        cfg: settings.shard.clone(),
        bulk: (settings.bulk_parallel, settings.bulk_mib_per_s),
        memory: BlockMemory::new(settings.block_memory, settings.block_memory_wait),
        provider,
        // Nothing is authenticated here: a throwaway key.
        signer: Signer::new(&random_bytes(32)),
        name: name.into(),
        replica: None,
    };
    let node = Arc::new(Node::open(&settings.data_dir, parts).map_err(|e| e.to_string())?);
    Ok((lock, node))
}

/// Writes for `seconds` with each session count in turn, on one node opened under the
/// settings' data dir.
pub async fn run(
    settings: &Settings,
    sessions: &[usize],
    seconds: f64,
) -> Result<Vec<Report>, String> {
    let (_lock, node) = open_node(settings, "store-bench")?;
    let mut reports = Vec::new();
    for &n in sessions {
        reports.push(measure(&node, n, seconds).await?);
    }
    Ok(reports)
}

async fn measure(node: &Arc<Node>, sessions: usize, seconds: f64) -> Result<Report, String> {
    let stats_before = node.committer().stats();
    let syncs_before = node.committer().log_syncs();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..sessions)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move {
                let ws = format!("bench-w{i}");
                let shard = node.shard_for(&ws).map_err(|e| e.to_string())?;
                let mut lat = Vec::new();
                let mut k = 0u64;
                while Instant::now() < deadline {
                    let req = pb::WriteRequest {
                        workspace: ws.clone(),
                        path: format!("bench/file-{}", k % 64),
                        data: vec![b'x'; 4096].into(),
                        request_id: request_id(),
                        ..Default::default()
                    };
                    let t = Instant::now();
                    shard.write(req).await.map_err(|e| e.to_string())?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    k += 1;
                }
                Ok::<_, String>(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (process_cpu() - cpu_before).as_secs_f64() * 1000.0;
    let stats = node.committer().stats();
    lat.sort_by(f64::total_cmp);
    let ops = lat.len();
    let batches = stats.batches - stats_before.batches;
    let fsyncs = node.committer().log_syncs() - syncs_before;
    let written = (stats.sessions - stats_before.sessions) as f64;
    Ok(Report {
        sessions,
        ops,
        seconds: elapsed,
        ops_per_s: ops as f64 / elapsed,
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        cpu_ms_per_op: cpu / ops.max(1) as f64,
        batches,
        writes_per_batch: written / batches.max(1) as f64,
        fsyncs,
        writes_per_fsync: written / fsyncs.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_32_hex_digits_led_by_the_millisecond() {
        let id = request_id();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        crate::names::request_id(&id).expect("a valid request id");
    }

    #[test]
    fn the_median_of_four_samples_is_the_second() {
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 99.0), 4.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
