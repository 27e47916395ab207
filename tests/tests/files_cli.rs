//! Small files through the real `nokv` CLI against a real `nokv-server` on the embedded
//! default: round trips, listing, restarts, conditional writes, request-id replay, name
//! validation and the inline limit.

use nokv_tests::{CliOutput, Daemon, cli_with_config};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data).as_slice())
}

/// `nokv --json put TARGET` with `data` on stdin; returns the written entry.
#[track_caller]
fn put(d: &Daemon, target: &str, data: &[u8]) -> Value {
    d.cli_stdin(&["--json", "put", target], data)
        .assert_ok()
        .json()
}

/// `nokv --json stat TARGET`; returns the entry.
#[track_caller]
fn stat(d: &Daemon, target: &str) -> Value {
    d.cli(&["--json", "stat", target]).assert_ok().json()
}

/// `nokv get TARGET` to stdout; returns the body.
#[track_caller]
fn get(d: &Daemon, target: &str) -> Vec<u8> {
    d.cli(&["get", target]).assert_ok().stdout.clone()
}

fn generation(entry: &Value) -> u64 {
    entry["generation"]
        .as_u64()
        .unwrap_or_else(|| panic!("entry without a generation: {entry}"))
}

/// Paths of the `entries` of a `--json ls` document, in the order printed.
fn paths(doc: &Value) -> Vec<String> {
    doc["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries array in {doc}"))
        .iter()
        .map(|e| e["path"].as_str().expect("entry path").to_string())
        .collect()
}

/// Every path in `ws`, via `nokv --json ls ws:`.
#[track_caller]
fn ls_all(d: &Daemon, ws: &str) -> Vec<String> {
    let doc = d
        .cli(&["--json", "ls", &format!("{ws}:")])
        .assert_ok()
        .json();
    assert_eq!(doc["next_cursor"], "", "a full listing has no next cursor");
    paths(&doc)
}

/// Sum of the per-shard entry counts reported by `nokv admin health`: every entry in every
/// workspace of the daemon.
#[track_caller]
fn total_entries(d: &Daemon) -> u64 {
    let doc = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    doc["shards"]
        .as_array()
        .expect("shards array")
        .iter()
        .map(|s| s["entries"].as_u64().expect("entries count"))
        .sum()
}

