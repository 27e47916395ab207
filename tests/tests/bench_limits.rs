//! The small-write limit measurements (issue 12): `nokv-server store-bench` (the store alone)
//! and `nokv bench limits` (the store, the transport's ceiling, the put and etcd side by side).
//! These assert what the benchmarks measure, never a timing.

use std::process::{Command, Stdio};

use nokv_tests::{Daemon, bin, server_command};
use serde_json::Value;

#[test]
fn store_bench_writes_through_the_shard_path_and_reports_each_session_count() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = server_command(&[
        "store-bench",
        "--data-dir",
        data.to_str().unwrap(),
        "--sessions",
        "1,3",
        "--seconds",
        "0.3",
    ]);
    assert_eq!(out.status, 0, "store-bench failed: {}", out.stderr);
    let reports: Vec<Value> = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON report per line"))
        .collect();
    assert_eq!(reports.len(), 2, "one report per session count");
    for (r, sessions) in reports.iter().zip([1, 3]) {
        assert_eq!(r["sessions"], sessions);
        assert!(r["ops"].as_u64().unwrap() > 0, "no write completed: {r}");
        assert!(
            r["batches"].as_u64().unwrap() > 0,
            "no batch committed: {r}"
        );
        assert!(r["writes_per_batch"].as_f64().unwrap() >= 1.0, "{r}");
        // Every committed batch is made durable by a log append; one append may cover
        // several batches, never the other way round.
        let fsyncs = r["fsyncs"].as_u64().unwrap();
        assert!(
            fsyncs > 0 && fsyncs <= r["batches"].as_u64().unwrap(),
            "{r}"
        );
        assert!(
            r["writes_per_fsync"].as_f64().unwrap() >= r["writes_per_batch"].as_f64().unwrap(),
            "{r}"
        );
        assert!(r["cpu_ms_per_op"].as_f64().unwrap() > 0.0, "{r}");
    }

    // The writes went through the real shard path into the node file: a daemon on the same
    // data dir serves them with the recorded size and a generation.
    let daemon = Daemon::start_in(&data, &[]);
    let stat = daemon.cli(&["--json", "stat", "bench-w2:bench/file-0"]);
    stat.assert_ok();
    let entry = stat.json();
    assert_eq!(entry["size"], 4096, "{entry}");
    assert!(entry["generation"].as_u64().unwrap() >= 1, "{entry}");
}

#[test]
fn bench_limits_measures_every_load_beside_etcd_at_each_client_count() {
    let report = bench_report(&["limits", "--clients", "1,2", "--seconds", "0.3"]);
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "one result per client count");
    for (r, clients) in results.iter().zip([1, 2]) {
        assert_eq!(r["clients"], clients);
        for load in [
            "store_alone",
            "bare_rpc",
            "refused_write",
            "durable_rpc_writer",
            "durable_rpc_inline",
            "nokv_put",
            "etcd_put",
            "etcd_tls_put",
        ] {
            // A load counts only operations that did what it names: a refused write only
            // when the daemon answered InvalidArgument, a durable RPC only when rpc-floor
            // accepted the token and answered once the body was synced, an etcd put over TLS
            // only when the handshake and the put succeeded.
            let ops = r[load]["summary"]["ops"].as_u64();
            assert!(ops.unwrap_or(0) > 0, "{load} completed nothing: {r}");
        }
        assert!(
            r["nokv_put_ops_over_etcd_put"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        assert!(
            r["store_alone_ops_over_etcd_put"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
}

/// `nokv bench upload-vs-direct` publishes, restores and PUTs directly, and reports each with
/// the CPU the daemon and the client spent per MiB (local provider, one small round: this
/// asserts what the bench measures, never a speed).
#[test]
fn upload_vs_direct_reports_speeds_and_both_sides_cpu_per_mib() {
    let report = bench_report(&[
        "upload-vs-direct",
        "--providers",
        "local",
        "--size-mib",
        "8",
        "--rounds",
        "1",
    ]);
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "one result per provider: {report}");
    let r = &results[0];
    assert_eq!(r["provider"], "local");
    for speed in [
        "best_publish_mib_s",
        "best_restore_mib_s",
        "best_direct_put_mib_s",
    ] {
        assert!(r[speed].as_f64().unwrap() > 0.0, "{speed}: {r}");
    }
    for cpu in [
        "daemon_cpu_ms_per_mib_published",
        "daemon_cpu_ms_per_mib_restored",
        "client_cpu_ms_per_mib_published",
        "client_cpu_ms_per_mib_restored",
    ] {
        let v = r[cpu].as_array().unwrap_or_else(|| panic!("{cpu}: {r}"));
        assert_eq!(v.len(), 1, "one figure per round: {cpu}: {r}");
        assert!(v[0].as_f64().unwrap() >= 0.0, "{cpu}: {r}");
    }
}

/// Runs `nokv bench ARGS` in a scratch work dir and returns the JSON report it wrote
/// (`OUT/<bench>.json`, the bench named by the first argument).
fn bench_report(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let status = Command::new(bin("nokv"))
        .arg("bench")
        .args(args)
        .arg("--work-dir")
        .arg(dir.path())
        .arg("--out")
        .arg(&out_dir)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run nokv bench {args:?}: {e}"));
    assert!(status.success(), "nokv bench {args:?} failed");
    let report = out_dir.join(format!("{}.json", args[0]));
    serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap()
}
