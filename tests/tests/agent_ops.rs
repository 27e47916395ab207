//! The agent operations done on the server (Edit, Append, Find, Grep) against the real
//! daemon: through the SDK under concurrency, and through the `nokv` CLI with `--json`.
//!
//! Grep's byte and time budgets have no daemon flag, so they are unit-tested in
//! `nokv-server/src/shard/search/tests.rs`; here the bounds a client can set or provoke are
//! checked: `max_matches`, a pathological regex, a pattern past the size limits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use nokv_tests::Daemon;
use serde_json::Value;
use tokio::sync::Barrier;

async fn put(c: &Client, ws: &str, path: &str, body: &[u8]) -> pb::Entry {
    c.write(pb::WriteRequest {
        workspace: ws.into(),
        path: path.into(),
        data: body.to_vec().into(),
        mode: pb::WriteMode::Upsert as i32,
        ..Default::default()
    })
    .await
    .expect("write")
}

async fn body(c: &Client, ws: &str, path: &str) -> String {
    let r = c.read(ws, path).await.expect("read");
    String::from_utf8(r.data.to_vec()).expect("UTF-8 body")
}

fn grep_req(ws: &str, regex: &str) -> pb::GrepRequest {
    pb::GrepRequest {
        workspace: ws.into(),
        regex: regex.into(),
        max_matches: 10_000,
        ..Default::default()
    }
}

