//! The authorization matrix of uploads and artifact reads against a real `nokv-server`: every
//! upload call that names only an upload id (PutBlock, RenewUpload, CommitUpload,
//! AbortUpload) is refused `PermissionDenied` under a token for another workspace and under a
//! read-only token for the right one — even when the caller holds the upload's capability —
//! and the refusal changes nothing: no object is written, no lease, publish or abort happens,
//! and no request id is recorded, so the rightful writer then finishes the upload with the
//! very same request ids. Reads of another workspace's artifact (ReadBlock by revision,
//! GetManifest by path) are refused too.
//!
//! The daemon runs with one shard so both workspaces share it: a revision number of one
//! workspace is then a valid record on the shard the other workspace's request reaches,
//! which is exactly where a missing workspace check would leak it.

use std::time::Duration;

use nokv_client::Client;
use nokv_client::config::ResolvedConfig;
use nokv_client::sdk::RetryPolicy;
use nokv_proto::v1 as pb;
use nokv_tests::{Daemon, files_under};
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;

/// An SDK client of `d` under `token`, making one attempt per call (these tests want the
/// first answer, not the SDK's patience).
async fn client_with(d: &Daemon, token: String) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = ResolvedConfig {
        endpoint: d.endpoint(),
        ca: d.ca_path(),
        token: Some(token),
    };
    Client::connect(&cfg)
        .await
        .expect("connect")
        .with_retry(RetryPolicy {
            attempts: 1,
            first_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        })
}

/// The `nokv-reason` of a raw gRPC status.
fn reason(s: &tonic::Status) -> String {
    s.metadata()
        .get("nokv-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[track_caller]
fn assert_refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, want: &str, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected {want}, but it succeeded: {v:?}"),
        Err(s) => assert_eq!(reason(&s), want, "{what}: {s:?}"),
    }
}

/// Block objects the daemon's local provider holds (its `DATA_DIR/objects`).
fn objects(d: &Daemon) -> usize {
    files_under(&d.data_dir().join("objects")).len()
}

/// Every upload call is checked against the upload's workspace with the write role, inside
/// the shard's session. Mutations caught (each verified red):
/// * PutBlock: deleting `claims.require(&upload.workspace, Role::Write)?;` in the admit
///   session of `Shard::put_block` (shard/sequencer.rs);
/// * RenewUpload: deleting the same line in `Shard::extend_lease`;
/// * AbortUpload: deleting the same line in `Shard::abort_upload`'s session;
/// * CommitUpload: its check runs three times (the digest-proof snapshot, the lease renewal
///   of `extend_lease`, the commit session); deleting all three goes red at the CommitUpload
///   row, deleting the snapshot's and the session's stays green (the renewal still refuses);
/// * the read-only rows: `Role::Write` → `Role::Read` in the PutBlock admit line (verified
///   there; the other lines are alike).
#[tokio::test(flavor = "multi_thread")]
async fn upload_calls_under_another_workspaces_or_a_read_only_token_are_refused_and_leave_the_upload_to_its_writer()
 {
    let d = Daemon::start(&["--shards", "1"]);
    let owner = client_with(&d, d.token("w1", "write", None)).await;
    let intruders = [
        ("a write token for w2", d.token("w2", "write", None)),
        ("a read token for w1", d.token("w1", "read", None)),
    ];
    let mut intruder_clients = Vec::new();
    for (who, token) in intruders {
        intruder_clients.push((who, client_with(&d, token).await.workspace_client()));
    }
    let mut own = owner.workspace_client();

    let body = b"an artifact only w1's writer may publish".to_vec();
    let sha = Sha256::digest(&body).to_vec();
    let up = own
        .begin_upload(pb::BeginUploadRequest {
            workspace: "w1".into(),
            path: "art".into(),
            size: body.len() as u64,
            request_id: "b1".into(),
            ..Default::default()
        })
        .await
        .expect("owner begins")
        .into_inner();
    // Every intruder request carries the upload's capability: only the bearer token is wrong.
    let put = pb::PutBlockRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        index: 0,
        block_sha256: sha.clone(),
        block_crc32c: None,
        data: body.clone().into(),
        request_id: "p1".into(),
    };
    let renew = pb::RenewUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
    };
    let commit = pb::CommitUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        sha256: sha.clone(),
        request_id: "c1".into(),
    };
    let abort = pb::AbortUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        request_id: "a1".into(),
    };

    // Before the block is written: PutBlock is refused and writes nothing to the provider.
    for (who, c) in &mut intruder_clients {
        assert_refused(
            c.put_block(put.clone()).await,
            "PermissionDenied",
            &format!("PutBlock under {who}"),
        );
    }
    assert_eq!(objects(&d), 0, "a refused PutBlock wrote no object");
    // The owner's PutBlock with the same request id executes: no refusal was recorded.
    own.put_block(put.clone())
        .await
        .expect("the owner's PutBlock with the refused request id");
    assert_eq!(objects(&d), 1);

    // With every block recorded, commit, abort and renew are refused (commit first: its
    // digest proof renews the lease, so a renewal that skipped the check would let it on).
    for (who, c) in &mut intruder_clients {
        assert_refused(
            c.commit_upload(commit.clone()).await,
            "PermissionDenied",
            &format!("CommitUpload under {who}"),
        );
        assert_refused(
            c.abort_upload(abort.clone()).await,
            "PermissionDenied",
            &format!("AbortUpload under {who}"),
        );
        assert_refused(
            c.renew_upload(renew.clone()).await,
            "PermissionDenied",
            &format!("RenewUpload under {who}"),
        );
        // A PutBlock of the already uploaded block is refused before its shortcut answers.
        assert_refused(
            c.put_block(put.clone()).await,
            "PermissionDenied",
            &format!("PutBlock of an uploaded block under {who}"),
        );
    }
    let missing = owner
        .stat("w1", "art")
        .await
        .expect_err("nothing published");
    assert_eq!(
        missing.reason,
        nokv_client::Reason::Server("NotFound".into()),
        "{missing:?}"
    );
    assert_eq!(objects(&d), 1, "refusals wrote no object");

    // The upload is still open and the owner's: renew, then commit with the refused id.
    own.renew_upload(renew)
        .await
        .expect("the owner renews: the upload was neither aborted nor published");
    let entry = own
        .commit_upload(commit)
        .await
        .expect("the owner commits with the refused request id")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(entry.generation, 1, "{entry:?}");
    assert_eq!(entry.sha256, sha, "{entry:?}");
    // The refused abort id was not recorded either: the owner's abort now answers as an abort
    // of a committed upload, not with a replayed PermissionDenied.
    assert_refused(
        own.abort_upload(abort).await,
        "FailedPrecondition",
        "the owner's abort of its committed upload",
    );
}

