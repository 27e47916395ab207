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
