//! The probe's workers. `session` is an agent's tool loop (stat a file, write a 4 KiB file),
//! closed (each pair right after the last) or open (`--rate`: pairs at a mean rate, each
//! started on its own schedule whatever the previous one's latency, so a slow server meets
//! the same offered load instead of a politely slowing client);
//! `upload` publishes artifacts back to back. Both print one JSON line per operation —
//! `op`, `start` (Unix seconds), `latency` (seconds), `latency_ms`, `ok` (the uploader also
//! one `block` line with its `bytes` per block acknowledged) — and stop after
//! `--seconds` or on SIGTERM/SIGINT, exiting 0.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nokv_client::publish::PublishOptions;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::json;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Resolves when the run should end: the deadline passes or a stop signal arrives.
async fn stop(seconds: Option<f64>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let deadline = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = deadline => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn emit(line: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn timed<T>(op: &str, f: impl std::future::Future<Output = Result<T, ClientError>>) -> bool {
    let (start, t) = (unix_now(), Instant::now());
    let r = f.await;
    let latency = t.elapsed().as_secs_f64();
    let mut line = json!({"op": op, "start": start, "latency": latency,
        "latency_ms": latency * 1000.0, "ok": r.is_ok()});
    if let Err(e) = &r {
        line["error"] = json!(e.reason_name());
    }
    emit(line);
    r.is_ok()
}

pub async fn session(
    client: &Client,
    ws: &str,
    seconds: Option<f64>,
    file_size: usize,
    rate: Option<f64>,
) {
    let probe = "session/stat-target.txt";
    let _ = client
        .write(pb::WriteRequest {
            workspace: ws.into(),
            path: probe.into(),
            data: bytes::Bytes::from_static(b"probe"),
            ..Default::default()
        })
        .await;
    let body = bytes::Bytes::from(vec![b'x'; file_size]);
    let mut think = rate.map(|r| ThinkTime::new(r, unix_now().to_bits()));
    let mut due = tokio::time::Instant::now();
    let work = async {
        for i in 0u64.. {
            if let Some(think) = &mut think {
                // Open loop: the next pair is due a think time after the previous one was due,
                // not after it was answered; a pair running late starts at once (no burst to
                // catch up, so the offered rate is at most the target).
                due = (due + think.next()).max(tokio::time::Instant::now() - think.mean);
                tokio::time::sleep_until(due).await;
            }
            timed("stat", client.stat(ws, probe)).await;
            let req = pb::WriteRequest {
                workspace: ws.into(),
                path: format!("session/file-{}.txt", i % 16),
                data: body.clone(),
                ..Default::default()
            };
            timed("put", client.write(req)).await;
        }
    };
    tokio::select! {
        _ = work => {}
        _ = stop(seconds) => {}
    }
}

pub async fn upload(
    client: &Client,
    ws: &str,
    size_mib: u64,
    pace: Option<f64>,
    seconds: Option<f64>,
) {
    let size = size_mib * 1024 * 1024;
    let data = std::sync::Arc::new(random_data(size as usize));
    let began = Instant::now();
    let work = async {
        let mut sent = 0u64;
        for i in 0u64.. {
            let (start, t) = (unix_now(), Instant::now());
            // One `block` line per block acknowledged: the probe attributes the uploader's
            // bytes to its windows by these (a large artifact spans several windows).
            let progress: nokv_client::publish::Progress = std::sync::Arc::new(|bytes| {
                emit(json!({"op": "block", "start": unix_now(), "latency": 0.0,
                    "latency_ms": 0.0, "bytes": bytes, "ok": true}));
            });
            let r = client
                .publish_reader(
                    ws,
                    &format!("uploads/artifact-{}", i % 4),
                    std::io::Cursor::new(data.as_slice()),
                    size,
                    PublishOptions {
                        progress: Some(progress),
                        ..PublishOptions::default()
                    },
                )
                .await;
            let latency = t.elapsed().as_secs_f64();
            let mut line = json!({"op": "upload", "start": start, "latency": latency,
                "latency_ms": latency * 1000.0, "bytes": size, "ok": r.is_ok()});
            if let Err(e) = &r {
                line["error"] = json!(e.reason_name());
            }
            emit(line);
            sent += size;
            if let Some(mib_s) = pace {
                let due = Duration::from_secs_f64(sent as f64 / (mib_s * 1024.0 * 1024.0));
                if let Some(wait) = due.checked_sub(began.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
    };
    tokio::select! {
        _ = work => {}
        _ = stop(seconds) => {}
    }
}

/// Think times of a session at a mean `rate` pairs per second: uniform on [0.5, 1.5] x the
/// mean, so sessions started together drift apart instead of arriving in lockstep, while the
/// rate stays exact on average.
struct ThinkTime {
    mean: Duration,
    state: u64,
}

impl ThinkTime {
    fn new(rate: f64, seed: u64) -> ThinkTime {
        ThinkTime {
            mean: Duration::from_secs_f64(1.0 / rate),
            state: seed | 1,
        }
    }

    fn next(&mut self) -> Duration {
        // xorshift64: jitter needs spread, not unpredictability.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let unit = (self.state >> 11) as f64 / (1u64 << 53) as f64;
        self.mean.mul_f64(0.5 + unit)
    }
}

/// Incompressible bench data (xorshift; speed matters here, not unpredictability).
pub fn random_data(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15
        ^ SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_times_average_to_the_rate_and_are_jittered_within_half_the_mean() {
        let mut t = ThinkTime::new(10.0, 42);
        let n = 10_000;
        let times: Vec<Duration> = (0..n).map(|_| t.next()).collect();
        let mean = times.iter().sum::<Duration>().as_secs_f64() / n as f64;
        assert!((mean - 0.1).abs() < 0.002, "mean think time {mean}");
        assert!(
            times
                .iter()
                .all(|d| (0.05..=0.15).contains(&d.as_secs_f64()))
        );
        assert!(times.windows(2).any(|w| w[0] != w[1]), "jittered");
    }
}
