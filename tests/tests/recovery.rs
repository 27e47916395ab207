//! Upload recovery against real processes (issue 9, seed 000): how the node behaves when the
//! object provider is away, and how it comes back without a restart.

use nokv_tests::{Daemon, Moto, pseudo_random_bytes};

/// Seed 000: a provider outage at start-up keeps every API up, and an outage that ends is
/// recovered without a restart. The outage here is a bucket that does not exist yet (moto
/// answers NoSuchBucket): start-up's provider check fails, yet small files are served; once
/// the bucket exists, a publish succeeds on the same daemon.
/// Mutation caught: making `provider.check()` fatal again in `server::run` (the daemon exits
/// before listening, so `Daemon::start_with_env` panics).
#[test]
fn a_provider_outage_at_start_up_keeps_the_api_up_and_ends_without_a_restart() {
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    let d = Daemon::start_with_env(
        &[
            "--provider",
            "s3",
            "--s3-endpoint",
            &endpoint,
            "--s3-bucket",
            "late-bucket",
            "--s3-prefix",
            "p",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    );
    d.cli_stdin(&["put", "ws:notes.md"], b"during the outage")
        .assert_ok();
    let got = d.cli(&["get", "ws:notes.md"]);
    assert_eq!(got.assert_ok().stdout, b"during the outage");

    moto.create_bucket("late-bucket");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.bin");
    let body = pseudo_random_bytes(9, 5 * 1024 * 1024 + 17);
    std::fs::write(&src, &body).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:big.bin"])
        .assert_ok();
    let out = dir.path().join("out.bin");
    d.cli(&["restore", "ws:big.bin", out.to_str().unwrap()])
        .assert_ok();
    assert!(
        std::fs::read(&out).unwrap() == body,
        "restored bytes differ"
    );
}

fn json(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    d.cli(&all).assert_ok().json()
}

/// Seed 000 accounting: every object the provider holds is referenced, guarded or
/// collectable; `nokv admin audit` classifies them and names what nobody accounts for.
/// A published artifact's blocks are referenced; a stray object planted under a shard's
/// prefix is the one unaccounted key; replacing the artifact with the retired grace at 0
/// makes the old blocks collectable, and a reconciler pass (the one at start-up) deletes them,
/// leaving health with nothing unresolved or collectable.
/// Mutations caught: classifying with an empty ledger (everything unaccounted); dropping
/// `add_collectable` in `retire` (the old blocks would stay referenced-less and unaccounted
/// after the revision is released).
#[test]
fn the_audit_accounts_for_every_object_and_names_the_stray_one() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--retired-grace", "0s"];
    let d = Daemon::start_in(dir.path(), &args);
    let src = dir.path().join("a.bin");
    std::fs::write(&src, pseudo_random_bytes(1, 6 * 1024 * 1024)).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:a.bin"])
        .assert_ok();
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(
        (a["objects"].as_u64(), a["referenced"].as_u64()),
        (Some(2), Some(2)),
        "{a}"
    );
    assert_eq!(a["unaccounted"], 0, "{a}");

    let stray = d.data_dir().join("objects/nokv/s0003/u/stray/00000000-x");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"nobody wrote me").unwrap();
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(a["unaccounted"], 1, "{a}");
    assert_eq!(
        a["unaccounted_keys"][0], "nokv/s0003/u/stray/00000000-x",
        "{a}"
    );
    std::fs::remove_file(&stray).unwrap();

    // Replace the artifact: its two old blocks are released (grace 0) and collected by the
    // next pass; restart the daemon to run the start-up pass deterministically.
    std::fs::write(&src, pseudo_random_bytes(2, 5 * 1024 * 1024)).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:a.bin"])
        .assert_ok();
    d.terminate();
    let d = Daemon::start_in(dir.path(), &args);
    // The start-up pass runs in the background and nothing outside signals its end: wait
    // (bounded) for its effect, the two old block objects gone from the provider.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while json(&d, &["admin", "audit"])["objects"] != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the old blocks were never collected"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let h = json(&d, &["admin", "health"]);
    for field in [
        "unresolved_uploads",
        "guards_unknown",
        "guards_finished",
        "dead_letters",
        "collectable",
    ] {
        assert_eq!(h[field], 0, "{field}: {h}");
    }
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(
        (
            a["objects"].as_u64(),
            a["referenced"].as_u64(),
            a["unaccounted"].as_u64()
        ),
        (Some(2), Some(2), Some(0)),
        "{a}"
    );
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
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Seed 000: a crashed writer stops renewing and becomes reclaimable after expiry. A publish
/// dies after 2 of 4 blocks, the daemon is killed -9; after the restart the open upload is
/// reclaimed once its (short) lease ended, its recorded blocks are deleted, and the audit
/// settles to nothing unaccounted, unresolved or collectable.
/// Mutation caught: skipping `claim_expired_uploads` in a pass (the upload stays unresolved).
#[test]
fn a_writer_killed_mid_upload_is_reclaimed_after_its_lease_and_the_audit_settles_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--upload-lease", "2s", "--reconcile-interval", "1s"];
    let d = Daemon::start_in(dir.path(), &args);
    let src = dir.path().join("big.bin");
    std::fs::write(&src, pseudo_random_bytes(3, 4 * 4 * 1024 * 1024)).unwrap();
    let crashed = d.cli_with_env(
        &[
            "publish",
            src.to_str().unwrap(),
            "ws:big.bin",
            "--receipt",
            "r1",
            "--parallel",
            "1",
        ],
        &[("NOKV_TEST_EXIT_AFTER_BLOCKS", "2")],
    );
    assert_eq!(crashed.status, 137, "{}", crashed.stderr);
    assert_eq!(json(&d, &["admin", "health"])["unresolved_uploads"], 1);
    d.kill9();

    let d = Daemon::start_in(dir.path(), &args);
    wait_until(
        "the expired upload is reclaimed and its bytes deleted",
        || {
            let h = json(&d, &["admin", "health"]);
            h["unresolved_uploads"] == 0
                && h["collectable"] == 0
                && h["guards_unknown"] == 0
                && h["guards_finished"] == 0
        },
    );
    let a = json(&d, &["admin", "audit"]);
    assert_eq!(
        (a["objects"].as_u64(), a["unaccounted"].as_u64()),
        (Some(0), Some(0)),
        "{a}"
    );
    d.cli(&["stat", "ws:big.bin"]).assert_fails_with("NotFound");
}

