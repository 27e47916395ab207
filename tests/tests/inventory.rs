//! The inventory (`nokv admin inventory start|status`, `nokv admin quarantine`): a durable,
//! paged scan of the provider prefix that quarantines objects no record accounts for and never
//! deletes anything.

use std::thread;
use std::time::{Duration, Instant};

use nokv_tests::{Daemon, Moto};
use serde_json::Value;

/// Polls `admin inventory status` (the daemon's own report) until `done` holds; panics with
/// the last status after a deadline.
fn wait_for_status(d: &Daemon, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = d
            .cli(&["--json", "admin", "inventory", "status"])
            .assert_ok()
            .json();
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "inventory never got there: {status}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

fn completed_everywhere(status: &Value, scans: u64) -> bool {
    status["state"] == "idle"
        && status["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["scans_completed"].as_u64().unwrap() >= scans)
}

fn quarantined_keys(d: &Daemon) -> Vec<String> {
    let q = d
        .cli(&["--json", "admin", "quarantine", "--limit", "1000"])
        .assert_ok()
        .json();
    let mut keys: Vec<String> = q["observations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_string())
        .collect();
    keys.sort();
    keys
}

#[test]
fn a_foreign_object_put_straight_into_the_bucket_is_quarantined_and_still_exists_after_several_scans()
 {
    let moto = Moto::start();
    moto.create_bucket("inv");
    let endpoint = moto.endpoint();
    let d = Daemon::start_with_env(
        &[
            "--provider",
            "s3",
            "--s3-endpoint",
            &endpoint,
            "--s3-bucket",
            "inv",
            "--s3-prefix",
            "pfx",
            "--shards",
            "4",
            "--inventory-interval",
            "off",
            "--inventory-page-size",
            "2",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    );
    // Live bytes of a published artifact: accounted for, never quarantined.
    let files = tempfile::tempdir().unwrap();
    let art = files.path().join("a.bin");
    std::fs::write(&art, nokv_tests::pseudo_random_bytes(1, 5 * 1024 * 1024)).unwrap();
    d.cli(&["publish", art.to_str().unwrap(), "ws:a.bin"])
        .assert_ok();
    // Foreign objects: one in a shard's key space, one under the prefix outside any shard.
    let foreign = ["pfx/loose.bin", "pfx/s0002/u/nobody/00000000-x"];
    for key in foreign {
        let (status, body) = moto.s3("PUT", &format!("/inv/{key}"), b"foreign bytes");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    // Outside the prefix: not the node's, never looked at.
    moto.s3("PUT", "/inv/elsewhere/x", b"not ours");

    let mut first_seen = None;
    for scan in 1..=3 {
        let started = d
            .cli(&["--json", "admin", "inventory", "start"])
            .assert_ok()
            .json();
        assert_eq!(started["started"], 4, "{started}");
        let status = wait_for_status(&d, |s| completed_everywhere(s, scan));
        assert_eq!(status["quarantined"], 2, "{status}");
        assert_eq!(quarantined_keys(&d), foreign);
        let q = d.cli(&["--json", "admin", "quarantine"]).assert_ok().json();
        let o = &q["observations"][0];
        assert_eq!(o["size"], 13, "{q}");
        let seen = o["first_seen_ms"].as_i64().unwrap();
        assert_eq!(*first_seen.get_or_insert(seen), seen, "first sighting kept");
        let keys = moto.list_keys("inv", "pfx/");
        for key in foreign {
            assert!(keys.iter().any(|k| k == key), "{key} was deleted: {keys:?}");
        }
        // The status names no key: its cursors are opaque tokens.
        assert!(!status.to_string().contains("pfx/"), "{status}");
    }
    let health = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    assert_eq!(health["quarantined"], 2, "{health}");
    let per_shard: u64 = health["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["quarantined"].as_u64().unwrap())
        .sum();
    assert_eq!(per_shard, 2, "{health}");
    // A bad limit is refused and changes nothing.
    d.cli(&["admin", "quarantine", "--limit", "1001"])
        .assert_fails_with("InvalidArgument");
    let zero = d.cli(&["admin", "quarantine", "--limit", "0"]);
    assert_eq!(zero.status, 2, "a usage error: {}", zero.stderr);
}

#[test]
fn a_scan_killed_mid_way_resumes_from_its_cursor_after_a_restart() {
    const OBJECTS: usize = 400;
    let data = tempfile::tempdir().unwrap();
    let args = [
        "--shards",
        "1",
        "--inventory-interval",
        "off",
        "--inventory-page-size",
        "1",
    ];
    let d = Daemon::start_in(data.path(), &args);
    let stray = data.path().join("objects/nokv/stray");
    std::fs::create_dir_all(&stray).unwrap();
    for i in 0..OBJECTS {
        std::fs::write(stray.join(format!("{i:04}")), b"x").unwrap();
    }
    d.cli(&["admin", "inventory", "start"]).assert_ok();
    let before = wait_for_status(&d, |s| s["pages"].as_u64().unwrap() >= 2);
    d.kill9();
    let pages_before = before["pages"].as_u64().unwrap();
    assert_eq!(before["state"], "running", "{before}");

    let d = Daemon::start_in(data.path(), &args);
    let resumed = d
        .cli(&["--json", "admin", "inventory", "status"])
        .assert_ok()
        .json();
    assert!(
        resumed["pages"].as_u64().unwrap() >= pages_before,
        "the scan's progress survived: {before} then {resumed}"
    );
    let done = wait_for_status(&d, |s| completed_everywhere(s, 1));
    // Each object was seen exactly once: the scan went on after its cursor, not from the top.
    assert_eq!(done["objects_seen"], OBJECTS, "{done}");
    assert_eq!(done["pages"], OBJECTS, "{done}");
    assert_eq!(done["quarantined"], OBJECTS, "{done}");
    assert_eq!(done["shards"][0]["scans_completed"], 1, "{done}");
    assert_eq!(std::fs::read_dir(&stray).unwrap().count(), OBJECTS);
}