#[track_caller]
fn assert_reason(out: &CliOutput, reason: &str, what: &str) {
    if out.status != 1 || out.reason() != Some(reason) {
        panic!(
            "{what}: expected exit 1 with reason {reason}, got exit {} reason {:?}\nstderr: {}",
            out.status,
            out.reason(),
            out.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Round trip and output
// ---------------------------------------------------------------------------------------------

#[test]
fn a_file_put_from_a_file_reads_back_through_stat_get_and_ls_and_is_gone_after_rm() {
    let d = Daemon::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    // Every byte value, so no layer may treat the body as text.
    let body: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let src = tmp.path().join("src.bin");
    std::fs::write(&src, &body).unwrap();

    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let out = d.cli(&["put", "w1:notes/a.bin", src.to_str().unwrap()]);
    out.assert_ok();
    let human = out.stdout_str();
    assert!(
        human.contains("w1:notes/a.bin") && human.contains("generation 1"),
        "human put output names the target and generation: {human}"
    );

    let e = stat(&d, "w1:notes/a.bin");
    assert_eq!(e["workspace"], "w1");
    assert_eq!(e["path"], "notes/a.bin");
    assert_eq!(e["kind"], "file");
    assert_eq!(e["size"], 10_000);
    assert_eq!(e["sha256"], sha256_hex(&body));
    assert_eq!(generation(&e), 1);
    let modified = e["modified_ms"].as_i64().expect("modified_ms");
    assert!(
        modified >= before_ms - 5_000 && modified <= before_ms + 600_000,
        "modified_ms {modified} is not near now ({before_ms})"
    );

    let human = d.cli(&["stat", "w1:notes/a.bin"]).assert_ok().stdout_str();
    assert!(human.contains("w1:notes/a.bin"), "{human}");
    assert!(human.contains(&sha256_hex(&body)), "{human}");
    assert!(human.contains("file"), "{human}");

    assert!(get(&d, "w1:notes/a.bin") == body, "get to stdout differs");
    let dest = tmp.path().join("dest.bin");
    let out = d.cli(&["get", "w1:notes/a.bin", dest.to_str().unwrap()]);
    out.assert_ok();
    assert!(
        std::fs::read(&dest).unwrap() == body,
        "get into FILE wrote other bytes"
    );
    let dest2 = tmp.path().join("dest2.bin");
    let doc = d
        .cli(&["--json", "get", "w1:notes/a.bin", dest2.to_str().unwrap()])
        .assert_ok()
        .json();
    assert_eq!(doc["entry"]["sha256"], sha256_hex(&body));
    assert!(std::fs::read(&dest2).unwrap() == body);

    let doc = d.cli(&["--json", "ls", "w1:"]).assert_ok().json();
    assert_eq!(doc["next_cursor"], "");
    let entries = doc["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{doc}");
    assert_eq!(entries[0], e, "ls shows the same entry as stat");
    let human = d.cli(&["ls", "w1:"]).assert_ok().stdout_str();
    assert!(human.contains("notes/a.bin"), "{human}");

    let doc = d
        .cli(&["--json", "rm", "w1:notes/a.bin"])
        .assert_ok()
        .json();
    assert_eq!(doc["deleted_generation"], 1, "{doc}");
    d.cli(&["stat", "w1:notes/a.bin"])
        .assert_fails_with("NotFound");
    d.cli(&["get", "w1:notes/a.bin"])
        .assert_fails_with("NotFound");
    d.cli(&["rm", "w1:notes/a.bin"])
        .assert_fails_with("NotFound");
    assert!(ls_all(&d, "w1").is_empty());
}

#[test]
fn put_from_stdin_replaces_the_body_and_bumps_the_generation() {
    let d = Daemon::start(&[]);
    let e1 = put(&d, "w1:doc.txt", b"first version\n");
    assert_eq!(generation(&e1), 1);
    assert_eq!(e1["sha256"], sha256_hex(b"first version\n"));

    // `-` is stdin too.
    let out = d.cli_stdin(&["--json", "put", "w1:doc.txt", "-"], b"second");
    let e2 = out.assert_ok().json();
    assert_eq!(generation(&e2), 2);
    assert_eq!(e2["size"], 6);
    assert_eq!(get(&d, "w1:doc.txt"), b"second");
    assert_eq!(stat(&d, "w1:doc.txt"), e2, "stat shows what put returned");

    // An empty file is a file.
    let e3 = put(&d, "w1:empty", b"");
    assert_eq!(e3["size"], 0);
    assert_eq!(e3["sha256"], sha256_hex(b""));
    assert_eq!(get(&d, "w1:empty"), b"");
}

#[test]
fn workspaces_do_not_see_each_others_files() {
    let d = Daemon::start(&[]);
    put(&d, "alpha:same/path", b"from alpha");
    put(&d, "beta:same/path", b"from beta");
    assert_eq!(get(&d, "alpha:same/path"), b"from alpha");
    assert_eq!(get(&d, "beta:same/path"), b"from beta");
    d.cli(&["rm", "alpha:same/path"]).assert_ok();
    assert_eq!(get(&d, "beta:same/path"), b"from beta");
    assert!(ls_all(&d, "alpha").is_empty());
    assert_eq!(ls_all(&d, "beta"), ["same/path"]);
}

#[test]
fn exit_status_is_zero_on_success_one_on_a_failed_operation_and_two_on_a_usage_error() {
    let d = Daemon::start(&[]);
    assert_eq!(d.cli_stdin(&["put", "w1:x"], b"x").status, 0);

    let out = d.cli(&["stat", "w1:missing"]);
    out.assert_fails_with("NotFound");
    assert!(out.stdout.is_empty(), "no result is printed on failure");
    // With --json the failure is also one JSON document on stdout.
    let out = d.cli(&["--json", "stat", "w1:missing"]);
    out.assert_fails_with("NotFound");
    assert_eq!(out.json()["error"]["reason"], "NotFound");

    for args in [
        &["put", "nocolon"][..],
        &["stat", ":path-without-workspace"],
        &["frobnicate", "w1:x"],
        &["ls", "w1:", "--limit", "many"],
        &["stat"],
    ] {
        let out = d.cli(args);
        assert_eq!(out.status, 2, "{args:?} is a usage error: {}", out.stderr);
    }
    // Usage errors reach no server: nothing but the one good write exists.
    assert_eq!(total_entries(&d), 1);
}

// ---------------------------------------------------------------------------------------------
// Listing
// ---------------------------------------------------------------------------------------------

#[test]
fn ls_pages_through_five_files_two_at_a_time_and_lists_all_in_order_by_default() {
    let d = Daemon::start(&[]);
    for p in ["d", "b", "e", "a", "c"] {
        put(&d, &format!("w1:{p}"), p.as_bytes());
    }

    // Without --cursor the CLI follows every page itself.
    let doc = d
        .cli(&["--json", "ls", "w1:", "--limit", "2"])
        .assert_ok()
        .json();
    assert_eq!(paths(&doc), ["a", "b", "c", "d", "e"]);
    assert_eq!(doc["next_cursor"], "");

    // With --cursor it prints exactly one page; an empty cursor is the first page.
    let mut cursor = String::new();
    let mut pages = Vec::new();
    loop {
        let doc = d
            .cli(&["--json", "ls", "w1:", "--limit", "2", "--cursor", &cursor])
            .assert_ok()
            .json();
        pages.push(paths(&doc));
        cursor = doc["next_cursor"]
            .as_str()
            .expect("next_cursor")
            .to_string();
        if cursor.is_empty() {
            break;
        }
        assert!(pages.len() < 5, "paging does not terminate: {pages:?}");
    }
    assert_eq!(pages, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);

    // The human listing says there is more when it stops at a page.
    let human = d
        .cli(&["ls", "w1:", "--limit", "2", "--cursor", ""])
        .assert_ok()
        .stdout_str();
    assert!(human.contains("--cursor"), "{human}");
}

#[test]
fn ls_with_a_prefix_lists_only_the_entries_that_start_with_it() {
    let d = Daemon::start(&[]);
    for p in ["a/2", "ab", "b/1", "a/1", "a/sub/x"] {
        put(&d, &format!("w1:{p}"), b".");
    }
    put(&d, "w2:a/other-workspace", b".");
    let ls = |prefix: &str| {
        paths(
            &d.cli(&["--json", "ls", &format!("w1:{prefix}")])
                .assert_ok()
                .json(),
        )
    };
    assert_eq!(ls("a/"), ["a/1", "a/2", "a/sub/x"]);
    assert_eq!(ls("a"), ["a/1", "a/2", "a/sub/x", "ab"]);
    assert_eq!(ls("a/s"), ["a/sub/x"]);
    assert_eq!(ls(""), ["a/1", "a/2", "a/sub/x", "ab", "b/1"]);
    assert!(ls("zz").is_empty());
    // Paging within a prefix never leaves it.
    let doc = d
        .cli(&["--json", "ls", "w1:a/", "--limit", "1"])
        .assert_ok()
        .json();
    assert_eq!(paths(&doc), ["a/1", "a/2", "a/sub/x"]);
}

#[test]
fn ls_refuses_bad_prefixes_limits_and_cursors_with_invalid_argument() {
    let d = Daemon::start(&[]);
    put(&d, "w1:a", b".");
    for args in [
        &["ls", "w1:/abs"][..],
        &["ls", "w1:a\nb"],
        &["ls", "UPPER:"],
        &["ls", "w1:", "--cursor", "not-a-cursor"],
    ] {
        assert_reason(&d.cli(args), "InvalidArgument", &format!("{args:?}"));
    }
    let doc = d
        .cli(&["--json", "ls", "w1:", "--limit", "1000"])
        .assert_ok()
        .json();
    assert_eq!(paths(&doc), ["a"], "the largest limit is accepted");
}

// ---------------------------------------------------------------------------------------------
// Restarts
// ---------------------------------------------------------------------------------------------

#[test]
fn files_written_before_a_sigterm_read_back_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    let e = put(&d, "w1:kept.txt", b"survives a graceful restart");
    put(&d, "w1:kept.txt", b"survives a graceful restart, v2");
    put(&d, "w2:other", b"another workspace");
    let status = d.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status}");

    let d = Daemon::start_in(dir.path(), &[]);
    assert_eq!(get(&d, "w1:kept.txt"), b"survives a graceful restart, v2");
    assert_eq!(get(&d, "w2:other"), b"another workspace");
    assert_eq!(generation(&stat(&d, "w1:kept.txt")), generation(&e) + 1);
    // Generations continue from where they were.
    let e3 = put(&d, "w1:kept.txt", b"v3");
    assert_eq!(generation(&e3), generation(&e) + 2);
}

#[test]
fn an_acknowledged_put_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    let mut written = Vec::new();
    for i in 0..10 {
        let target = format!("w{}:crash/{i}", i % 3);
        let body = format!("acknowledged write {i}").into_bytes();
        let e = put(&d, &target, &body);
        written.push((target, body, e));
    }
    d.cli(&["rm", "w0:crash/0"]).assert_ok();
    d.kill9();

    let d = Daemon::start_in(dir.path(), &[]);
    for (target, body, e) in &written[1..] {
        assert_eq!(&get(&d, target), body, "{target} after kill -9");
        assert_eq!(&stat(&d, target), e, "{target} entry after kill -9");
    }
    d.cli(&["stat", "w0:crash/0"]).assert_fails_with("NotFound");
}

