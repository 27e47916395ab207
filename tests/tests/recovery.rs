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
