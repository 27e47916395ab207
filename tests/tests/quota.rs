//! Quotas and admission caps as an operator and an agent meet them on a real `nokv-server`:
//! `nokv admin quota set|get` (and `--json`), a small write and an artifact publish refused
//! past the quota with no object written, the per-workspace admission cap refusing the upload
//! past it, and `nokv admin health` showing reserved bytes and reservations equal to the
//! unresolved uploads.

use std::path::Path;

use nokv_proto::v1 as pb;
use nokv_tests::{Daemon, files_under, pseudo_random_bytes};
use serde_json::json;

/// Block objects the daemon's local provider holds (its `DATA_DIR/objects`).
fn objects(dir: &Path) -> usize {
    files_under(&dir.join("objects")).len()
}

fn reason(s: &tonic::Status) -> String {
    s.metadata()
        .get("nokv-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_sets_a_workspace_quota_that_refuses_writes_and_uploads_past_it_and_a_cap_refuses_the_fourth_upload()
 {
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(
        data.path(),
        &["--max-unresolved-uploads-per-workspace", "3"],
    );

    // No quota yet: null, nothing counted.
    let got = d
        .cli(&["--json", "admin", "quota", "get", "ws"])
        .assert_ok()
        .json();
    assert_eq!(
        got,
        json!({"workspace": "ws", "quota": null, "used_bytes": 0, "reserved_bytes": 0,
               "reservations": 0})
    );
    let set = d
        .cli(&["--json", "admin", "quota", "set", "ws", "10"])
        .assert_ok()
        .json();
    assert_eq!(set["quota"], 10, "{set}");
    let text = d
        .cli(&["admin", "quota", "get", "ws"])
        .assert_ok()
        .stdout_str();
    assert!(text.contains("quota 10 B"), "{text}");

    // Bad input is refused and changes nothing.
    let bad = d.cli(&["admin", "quota", "set", "ws", "10MB"]);
    assert_eq!(bad.status, 2, "{}", bad.stderr);
    let writer = d.token("ws", "write", None);
    d.cli_with_env(
        &["admin", "quota", "set", "ws", "none"],
        &[("NOKV_TOKEN", &writer)],
    )
    .assert_fails_with("PermissionDenied");
    let got = d
        .cli(&["--json", "admin", "quota", "get", "ws"])
        .assert_ok()
        .json();
    assert_eq!(got["quota"], 10, "{got}");

    // Small files count against it; the write past it is refused.
    d.cli_stdin(&["put", "ws:a", "-"], b"123456").assert_ok();
    d.cli_stdin(&["put", "ws:b", "-"], b"123456")
        .assert_fails_with("QuotaExceeded");
    d.cli(&["stat", "ws:b"]).assert_fails_with("NotFound");
    let got = d
        .cli(&["--json", "admin", "quota", "get", "ws"])
        .assert_ok()
        .json();
    assert_eq!(
        (got["used_bytes"].clone(), got["reserved_bytes"].clone()),
        (json!(6), json!(0))
    );

    // An artifact past the quota is refused at BeginUpload: no provider write at all.
    let big = files.path().join("big.bin");
    std::fs::write(&big, pseudo_random_bytes(3, 5 * 1024 * 1024)).unwrap();
    let big = big.to_str().unwrap();
    let refused = d.cli(&["publish", "-q", big, "ws:big.bin"]);
    refused.assert_fails_with("QuotaExceeded");
    // The gRPC code the reason refines is named too, for scripts that match on it.
    assert!(
        refused.stderr.contains("(gRPC ResourceExhausted)"),
        "{}",
        refused.stderr
    );
    let refused = d.cli(&["--json", "publish", "-q", big, "ws:big.bin"]);
    assert_eq!(refused.status, 1, "{}", refused.stderr);
    assert_eq!(
        refused.json()["error"],
        json!({"reason": "QuotaExceeded", "code": "ResourceExhausted",
               "message": refused.json()["error"]["message"]}),
    );
    assert_eq!(objects(data.path()), 0, "nothing reached the provider");

    // Without a quota the per-workspace admission cap (3 here) still bounds open uploads.
    d.cli(&["admin", "quota", "set", "ws", "none"]).assert_ok();
    let client = d.sdk().await;
    let mut ws = client.workspace_client();
    let begin = |i: u32| pb::BeginUploadRequest {
        workspace: "ws".into(),
        path: format!("up{i}"),
        size: 1000,
        request_id: format!("begin-{i}"),
        ..Default::default()
    };
    for i in 0..3 {
        ws.begin_upload(begin(i)).await.unwrap();
    }
    let refused = ws.begin_upload(begin(3)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&refused), "AdmissionCapReached");

    let got = d
        .cli(&["--json", "admin", "quota", "get", "ws"])
        .assert_ok()
        .json();
    assert_eq!(
        got,
        json!({"workspace": "ws", "quota": null, "used_bytes": 6, "reserved_bytes": 3000,
               "reservations": 3})
    );
    let health = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    assert_eq!(health["reserved_bytes"], 3000, "{health}");
    assert_eq!(health["reservations"], 3, "{health}");
    assert_eq!(health["unresolved_uploads"], 3, "{health}");
    assert_eq!(health["reservations_match"], true, "{health}");
    let shards = health["shards"].as_array().unwrap();
    assert!(
        shards.iter().all(|s| s["reservations_match"] == true),
        "{health}"
    );
    let text = d.cli(&["admin", "health"]).assert_ok().stdout_str();
    assert!(
        text.contains("reserved 2.9 KiB by 3 reservations"),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("MISMATCH")), "{text}");
}