/// A revision is readable only through its own workspace. Mutations caught (each verified
/// red): ReadBlock — `Some(rev) if rev.workspace == ws => rev` → `Some(rev) => rev` in
/// `Shard::read_block` (shard/sequencer.rs), and deleting `self.admit(&req, &r.workspace,
/// Role::Read)?;` in `read_block` (service/workspace.rs); GetManifest — deleting the same
/// line in `get_manifest`.
#[tokio::test(flavor = "multi_thread")]
async fn another_workspaces_revision_cannot_be_read_by_block_or_by_manifest() {
    let d = Daemon::start(&["--shards", "1"]);
    let owner = client_with(&d, d.token("w1", "write", None)).await;
    let other = client_with(&d, d.token("w2", "read", None)).await;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("secret.bin");
    let secret = b"w1's secret bytes".to_vec();
    std::fs::write(&src, &secret).unwrap();
    let entry = owner
        .publish_file("w1", "secret.bin", &src, Default::default())
        .await
        .expect("owner publishes");
    let revision = entry.revision;
    let (mut own, mut theirs) = (owner.workspace_client(), other.workspace_client());

    let read = |workspace: &str| pb::ReadBlockRequest {
        workspace: workspace.into(),
        revision,
        index: 0,
    };
    // Control: the owner reads the block by revision.
    let mut stream = own
        .read_block(read("w1"))
        .await
        .expect("owner reads")
        .into_inner();
    let mut got = Vec::new();
    while let Some(chunk) = stream.next().await {
        got.extend_from_slice(&chunk.expect("chunk").data);
    }
    assert_eq!(got, secret);

    // Naming w1 under a w2 token: refused by scope.
    assert_refused(
        theirs.read_block(read("w1")).await.map(|_| ()),
        "PermissionDenied",
        "ReadBlock of w1's revision naming w1",
    );
    // Naming its own workspace with w1's revision number: no such revision in w2.
    assert_refused(
        theirs.read_block(read("w2")).await.map(|_| ()),
        "NotFound",
        "ReadBlock of w1's revision naming w2",
    );
    let manifest = |workspace: &str| pb::GetManifestRequest {
        workspace: workspace.into(),
        path: "secret.bin".into(),
    };
    assert_refused(
        theirs.get_manifest(manifest("w1")).await,
        "PermissionDenied",
        "GetManifest of w1's artifact naming w1",
    );
    assert_refused(
        theirs.get_manifest(manifest("w2")).await,
        "NotFound",
        "GetManifest of w1's path naming w2",
    );
}