// ---------------------------------------------------------------------------------------------
// Conditional writes and generations
// ---------------------------------------------------------------------------------------------

#[test]
fn create_only_on_an_existing_path_fails_with_already_exists_and_keeps_the_content() {
    let d = Daemon::start(&[]);
    let e = d
        .cli_stdin(&["--json", "put", "--create-only", "w1:once"], b"original")
        .assert_ok()
        .json();
    assert_eq!(generation(&e), 1);

    d.cli_stdin(&["put", "--create-only", "w1:once"], b"intruder")
        .assert_fails_with("AlreadyExists");
    assert_eq!(get(&d, "w1:once"), b"original");
    assert_eq!(stat(&d, "w1:once"), e, "the entry is untouched");
}

#[test]
fn a_stale_if_generation_fails_with_generation_mismatch_and_keeps_the_content() {
    let d = Daemon::start(&[]);
    // if-generation 0 means "must not exist".
    let e1 = d
        .cli_stdin(&["--json", "put", "--if-generation", "0", "w1:f"], b"one")
        .assert_ok()
        .json();
    assert_eq!(generation(&e1), 1);
    let e2 = d
        .cli_stdin(&["--json", "put", "--if-generation", "1", "w1:f"], b"two")
        .assert_ok()
        .json();
    assert_eq!(generation(&e2), 2);

    for stale in ["1", "0", "3", "99"] {
        d.cli_stdin(&["put", "--if-generation", stale, "w1:f"], b"stale")
            .assert_fails_with("GenerationMismatch");
    }
    assert_eq!(get(&d, "w1:f"), b"two");
    assert_eq!(stat(&d, "w1:f"), e2);
    // A non-zero if-generation on a missing path is a mismatch too, and creates nothing.
    d.cli_stdin(&["put", "--if-generation", "1", "w1:new"], b"x")
        .assert_fails_with("GenerationMismatch");
    d.cli(&["stat", "w1:new"]).assert_fails_with("NotFound");
}

