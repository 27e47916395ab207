//! etcd over TLS with client certificates, and etcd user/password auth (issue 43 item 4): a
//! real etcd on loopback started with `--client-cert-auth --trusted-ca-file C/ca.pem
//! --cert-file C/etcd/server.pem --key-file C/etcd/server.key` (all from `nokv-server cluster
//! init --etcd-host 127.0.0.1`). A node with the cluster's etcd client certificate joins and
//! serves; a node without one, with one from another CA, or that does not trust etcd's
//! certificate is refused at start-up, before it listens, with one line naming the cause.

use std::path::{Path, PathBuf};

use nokv_tests::cluster::{Cluster, path_str};
use nokv_tests::server_command;

/// A second cluster directory (another CA) with its own etcd certificates.
fn other_ca(root: &Path) -> PathBuf {
    let dir = root.join("other-ca");
    server_command(&[
        "cluster",
        "init",
        "--dir",
        path_str(&dir),
        "--host",
        "127.0.0.1",
        "--etcd-host",
        "127.0.0.1",
    ])
    .assert_ok();
    dir
}

/// The access flags `--etcd-ca CA --etcd-cert C/etcd/client.pem --etcd-key C/etcd/client.key`.
fn access(ca: &Path, client_dir: &Path) -> Vec<String> {
    vec![
        "--etcd-ca".into(),
        path_str(ca).into(),
        "--etcd-cert".into(),
        path_str(&client_dir.join("etcd/client.pem")).into(),
        "--etcd-key".into(),
        path_str(&client_dir.join("etcd/client.key")).into(),
    ]
}

/// The refusal: the process failed, and exactly one stderr line (the last) carries the cause,
/// `expected`, and names the etcd endpoint.
fn assert_refused_in_one_line(c: &Cluster, access: &[String], expected: &str) -> String {
    let spec = c.spec(9);
    let access: Vec<&str> = access.iter().map(String::as_str).collect();
    let (status, stderr) = c.start_refused_with_etcd_access(&spec, &access, &[]);
    assert!(!status.success(), "{stderr}");
    let naming: Vec<&str> = stderr.lines().filter(|l| l.contains(expected)).collect();
    assert_eq!(naming.len(), 1, "one line names the cause:\n{stderr}");
    let line = naming[0];
    assert!(line.starts_with("nokv-server: "), "{stderr}");
    assert_eq!(Some(line), stderr.trim_end().lines().last(), "{stderr}");
    assert!(line.contains(&c.etcd().endpoint()), "{line}");
    line.to_string()
}

#[test]
fn a_node_with_the_cluster_etcd_client_certificate_joins_an_etcd_demanding_client_certificates_and_serves_a_write_and_a_read()
 {
    let c = Cluster::with_etcd_tls("etcdtls");
    assert!(c.etcd().endpoint().starts_with("https://127.0.0.1:"));
    let node = c.start(c.spec(1));
    c.wait_until("the node owns every shard", |v| {
        v.owned_by("n1").len() == 16
    });
    let body = b"written while etcd checked our certificate\n";
    c.cli_stdin(&[node.endpoint()], &["put", "w:notes/a.txt"], Some(body))
        .assert_ok();
    let read = c.cli_via(&node, &["get", "w:notes/a.txt"]);
    assert_eq!(read.assert_ok().stdout, body);
}

#[test]
fn a_node_without_a_client_certificate_is_refused_at_start_up_in_one_line_saying_etcd_requires_one()
{
    let c = Cluster::with_etcd_tls("etcdtls-nocert");
    let ca = c.tls_dir().join("ca.pem");
    let flags = ["--etcd-ca".to_string(), path_str(&ca).to_string()];
    let line = assert_refused_in_one_line(&c, &flags, "requires a client certificate");
    assert!(line.contains("--etcd-cert"), "{line}");
}