#[track_caller]
fn assert_reason<T: std::fmt::Debug>(r: Result<T, ClientError>, reason: &str) {
    match r {
        Err(e) if e.is(reason) => {}
        other => panic!("expected {reason}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Edit and Append under concurrency
// ---------------------------------------------------------------------------------------------

const CLIENTS: usize = 8;
const LINES: usize = 100;

// Catches: an append that reads the body in one snapshot and writes it in another session
// (appends lost when two interleave), or one that writes a partial line. (Verified red: with
// the body read before the write session, 173 of 800 lines survived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_appending_a_hundred_lines_each_leave_800_whole_lines_in_each_clients_order()
{
    let d = Daemon::start(&[]);
    let start = Arc::new(Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = d.sdk().await;
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for i in 0..LINES {
                // A line long enough that a torn write would show.
                let line = format!("client {c} line {i:03} {}\n", "x".repeat(40));
                client
                    .append(pb::AppendRequest {
                        workspace: "ws".into(),
                        path: "log.txt".into(),
                        data: line.into_bytes(),
                        request_id: String::new(),
                    })
                    .await
                    .expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let text = body(&d.sdk().await, "ws", "log.txt").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), CLIENTS * LINES);
    let mut seen: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        assert!(
            parts.len() == 5
                && parts[0] == "client"
                && parts[2] == "line"
                && parts[4] == "x".repeat(40),
            "torn or interleaved line: {line:?}"
        );
        let c: usize = parts[1].parse().unwrap();
        let i: usize = parts[3].parse().unwrap();
        seen.entry(c).or_default().push(i);
    }
    for c in 0..CLIENTS {
        let want: Vec<usize> = (0..LINES).collect();
        assert_eq!(seen.get(&c), Some(&want), "client {c}'s lines in its order");
    }
}

// Catches: the generation check done outside the write session that applies the edit (two
// edits both pass it), or edits that ignore `expected_generation`. (Verified red: with the
// check dropped, the losers see MatchCount instead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_edits_with_the_same_expected_generation_let_exactly_one_win() {
    let d = Daemon::start(&[]);
    let setup = d.sdk().await;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(Arc::new(d.sdk().await));
    }
    for round in 0..5 {
        let e = put(&setup, "ws", "state.txt", b"owner = nobody\n").await;
        let start = Arc::new(Barrier::new(CLIENTS));
        let mut tasks = Vec::new();
        for (c, client) in clients.iter().enumerate() {
            let (client, start) = (client.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let r = client
                    .edit(pb::EditRequest {
                        workspace: "ws".into(),
                        path: "state.txt".into(),
                        old: "nobody".into(),
                        new: format!("client-{c}"),
                        expected_generation: e.generation,
                        request_id: String::new(),
                    })
                    .await;
                (c, r)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            let (c, r) = t.await.unwrap();
            match r {
                Ok(entry) => winners.push((c, entry)),
                Err(err) => assert!(
                    err.is("GenerationMismatch"),
                    "round {round}: a loser must see GenerationMismatch, got {err:?}"
                ),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one edit wins");
        let (c, entry) = &winners[0];
        assert_eq!(entry.generation, e.generation + 1);
        assert_eq!(
            body(&setup, "ws", "state.txt").await,
            format!("owner = client-{c}\n")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Grep bounds
// ---------------------------------------------------------------------------------------------

// Catches: a backtracking engine (the `(a*)*b` search would not answer), or patterns that
// compile without a size limit. No timing threshold: the search answers, or the test hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pathological_regex_is_answered_and_oversized_patterns_are_refused() {
    let d = Daemon::start(&[]);
    let c = d.sdk().await;
    put(&c, "ws", "long.txt", "a".repeat(200_000).as_bytes()).await;
    let (matches, summary) = c.grep(grep_req("ws", "(a*)*b")).await.expect("grep");
    assert!(matches.is_empty());
    assert_eq!(summary.files_scanned, 1);
    assert_eq!(summary.bytes_scanned, 200_000);
    assert_reason(
        c.grep(grep_req("ws", "a{1000}{1000}")).await,
        "InvalidArgument",
    );
    assert_reason(
        c.grep(grep_req("ws", &"a".repeat(5000))).await,
        "InvalidArgument",
    );
}

// Catches: `max_matches` not enforced over several files, or truncation not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_stops_at_max_matches_across_files_and_reports_it() {
    let d = Daemon::start(&[]);
    let c = d.sdk().await;
    for f in 0..3 {
        put(&c, "ws", &format!("f{f}"), "hit\n".repeat(50).as_bytes()).await;
    }
    let (matches, summary) = c
        .grep(pb::GrepRequest {
            max_matches: 120,
            ..grep_req("ws", "hit")
        })
        .await
        .expect("grep");
    assert_eq!(matches.len(), 120);
    assert_eq!(summary.matches, 120);
    assert_eq!(summary.truncated_by, "max_matches");
    let (all, summary) = c.grep(grep_req("ws", "hit")).await.expect("grep");
    assert_eq!(all.len(), 150);
    assert_eq!(summary.truncated_by, "");
}

const FILES: usize = 50;
const FILE_LINES: usize = 20;

fn round_body(f: usize, round: u64) -> String {
    (0..FILE_LINES)
        .map(|l| format!("f{f:02} round {round} line {l}\n"))
        .collect()
}

// Catches: a grep that reads files from more than one snapshot (e.g. one read transaction
// per file): a writer rewriting f00..f49 in order would then show a later round in a later
// file, or a gap of two rounds. (Verified red with one snapshot per file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_grep_sees_one_snapshot_while_a_writer_rewrites_the_files_round_after_round() {
    let d = Daemon::start(&[]);
    let writer = d.sdk().await;
    for f in 0..FILES {
        put(
            &writer,
            "ws",
            &format!("f{f:02}"),
            round_body(f, 0).as_bytes(),
        )
        .await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let writing = {
        let (stop, rounds) = (stop.clone(), rounds.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(Ordering::Acquire) {
                round += 1;
                for f in 0..FILES {
                    put(
                        &writer,
                        "ws",
                        &format!("f{f:02}"),
                        round_body(f, round).as_bytes(),
                    )
                    .await;
                }
                rounds.store(round, Ordering::Release);
            }
        })
    };

    let mut readers = Vec::new();
    for _ in 0..2 {
        let (c, rounds) = (d.sdk().await, rounds.clone());
        readers.push(tokio::spawn(async move {
            let (mut greps, mut mixed) = (0, 0);
            // Until the writer has rewritten everything a few times during the greps.
            while greps < 10 || rounds.load(Ordering::Acquire) < 3 {
                let (matches, summary) = c.grep(grep_req("ws", "round")).await.expect("grep");
                greps += 1;
                assert_eq!(summary.truncated_by, "");
                assert_eq!(matches.len(), FILES * FILE_LINES);
                let mut per_file: BTreeMap<String, Vec<u64>> = BTreeMap::new();
                for m in &matches {
                    let round: u64 = m.line.split(' ').nth(2).unwrap().parse().unwrap();
                    per_file.entry(m.path.clone()).or_default().push(round);
                }
                let file_rounds: Vec<u64> = per_file
                    .iter()
                    .map(|(path, rs)| {
                        assert!(
                            rs.iter().all(|r| *r == rs[0]),
                            "{path} mixes rounds within one file: {rs:?}"
                        );
                        rs[0]
                    })
                    .collect();
                assert_eq!(file_rounds.len(), FILES);
                assert!(
                    file_rounds.windows(2).all(|w| w[0] >= w[1]),
                    "rounds must not increase along f00..f49: {file_rounds:?}"
                );
                let (max, min) = (file_rounds[0], file_rounds[FILES - 1]);
                assert!(max - min <= 1, "more than one round apart: {file_rounds:?}");
                if max != min {
                    mixed += 1;
                }
            }
            (greps, mixed)
        }));
    }
    let (mut greps, mut mixed) = (0, 0);
    for r in readers {
        let (g, m) = r.await.unwrap();
        (greps, mixed) = (greps + g, mixed + m);
    }
    stop.store(true, Ordering::Release);
    writing.await.unwrap();
    assert!(greps >= 20);
    // How often a grep landed mid-round (informational: it depends on scheduling).
    eprintln!("{greps} greps, {mixed} of them between two rounds");
}

// ---------------------------------------------------------------------------------------------
// The CLI
// ---------------------------------------------------------------------------------------------

fn entry_fields_are_the_cli_entry_json(e: &Value) {
    for k in [
        "workspace",
        "path",
        "kind",
        "size",
        "sha256",
        "generation",
        "modified_ms",
    ] {
        assert!(e.get(k).is_some(), "entry JSON lacks {k}: {e}");
    }
}

// Catches: the CLI commands not reaching the server operations, or JSON shapes other than the
// Entry JSON `stat` prints.
#[test]
fn edit_and_append_through_the_cli_print_the_entry_and_change_the_file() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "ws:notes.md"], b"# Notes\nstatus: draft\n")
        .assert_ok();
    let e = d
        .cli(&[
            "--json",
            "edit",
            "ws:notes.md",
            "--old",
            "draft",
            "--new",
            "final",
        ])
        .assert_ok()
        .json();
    entry_fields_are_the_cli_entry_json(&e);
    assert_eq!(e["generation"], 2);
    let stat = d.cli(&["--json", "stat", "ws:notes.md"]).assert_ok().json();
    assert_eq!(e, stat);

    let a = d
        .cli_stdin(&["--json", "append", "ws:notes.md"], b"- item\n")
        .assert_ok()
        .json();
    entry_fields_are_the_cli_entry_json(&a);
    assert_eq!(a["generation"], 3);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("more.txt");
    std::fs::write(&src, "- more\n").unwrap();
    let human = d
        .cli(&["append", "ws:notes.md", src.to_str().unwrap()])
        .assert_ok()
        .stdout_str();
    assert!(
        human.contains("ws:notes.md") && human.contains("generation 4"),
        "{human}"
    );
    let got = d.cli(&["get", "ws:notes.md"]).assert_ok().stdout_str();
    assert_eq!(got, "# Notes\nstatus: final\n- item\n- more\n");
}