#[test]
fn a_deleted_path_recreated_gets_a_generation_above_the_deleted_one_even_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    put(&d, "w1:p", b"1");
    let e2 = put(&d, "w1:p", b"2");
    let deleted = d.cli(&["--json", "rm", "w1:p"]).assert_ok().json()["deleted_generation"]
        .as_u64()
        .unwrap();
    assert_eq!(deleted, generation(&e2));

    let e3 = put(&d, "w1:p", b"3");
    assert!(
        generation(&e3) > deleted,
        "recreated generation {} reuses or precedes deleted {deleted}",
        generation(&e3)
    );
    // create-only works again once the path is gone, still above every earlier generation.
    d.cli(&["rm", "w1:p"]).assert_ok();
    let e4 = d
        .cli_stdin(&["--json", "put", "--create-only", "w1:p"], b"4")
        .assert_ok()
        .json();
    assert!(generation(&e4) > generation(&e3));

    // The high-water mark survives a restart while the path does not exist.
    d.cli(&["rm", "w1:p"]).assert_ok();
    assert!(d.terminate().success());
    let d = Daemon::start_in(dir.path(), &[]);
    let e5 = put(&d, "w1:p", b"5");
    assert!(
        generation(&e5) > generation(&e4),
        "after restart: {} <= {}",
        generation(&e5),
        generation(&e4)
    );
}

#[test]
fn rm_with_a_stale_if_generation_fails_with_generation_mismatch_and_keeps_the_file() {
    let d = Daemon::start(&[]);
    put(&d, "w1:f", b"a");
    let e = put(&d, "w1:f", b"b");
    d.cli(&["rm", "--if-generation", "1", "w1:f"])
        .assert_fails_with("GenerationMismatch");
    assert_eq!(get(&d, "w1:f"), b"b");
    assert_eq!(stat(&d, "w1:f"), e);

    let doc = d
        .cli(&["--json", "rm", "--if-generation", "2", "w1:f"])
        .assert_ok()
        .json();
    assert_eq!(doc["deleted_generation"], 2);
    d.cli(&["stat", "w1:f"]).assert_fails_with("NotFound");
}

