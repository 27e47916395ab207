//! Issue 11 (seed 001), the operations ledger seen by an operator: a delete outage longer
//! than `--delete-attempts` dead-letters the delete, `nokv admin retry` settles it after the
//! outage, and `nokv admin ops` pages the ledger without keys or secrets. The outage is the
//! daemon's test-only fault layer (`NOKV_TEST_FAULTS=...,delete_fail=8`: exactly the first 8
//! provider deletes fail), so no timing decides the outcome.

use nokv_tests::*;
use serde_json::Value;

fn json(d: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    d.cli(&all).assert_ok().json()
}

/// Waits (bounded) until `done` holds: the reconciler runs on its own timer and nothing
/// outside the daemon signals the end of a pass, so its effect is polled for.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Publishes a one-block artifact and deletes it: its block becomes a delete operation once
/// the (zero) retired grace passed.
fn publish_and_remove(d: &Daemon, dir: &std::path::Path, name: &str) {
    let src = dir.join(name);
    std::fs::write(&src, vec![7u8; 300 * 1024]).unwrap();
    let target = format!("ws:{name}");
    d.cli(&["publish", src.to_str().unwrap(), &target, "--quiet"])
        .assert_ok();
    d.cli(&["rm", &target]).assert_ok();
}

fn ops(d: &Daemon, state: &str) -> Vec<Value> {
    json(d, &["admin", "ops", "--state", state])["operations"]
        .as_array()
        .unwrap()
        .clone()
}

/// Every file name under the data dir (provider keys end in them): none may appear in a
/// summary.
fn stored_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(n) = path.file_name().and_then(|n| n.to_str()) {
                out.push(n.to_string());
            }
        }
    }
    out
}

/// Mutations caught: never dead-lettering (`op.attempts >= max_attempts` → `false`: the 9th
/// automatic delete succeeds and no dead letter ever shows), and a retry that does not settle
/// the operation (dead_letters stays 1).
#[test]
fn a_delete_outage_longer_than_8_attempts_dead_letters_it_and_admin_retry_completes_it_after() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in_with_env(
        dir.path(),
        &["--retired-grace", "0s", "--reconcile-interval", "100ms"],
        &[("NOKV_TEST_FAULTS", "seed=1,delete_fail=8")],
    );
    publish_and_remove(&d, dir.path(), "a.bin");
    wait_until("the delete is dead-lettered", || {
        json(&d, &["admin", "health"])["dead_letters"] == 1
    });
    let dead = ops(&d, "dead_letter");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let op = &dead[0];
    assert_eq!(
        (op["kind"].as_str(), op["attempts"].as_u64()),
        (Some("delete"), Some(8))
    );
    assert_eq!(op["workspace"], "ws");
    assert!(!op["last_error"].as_str().unwrap().is_empty());
    let id = op["id"].as_str().unwrap().to_string();

    // It left the automatic queue: a later delete (the outage is over) completes while the
    // dead letter stays as it was, its object and accounting kept.
    publish_and_remove(&d, dir.path(), "b.bin");
    wait_until("the second delete completes", || {
        ops(&d, "deleted").len() == 1
    });
    let still = ops(&d, "dead_letter");
    assert_eq!((still.len(), &still[0]["attempts"]), (1, &Value::from(8)));
    let h = json(&d, &["admin", "health"]);
    assert_eq!(h["collectable"], 0, "not in the queue: {h}");
    assert_eq!(h["operations"]["dead_letter"], 1);
    assert!(h["oldest_unresolved_age_ms"].as_i64().unwrap() >= 0);
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(
        (a["objects"].as_u64(), a["collectable"].as_u64()),
        (Some(1), Some(1)),
        "{a}"
    );
    assert_eq!(a["unaccounted"], 0);

    // The retry after the outage.
    let r = json(&d, &["admin", "retry", &id]);
    assert_eq!(
        (r["result"].as_str(), r["state"].as_str()),
        (Some("completed"), Some("deleted")),
        "{r}"
    );
    let h = json(&d, &["admin", "health"]);
    assert_eq!(
        (
            h["dead_letters"].as_u64(),
            h["operations"]["deleted"].as_u64()
        ),
        (Some(0), Some(2)),
        "{h}"
    );
    assert_eq!(h["oldest_unresolved_age_ms"], 0);
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(a["objects"], 0, "the object is gone: {a}");
    // Idempotent.
    assert_eq!(json(&d, &["admin", "retry", &id])["result"], "completed");
    d.cli(&["admin", "retry", "not-an-id"])
        .assert_fails_with("InvalidArgument");
}