// Catches: a MatchCount or stale-generation refusal reported as success, or with another
// exit status or reason than the other commands use.
#[test]
fn cli_edits_that_match_zero_or_two_times_or_are_stale_fail_with_their_reason_and_change_nothing() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "ws:a.txt"], b"x x\n").assert_ok();
    let out = d.cli(&["edit", "ws:a.txt", "--old", "x", "--new", "y"]);
    out.assert_fails_with("MatchCount");
    assert!(out.stderr.contains("2 times"), "{}", out.stderr);
    d.cli(&["edit", "ws:a.txt", "--old", "z", "--new", "y"])
        .assert_fails_with("MatchCount");
    d.cli(&[
        "edit",
        "ws:a.txt",
        "--old",
        "x x",
        "--new",
        "y",
        "--if-generation",
        "7",
    ])
    .assert_fails_with("GenerationMismatch");
    assert_eq!(
        d.cli(&["get", "ws:a.txt"]).assert_ok().stdout_str(),
        "x x\n"
    );
    // --json puts the reason in the document too.
    let doc = d
        .cli(&["--json", "edit", "ws:a.txt", "--old", "q", "--new", "y"])
        .json();
    assert_eq!(doc["error"]["reason"], "MatchCount");
}

#[test]
fn cli_append_past_the_inline_limit_fails_with_invalid_argument_and_changes_nothing() {
    let d = Daemon::start(&["--inline-max", "1024"]);
    d.cli_stdin(&["put", "ws:log"], &[b'a'; 1000]).assert_ok();
    let out = d.cli_stdin(&["append", "ws:log"], &[b'b'; 100]);
    out.assert_fails_with("InvalidArgument");
    assert!(out.stderr.contains("1024"), "{}", out.stderr);
    assert_eq!(
        d.cli(&["get", "ws:log"]).assert_ok().stdout,
        vec![b'a'; 1000]
    );
}