// ---------------------------------------------------------------------------------------------
// Request-id replay
// ---------------------------------------------------------------------------------------------

#[test]
fn a_repeated_put_request_id_returns_the_recorded_entry_without_writing_again() {
    let d = Daemon::start(&[]);
    let args = ["--json", "put", "--request-id", "req-put-1", "w1:r"];
    let first = d.cli_stdin(&args, b"payload").assert_ok().json();
    let again = d.cli_stdin(&args, b"payload").assert_ok().json();
    assert_eq!(again, first, "the duplicate gets the recorded entry");
    assert_eq!(
        stat(&d, "w1:r"),
        first,
        "the duplicate wrote no new generation"
    );

    // Someone else writes; a late duplicate still gets the recorded outcome and does not
    // overwrite the newer content.
    let newer = put(&d, "w1:r", b"newer");
    assert_eq!(generation(&newer), generation(&first) + 1);
    let late = d.cli_stdin(&args, b"payload").assert_ok().json();
    assert_eq!(late, first);
    assert_eq!(get(&d, "w1:r"), b"newer");
    assert_eq!(stat(&d, "w1:r"), newer);
}

#[test]
fn a_refused_request_replays_its_refusal_even_after_the_state_changed() {
    let d = Daemon::start(&[]);
    put(&d, "w1:taken", b"first");
    let create = [
        "put",
        "--create-only",
        "--request-id",
        "rid-refused",
        "w1:taken",
    ];
    d.cli_stdin(&create, b"second")
        .assert_fails_with("AlreadyExists");
    d.cli(&["rm", "w1:taken"]).assert_ok();
    // The retry of the refused request gets the recorded refusal, not a fresh evaluation.
    d.cli_stdin(&create, b"second")
        .assert_fails_with("AlreadyExists");
    d.cli(&["stat", "w1:taken"]).assert_fails_with("NotFound");

    // The same for a stale if-generation delete: the refusal stays the recorded outcome.
    let e = put(&d, "w1:g", b"v1");
    let stale = generation(&e) + 5;
    let rm = [
        "rm",
        "--if-generation",
        &stale.to_string(),
        "--request-id",
        "rid-rm",
        "w1:g",
    ];
    d.cli(&rm).assert_fails_with("GenerationMismatch");
    d.cli(&rm).assert_fails_with("GenerationMismatch");
    assert_eq!(get(&d, "w1:g"), b"v1");
}

#[test]
fn a_reused_request_id_with_other_content_is_refused_and_changes_nothing() {
    let d = Daemon::start(&[]);
    let first = d
        .cli_stdin(&["--json", "put", "--request-id", "rid-7", "w1:r"], b"one")
        .assert_ok()
        .json();
    d.cli_stdin(&["put", "--request-id", "rid-7", "w1:r"], b"two")
        .assert_fails_with("RequestIdReused");
    // Other path, same id: also a different request.
    d.cli_stdin(&["put", "--request-id", "rid-7", "w1:elsewhere"], b"one")
        .assert_fails_with("RequestIdReused");
    // Other operation, same id.
    d.cli(&["rm", "--request-id", "rid-7", "w1:r"])
        .assert_fails_with("RequestIdReused");
    assert_eq!(get(&d, "w1:r"), b"one");
    assert_eq!(stat(&d, "w1:r"), first);
    d.cli(&["stat", "w1:elsewhere"])
        .assert_fails_with("NotFound");
    // Request ids are per workspace: the same id in another workspace is a new request.
    d.cli_stdin(&["put", "--request-id", "rid-7", "w2:r"], b"two")
        .assert_ok();
}

