//! Audit events (`nokv admin events`) and Prometheus metrics (`--metrics-listen`), against a
//! real daemon: every admitted admin action leaves exactly one secret-free event, and
//! `/metrics` is scraped over HTTP and parses as the Prometheus text format.

use std::collections::{BTreeMap, BTreeSet};

use nokv_tests::{Daemon, files_under, http, pseudo_random_bytes};
use serde_json::Value;
use sha2::Digest;

/// The id events give a token: the first 16 hex digits of its SHA-256 (see the server's
/// `events` module; recomputed here from the definition, not imported).
fn token_id(token: &str) -> String {
    hex::encode(&sha2::Sha256::digest(token.as_bytes())[..8])
}

fn events(d: &Daemon, limit: Option<&str>) -> (Vec<Value>, String) {
    let mut args = vec!["--json", "admin", "events"];
    if let Some(l) = limit {
        args.extend(["--limit", l]);
    }
    let out = d.cli(&args);
    out.assert_ok();
    let raw = out.stdout_str();
    let list = out.json()["events"]
        .as_array()
        .expect("events array")
        .clone();
    (list, raw)
}

#[test]
fn every_admitted_admin_action_leaves_one_secret_free_event_and_refused_callers_leave_none() {
    let d = Daemon::start(&[]);
    let files = tempfile::tempdir().unwrap();
    let big = files.path().join("big.bin");
    std::fs::write(&big, pseudo_random_bytes(11, 5 * 1024 * 1024)).unwrap();
    d.cli(&["--json", "publish", big.to_str().unwrap(), "doomed:big.bin"])
        .assert_ok();
    d.cli_stdin(&["put", "doomed:notes.txt", "-"], b"notes")
        .assert_ok();
    // The object keys the provider holds for the workspace: they must never appear in events.
    let objects: Vec<String> = files_under(&d.data_dir().join("objects"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(objects.len(), 2, "the artifact's blocks: {objects:?}");
    let (before, _) = events(&d, None);
    assert!(before.is_empty(), "a fresh node has no events: {before:?}");

    // 1. An offline token issue (the daemon keeps running).
    let token = d.token("doomed", "write", None);
    // Refused callers were not admitted: no event.
    let stranger = d.token("other", "write", None);
    d.cli_with_env(
        &["workspace", "delete", "doomed", "--yes"],
        &[("NOKV_TOKEN", &stranger)],
    )
    .assert_fails_with("PermissionDenied");
    d.cli_with_env(
        &["admin", "shard", "move", "3", "other"],
        &[("NOKV_TOKEN", &stranger)],
    )
    .assert_fails_with("PermissionDenied");
    // 2. A workspace deletion by the issued token.
    d.cli_with_env(
        &["workspace", "delete", "doomed", "--yes"],
        &[("NOKV_TOKEN", &token)],
    )
    .assert_ok();
    // 3. A shard move on the embedded node: refused by the node, still an admitted action.
    d.cli(&["admin", "shard", "move", "3", "other"])
        .assert_fails_with("InvalidArgument");

    let (list, raw) = events(&d, None);
    let summary: Vec<(&str, &str, &str)> = list
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
                e["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("MoveShard", "error", "InvalidArgument"),
            ("DeleteWorkspace", "ok", ""),
            ("TokenIssue", "ok", ""),
            ("TokenIssue", "ok", ""),
        ],
        "newest first, one per admitted action: {raw}"
    );
    let (moved, deleted, stranger_issued, issued) = (&list[0], &list[1], &list[2], &list[3]);
    // Who: the admin token's id and role; the deleting token's id; the offline operator.
    assert_eq!(moved["token_id"], token_id(&d.admin_token()));
    assert_eq!(moved["role"], "admin");
    assert_eq!(moved["target"], "shard 3 to node other");
    assert_eq!(deleted["token_id"], token_id(&token));
    assert_eq!(deleted["role"], "write");
    assert_eq!(deleted["target"], "workspace doomed");
    assert_eq!(
        (issued["role"].as_str(), issued["token_id"].as_str()),
        (Some("local"), Some(""))
    );
    let issued_target = issued["target"].as_str().unwrap();
    assert!(
        issued_target.contains(&token_id(&token)) && issued_target.contains("role=write"),
        "the issue event names the new token by id: {issued_target}"
    );
    assert!(
        stranger_issued["target"]
            .as_str()
            .unwrap()
            .contains(&token_id(&stranger))
    );
    // When: ordered, within the test's lifetime.
    let times: Vec<u64> = list
        .iter()
        .map(|e| e["at_unix_ms"].as_u64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");

    // No token, secret, key or endpoint anywhere: in the answer or in the file itself.
    let file = std::fs::read_to_string(d.data_dir().join("events.jsonl")).unwrap();
    let secret = std::fs::read_to_string(d.data_dir().join("cluster.secret")).unwrap();
    let mut forbidden = vec![
        token.clone(),
        stranger.clone(),
        d.admin_token(),
        secret.trim().to_string(),
        d.addr().to_string(),
    ];
    forbidden.extend(objects);
    for text in [&raw, &file] {
        for f in &forbidden {
            assert!(!text.contains(f.as_str()), "{f:?} leaked into:\n{text}");
        }
        assert!(!text.contains("nokv1."), "a token leaked into:\n{text}");
    }
    // One line per event in the durable log.
    assert_eq!(file.lines().count(), 4, "{file}");

    // Paging: --limit N returns the newest N; out-of-range limits are refused.
    let (newest, _) = events(&d, Some("1"));
    assert_eq!(newest, list[..1]);
    for bad in ["0", "1001"] {
        let out = d.cli(&["admin", "events", "--limit", bad]);
        assert_eq!(out.status, 2, "--limit {bad}: {}", out.stderr);
    }
}

/// One parsed Prometheus sample: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format strictly enough to catch a broken exposition: every
/// line is `# HELP name text`, `# TYPE name kind`, or a sample whose family was typed first.
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut typed = BTreeSet::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            assert!(rest.split_once(' ').is_some(), "HELP without text: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            typed.insert(name.to_string());
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment: {line}");
        let (series, value) = line.rsplit_once(' ').expect("sample: series value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                let labels = body
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
                        let v = v
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or_else(|| panic!("unquoted label in {line}"));
                        (k.to_string(), v.to_string())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "sample before its # TYPE: {line}");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

fn scrape(url: &str) -> Vec<Sample> {
    let (status, body) = http("GET", url, b"");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    parse_prometheus(&String::from_utf8(body).expect("UTF-8 exposition"))
}

/// The `/metrics` URL a daemon started with `--metrics-listen` announced.
fn metrics_url(d: &Daemon) -> String {
    d.stdout()
        .lines()
        .find_map(|l| {
            l.strip_prefix("nokv-server metrics on ")
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no metrics line in:\n{}", d.stdout()))
}

#[test]
fn metrics_are_scraped_over_http_as_prometheus_text_and_count_the_rpcs_a_client_made() {
    let d = Daemon::start(&["--metrics-listen", "127.0.0.1:0"]);
    let url = metrics_url(&d);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let write_ok = [("method", "Workspace/Write"), ("code", "OK")];
    let read_missing = [("method", "Workspace/Read"), ("code", "NotFound")];
    let before = scrape(&url);
    let count = |s: &[Sample], l: &[(&str, &str)]| value(s, "nokv_rpc_requests_total", l);
    assert_eq!(count(&before, &write_ok), None, "no Write yet");

    d.cli_stdin(&["put", "ws:a.txt", "-"], b"hello").assert_ok();
    d.cli(&["get", "ws:missing.txt"])
        .assert_fails_with("NotFound");

    let after = scrape(&url);
    assert_eq!(count(&after, &write_ok), Some(1.0), "the one Write");
    assert_eq!(
        count(&after, &read_missing),
        Some(1.0),
        "the one failed Read"
    );
    assert_eq!(
        value(&after, "nokv_rpc_duration_seconds_count", &write_ok),
        Some(1.0),
        "its latency was observed once"
    );
    // The write ran as a gate session in a batch of at least one.
    assert!(value(&after, "nokv_gate_batch_sessions_count", &[]).unwrap() >= 1.0);
    assert!(value(&after, "nokv_gate_queue_wait_seconds_count", &[]).unwrap() >= 1.0);
    // Health gauges, one per shard, refreshed at scrape time: the new entry is counted.
    let per_shard = |name: &str| -> Vec<f64> {
        after
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .collect()
    };
    assert_eq!(per_shard("nokv_shard_serving"), vec![1.0; 16]);
    assert_eq!(per_shard("nokv_shard_entries").iter().sum::<f64>(), 1.0);
    assert_eq!(per_shard("nokv_shard_unresolved_uploads").len(), 16);
    // Every health counter is a gauge too, and agrees with `admin health`.
    let health = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    for name in [
        "nokv_shard_reserved_bytes",
        "nokv_shard_reservations",
        "nokv_shard_quarantined",
        "nokv_shard_oldest_unresolved_age_seconds",
    ] {
        assert_eq!(per_shard(name), vec![0.0; 16], "{name}");
    }
    assert_eq!(per_shard("nokv_shard_reservations_match"), vec![1.0; 16]);
    let states = health["operations"].as_object().unwrap();
    assert_eq!(states.len(), 7, "{health}");
    for (state, n) in states {
        let per_state: Vec<f64> = after
            .iter()
            .filter(|s| s.name == "nokv_shard_operations" && s.labels.get("state") == Some(state))
            .map(|s| s.value)
            .collect();
        assert_eq!(per_state.len(), 16, "{state}: one per shard");
        assert_eq!(
            per_state.iter().sum::<f64>(),
            n.as_f64().unwrap(),
            "{state}"
        );
    }

    // Only /metrics is served.
    let host = url.strip_suffix("/metrics").unwrap();
    assert_eq!(http("GET", &format!("{host}/other"), b"").0, 404);
}

/// Calls `path` (a method the daemon may not serve) with no token over TLS; its outcome
/// (Unimplemented, Unauthenticated) does not matter, only that the daemon saw the call.
async fn call_made_up_method(channel: tonic::transport::Channel, path: String) {
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("channel ready");
    let path = tonic::codegen::http::uri::PathAndQuery::try_from(path).unwrap();
    let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
    let _ = grpc
        .unary(
            tonic::Request::new(HealthCheckRequest::default()),
            path,
            codec,
        )
        .await;
}

// Catches (issue 43, item 2): the rpc metrics' method label taken from the request path
// verbatim — an unauthenticated caller then adds series at will (300 made-up names once added
// 7,200 lines to /metrics).
#[test]
fn a_thousand_calls_to_made_up_methods_add_no_metric_series() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let d = Daemon::start(&["--metrics-listen", "127.0.0.1:0"]);
    let url = metrics_url(&d);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ca = std::fs::read(d.ca_path()).unwrap();
    let channel = rt.block_on(async {
        tonic::transport::Endpoint::from_shared(d.endpoint())
            .unwrap()
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let made_up = |i: u32| {
        let name = hex::encode(pseudo_random_bytes(u64::from(i), 8));
        match i % 3 {
            0 => format!("/nokv.v1.Workspace/X{name}"),
            1 => format!("/nokv.v1.S{name}/Write"),
            _ => format!("/x{name}.Y/Z"),
        }
    };
    // One call first: the `unknown` label's series exist from then on. And one health check:
    // the daemon's own start-up self-check makes one too, whenever it gets to it, and its
    // series must exist before the count is taken.
    rt.block_on(call_made_up_method(channel.clone(), made_up(0)));
    rt.block_on(async {
        tonic_health::pb::health_client::HealthClient::new(channel.clone())
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check")
    });
    let before = scrape(&url);
    assert!(
        before.iter().any(|s| s.name == "nokv_rpc_requests_total"
            && s.labels.get("method").map(String::as_str) == Some("unknown")),
        "made-up methods are counted, as one label"
    );
    for i in 1..=1000 {
        rt.block_on(call_made_up_method(channel.clone(), made_up(i)));
    }
    let after = scrape(&url);
    // The series a call's method can name (other series may appear meanwhile for reasons of
    // their own, e.g. the start-up inventory's first batches).
    let series = |s: &[Sample]| -> BTreeSet<String> {
        s.iter()
            .filter(|s| s.labels.contains_key("method"))
            .map(|s| format!("{}{:?}", s.name, s.labels))
            .collect()
    };
    assert_eq!(
        series(&after).len(),
        series(&before).len(),
        "new series: {:?}",
        series(&after)
            .difference(&series(&before))
            .take(5)
            .collect::<Vec<_>>()
    );
}

#[test]
fn metrics_are_off_unless_metrics_listen_is_given() {
    let d = Daemon::start(&[]);
    assert!(!d.stdout().contains("metrics on"), "{}", d.stdout());
}

#[test]
fn a_quota_change_an_inventory_start_and_a_cleanup_retry_each_leave_one_event() {
    let d = Daemon::start(&[]);
    d.cli(&["admin", "quota", "set", "team-a", "1000"])
        .assert_ok();
    d.cli(&["admin", "inventory", "start"]).assert_ok();
    // An operation that does not exist: admitted, refused by the node, still an event.
    let retry = d.cli(&["admin", "retry", "3-999"]);
    assert_ne!(retry.status, 0, "retrying a missing operation must fail");

    let (list, raw) = events(&d, None);
    let summary: Vec<(&str, &str, &str)> = list
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
                e["target"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("RetryCleanup", "error", "operation 3-999"),
            ("StartInventory", "ok", "inventory"),
            ("SetQuota", "ok", "workspace team-a quota 1000"),
        ],
        "newest first, one per admitted action: {raw}"
    );
    for e in &list {
        assert_eq!(e["token_id"], token_id(&d.admin_token()));
        assert_eq!(e["role"], "admin");
    }
    assert!(
        !raw.contains(&d.admin_token()) && !raw.contains("nokv1."),
        "{raw}"
    );
}