// Catches: find not walking every page (`--limit` absent), `--limit` not capping, or paths
// outside the glob.
#[test]
fn cli_find_prints_every_matching_path_across_pages_or_the_first_limit() {
    let d = Daemon::start(&[]);
    for p in ["src/a.rs", "src/x/b.rs", "src/x/c.txt", "docs/d.rs"] {
        d.cli_stdin(&["put", &format!("ws:{p}")], b"x").assert_ok();
    }
    let doc = d
        .cli(&["--json", "find", "ws:src/**/*.rs"])
        .assert_ok()
        .json();
    let paths: Vec<&str> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            entry_fields_are_the_cli_entry_json(e);
            e["path"].as_str().unwrap()
        })
        .collect();
    assert_eq!(paths, ["src/a.rs", "src/x/b.rs"]);
    let human = d.cli(&["find", "ws:**/*.rs"]).assert_ok().stdout_str();
    assert_eq!(human, "docs/d.rs\nsrc/a.rs\nsrc/x/b.rs\n");
    let one = d
        .cli(&["find", "ws:**/*.rs", "--limit", "1"])
        .assert_ok()
        .stdout_str();
    assert_eq!(one, "docs/d.rs\n");
    let dir = d.cli(&["find", "ws:src/x/"]).assert_ok().stdout_str();
    assert_eq!(
        dir, "src/x/b.rs\nsrc/x/c.txt\n",
        "a trailing / is the directory's contents"
    );
    let meant_dir = d.cli(&["find", "ws:src/x"]);
    meant_dir.assert_ok();
    assert_eq!(
        meant_dir.stdout_str(),
        "",
        "a glob without wildcards names one path"
    );
    assert!(
        meant_dir.stderr.contains(
            "no path is ws:src/x; if it is a directory, everything under it is ws:src/x/"
        ),
        "{}",
        meant_dir.stderr
    );
}

// Catches: grep output not in grep's `path:line:text` / `path-line-text` form, a glob not
// honoured, `-i` not passed, or a JSON document without the documented fields.
#[test]
fn cli_grep_prints_grep_lines_and_json_matches_with_a_summary() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "ws:src/a.rs"], b"fn main() {\n    todo!()\n}\n")
        .assert_ok();
    d.cli_stdin(&["put", "ws:notes.txt"], b"TODO: tests\n")
        .assert_ok();
    let human = d
        .cli(&["grep", "todo", "ws:src/**", "-i", "-C", "1"])
        .assert_ok()
        .stdout_str();
    assert_eq!(
        human,
        "src/a.rs-1-fn main() {\nsrc/a.rs:2:    todo!()\nsrc/a.rs-3-}\n"
    );
    let human = d
        .cli(&["grep", "-i", "todo", "ws"])
        .assert_ok()
        .stdout_str();
    assert_eq!(human, "notes.txt:1:TODO: tests\nsrc/a.rs:2:    todo!()\n");
    let under = d
        .cli(&["grep", "-i", "todo", "ws:src/"])
        .assert_ok()
        .stdout_str();
    assert_eq!(
        under, "src/a.rs:2:    todo!()\n",
        "ws:src/ searches under src"
    );
    let bare = d.cli(&["grep", "-i", "todo", "ws:src"]);
    bare.assert_ok();
    assert_eq!(bare.stdout_str(), "", "ws:src names the path src only");
    assert!(
        bare.stderr.contains(
            "no file was searched at ws:src; if it is a directory, everything under it is ws:src/"
        ),
        "{}",
        bare.stderr
    );

    let doc = d
        .cli(&["--json", "grep", "todo", "ws", "-C", "1"])
        .assert_ok()
        .json();
    let m = &doc["matches"][0];
    assert_eq!(m["path"], "src/a.rs");
    assert_eq!(m["line_number"], 2);
    assert_eq!(m["line"], "    todo!()");
    assert_eq!(m["before"], serde_json::json!(["fn main() {"]));
    assert_eq!(m["after"], serde_json::json!(["}"]));
    assert_eq!(m["generation"], 1);
    assert_eq!(doc["matches"].as_array().unwrap().len(), 1);
    let s = &doc["summary"];
    assert_eq!(s["files_scanned"], 2);
    assert_eq!(s["matches"], 1);
    assert_eq!(s["truncated_by"], "");
    assert!(s["bytes_scanned"].as_u64().unwrap() > 0);

    let capped = d
        .cli(&["--json", "grep", ".", "ws", "--max-matches", "2"])
        .assert_ok()
        .json();
    assert_eq!(capped["matches"].as_array().unwrap().len(), 2);
    assert_eq!(capped["summary"]["truncated_by"], "max_matches");
    d.cli(&["grep", "(", "ws"])
        .assert_fails_with("InvalidArgument");
}