#[test]
fn a_repeated_rm_request_id_returns_the_recorded_deleted_generation_after_the_path_is_gone() {
    let d = Daemon::start(&[]);
    put(&d, "w1:gone", b"1");
    let e = put(&d, "w1:gone", b"2");
    let args = ["--json", "rm", "--request-id", "req-rm-1", "w1:gone"];
    let first = d.cli(&args).assert_ok().json();
    assert_eq!(first["deleted_generation"], generation(&e));
    d.cli(&["stat", "w1:gone"]).assert_fails_with("NotFound");

    let again = d.cli(&args).assert_ok().json();
    assert_eq!(again, first, "the duplicate rm gets the recorded outcome");

    // The duplicate did not delete a newer file at that path.
    let newer = put(&d, "w1:gone", b"3");
    assert_eq!(d.cli(&args).assert_ok().json(), first);
    assert_eq!(stat(&d, "w1:gone"), newer);
    // Same id, other path: refused.
    d.cli(&["rm", "--request-id", "req-rm-1", "w1:other"])
        .assert_fails_with("RequestIdReused");
}

// ---------------------------------------------------------------------------------------------
// Names and limits
// ---------------------------------------------------------------------------------------------

#[test]
fn invalid_workspace_names_and_paths_are_refused_with_invalid_argument_and_change_nothing() {
    let d = Daemon::start(&[]);
    let long_ws = "a".repeat(64);
    let long_component = "c".repeat(256);
    // 1000 components of 4 bytes: 4999 bytes, each component valid.
    let long_path = vec!["abcd"; 1000].join("/");
    let bad_workspaces = [
        "UPPER",
        "Mixed",
        "-x",
        ".x",
        "_x",
        long_ws.as_str(),
        "a b",
        "ä",
        "a/b",
        "a\nb",
    ];
    let bad_paths = [
        "",
        "/abs",
        "a//b",
        "a/",
        ".",
        "..",
        "./a",
        "a/./b",
        "a/../b",
        "a/..",
        "a\u{1}b",
        "a\nb",
        "a\tb",
        "a\u{7f}",
        "a\u{85}b",
        long_component.as_str(),
        long_path.as_str(),
    ];
    let mut targets: Vec<String> = bad_workspaces
        .iter()
        .map(|ws| format!("{ws}:ok.txt"))
        .collect();
    targets.extend(bad_paths.iter().map(|p| format!("w1:{p}")));
    assert!(targets.len() >= 20);

    for target in &targets {
        let what = |op: &str| format!("{op} {target:?}");
        // `--` so that names starting with '-' are not taken for flags.
        assert_reason(
            &d.cli_stdin(&["put", "--", target], b"x"),
            "InvalidArgument",
            &what("put"),
        );
        assert_reason(
            &d.cli_stdin(&["put", "--create-only", "--", target], b"x"),
            "InvalidArgument",
            &what("put --create-only"),
        );
        // Reads and deletes refuse the name too rather than answering NotFound.
        for op in ["stat", "get", "rm"] {
            assert_reason(&d.cli(&[op, "--", target]), "InvalidArgument", &what(op));
        }
    }

    assert!(ls_all(&d, "w1").is_empty(), "something was written to w1");
    assert_eq!(total_entries(&d), 0, "something was written somewhere");
    // The same daemon and credentials accept a valid name, so the refusals above were about
    // the names.
    put(&d, "w1:ok.txt", b"x");
    assert_eq!(total_entries(&d), 1);
}

#[test]
fn names_at_the_limits_are_accepted_unchanged() {
    let d = Daemon::start(&[]);
    let ws = format!("0{}", "a._-".repeat(15) + "zz");
    assert_eq!(ws.len(), 63);
    let long_component = "c".repeat(255);
    // 17 components of 240 bytes plus 16 slashes: exactly 4096 bytes.
    let longest_path = vec!["p".repeat(240); 17].join("/");
    assert_eq!(longest_path.len(), 4096);
    for (ws, path) in [
        (ws.as_str(), "x"),
        ("w1", long_component.as_str()),
        ("w1", longest_path.as_str()),
        ("w1", "ünïcode/файл.txt"),
        ("w1", "x/.hidden/a..b/..."),
    ] {
        let target = format!("{ws}:{path}");
        let e = put(&d, &target, path.as_bytes());
        assert_eq!(e["workspace"], ws);
        assert_eq!(e["path"], path, "the path is stored as given");
        assert_eq!(get(&d, &target), path.as_bytes());
    }
}

#[test]
fn a_file_over_the_inline_limit_is_refused_with_invalid_argument() {
    let d = Daemon::start(&["--inline-max", "1024"]);
    let e = put(&d, "w1:at-limit", &[7u8; 1024]);
    assert_eq!(e["size"], 1024);

    for size in [1025, 2000] {
        d.cli_stdin(&["put", "w1:too-big"], &vec![1u8; size])
            .assert_fails_with("InvalidArgument");
    }
    d.cli(&["stat", "w1:too-big"]).assert_fails_with("NotFound");
    // Replacing an existing file with an oversized body leaves the old one.
    d.cli_stdin(&["put", "w1:at-limit"], &[2u8; 2000])
        .assert_fails_with("InvalidArgument");
    assert_eq!(stat(&d, "w1:at-limit"), e);
    assert_eq!(get(&d, "w1:at-limit"), vec![7u8; 1024]);
}

