//! `nokv workspace delete`: the whole workspace goes (entries, artifact blocks on the
//! provider after a reconciler pass), other workspaces stay, and the name is reusable.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nokv_tests::{Daemon, files_under, pseudo_random_bytes};

/// Blocks until the daemon's stderr has a line containing `needle`: the daemon's own log is
/// its signal that, e.g., a reconciler pass finished. Panics with the log after a deadline.
fn wait_for_log(d: &Daemon, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !d.stderr().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the daemon log:\n{}",
            d.stderr()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

fn objects(dir: &Path) -> usize {
    files_under(&dir.join("objects")).len()
}

#[test]
fn deleting_a_workspace_removes_its_entries_and_blocks_and_leaves_the_name_free_for_a_fresh_one() {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(data.path(), &[]);
    let big = files.path().join("big.bin");
    // Two blocks of 4 MiB.
    std::fs::write(&big, pseudo_random_bytes(9, 5 * 1024 * 1024)).unwrap();
    let big = big.to_str().unwrap();
    d.cli_stdin(&["put", "ws:notes.txt", "-"], b"old notes")
        .assert_ok();
    d.cli(&["--json", "publish", big, "ws:big.bin"]).assert_ok();
    d.cli_stdin(&["put", "other:keep.txt", "-"], b"keep")
        .assert_ok();
    assert_eq!(objects(data.path()), 2, "the artifact's blocks");

    // Without --yes nothing is sent: usage error, exit 2, the workspace is untouched.
    let refused = d.cli(&["workspace", "delete", "ws"]);
    assert_eq!(refused.status, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
    // A write token for another workspace may not delete it.
    let other_token = d.token("other", "write", None);
    d.cli_with_env(
        &["workspace", "delete", "ws", "--yes"],
        &[("NOKV_TOKEN", &other_token)],
    )
    .assert_fails_with("PermissionDenied");
    let listed = d.cli(&["--json", "ls", "ws:"]).assert_ok().json();
    assert_eq!(listed["entries"].as_array().unwrap().len(), 2, "{listed}");

    // A write token for the workspace itself may.
    let ws_token = d.token("ws", "write", None);
    let deleted = d
        .cli_with_env(
            &["--json", "workspace", "delete", "ws", "--yes"],
            &[("NOKV_TOKEN", &ws_token)],
        )
        .assert_ok()
        .json();
    assert_eq!(deleted["entries_removed"], 2, "{deleted}");
    let listed = d.cli(&["--json", "ls", "ws:"]).assert_ok().json();
    assert!(listed["entries"].as_array().unwrap().is_empty(), "{listed}");
    d.cli(&["stat", "ws:big.bin"]).assert_fails_with("NotFound");
    d.cli(&["stat", "other:keep.txt"]).assert_ok();

    // A restart runs a reconciler pass at start-up, which deletes the released blocks (unless
    // a periodic pass already did, while the first daemon ran).
    d.terminate();
    let d = Daemon::start_in(data.path(), &[]);
    if objects(data.path()) > 0 {
        wait_for_log(&d, "reconciled");
    }
    assert_eq!(objects(data.path()), 0, "{:?}", files_under(data.path()));

    // The name is a fresh, empty workspace.
    let fresh = d.cli_stdin(&["--json", "put", "ws:notes.txt", "-"], b"fresh");
    fresh.assert_ok();
    assert_eq!(d.cli(&["get", "ws:notes.txt"]).assert_ok().stdout, b"fresh");
    d.cli(&["--json", "publish", big, "ws:big.bin"]).assert_ok();
    assert_eq!(objects(data.path()), 2);
}

/// Seed 000 (stable receipt + workspace fence): a workspace deletion racing a publish — one
/// receipt's upload left open mid-way, another's committed — leaves no live entry; reruns of
/// both receipts afterwards publish afresh into the new workspace of the same name (the old
/// receipts never answer for it), and once reconciliation settled the audit accounts for
/// every object.
/// Mutation caught: not removing the workspace's receipts on deletion (the committed
/// receipt's rerun answers `already_committed` with an entry that no longer exists).
#[test]
fn a_deletion_racing_receipt_publishes_leaves_nothing_live_and_the_reruns_start_afresh() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(data.path(), &["--reconcile-interval", "1s"]);
    let src = data.path().join("in.bin");
    std::fs::write(
        &src,
        nokv_tests::pseudo_random_bytes(8, 2 * 4 * 1024 * 1024 + 3),
    )
    .unwrap();
    let publish = |receipt: &str, envs: &[(&str, &str)]| {
        d.cli_with_env(
            &[
                "--json",
                "publish",
                src.to_str().unwrap(),
                &format!("ws:{receipt}.bin"),
                "--receipt",
                receipt,
                "--parallel",
                "1",
            ],
            envs,
        )
    };
    publish("done", &[]).assert_ok();
    let open = publish("open", &[("NOKV_TEST_EXIT_AFTER_BLOCKS", "1")]);
    assert_eq!(open.status, 137, "{}", open.stderr);

    d.cli(&["workspace", "delete", "ws", "--yes"]).assert_ok();
    d.cli(&["stat", "ws:done.bin"])
        .assert_fails_with("NotFound");
    d.cli(&["stat", "ws:open.bin"])
        .assert_fails_with("NotFound");

    for receipt in ["done", "open"] {
        let doc = publish(receipt, &[]).assert_ok().json();
        assert_eq!(doc["already_committed"], false, "{receipt}: {doc}");
        assert_eq!(doc["resumed_blocks"], 0, "{receipt}: {doc}");
        assert_eq!(doc["sent_blocks"], 3, "{receipt}: {doc}");
        d.cli(&["stat", &format!("ws:{receipt}.bin")]).assert_ok();
    }
    // Settled: the old blocks are deleted by the periodic passes (bounded wait: nothing
    // outside the daemon signals a pass), and every object left is accounted for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let a = d.cli(&["--json", "admin", "audit"]).assert_ok().json();
        if a["objects"] == 6 {
            assert_eq!(
                (a["referenced"].as_u64(), a["unaccounted"].as_u64()),
                (Some(6), Some(0)),
                "{a}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never settled: {a}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
