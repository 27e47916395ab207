//! Security of a real `nokv-server`: bearer tokens (the CLI's token matrix), TLS-only
//! transport, the standard gRPC health and reflection services over TLS, secrets kept out of
//! the daemon's output, and names no CLI can send (NUL) refused through the SDK.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nokv_client::Client;
use nokv_client::config::ResolvedConfig;
use nokv_client::sdk::RetryPolicy;
use nokv_proto::v1 as pb;
use nokv_tests::{CliOutput, Daemon};
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Bound on any single RPC in these tests, so a server that never answers fails the test
/// instead of hanging it.
const RPC_DEADLINE: Duration = Duration::from_secs(20);

fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client config with the daemon's endpoint and CA but no token.
fn tokenless_config(d: &Daemon, dir: &Path) -> PathBuf {
    let path = dir.join("no-token.toml");
    let text = format!(
        "endpoint = {:?}\nca = {:?}\n",
        d.endpoint(),
        d.ca_path().display().to_string()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `nokv --json put TARGET` as the admin (client.toml's token); returns the entry.
#[track_caller]
fn admin_put(d: &Daemon, target: &str, data: &[u8]) -> Value {
    d.cli_stdin(&["--json", "put", target], data)
        .assert_ok()
        .json()
}

#[track_caller]
fn admin_stat(d: &Daemon, target: &str) -> Value {
    d.cli(&["--json", "stat", target]).assert_ok().json()
}

#[track_caller]
fn admin_get(d: &Daemon, target: &str) -> Vec<u8> {
    d.cli(&["get", target]).assert_ok().stdout.clone()
}

#[track_caller]
fn admin_ls(d: &Daemon, ws: &str) -> Vec<String> {
    d.cli(&["--json", "ls", &format!("{ws}:")])
        .assert_ok()
        .json()["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect()
}

#[track_caller]
fn assert_reason(out: &CliOutput, reason: &str, what: &str) {
    if out.status != 1 || out.reason() != Some(reason) {
        panic!(
            "{what}: expected exit 1 with reason {reason}, got exit {} reason {:?}\n\
             stderr: {}\nstdout: {}",
            out.status,
            out.reason(),
            out.stderr,
            out.stdout_str()
        );
    }
}

/// A copy of `token` with its last character changed (so its signature no longer matches).
fn tampered(token: &str) -> String {
    let mut t = token.to_string();
    let last = t.pop().expect("non-empty token");
    t.push(if last == '0' { '1' } else { '0' });
    t
}

// ---------------------------------------------------------------------------------------------
// Token matrix through the CLI
// ---------------------------------------------------------------------------------------------

#[test]
fn every_bad_credential_gets_its_status_and_changes_nothing() {
    let d = Daemon::start(&[]);
    let foreign = Daemon::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let no_token = tokenless_config(&d, tmp.path());
    let no_token = no_token.to_str().unwrap();

    let original = admin_put(&d, "team-a:keep.txt", b"original");
    let expired = d.expired_token("team-a", "write");
    let forged = tampered(&d.token("team-a", "write", None));
    let other_secret = foreign.token("team-a", "write", None);
    let other_workspace = d.token("team-b", "write", None);
    let read_only = d.token("team-a", "read", None);

    struct Case<'a> {
        name: &'a str,
        flags: Vec<&'a str>,
        env: Vec<(&'a str, &'a str)>,
        reason: &'a str,
        /// Whether stat/get/ls are allowed with this credential.
        reads: bool,
    }
    let env_token = |name, token, reason, reads| Case {
        name,
        flags: vec![],
        env: vec![("NOKV_TOKEN", token)],
        reason,
        reads,
    };
    let cases = [
        Case {
            name: "no token at all",
            flags: vec![],
            env: vec![("NOKV_CONFIG", no_token)],
            reason: "Unauthenticated",
            reads: false,
        },
        env_token("garbage token", "garbage", "Unauthenticated", false),
        Case {
            name: "garbage token in --token (the flag wins over the config file)",
            flags: vec!["--token", "nokv1.00.00"],
            env: vec![],
            reason: "Unauthenticated",
            reads: false,
        },
        env_token("expired token", &expired, "Unauthenticated", false),
        env_token(
            "token with a tampered signature",
            &forged,
            "Unauthenticated",
            false,
        ),
        env_token(
            "token signed by another cluster's secret",
            &other_secret,
            "Unauthenticated",
            false,
        ),
        env_token(
            "token for another workspace",
            &other_workspace,
            "PermissionDenied",
            false,
        ),
        env_token("read-only token", &read_only, "PermissionDenied", true),
    ];

    let changed = tmp.path().join("changed");
    std::fs::write(&changed, b"changed").unwrap();
    let changed = changed.to_str().unwrap();

    for case in &cases {
        let run = |args: &[&str]| {
            let mut all: Vec<&str> = case.flags.clone();
            all.extend_from_slice(args);
            d.cli_with_env(&all, &case.env)
        };
        let name = case.name;
        for (what, out) in [
            ("overwrite", run(&["put", "team-a:keep.txt", changed])),
            ("create", run(&["put", "team-a:new.txt", changed])),
            ("rm", run(&["rm", "team-a:keep.txt"])),
        ] {
            assert_reason(&out, case.reason, &format!("{name}: {what}"));
        }
        for (what, out) in [
            ("stat", run(&["--json", "stat", "team-a:keep.txt"])),
            ("get", run(&["get", "team-a:keep.txt"])),
            ("ls", run(&["--json", "ls", "team-a:"])),
        ] {
            if case.reads {
                out.assert_ok();
            } else {
                assert_reason(&out, case.reason, &format!("{name}: {what}"));
            }
        }

        // The admin sees nothing changed.
        assert_eq!(admin_stat(&d, "team-a:keep.txt"), original, "{name}");
        assert_eq!(admin_get(&d, "team-a:keep.txt"), b"original", "{name}");
        assert_eq!(admin_ls(&d, "team-a"), ["keep.txt"], "{name}");
        assert!(admin_ls(&d, "team-b").is_empty(), "{name}");
    }
}

#[test]
fn a_read_token_can_stat_get_and_list_but_not_write_or_delete() {
    let d = Daemon::start(&[]);
    let e = admin_put(&d, "team-a:doc", b"readable");
    let tok = d.token("team-a", "read", None);
    let env = [("NOKV_TOKEN", tok.as_str())];

    let got = d
        .cli_with_env(&["--json", "stat", "team-a:doc"], &env)
        .assert_ok()
        .json();
    assert_eq!(got, e);
    let body = d.cli_with_env(&["get", "team-a:doc"], &env);
    assert_eq!(body.assert_ok().stdout, b"readable");
    let doc = d
        .cli_with_env(&["--json", "ls", "team-a:"], &env)
        .assert_ok()
        .json();
    assert_eq!(doc["entries"][0]["path"], "doc");

    d.cli_with_env(&["rm", "team-a:doc"], &env)
        .assert_fails_with("PermissionDenied");
    d.cli_with_env(&["admin", "health"], &env)
        .assert_fails_with("PermissionDenied");
    assert_eq!(admin_stat(&d, "team-a:doc"), e);
}

#[test]
fn a_write_token_for_one_workspace_can_use_it_but_cannot_read_or_write_another() {
    let d = Daemon::start(&[]);
    admin_put(&d, "team-b:secret", b"b's data");
    let tok = d.token("team-a", "write", None);
    let env = [("NOKV_TOKEN", tok.as_str())];

    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("f");
    std::fs::write(&src, b"a's data").unwrap();
    let src = src.to_str().unwrap();
    d.cli_with_env(&["put", "team-a:mine", src], &env)
        .assert_ok();
    let out = d.cli_with_env(&["get", "team-a:mine"], &env);
    assert_eq!(out.assert_ok().stdout, b"a's data");

    for args in [
        &["get", "team-b:secret"][..],
        &["stat", "team-b:secret"],
        &["ls", "team-b:"],
        &["rm", "team-b:secret"],
        &["put", "team-b:secret", src],
        &["put", "team-b:new", src],
        // A workspace that merely starts with the token's name is another workspace.
        &["put", "team-ab:x", src],
    ] {
        assert_reason(
            &d.cli_with_env(args, &env),
            "PermissionDenied",
            &format!("{args:?}"),
        );
    }
    assert_eq!(admin_get(&d, "team-b:secret"), b"b's data");
    assert_eq!(admin_ls(&d, "team-b"), ["secret"]);
    assert!(admin_ls(&d, "team-ab").is_empty());
    // A write token is not an admin token, and the refusal says what the token covers.
    let out = d.cli_with_env(&["admin", "health"], &env);
    out.assert_fails_with("PermissionDenied");
    assert!(
        out.stderr
            .contains(r#"need an admin token: this one covers workspace "team-a" with role write"#),
        "{}",
        out.stderr
    );
}

#[test]
fn a_workspace_pattern_token_covers_matching_workspaces_only() {
    let d = Daemon::start(&[]);
    let tok = d.token("team-*", "write", None);
    let env = [("NOKV_TOKEN", tok.as_str())];
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let src = src.to_str().unwrap();
    d.cli_with_env(&["put", "team-x:f", src], &env).assert_ok();
    d.cli_with_env(&["put", "team-yz:f", src], &env).assert_ok();
    d.cli_with_env(&["put", "other:f", src], &env)
        .assert_fails_with("PermissionDenied");
    assert!(admin_ls(&d, "other").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Transport
// ---------------------------------------------------------------------------------------------

fn sdk_config(d: &Daemon, ca: PathBuf, token: Option<String>) -> ResolvedConfig {
    ResolvedConfig {
        endpoint: d.endpoint(),
        ca,
        token,
    }
}

/// One attempt only: these tests want the first answer, not the SDK's patience.
fn no_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 1,
        first_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    }
}

/// A TLS channel to the daemon trusting only its CA, with no bearer token.
async fn tls_channel(d: &Daemon) -> Channel {
    let ca = std::fs::read(d.ca_path()).expect("read daemon CA");
    Endpoint::from_shared(d.endpoint())
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
        .unwrap()
        .timeout(RPC_DEADLINE)
        .connect()
        .await
        .expect("TLS connect to the daemon")
}

#[tokio::test]
async fn a_plaintext_grpc_client_is_refused() {
    install_crypto_provider();
    let d = Daemon::start(&[]);
    let bearer: tonic::metadata::MetadataValue<_> =
        format!("Bearer {}", d.admin_token()).parse().unwrap();

    let plaintext = Endpoint::from_shared(format!("http://{}", d.addr()))
        .unwrap()
        .connect_timeout(RPC_DEADLINE)
        .timeout(RPC_DEADLINE);
    let health = async {
        let channel = plaintext.connect().await.map_err(|e| e.to_string())?;
        let mut admin = pb::admin_client::AdminClient::new(channel.clone());
        let mut req = tonic::Request::new(pb::HealthRequest {});
        req.metadata_mut().insert("authorization", bearer.clone());
        admin.health(req).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let result = tokio::time::timeout(RPC_DEADLINE * 2, health)
        .await
        .expect("a plaintext call must fail, not hang");
    assert!(result.is_err(), "plaintext Admin/Health succeeded");

    // A plaintext write with a valid admin token is refused too, and writes nothing.
    let write = async {
        let channel = plaintext.connect().await.map_err(|e| e.to_string())?;
        let mut ws = pb::workspace_client::WorkspaceClient::new(channel);
        let mut req = tonic::Request::new(pb::WriteRequest {
            workspace: "w1".into(),
            path: "plaintext".into(),
            data: b"x".to_vec().into(),
            request_id: "plaintext-1".into(),
            ..Default::default()
        });
        req.metadata_mut().insert("authorization", bearer.clone());
        ws.write(req).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let result = tokio::time::timeout(RPC_DEADLINE * 2, write)
        .await
        .expect("a plaintext call must fail, not hang");
    assert!(result.is_err(), "plaintext Workspace/Write succeeded");
    assert!(admin_ls(&d, "w1").is_empty());

    // The SDK pointed at an http:// endpoint is refused the same way.
    let cfg = ResolvedConfig {
        endpoint: format!("http://{}", d.addr()),
        ca: d.ca_path(),
        token: Some(d.admin_token()),
    };
    let err = match Client::connect(&cfg).await {
        Ok(_) => panic!("the SDK accepted an http:// endpoint"),
        Err(e) => e,
    };
    assert!(err.message.contains("`https://` required"), "{err:?}");
}

#[tokio::test]
async fn the_sdk_over_tls_with_the_daemon_ca_gets_health_and_round_trips_a_file() {
    install_crypto_provider();
    let d = Daemon::start(&[]);
    let client = Client::connect(&sdk_config(&d, d.ca_path(), Some(d.admin_token())))
        .await
        .unwrap();
    let h = client.health().await.expect("health over TLS");
    assert_eq!(h.status, "SERVING");
    assert_eq!(h.shard_count, 16, "the embedded default has 16 shards");
    assert_eq!(h.shards.len(), 16);
    assert!(h.shards.iter().all(|s| s.owned));

    let e = client
        .write(pb::WriteRequest {
            workspace: "w1".into(),
            path: "sdk.txt".into(),
            data: b"via the sdk".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("write over TLS");
    assert_eq!(e.generation, 1);
    let r = client.read("w1", "sdk.txt").await.expect("read over TLS");
    assert_eq!(&r.data[..], b"via the sdk");
    assert_eq!(admin_get(&d, "w1:sdk.txt"), b"via the sdk");
}

#[tokio::test]
async fn a_tls_client_that_does_not_trust_the_daemon_ca_is_refused() {
    install_crypto_provider();
    let d = Daemon::start(&[]);
    let other = Daemon::start(&[]);
    let client = Client::connect(&sdk_config(&d, other.ca_path(), Some(d.admin_token())))
        .await
        .unwrap()
        .with_retry(no_retries());
    let result = tokio::time::timeout(RPC_DEADLINE, client.health())
        .await
        .expect("an untrusted server must fail the call, not hang it");
    let err = result.expect_err("health succeeded against a server signed by another CA");
    assert!(err.is("CertificateNotTrusted"), "{err:?}");
    assert!(err.message.contains("certificate not trusted"), "{err:?}");
    assert!(
        !err.is_retryable(),
        "an untrusted certificate is not retried: {err:?}"
    );
}

#[tokio::test]
async fn standard_grpc_health_reports_serving_over_tls_without_a_token() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    install_crypto_provider();
    let d = Daemon::start(&[]);
    let mut health = HealthClient::new(tls_channel(&d).await);
    for service in ["", "nokv.v1.Workspace", "nokv.v1.Admin"] {
        let resp = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|s| panic!("health check {service:?}: {s:?}"))
            .into_inner();
        assert_eq!(
            resp.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("an unknown service is not SERVING");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn server_reflection_lists_and_describes_the_services_over_tls_without_a_token() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

    install_crypto_provider();
    let d = Daemon::start(&[]);
    let mut reflection = ServerReflectionClient::new(tls_channel(&d).await);
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "nokv.v1.Workspace".into(),
            )),
        ]))
        .await
        .expect("reflection stream")
        .into_inner();
    let mut next = async || -> ServerReflectionResponse {
        stream
            .message()
            .await
            .expect("reflection answer")
            .expect("one answer per request")
    };

    let services: Vec<String> = match next().await.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("expected a service list, got {other:?}"),
    };
    for wanted in [
        "nokv.v1.Workspace",
        "nokv.v1.Admin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.iter().any(|s| s == wanted),
            "{wanted} missing from {services:?}"
        );
    }

    match next().await.message_response {
        Some(MessageResponse::FileDescriptorResponse(f)) => {
            let all: Vec<u8> = f.file_descriptor_proto.concat();
            let has = |needle: &[u8]| all.windows(needle.len()).any(|w| w == needle);
            assert!(has(b"nokv.v1"), "descriptor does not name the package");
            for method in [&b"Write"[..], b"BeginUpload", b"ReadBlock"] {
                assert!(
                    has(method),
                    "descriptor lacks {}",
                    String::from_utf8_lossy(method)
                );
            }
        }
        other => panic!("expected a file descriptor, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets and names
// ---------------------------------------------------------------------------------------------

#[test]
fn tokens_and_secrets_never_appear_in_the_daemon_output_even_at_trace_level() {
    let d = Daemon::start(&["--log", "trace"]);
    let admin = d.admin_token();
    let write = d.token("w1", "write", None);
    let read = d.token("w1", "read", None);
    let expired = d.expired_token("w1", "write");
    let forged = tampered(&write);

    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("f");
    std::fs::write(&src, b"x").unwrap();
    let src = src.to_str().unwrap();
    d.cli(&["put", "w1:a", src]).assert_ok();
    d.cli(&["admin", "health"]).assert_ok();
    d.cli_with_env(&["put", "w1:b", src], &[("NOKV_TOKEN", &write)])
        .assert_ok();
    d.cli_with_env(&["get", "w1:b"], &[("NOKV_TOKEN", &read)])
        .assert_ok();
    d.cli_with_env(&["put", "w1:c", src], &[("NOKV_TOKEN", &read)])
        .assert_fails_with("PermissionDenied");
    d.cli_with_env(&["stat", "w1:a"], &[("NOKV_TOKEN", &expired)])
        .assert_fails_with("Unauthenticated");
    d.cli_with_env(&["stat", "w1:a"], &[("NOKV_TOKEN", &forged)])
        .assert_fails_with("Unauthenticated");

    let mut secrets: Vec<(String, String)> = vec![
        ("admin token".into(), admin),
        ("write token".into(), write),
        ("read token".into(), read),
        ("expired token".into(), expired),
        ("forged token".into(), forged),
    ];
    // Each dot-separated part of a token on its own (e.g. just the signature) is a leak too.
    let parts: Vec<(String, String)> = secrets
        .iter()
        .flat_map(|(name, tok)| {
            tok.split('.')
                .filter(|p| p.len() >= 16)
                .map(|p| (format!("part of the {name}"), p.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    secrets.extend(parts);
    for file in ["cluster.secret", "tls/ca.key", "tls/server.key"] {
        let text = std::fs::read_to_string(d.data_dir().join(file)).unwrap_or_default();
        // PEM bodies line by line; the hex secret as one line.
        for line in text
            .lines()
            .filter(|l| l.len() >= 16 && !l.starts_with("-----"))
        {
            secrets.push((file.to_string(), line.trim().to_string()));
        }
    }
    assert!(secrets.len() > 10, "found the secrets to look for");

    let (status, stdout, stderr) = d.terminate_collecting_output();
    assert!(status.success());
    assert!(
        stderr.lines().count() > 20,
        "trace logging produced output to search"
    );
    for (name, secret) in &secrets {
        assert!(!stderr.contains(secret.as_str()), "{name} in daemon stderr");
        assert!(!stdout.contains(secret.as_str()), "{name} in daemon stdout");
    }
}

#[tokio::test]
async fn nul_bytes_and_bad_request_ids_sent_through_the_sdk_are_refused_as_invalid_argument() {
    install_crypto_provider();
    let d = Daemon::start(&[]);
    let client = Client::connect(&sdk_config(&d, d.ca_path(), Some(d.admin_token())))
        .await
        .unwrap()
        .with_retry(no_retries());
    let write = |ws: &str, path: &str, request_id: &str| pb::WriteRequest {
        workspace: ws.into(),
        path: path.into(),
        data: b"x".to_vec().into(),
        request_id: request_id.into(),
        ..Default::default()
    };

    for (what, req) in [
        ("NUL in path", write("w1", "a\0b", "")),
        ("NUL at end of path", write("w1", "a\0", "")),
        ("NUL in workspace", write("w1\0", "a", "")),
        ("request id with a space", write("w1", "a", "a b")),
        ("non-ASCII request id", write("w1", "a", "é")),
        ("over-long request id", write("w1", "a", &"r".repeat(129))),
    ] {
        let err = client
            .write(req)
            .await
            .expect_err(&format!("{what}: write succeeded"));
        assert!(err.is("InvalidArgument"), "{what}: {err:?}");
    }
    let err = client.stat("w1", "a\0b").await.expect_err("stat NUL");
    assert!(err.is("InvalidArgument"), "{err:?}");
    let err = client.read("w1", "a\0b").await.expect_err("read NUL");
    assert!(err.is("InvalidArgument"), "{err:?}");
    let err = client.list("w1", "a\0", 0, "").await.expect_err("list NUL");
    assert!(err.is("InvalidArgument"), "{err:?}");
    let err = client
        .delete(pb::DeleteRequest {
            workspace: "w1".into(),
            path: "a\0b".into(),
            ..Default::default()
        })
        .await
        .expect_err("delete NUL");
    assert!(err.is("InvalidArgument"), "{err:?}");

    let listing = client.list("w1", "", 0, "").await.unwrap();
    assert!(listing.entries.is_empty(), "{:?}", listing.entries);
    let h = client.health().await.unwrap();
    assert_eq!(h.shards.iter().map(|s| s.entries).sum::<u64>(), 0);
    // The longest valid request id is accepted.
    client
        .write(write("w1", "a", &"r".repeat(128)))
        .await
        .expect("128-character request id");
}

// ---------------------------------------------------------------------------------------------
// Token handling and connection errors (issue 7, items 11 and 16)
// ---------------------------------------------------------------------------------------------

/// `nokv-server token issue --data-dir DATA_DIR ARGS`.
fn token_issue(d: &Daemon, args: &[&str]) -> CliOutput {
    let out = std::process::Command::new(nokv_tests::bin("nokv-server"))
        .args(["token", "issue", "--data-dir"])
        .arg(d.data_dir())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run nokv-server token issue");
    CliOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn token_issue_refuses_dead_overflowing_and_empty_scoped_tokens_with_exit_2() {
    let d = Daemon::start(&[]);
    for args in [
        &["--workspace", "w1", "--ttl", "0"][..],
        &["--workspace", "w1", "--ttl", "0s"],
        &["--workspace", "w1", "--ttl", "1ms"],
        &["--workspace", "w1", "--ttl", "59s"],
        // 213503982334602 days * 86400 s overflows u64 seconds: it must not wrap to hours.
        &["--workspace", "w1", "--ttl", "213503982334602d"],
        &["--workspace", "w1", "--ttl", "18446744073709551615s"],
        &["--workspace", ""],
        &["--workspace", "w1", "--workspace", ""],
    ] {
        let out = token_issue(&d, args);
        assert_eq!(out.status, 2, "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?} printed a token");
        assert!(!out.stderr.trim().is_empty(), "{args:?} says why");
    }
    // The minimum is usable: the token is accepted (the file is just missing).
    let out = token_issue(&d, &["--workspace", "w1", "--ttl", "1m"]);
    assert_eq!(out.status, 0, "{}", out.stderr);
    let token = out.stdout_str().trim().to_string();
    d.cli_with_env(&["stat", "w1:none"], &[("NOKV_TOKEN", &token)])
        .assert_fails_with("NotFound");
}

#[test]
fn a_token_with_a_trailing_newline_is_trimmed_and_an_empty_nokv_token_means_no_token() {
    let d = Daemon::start(&[]);
    let tmp = tempfile::tempdir().unwrap();
    let token = d.token("w1", "write", None);

    // As `NOKV_TOKEN=$(cat file)` would not, but `read` or a file's contents would: a newline.
    let with_newline = format!("{token}\n");
    d.cli_with_env(&["put", "w1:env", "-"], &[("NOKV_TOKEN", &with_newline)])
        .assert_ok();
    let config = tokenless_config(&d, tmp.path());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("token = {with_newline:?}\n"));
    std::fs::write(&config, text).unwrap();
    d.cli_with_env(
        &["stat", "w1:env"],
        &[("NOKV_CONFIG", config.to_str().unwrap())],
    )
    .assert_ok();

    // An empty variable is "no token", not "use the admin token of client.toml".
    let out = d.cli_with_env(&["put", "w1:empty", "-"], &[("NOKV_TOKEN", "")]);
    out.assert_fails_with("Unauthenticated");
    assert!(
        out.stderr.contains("NOKV_TOKEN is set but empty"),
        "{}",
        out.stderr
    );
    admin_stat_missing(&d, "w1:empty");
}

#[track_caller]
fn admin_stat_missing(d: &Daemon, target: &str) {
    d.cli(&["stat", target]).assert_fails_with("NotFound");
}

#[test]
fn endpoints_without_https_and_an_untrusted_ca_fail_at_once_with_one_line_naming_the_cause() {
    let d = Daemon::start(&[]);
    let other = Daemon::start(&[]);
    let addr = d.addr().to_string();
    for endpoint in [
        format!("http://{addr}"),
        format!("ftp://{addr}"),
        addr.clone(),
    ] {
        let out = d.cli(&["--endpoint", &endpoint, "stat", "w1:x"]);
        assert_eq!(out.status, 2, "{endpoint}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{endpoint}: {}", out.stderr);
        assert!(
            out.stderr.contains("`https://` required"),
            "{endpoint}: {}",
            out.stderr
        );
    }
    let ca = other.ca_path();
    let out = d.cli(&["--ca", ca.to_str().unwrap(), "stat", "w1:x"]);
    out.assert_fails_with("CertificateNotTrusted");
    assert!(
        out.stderr.contains("certificate not trusted"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_admin_token_scoped_to_some_workspaces_cannot_see_node_wide_health() {
    let d = Daemon::start(&[]);
    let scoped = d.token("team-*", "admin", None);
    d.cli_with_env(&["admin", "health"], &[("NOKV_TOKEN", scoped.as_str())])
        .assert_fails_with("PermissionDenied");
    // The node-wide admin (scope `*`) still sees it, every shard serving.
    let h = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    assert_eq!(h["status"], "SERVING");
    let shards = h["shards"].as_array().unwrap();
    assert!(shards.iter().all(|s| s["serving"] == true), "{h}");
}

/// The `nokv-reason` of a raw gRPC status.
fn status_reason(s: &tonic::Status) -> String {
    s.metadata()
        .get("nokv-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn replaying_an_upload_request_id_with_another_workspaces_token_is_refused_before_replay() {
    use sha2::{Digest, Sha256};
    install_crypto_provider();
    let d = Daemon::start(&[]);
    let owner = Client::connect(&sdk_config(
        &d,
        d.ca_path(),
        Some(d.token("w1", "write", None)),
    ))
    .await
    .unwrap()
    .with_retry(no_retries());
    let intruder = Client::connect(&sdk_config(
        &d,
        d.ca_path(),
        Some(d.token("w2", "write", None)),
    ))
    .await
    .unwrap()
    .with_retry(no_retries());
    let (mut own, mut other) = (owner.workspace_client(), intruder.workspace_client());
    let body = b"secret artifact".to_vec();
    let sha = Sha256::digest(&body).to_vec();

    // The owner publishes one artifact and aborts another upload, all with request ids.
    let begin = |path: &str, rid: &str| pb::BeginUploadRequest {
        workspace: "w1".into(),
        path: path.into(),
        size: body.len() as u64,
        request_id: rid.into(),
        ..Default::default()
    };
    let up = own
        .begin_upload(begin("art", "b1"))
        .await
        .unwrap()
        .into_inner();
    let put = pb::PutBlockRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        index: 0,
        block_sha256: sha.clone(),
        block_crc32c: None,
        data: body.clone().into(),
        request_id: "p1".into(),
    };
    own.put_block(put.clone()).await.unwrap();
    let commit = pb::CommitUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        sha256: sha.clone(),
        request_id: "c1".into(),
    };
    own.commit_upload(commit.clone()).await.unwrap();
    let up2 = own
        .begin_upload(begin("gone", "b2"))
        .await
        .unwrap()
        .into_inner();
    let abort = pb::AbortUploadRequest {
        upload_id: up2.upload_id.clone(),
        upload_token: up2.upload_token.clone(),
        request_id: "a1".into(),
    };
    own.abort_upload(abort.clone()).await.unwrap();

    // The same requests (same ids, same upload capabilities) under a token for w2.
    let refused = [
        (
            "PutBlock",
            other.put_block(put).await.map(|_| ()).unwrap_err(),
        ),
        (
            "CommitUpload",
            other.commit_upload(commit).await.map(|_| ()).unwrap_err(),
        ),
        (
            "AbortUpload",
            other.abort_upload(abort).await.map(|_| ()).unwrap_err(),
        ),
    ];
    for (what, status) in refused {
        assert_eq!(
            status_reason(&status),
            "PermissionDenied",
            "{what} replay under another workspace's token: {status:?}"
        );
    }
}