#[test]
fn the_default_inline_limit_is_256_kib() {
    let d = Daemon::start(&[]);
    let body: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let e = put(&d, "w1:max", &body);
    assert_eq!(e["sha256"], sha256_hex(&body));
    assert_eq!(e["kind"], "file");
    assert!(get(&d, "w1:max") == body, "256 KiB body differs on read");
}

/// Issue 7, item 15: agents need not care about the inline limit.
#[test]
fn put_of_a_body_over_the_inline_limit_publishes_it_as_an_artifact() {
    let d = Daemon::start(&[]);
    let tmp = tempfile::tempdir().unwrap();

    // From a file: one byte over the limit.
    let body: Vec<u8> = (0..256 * 1024 + 1).map(|i| (i % 253) as u8).collect();
    let big = tmp.path().join("big");
    std::fs::write(&big, &body).unwrap();
    let e = d
        .cli(&["--json", "put", "w1:over", big.to_str().unwrap()])
        .assert_ok()
        .json();
    assert_eq!(e["kind"], "artifact", "{e}");
    assert_eq!(e["sha256"], sha256_hex(&body));
    assert_eq!(stat(&d, "w1:over")["kind"], "artifact");
    assert!(
        get(&d, "w1:over") == body,
        "artifact put from a file differs on read"
    );

    // From stdin: more than one block, spooled rather than held in memory.
    let piped: Vec<u8> = (0..(4 << 20) + 4097).map(|i| (i % 241) as u8).collect();
    let e = d
        .cli_stdin(&["--json", "put", "w1:piped"], &piped)
        .assert_ok()
        .json();
    assert_eq!(e["kind"], "artifact", "{e}");
    assert_eq!(e["block_count"], 2);
    assert_eq!(e["sha256"], sha256_hex(&piped));
    assert!(
        get(&d, "w1:piped") == piped,
        "artifact put from stdin differs on read"
    );

    // Conditions cannot be honoured by a publish: refused as a usage error, nothing changes.
    for flags in [&["--create-only"][..], &["--if-generation", "1"]] {
        let mut args = vec!["put", "w1:cond", big.to_str().unwrap()];
        args.extend_from_slice(flags);
        let out = d.cli(&args);
        assert_eq!(out.status, 2, "{flags:?}: {}", out.stderr);
    }
    d.cli(&["stat", "w1:cond"]).assert_fails_with("NotFound");
}

// ---------------------------------------------------------------------------------------------
// Lookalike names, flags and unknown outcomes (issue 7, items 13 and 18)
// ---------------------------------------------------------------------------------------------

#[test]
fn nfc_and_nfd_spellings_name_one_entry_and_invisible_format_characters_are_refused() {
    let d = Daemon::start(&[]);
    let composed = "w1:caf\u{e9}/r\u{e9}sum\u{e9}.txt";
    let decomposed = "w1:cafe\u{301}/re\u{301}sume\u{301}.txt";
    let first = put(&d, composed, b"one");
    let second = put(&d, decomposed, b"two");
    assert_eq!(
        generation(&second),
        generation(&first) + 1,
        "one entry, replaced"
    );
    assert_eq!(ls_all(&d, "w1"), ["caf\u{e9}/r\u{e9}sum\u{e9}.txt"]);
    assert_eq!(get(&d, composed), b"two");
    assert_eq!(get(&d, decomposed), b"two");
    let prefixed = d
        .cli(&["--json", "ls", "w1:cafe\u{301}/"])
        .assert_ok()
        .json();
    assert_eq!(
        paths(&prefixed).len(),
        1,
        "an NFD prefix lists the NFC entry"
    );

    for name in [
        "w1:a\u{200b}b.txt",          // zero-width space
        "w1:x\u{200d}y",              // zero-width joiner
        "w1:invoice\u{202e}fdp.exe",  // right-to-left override
        "w1:\u{2066}iso\u{2069}.txt", // bidi isolates
        "w1:\u{feff}bom",             // byte order mark
        "w1:soft\u{ad}hyphen",        // soft hyphen
    ] {
        assert_reason(
            &d.cli_stdin(&["put", name], b"x"),
            "InvalidArgument",
            &format!("{name:?}"),
        );
    }
    assert_reason(
        &d.cli(&["ls", "w1:a\u{200b}"]),
        "InvalidArgument",
        "format character in a prefix",
    );
    assert_eq!(total_entries(&d), 1, "refused names changed nothing");
}

