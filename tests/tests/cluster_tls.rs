//! Cluster TLS and secrets (issue 10, item 1): `nokv-server cluster init` / `cluster cert`
//! write one CA, per-host node certificates, the token secret, an admin token and a
//! `client.toml`; nodes started with `--tls-dir` share them, so one client configuration
//! reaches every node. A cluster node refuses to start without a shared TLS directory.

use std::path::Path;

use nokv_tests::{Daemon, cli_with_config, server_command};

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn two_nodes_started_with_one_tls_dir_both_answer_the_cli_through_the_cluster_client_config() {
    let root = tempfile::tempdir().unwrap();
    let c = root.path().join("cluster");
    server_command(&["cluster", "init", "--dir", path(&c), "--host", "127.0.0.1"]).assert_ok();
    server_command(&["cluster", "cert", "--dir", path(&c), "--host", "localhost"]).assert_ok();
    // Each node serves the certificate of its own advertised host: a client checks the name
    // it dialled, so a node serving the other's certificate would fail the TLS handshake.
    let a = Daemon::start(&["--tls-dir", path(&c), "--advertise", "127.0.0.1"]);
    let b = Daemon::start(&["--tls-dir", path(&c), "--advertise", "localhost"]);
    assert!(
        b.endpoint().starts_with("https://localhost:"),
        "{}",
        b.endpoint()
    );
    let config = c.join("client.toml");
    let via = |d: &Daemon, args: &[&str]| {
        cli_with_config(&config, args, &[("NOKV_ENDPOINT", &d.endpoint())], None)
    };
    for d in [&a, &b] {
        via(d, &["admin", "health"]).assert_ok();
        // Neither node generated development material of its own.
        assert!(!d.data_dir().join("tls").exists());
        assert!(!d.data_dir().join("cluster.secret").exists());
    }
    let src = root.path().join("note.txt");
    std::fs::write(&src, b"written through node a").unwrap();
    via(&a, &["put", "w1:note.txt", path(&src)]).assert_ok();
    via(&b, &["put", "w2:note.txt", path(&src)]).assert_ok();
    assert_eq!(
        via(&a, &["get", "w1:note.txt"]).assert_ok().stdout,
        b"written through node a"
    );
    // A token signed with the cluster secret is accepted by both nodes.
    let token = server_command(&[
        "token",
        "issue",
        "--data-dir",
        path(&c),
        "--workspace",
        "w2",
        "--role",
        "read",
    ]);
    let token = token.assert_ok().stdout_str();
    let with_token = [
        ("NOKV_ENDPOINT", b.endpoint()),
        ("NOKV_TOKEN", token.trim().to_string()),
    ];
    let envs: Vec<(&str, &str)> = with_token.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cli_with_config(&config, &["get", "w2:note.txt"], &envs, None).assert_ok();
}

#[test]
fn cluster_init_never_overwrites_an_existing_cluster_directory() {
    let root = tempfile::tempdir().unwrap();
    let c = root.path().join("cluster");
    server_command(&["cluster", "init", "--dir", path(&c), "--host", "n1"]).assert_ok();
    let secret = std::fs::read(c.join("cluster.secret")).unwrap();
    let again = server_command(&["cluster", "init", "--dir", path(&c), "--host", "n2"]);
    assert_eq!(again.status, 2, "{again:?}");
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);
    assert_eq!(std::fs::read(c.join("cluster.secret")).unwrap(), secret);
    assert!(!c.join("nodes/n2.pem").exists());
}

#[test]
fn a_node_given_etcd_without_tls_dir_refuses_to_start_with_a_one_line_explanation() {
    let dir = tempfile::tempdir().unwrap();
    let (status, _stdout, stderr) = Daemon::start_refused_in(
        dir.path(),
        &[
            "--etcd",
            "http://127.0.0.1:2379",
            "--cluster",
            "k",
            "--node-id",
            "n1",
            "--advertise",
            "127.0.0.1",
        ],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--etcd needs --tls-dir"), "{stderr}");
    assert!(!dir.path().join("tls").exists(), "nothing was generated");
}

#[test]
fn a_node_whose_host_has_no_certificate_in_the_tls_dir_refuses_naming_cluster_cert() {
    let root = tempfile::tempdir().unwrap();
    let c = root.path().join("cluster");
    server_command(&["cluster", "init", "--dir", path(&c), "--host", "127.0.0.1"]).assert_ok();
    let data = root.path().join("data");
    let (status, _stdout, stderr) =
        Daemon::start_refused_in(&data, &["--tls-dir", path(&c), "--advertise", "localhost"]);
    assert!(!status.success());
    assert!(stderr.contains("cluster cert"), "{stderr}");
}