/// Mutation caught: `workspace: d.workspace.clone()` → `d.key.clone()` in
/// `LedgerRow::of_delete` (a summary would name the object key).
#[test]
fn the_ops_page_filters_by_state_refuses_bad_limits_and_states_and_shows_no_key_or_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(
        dir.path(),
        &["--retired-grace", "0s", "--reconcile-interval", "100ms"],
    );
    publish_and_remove(&d, dir.path(), "a.bin");
    let src = dir.path().join("kept.bin");
    std::fs::write(&src, vec![1u8; 300 * 1024]).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:kept.bin", "--quiet"])
        .assert_ok();
    wait_until("the removed artifact's block is deleted", || {
        ops(&d, "deleted").len() == 1
    });
    let page = d
        .cli(&["--json", "admin", "ops", "--limit", "100"])
        .assert_ok()
        .stdout_str();
    let all: Value = serde_json::from_str(&page).unwrap();
    let list = all["operations"].as_array().unwrap();
    // Two uploads (committed) and one delete (deleted).
    let mut states: Vec<_> = list.iter().map(|o| o["state"].as_str().unwrap()).collect();
    states.sort();
    assert_eq!(states, ["committed", "committed", "deleted"], "{all}");
    assert_eq!(all["next"], Value::Null);
    let fields: Vec<_> = list[0].as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        fields,
        [
            "attempts",
            "bytes",
            "created_ms",
            "id",
            "kind",
            "last_error",
            "shard",
            "state",
            "updated_ms",
            "workspace"
        ]
    );
    let committed = ops(&d, "committed");
    assert_eq!(committed.len(), 2);
    assert!(committed.iter().all(|o| o["kind"] == "upload"));
    // A page of one, then the rest after its cursor.
    let first = json(&d, &["admin", "ops", "--limit", "1"]);
    let next = first["next"].as_str().unwrap();
    let rest = json(&d, &["admin", "ops", "--after", next]);
    assert_eq!(rest["operations"].as_array().unwrap().len(), 2);
    // Secret-free: no token, no object key (keys are `[prefix/]sNNNN/u/UPLOAD/INDEX-ATTEMPT`,
    // live or already deleted), no stored object name.
    assert!(!page.contains(&d.admin_token()));
    for o in list {
        for (field, v) in o.as_object().unwrap() {
            let text = v.as_str().unwrap_or("");
            assert!(!text.contains('/'), "{field} looks like a key: {text}");
        }
    }
    for name in stored_names(d.data_dir()).iter().filter(|n| n.len() >= 12) {
        assert!(!page.contains(name.as_str()), "{name} leaked into {page}");
    }
    // Refused with a clear error.
    d.cli(&["admin", "ops", "--limit", "0"])
        .assert_fails_with("InvalidArgument");
    d.cli(&["admin", "ops", "--limit", "101"])
        .assert_fails_with("InvalidArgument");
    let mut nine = vec!["admin", "ops"];
    for s in [
        "open",
        "committed",
        "aborted",
        "reclaimed",
        "deleting",
        "deleted",
        "dead_letter",
        "open",
        "deleted",
    ] {
        nine.extend(["--state", s]);
    }
    d.cli(&nine).assert_fails_with("InvalidArgument");
    d.cli(&["admin", "ops", "--after", "garbage"])
        .assert_fails_with("InvalidArgument");
}