#[test]
fn out_of_range_ls_limits_and_rm_if_generation_0_are_usage_errors() {
    let d = Daemon::start(&[]);
    let e = put(&d, "w1:a", b"a");
    for args in [
        &["ls", "w1:", "--limit", "100000"][..],
        &["ls", "w1:", "--limit", "1001"],
        &["ls", "w1:", "--limit", "0"],
        &["rm", "w1:a", "--if-generation", "0"],
    ] {
        let out = d.cli(args);
        assert_eq!(out.status, 2, "{args:?} is a usage error: {}", out.stderr);
    }
    assert_eq!(stat(&d, "w1:a"), e, "usage errors change nothing");

    // put's 0 means "must not exist", the one meaning 0 has anywhere.
    let out = d.cli_stdin(&["put", "w1:a", "--if-generation", "0"], b"b");
    assert_eq!(out.status, 1, "{}", out.stderr);
    assert_eq!(get(&d, "w1:a"), b"a");
    put_if_absent(&d, "w1:new");
    let help = d.cli(&["rm", "--help"]).assert_ok().stdout_str();
    assert!(help.contains("unconditionally"), "{help}");
}

#[track_caller]
fn put_if_absent(d: &Daemon, target: &str) {
    let e = d
        .cli_stdin(&["--json", "put", target, "--if-generation", "0"], b"n")
        .assert_ok()
        .json();
    assert_eq!(generation(&e), 1);
}

/// The request id printed after `--request-id ` in a failure line.
fn printed_request_id(out: &CliOutput) -> String {
    let at = out
        .stderr
        .find("--request-id ")
        .unwrap_or_else(|| panic!("no request id printed: {}", out.stderr));
    out.stderr[at + "--request-id ".len()..]
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_mutation_whose_outcome_is_unknown_prints_its_request_id_for_a_safe_retry() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    put(&d, "w1:doomed", b"x");
    let config = d.client_config();
    d.terminate();

    // The daemon is gone and what answers at the endpoint takes each connection and drops
    // it: the CLI cannot know whether the request was applied. (A refused connection sent
    // nothing, and says so instead: first_hour_errors.rs.)
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dropping = format!("https://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let down = |args: &[&str], stdin: Option<&[u8]>| {
        cli_with_config(&config, args, &[("NOKV_ENDPOINT", &dropping)], stdin)
    };
    let out = down(&["put", "w1:a"], Some(b"v1"));
    assert_eq!(out.status, 1, "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
    assert!(out.stderr.contains("outcome is unknown"), "{}", out.stderr);
    let put_id = printed_request_id(&out);
    let out = down(&["rm", "w1:doomed"], None);
    assert!(out.stderr.contains("outcome is unknown"), "{}", out.stderr);
    let rm_id = printed_request_id(&out);

    // The printed retries apply each mutation once, however often they are repeated.
    let d = Daemon::start_in(dir.path(), &[]);
    let first = d
        .cli_stdin(&["--json", "put", "w1:a", "--request-id", &put_id], b"v1")
        .assert_ok()
        .json();
    let again = d
        .cli_stdin(&["--json", "put", "w1:a", "--request-id", &put_id], b"v1")
        .assert_ok()
        .json();
    assert_eq!(first, again, "the retry replays the recorded entry");
    assert_eq!(generation(&stat(&d, "w1:a")), 1);
    for _ in 0..2 {
        d.cli(&["rm", "w1:doomed", "--request-id", &rm_id])
            .assert_ok();
    }
}

// Catches: a CLI whose reader went away (`nokv ls | head -1`) panicking on the closed pipe
// (exit 101 and a backtrace) instead of ending quietly like any Unix filter (141, what a
// shell shows for a SIGPIPE death).
#[test]
fn output_into_a_closed_pipe_ends_the_cli_quietly() {
    let d = Daemon::start(&[]);
    put(&d, "ws:a.txt", b"a");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = d
        .cli_command(&["--json", "admin", "health"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{:?}", out.status);
}
