//! `nokv admin cluster` and `nokv admin shard move` against the embedded default: one node
//! owning every shard at epoch 0, and shard moves refused (they need cluster mode).

use nokv_tests::{CliOutput, Daemon};
use serde_json::{Value, json};

/// Every secret of the daemon's data dir a careless answer could leak.
fn secrets(d: &Daemon) -> Vec<String> {
    let secret =
        std::fs::read_to_string(d.data_dir().join("cluster.secret")).expect("read cluster.secret");
    vec![d.admin_token(), secret.trim().to_string()]
}

#[track_caller]
fn assert_no_secret(d: &Daemon, out: &CliOutput) {
    let text = format!("{}{}", out.stdout_str(), out.stderr);
    for s in secrets(d) {
        assert!(!s.is_empty());
        assert!(!text.contains(&s), "output leaks a secret:\n{text}");
    }
}

fn cluster_json(d: &Daemon) -> Value {
    let out = d.cli(&["--json", "admin", "cluster"]);
    out.assert_ok();
    assert_no_secret(d, &out);
    out.json()
}

#[test]
fn the_embedded_node_reports_itself_as_the_only_node_owning_all_16_shards_at_epoch_0() {
    let d = Daemon::start(&[]);
    let node = d.cli(&["--json", "admin", "health"]).assert_ok().json()["node"].clone();
    let doc = cluster_json(&d);

    assert_eq!(doc["cluster"], Value::Null, "{doc}");
    assert_eq!(
        doc["nodes"],
        json!([{"id": node, "endpoint": d.endpoint(), "alive": true}]),
        "{doc}"
    );
    let shards = doc["shards"].as_array().expect("shards array");
    assert_eq!(shards.len(), 16, "{doc}");
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(
            *s,
            json!({"shard": i, "owner": node, "endpoint": d.endpoint(), "epoch": 0,
                   "state": "serving", "owner_alive": true, "checkpoint_size": null,
                   "checkpoint_age_ms": null}),
            "{doc}"
        );
    }

    // The human form is a table naming the node and every shard.
    let out = d.cli(&["admin", "cluster"]);
    out.assert_ok();
    assert_no_secret(&d, &out);
    let text = out.stdout_str();
    assert!(
        text.contains("embedded node (no cluster) · 1 node · 16 shards"),
        "{text}"
    );
    assert!(text.contains(&d.endpoint()), "{text}");
    let serving_rows = text.lines().filter(|l| l.contains("serving")).count();
    assert_eq!(serving_rows, 16, "{text}");
}

#[test]
fn a_shard_move_on_the_embedded_node_is_refused_with_the_reason_and_changes_nothing() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "demo:kept.txt"], b"still here")
        .assert_ok();
    let before = cluster_json(&d);

    let out = d.cli(&["admin", "shard", "move", "3", "other"]);
    out.assert_fails_with("InvalidArgument");
    assert!(out.stderr.contains("cluster mode"), "{}", out.stderr);
    assert_no_secret(&d, &out);
    let out = d.cli(&["--json", "admin", "shard", "move", "3", "other"]);
    assert_eq!(out.status, 1, "{}", out.stderr);
    assert_eq!(out.json()["error"]["reason"], "InvalidArgument");

    assert_eq!(cluster_json(&d), before);
    let got = d.cli(&["get", "demo:kept.txt"]);
    assert_eq!(got.assert_ok().stdout, b"still here");
}

#[test]
fn a_shard_move_names_an_existing_shard_and_a_node() {
    let d = Daemon::start(&[]);
    let out = d.cli(&["admin", "shard", "move", "99", "other"]);
    out.assert_fails_with("InvalidArgument");
    assert!(
        out.stderr.contains("shard 99 does not exist"),
        "{}",
        out.stderr
    );
    assert_no_secret(&d, &out);
    let out = d.cli(&["admin", "shard", "move", "16", "other"]);
    out.assert_fails_with("InvalidArgument");
    assert!(
        out.stderr.contains("shard 16 does not exist"),
        "{}",
        out.stderr
    );
    let out = d.cli(&["admin", "shard", "move", "3", ""]);
    out.assert_fails_with("InvalidArgument");
    assert!(out.stderr.contains("node id is empty"), "{}", out.stderr);
}

#[test]
fn cluster_commands_need_an_admin_token_for_every_workspace() {
    let d = Daemon::start(&[]);
    for (workspace, role) in [("*", "read"), ("*", "write"), ("team-a", "admin")] {
        let tok = d.token(workspace, role, None);
        let env = [("NOKV_TOKEN", tok.as_str())];
        for args in [
            &["admin", "cluster"][..],
            &["admin", "shard", "move", "3", "other"],
        ] {
            let out = d.cli_with_env(args, &env);
            out.assert_fails_with("PermissionDenied");
            assert!(
                !out.stderr.contains(&tok),
                "{workspace} {role} {args:?}: {}",
                out.stderr
            );
        }
    }
}