/// Seed 000: "a second API preserves the first API's active upload". A second daemon on the
/// same bucket and prefix (its own data dir) starts, reconciles — proven by a pass that
/// deletes its own replaced artifact's blocks — and audits: it sees the first daemon's
/// objects as unaccounted by *its* metadata, and deletes none of them, because a node only
/// deletes keys its own records name. The first daemon's open upload then resumes and
/// commits byte-identical.
/// Mutation caught: a reconciler that deleted what its audit cannot account for (the resumed
/// commit would miss its blocks and the restore would fail).
#[test]
fn a_second_daemon_on_the_same_bucket_never_touches_the_first_ones_active_upload() {
    let moto = Moto::start();
    moto.create_bucket("shared");
    let endpoint = moto.endpoint();
    let s3 = [
        "--provider",
        "s3",
        "--s3-endpoint",
        endpoint.as_str(),
        "--s3-bucket",
        "shared",
        "--s3-prefix",
        "p",
    ];
    let creds = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = Daemon::start_in_with_env(dirs.0.path(), &s3, &creds);
    let src = dirs.0.path().join("big.bin");
    let body = pseudo_random_bytes(4, 3 * 4 * 1024 * 1024 + 5);
    std::fs::write(&src, &body).unwrap();
    let publish = |envs: &[(&str, &str)]| {
        first.cli_with_env(
            &[
                "--json",
                "publish",
                src.to_str().unwrap(),
                "ws:big.bin",
                "--receipt",
                "r1",
                "--parallel",
                "1",
            ],
            envs,
        )
    };
    let crashed = publish(&[("NOKV_TEST_EXIT_AFTER_BLOCKS", "2")]);
    assert_eq!(crashed.status, 137, "{}", crashed.stderr);

    let mut args = s3.to_vec();
    args.extend(["--retired-grace", "0s", "--reconcile-interval", "1s"]);
    let mut second = Daemon::start_in_with_env(dirs.1.path(), &args, &creds);
    let other = dirs.1.path().join("o.bin");
    for seed in [5, 6] {
        std::fs::write(&other, pseudo_random_bytes(seed, 4 * 1024 * 1024 + 1)).unwrap();
        second
            .cli(&["publish", other.to_str().unwrap(), "ws2:o.bin"])
            .assert_ok();
    }
    let line = second.wait_for_log_line("deleted_keys: 2");
    assert!(line.contains("failed_deletes: 0"), "{line}");
    let a = json(&second, &["admin", "audit"]);
    assert_eq!(a["unaccounted"], 2, "the first daemon's two blocks: {a}");

    let done = publish(&[]).assert_ok().json();
    assert_eq!(done["resumed_blocks"], 2, "{done}");
    let out = dirs.0.path().join("out.bin");
    first
        .cli(&["restore", "ws:big.bin", out.to_str().unwrap()])
        .assert_ok();
    assert!(
        std::fs::read(&out).unwrap() == body,
        "restored bytes differ"
    );
}
