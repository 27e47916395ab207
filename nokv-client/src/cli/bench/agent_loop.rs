//! `nokv bench agent-loop`: an agent's edit loop with the search and the edit done on the
//! server, beside the same loop done by the client, in one run against one daemon.
//!
//! Each session owns a workspace of `files` small source files (`src/mNNNN.rs`), each holding
//! a unique `id: doc-NNNN` line and a `counter: N` line. One iteration picks the next file and:
//! * **server**: Grep `^id: doc-NNNN$` (one RPC) → Read the file it names → Edit
//!   `counter: N` → `counter: N+1` conditioned on the generation read → Stat;
//! * **client**: List every path → Read every file and match the same regex locally (the same
//!   `regex` crate the server uses, so the engines are equal) → Read the file → Write the
//!   edited body with if_generation → Stat.
//!
//! Both modes run at each session count for `--seconds`, server first; per tool p50/p99 and
//! the whole loop's, printed as a table (or one JSON document with `--json`) and saved as a
//! JSON report. Nothing here asserts a timing.

use std::time::{Duration, Instant};

use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use regex::Regex;
use serde_json::{Value, json};

use super::harness::{Result, Scratch, Summary, f2, summarize, table};
use super::load::{BenchEnv, nokv_clients};

/// What to measure (flags of `nokv bench agent-loop`).
pub struct AgentLoopBench {
    /// Concurrent sessions per measurement, each on its own workspace.
    pub sessions: Vec<usize>,
    /// Files per session's workspace.
    pub files: usize,
    /// Approximate size of each file in bytes.
    pub file_size: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Server,
    Client,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Server => "server",
            Mode::Client => "client",
        }
    }
}

/// The tools of one iteration, in order, then the whole iteration.
const TOOLS: [&str; 5] = ["grep", "read", "edit", "stat", "loop"];

/// Latencies (ms) of each tool over every iteration that completed.
#[derive(Default)]
struct Samples {
    per_tool: [Vec<f64>; 5],
    failed: u64,
}

pub async fn run(env: &BenchEnv, b: &AgentLoopBench) -> Result<(Value, String)> {
    let scratch = Scratch::new(&env.work_dir, "agent-loop")?;
    let daemon = env.daemon(&scratch, &[])?;
    let most = b.sessions.iter().copied().max().unwrap_or(1);
    let conns = nokv_clients(&daemon, most).await?;
    for (c, ws) in &conns {
        populate(c, ws, b.files, b.file_size).await?;
    }
    let mut rows = Vec::new();
    let mut results = Vec::new();
    for &n in &b.sessions {
        for mode in [Mode::Server, Mode::Client] {
            let (samples, elapsed) = measure(&conns[..n], mode, b.files, env.seconds).await;
            let mut tools = serde_json::Map::new();
            for (tool, lat) in TOOLS.iter().zip(samples.per_tool) {
                let s = summarize(lat, elapsed);
                rows.push(row(mode, n, tool, &s));
                tools.insert(tool.to_string(), json!(s));
            }
            results.push(json!({
                "mode": mode.name(),
                "sessions": n,
                "failed_iterations": samples.failed,
                "tools": tools,
            }));
        }
    }
    let mut text = format!(
        "nokv-server pid {}; {} files of ~{} bytes per session workspace; {} s per row group",
        daemon.pid(),
        b.files,
        b.file_size,
        env.seconds
    );
    text.push_str(&table(
        "agent loop: grep -> read -> edit -> stat (server = Grep/Edit RPCs; client = list + read every file + local regex, then write with if_generation)",
        &["mode", "sessions", "tool", "p50 ms", "p99 ms", "loops/s"],
        &rows,
    ));
    text.push_str(&ratios(&results));
    let report = json!({
        "bench": "agent-loop",
        "files": b.files,
        "file_size": b.file_size,
        "seconds": env.seconds,
        "results": results,
    });
    Ok((report, text))
}

fn row(mode: Mode, sessions: usize, tool: &str, s: &Summary) -> Vec<String> {
    vec![
        mode.name().into(),
        sessions.to_string(),
        tool.into(),
        f2(s.p50_ms),
        f2(s.p99_ms),
        format!("{:.0}", s.ops_per_s),
    ]
}

/// Client loop p50 over server loop p50, per session count.
fn ratios(results: &[Value]) -> String {
    let p50 = |mode: &str, n: &Value| {
        results
            .iter()
            .find(|r| r["mode"] == mode && &r["sessions"] == n)
            .and_then(|r| r["tools"]["loop"]["p50_ms"].as_f64())
    };
    let mut out = String::from("\nloop p50, client-side / server-side:");
    for r in results.iter().filter(|r| r["mode"] == "server") {
        if let (Some(s), Some(c)) = (p50("server", &r["sessions"]), p50("client", &r["sessions"])) {
            out.push_str(&format!(" {} sessions {:.2}x;", r["sessions"], c / s));
        }
    }
    out.push('\n');
    out
}

fn path_of(k: usize) -> String {
    format!("src/m{k:04}.rs")
}