#[test]
fn a_node_whose_client_certificate_comes_from_another_ca_is_refused_in_one_line_naming_the_certificate()
 {
    let c = Cluster::with_etcd_tls("etcdtls-otherca");
    let other = other_ca(c.root());
    let flags = access(&c.tls_dir().join("ca.pem"), &other);
    let line = assert_refused_in_one_line(&c, &flags, "refused our client certificate");
    assert!(
        line.contains(path_str(&other.join("etcd/client.pem"))),
        "{line}"
    );
}

#[test]
fn a_node_that_does_not_trust_etcds_certificate_is_refused_in_one_line_naming_its_etcd_ca() {
    let c = Cluster::with_etcd_tls("etcdtls-untrusted");
    let other = other_ca(c.root());
    let flags = access(&other.join("ca.pem"), c.tls_dir());
    let line = assert_refused_in_one_line(&c, &flags, "is not signed by --etcd-ca");
    assert!(line.contains(path_str(&other.join("ca.pem"))), "{line}");
}

#[test]
fn an_etcd_that_does_not_answer_is_named_with_the_time_waited() {
    let c = Cluster::with_etcd_tls("etcdtls-silent");
    // A listener that accepts and never speaks: the TLS handshake cannot finish.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", silent.local_addr().unwrap());
    let spec = c.spec(9);
    let mut flags = access(&c.tls_dir().join("ca.pem"), c.tls_dir());
    flags.extend(["--etcd".into(), url.clone()]);
    // node_args already passes the cluster's --etcd: run the daemon directly instead.
    let mut args = c.node_args_with_etcd_access(&spec, &[], &[]);
    let at = args.iter().position(|a| a == "--etcd").unwrap();
    args.drain(at..at + 2);
    args.extend(flags);
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, _stdout, stderr) = nokv_tests::Daemon::start_refused_in_with_env(
        &spec.data_dir,
        &args,
        &nokv_tests::cluster::S3_ENV,
    );
    assert!(!status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains(&url) && last.contains("did not answer within"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_user_auth_joins_with_the_right_password_refuses_a_wrong_one_and_never_prints_either()
{
    let c = Cluster::with_etcd_tls("etcdtls-auth");
    let tls = c.tls_dir();
    let options = etcd_client::ConnectOptions::new().with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(
                std::fs::read(tls.join("ca.pem")).unwrap(),
            ))
            .identity(etcd_client::Identity::from_pem(
                std::fs::read(tls.join("etcd/client.pem")).unwrap(),
                std::fs::read(tls.join("etcd/client.key")).unwrap(),
            )),
    );
    let mut admin = etcd_client::Client::connect([c.etcd().endpoint()], Some(options))
        .await
        .expect("connect to etcd as the test");
    let (right, wrong) = ("Right-0f-passage", "Wr0ng-guess");
    admin.user_add("root", "root-pw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("nokv-node", right, None).await.unwrap();
    admin.user_grant_role("nokv-node", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let pw = c.root().join("etcd-password");
    std::fs::write(&pw, format!("{wrong}\n")).unwrap();
    let user = [
        "--etcd-user",
        "nokv-node",
        "--etcd-password-file",
        path_str(&pw),
    ];
    let c = &c;
    let (status, stderr) = tokio::task::block_in_place(|| c.start_refused(&c.spec(8), &user));
    assert!(!status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("refused user \"nokv-node\"") && last.contains(path_str(&pw)),
        "{stderr}"
    );
    assert!(!stderr.contains(wrong), "the password leaked:\n{stderr}");

    std::fs::write(&pw, format!("{right}\n")).unwrap();
    let (stderr, owned) = tokio::task::block_in_place(|| {
        let node = c.start_with(c.spec(1), &user);
        let view = c.wait_until("the node owns every shard", |v| {
            v.owned_by("n1").len() == 16
        });
        c.cli_stdin(&[node.endpoint()], &["put", "w:a.txt"], Some(b"x"))
            .assert_ok();
        let (_, _, stderr) = c.terminate(node);
        (stderr, view.owned_by("n1").len())
    });
    assert_eq!(owned, 16);
    assert!(!stderr.contains(right), "the password leaked:\n{stderr}");
}