// Catches: artifacts searched without `--include-artifacts`, or not found with it; a line
// that spans the artifact's first block boundary (4 MiB) split or lost.
#[test]
fn cli_grep_searches_an_artifact_across_its_block_boundary_only_when_asked() {
    let d = Daemon::start(&[]);
    let (mut text, mut needle_line) = (Vec::new(), 0);
    for i in 0..260_000u64 {
        let start = text.len();
        text.extend_from_slice(format!("filler line {i:08}\n").as_bytes());
        if start < 4 << 20 && text.len() > 4 << 20 {
            text[start..start + 6].copy_from_slice(b"needle");
            needle_line = i + 1;
        }
    }
    assert!(needle_line > 0 && text.len() > 5 << 20);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.log");
    std::fs::write(&file, &text).unwrap();
    d.cli(&["publish", "-q", file.to_str().unwrap(), "ws:big.log"])
        .assert_ok();

    let skipped = d
        .cli(&["--json", "grep", "needle", "ws"])
        .assert_ok()
        .json();
    assert_eq!(skipped["matches"], serde_json::json!([]));
    assert_eq!(skipped["summary"]["files_scanned"], 0);

    let doc = d
        .cli(&[
            "--json",
            "grep",
            "needle",
            "ws",
            "-C",
            "1",
            "--include-artifacts",
        ])
        .assert_ok()
        .json();
    let matches = doc["matches"].as_array().unwrap();
    assert_eq!(matches.len(), 1, "{doc}");
    let m = &matches[0];
    assert_eq!(m["path"], "big.log");
    assert_eq!(m["line_number"], needle_line);
    assert_eq!(m["line"], format!("needle line {:08}", needle_line - 1));
    assert_eq!(
        m["before"],
        serde_json::json!([format!("filler line {:08}", needle_line - 2)])
    );
    assert_eq!(
        m["after"],
        serde_json::json!([format!("filler line {:08}", needle_line)])
    );
    assert_eq!(doc["summary"]["files_scanned"], 1);
    assert_eq!(doc["summary"]["bytes_scanned"], text.len());
}

// Catches: the new RPCs admitted with the wrong role (a read token editing) or without the
// workspace scope (a token for another workspace searching). (Verified red with Edit admitted
// as Role::Read.)
#[test]
fn a_read_token_cannot_edit_or_append_and_a_token_for_another_workspace_cannot_search() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "team-a:a.txt"], b"secret\n")
        .assert_ok();
    let read = d.token("team-a", "read", None);
    let env = [("NOKV_TOKEN", read.as_str())];
    d.cli_with_env(
        &["edit", "team-a:a.txt", "--old", "secret", "--new", "x"],
        &env,
    )
    .assert_fails_with("PermissionDenied");
    d.cli_with_env(&["append", "team-a:a.txt", "/dev/null"], &env)
        .assert_fails_with("PermissionDenied");
    d.cli_with_env(&["grep", "secret", "team-a"], &env)
        .assert_ok();

    let other = d.token("team-b", "write", None);
    let env = [("NOKV_TOKEN", other.as_str())];
    d.cli_with_env(&["grep", "secret", "team-a"], &env)
        .assert_fails_with("PermissionDenied");
    d.cli_with_env(&["find", "team-a:**"], &env)
        .assert_fails_with("PermissionDenied");
    assert_eq!(
        d.cli(&["get", "team-a:a.txt"]).assert_ok().stdout_str(),
        "secret\n"
    );
}