/// A source-like body with the file's unique id line and its counter, padded with filler
/// lines to about `size` bytes.
fn body_of(k: usize, size: usize) -> String {
    let mut s = format!("// module {k}\nid: doc-{k:04}\ncounter: 0\n");
    let mut n = 0;
    while s.len() < size {
        s.push_str(&format!(
            "fn helper_{n}(x: u64) -> u64 {{ x.wrapping_mul({n}) ^ 0x5eed }}\n"
        ));
        n += 1;
    }
    s
}

async fn populate(c: &Client, ws: &str, files: usize, size: usize) -> Result<()> {
    for k in 0..files {
        c.write(pb::WriteRequest {
            workspace: ws.into(),
            path: path_of(k),
            data: body_of(k, size).into_bytes().into(),
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// Every session runs the loop in `mode` until `seconds` pass.
async fn measure(
    conns: &[(Client, String)],
    mode: Mode,
    files: usize,
    seconds: f64,
) -> (Samples, f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .iter()
        .cloned()
        .enumerate()
        .map(|(s, (c, ws))| {
            tokio::spawn(async move {
                let mut samples = Samples::default();
                // Sessions start on different files, so they do not move in lockstep.
                let mut k = s * 7;
                while Instant::now() < deadline {
                    match iteration(&c, &ws, mode, k % files.max(1)).await {
                        Ok(lat) => {
                            for (all, one) in samples.per_tool.iter_mut().zip(lat) {
                                all.push(one);
                            }
                        }
                        Err(_) => samples.failed += 1,
                    }
                    k += 1;
                }
                samples
            })
        })
        .collect();
    let mut all = Samples::default();
    for t in tasks {
        let s = t.await.unwrap_or_default();
        for (into, from) in all.per_tool.iter_mut().zip(s.per_tool) {
            into.extend(from);
        }
        all.failed += s.failed;
    }
    (all, started.elapsed().as_secs_f64())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// One grep → read → edit → stat iteration on file `k`; the latency of each tool and of
/// the whole.
async fn iteration(
    c: &Client,
    ws: &str,
    mode: Mode,
    k: usize,
) -> std::result::Result<[f64; 5], ClientError> {
    let start = Instant::now();
    let regex = format!("^id: doc-{k:04}$");
    let t = Instant::now();
    let path = match mode {
        Mode::Server => server_grep(c, ws, &regex).await?,
        Mode::Client => client_grep(c, ws, &regex).await?,
    };
    let grep = ms(t);

    let t = Instant::now();
    let r = c.read(ws, &path).await?;
    let read = ms(t);
    let entry = r.entry.unwrap_or_default();
    let text = String::from_utf8_lossy(&r.data).into_owned();
    let old = text
        .lines()
        .find(|l| l.starts_with("counter: "))
        .ok_or_else(|| ClientError::local(format!("{path} has no counter line")))?
        .to_string();
    let n: u64 = old["counter: ".len()..].parse().unwrap_or(0);
    let new = format!("counter: {}", n + 1);

    let t = Instant::now();
    match mode {
        Mode::Server => {
            c.edit(pb::EditRequest {
                workspace: ws.into(),
                path: path.clone(),
                old,
                new,
                expected_generation: entry.generation,
                request_id: String::new(),
            })
            .await?;
        }
        Mode::Client => {
            c.write(pb::WriteRequest {
                workspace: ws.into(),
                path: path.clone(),
                data: text.replacen(&old, &new, 1).into_bytes().into(),
                mode: pb::WriteMode::IfGeneration as i32,
                if_generation: entry.generation,
                request_id: String::new(),
            })
            .await?;
        }
    }
    let edit = ms(t);

    let t = Instant::now();
    c.stat(ws, &path).await?;
    let stat = ms(t);
    Ok([grep, read, edit, stat, ms(start)])
}

async fn server_grep(
    c: &Client,
    ws: &str,
    regex: &str,
) -> std::result::Result<String, ClientError> {
    let (matches, _) = c
        .grep(pb::GrepRequest {
            workspace: ws.into(),
            regex: regex.into(),
            path_glob: "src/**".into(),
            // The default (100): the whole workspace is searched, as the client side does.
            ..Default::default()
        })
        .await?;
    matches
        .into_iter()
        .next()
        .map(|m| m.path)
        .ok_or_else(|| ClientError::local(format!("no file matches {regex}")))
}

/// What an agent without server-side search does: list the workspace, read every file (one
/// at a time, as a tool loop calls its tools), match line by line.
async fn client_grep(
    c: &Client,
    ws: &str,
    regex: &str,
) -> std::result::Result<String, ClientError> {
    let re = Regex::new(regex).map_err(|e| ClientError::local(e.to_string()))?;
    let mut cursor = String::new();
    let mut found = None;
    loop {
        let page = c.list(ws, "src/", 1000, &cursor).await?;
        for e in &page.entries {
            let r = c.read(ws, &e.path).await?;
            let text = String::from_utf8_lossy(&r.data);
            if found.is_none() && text.lines().any(|l| re.is_match(l)) {
                found = Some(e.path.clone());
            }
        }
        cursor = page.next_cursor;
        if cursor.is_empty() {
            break;
        }
    }
    found.ok_or_else(|| ClientError::local(format!("no file matches {regex}")))
}
