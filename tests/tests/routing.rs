//! Routing (issue 10, item 5) against a real daemon: `Route` answers for a workspace, and the
//! SDK/CLI given several endpoints gets past one that does not answer.

use nokv_client::config::ResolvedConfig;
use nokv_tests::{Daemon, cli_with_config, free_port};

/// An endpoint nothing listens on (a port just freed).
fn closed_endpoint() -> String {
    format!("https://127.0.0.1:{}", free_port())
}

/// Mutation caught: `Router::unreachable` made a no-op (no move to the next endpoint) → every
/// attempt goes to the closed port and the CLI fails with Transport (verified red).
#[test]
fn the_cli_with_a_closed_endpoint_first_falls_over_to_the_next_one() {
    let d = Daemon::start(&[]);
    let endpoints = format!("{},{}", closed_endpoint(), d.endpoint());

    d.cli_stdin(&["--endpoint", &endpoints, "put", "w1:a.txt"], b"hello")
        .assert_ok();
    let out = d.cli_with_env(&["get", "w1:a.txt"], &[("NOKV_ENDPOINT", &endpoints)]);
    assert_eq!(out.assert_ok().stdout, b"hello");
}

/// Mutation caught: the TOML `endpoints` list ignored in `ClientConfig::resolve` → the CLI
/// falls back to the default endpoint, where nothing listens (verified red).
#[test]
fn a_client_toml_with_an_endpoints_list_reaches_the_daemon_past_a_closed_endpoint() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("client.toml");
    std::fs::write(
        &config,
        format!(
            "endpoints = [{:?}, {:?}]\nca = {:?}\ntoken = {:?}\n",
            closed_endpoint(),
            d.endpoint(),
            d.ca_path(),
            d.admin_token()
        ),
    )
    .unwrap();

    cli_with_config(&config, &["put", "w2:b.txt"], &[], Some(b"there")).assert_ok();
    let out = cli_with_config(&config, &["get", "w2:b.txt"], &[], None);
    assert_eq!(out.assert_ok().stdout, b"there");
}

/// Red before the fix: the `Route` RPC did not exist (Unimplemented).
#[tokio::test(flavor = "multi_thread")]
async fn an_embedded_node_answers_every_route_with_itself_at_epoch_zero() {
    let d = Daemon::start(&[]);
    let client = d.sdk().await;
    let mut shards = std::collections::HashSet::new();
    for i in 0..40 {
        let r = client.route(&format!("ws{i}")).await.expect("route");
        assert_eq!(r.endpoint, d.endpoint());
        assert_eq!(r.epoch, 0);
        assert!(r.shard < 16, "{r:?}");
        shards.insert(r.shard);
    }
    assert!(
        shards.len() > 1,
        "workspaces spread over shards: {shards:?}"
    );
    let again = client.route("ws0").await.unwrap();
    assert_eq!(again, client.route("ws0").await.unwrap(), "stable");

    // Authorised like a read: a token of another workspace learns nothing.
    let cfg = ResolvedConfig {
        endpoint: d.endpoint(),
        ca: d.ca_path(),
        token: Some(d.token("other", "read", None)),
    };
    let other = nokv_client::Client::connect(&cfg).await.unwrap();
    assert!(other.route("other").await.is_ok());
    let err = other.route("ws0").await.unwrap_err();
    assert!(err.is("PermissionDenied"), "{err:?}");
}

/// Mutation caught: the final-error arm of `retrying_for` that names the endpoints removed
/// → the error names only the last one tried (verified red).
#[test]
fn a_cli_with_no_reachable_endpoint_names_every_endpoint_it_tried() {
    let d = Daemon::start(&[]);
    let (a, b) = (closed_endpoint(), closed_endpoint());
    let out = d.cli(&["--endpoint", &format!("{a},{b}"), "stat", "w1:a.txt"]);
    out.assert_fails_with("Transport");
    assert!(
        out.stderr.contains(&a) && out.stderr.contains(&b),
        "{}",
        out.stderr
    );
}
