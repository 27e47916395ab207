//! Workspace deletion against a real redb store and a fault-injecting in-memory provider:
//! the fence on every mutation kind, and the races with an upload (admission, a PUT in
//! flight, commit).

use std::sync::Arc;
use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use super::fence;
use crate::error::Error;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::object::fault::{Faults, MemoryFake};
use crate::shard::{Shard, ShardConfig};
use crate::token::{Claims, Role, Signer};

/// Fails a test that would otherwise hang forever (a deadlock detector, not a timing
/// assertion: healthy runs finish in milliseconds).
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("operation blocked")
}

struct Fixture {
    _dir: tempfile::TempDir,
    shard: Arc<Shard>,
    faults: Faults,
    provider: ObjectProvider,
}

/// Blocks of 8 bytes, a lease long enough never to expire during a test.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let faults = Faults::default();
    let provider = MemoryFake::new(faults.clone()).faulty_writes();
    let bulk = Arc::new(crate::bulk::Bulk::new(2, None).unwrap());
    let cfg = ShardConfig {
        block_size: 8,
        upload_lease: Duration::from_secs(600),
        ..ShardConfig::default()
    };
    let shard = Shard::open(5, meta, provider.clone(), bulk, Signer::new(b"k"), cfg);
    Fixture {
        _dir: dir,
        shard,
        faults,
        provider,
    }
}

fn writer() -> Claims {
    Claims {
        workspaces: vec!["*".into()],
        role: Role::Write,
        expires: u64::MAX,
    }
}

fn rid(what: &str) -> String {
    format!("{what}-{}", crate::ids::random_hex(4))
}

async fn write(f: &Fixture, ws: &str, path: &str, data: &[u8]) -> Result<pb::WriteResponse, Error> {
    f.shard
        .write(pb::WriteRequest {
            workspace: ws.into(),
            path: path.into(),
            data: data.to_vec().into(),
            request_id: rid("w"),
            ..Default::default()
        })
        .await
}

async fn begin(
    f: &Fixture,
    ws: &str,
    path: &str,
    size: u64,
) -> Result<pb::BeginUploadResponse, Error> {
    f.shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: ws.into(),
            path: path.into(),
            size,
            request_id: rid("begin"),
            ..Default::default()
        })
        .await
}

fn block(up: &pb::BeginUploadResponse, index: u32, data: &[u8]) -> pb::PutBlockRequest {
    pb::PutBlockRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        index,
        block_sha256: Vec::new(),
        block_crc32c: Some(nokv_proto::block_checksum::crc32c(data)),
        data: data.to_vec().into(),
        request_id: rid("put"),
    }
}

async fn commit(
    f: &Fixture,
    up: &pb::BeginUploadResponse,
    body: &[u8],
) -> Result<pb::CommitUploadResponse, Error> {
    f.shard
        .commit_upload(
            writer(),
            pb::CommitUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                sha256: Sha256::digest(body).to_vec(),
                request_id: rid("commit"),
            },
        )
        .await
}

/// Publishes `body` (one block of 8 bytes) at `ws:path`.
async fn publish(f: &Fixture, ws: &str, path: &str, body: &[u8; 8]) {
    let up = begin(f, ws, path, 8).await.unwrap();
    f.shard
        .put_block(writer(), block(&up, 0, body))
        .await
        .unwrap();
    commit(f, &up, body).await.unwrap();
}

async fn delete_ws(f: &Fixture, ws: &str) -> pb::DeleteWorkspaceResponse {
    within(f.shard.delete_workspace(pb::DeleteWorkspaceRequest {
        workspace: ws.into(),
        request_id: rid("delete-ws"),
    }))
    .await
    .unwrap()
}

async fn provider_keys(f: &Fixture) -> Vec<String> {
    f.provider.list_keys().await.unwrap()
}

fn assert_fenced(r: Result<impl std::fmt::Debug, Error>, what: &str) {
    match r {
        Err(Error::FailedPrecondition(m)) if m.contains("being deleted") => {}
        other => panic!("{what}: expected the deletion fence, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutation_of_a_workspace_being_deleted_is_refused_and_changes_nothing() {
    let f = fixture();
    write(&f, "ws", "notes.txt", b"keep").await.unwrap();
    // A complete upload (commit would succeed) and an open one waiting for its block.
    let complete = begin(&f, "ws", "done.bin", 8).await.unwrap();
    f.shard
        .put_block(writer(), block(&complete, 0, b"complete"))
        .await
        .unwrap();
    let waiting = begin(&f, "ws", "next.bin", 8).await.unwrap();
    let creates = f.faults.creates();

    // The fence as a deletion sets it first; the pages that release the contents come later
    // (a big workspace is released over several sessions).
    f.shard
        .gate
        .write(|w| fence(w, "ws", 1_000, ""))
        .await
        .unwrap();

    assert_fenced(write(&f, "ws", "new.txt", b"x").await, "Write");
    assert_fenced(write(&f, "ws", "notes.txt", b"y").await, "overwrite");
    assert_fenced(
        f.shard
            .delete(pb::DeleteRequest {
                workspace: "ws".into(),
                path: "notes.txt".into(),
                request_id: rid("rm"),
                ..Default::default()
            })
            .await,
        "Delete",
    );
    assert_fenced(begin(&f, "ws", "more.bin", 8).await, "BeginUpload");
    assert_fenced(
        f.shard
            .put_block(writer(), block(&waiting, 0, b"blockbyt"))
            .await,
        "PutBlock admission",
    );
    assert_eq!(
        f.faults.creates(),
        creates,
        "a fenced PutBlock writes nothing"
    );
    assert_fenced(
        f.shard
            .renew_upload(
                writer(),
                pb::RenewUploadRequest {
                    upload_id: waiting.upload_id.clone(),
                    upload_token: waiting.upload_token.clone(),
                },
            )
            .await,
        "RenewUpload",
    );
    assert_fenced(commit(&f, &complete, b"complete").await, "CommitUpload");

    // Nothing changed: the old file is still there, nothing was published.
    assert_eq!(
        f.shard.read("ws", "notes.txt").await.unwrap().data,
        b"keep".as_slice()
    );
    assert!(f.shard.stat("ws", "done.bin").await.is_err());
    // Other workspaces are not fenced.
    write(&f, "other", "a.txt", b"fine").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_workspace_removes_its_entries_releases_every_block_and_frees_the_name() {
    let f = fixture();
    write(&f, "ws", "notes.txt", b"small").await.unwrap();
    publish(&f, "ws", "a.bin", b"version1").await;
    // Replaced: version1's revision is retired but still within its grace.
    publish(&f, "ws", "a.bin", b"version2").await;
    // An open upload with a recorded block.
    let open = begin(&f, "ws", "open.bin", 16).await.unwrap();
    f.shard
        .put_block(writer(), block(&open, 0, b"partial1"))
        .await
        .unwrap();
    // Another workspace's artifact must survive.
    publish(&f, "other", "keep.bin", b"keepthis").await;
    let other_keys = {
        let m = f.shard.get_manifest("other", "keep.bin").await.unwrap();
        assert_eq!(m.blocks.len(), 1);
        provider_keys(&f).await.len()
    };
    assert_eq!(other_keys, 4, "three blocks of ws and one of other");

    let r = delete_ws(&f, "ws").await;
    assert_eq!(r.entries_removed, 2);
    assert_eq!(r.uploads_ended, 1);
    assert_eq!(r.retired_revisions_released, 1);

    assert!(
        f.shard
            .list("ws", "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    assert!(matches!(
        f.shard.read("ws", "notes.txt").await,
        Err(Error::NotFound(_))
    ));
    assert_fenced_not(&f, &open).await;

    // One reconciler pass deletes every released key; other's block stays.
    f.shard.reconcile().await.unwrap();
    let left = provider_keys(&f).await;
    assert_eq!(left.len(), 1, "{left:?}");
    let counts = f.shard.counts().await.unwrap();
    assert_eq!(
        (counts.guards, counts.collectable, counts.uploads),
        (0, 0, 0)
    );

    // The name is a fresh, empty workspace now.
    write(&f, "ws", "notes.txt", b"fresh").await.unwrap();
    publish(&f, "ws", "a.bin", b"version3").await;
    let listed = f.shard.list("ws", "", 0, "").await.unwrap();
    assert_eq!(listed.entries.len(), 2);
    assert_eq!(
        f.shard.read("ws", "notes.txt").await.unwrap().data,
        b"fresh".as_slice()
    );
    assert_eq!(
        f.shard
            .read("other", "keep.bin")
            .await
            .unwrap()
            .entry
            .unwrap()
            .size,
        8
    );
}

/// The old workspace's open upload stays ended after the deletion: its calls are refused.
async fn assert_fenced_not(f: &Fixture, up: &pb::BeginUploadResponse) {
    let err = f
        .shard
        .put_block(writer(), block(up, 1, b"partial2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_put_in_flight_when_its_workspace_is_deleted_lands_late_and_its_guard_deletes_the_bytes()
 {
    let f = fixture();
    let up = begin(&f, "ws", "a.bin", 8).await.unwrap();
    f.faults.hold_creates();
    let shard = f.shard.clone();
    let req = block(&up, 0, b"inflight");
    let put = tokio::spawn(async move { shard.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;

    // Past admission; the deletion ends its upload while the PUT is held at the provider.
    let r = delete_ws(&f, "ws").await;
    assert_eq!(r.uploads_ended, 1);
    f.faults.release(1);
    let landed = within(put).await.unwrap();
    assert!(
        landed.is_err(),
        "a late block is never recorded: {landed:?}"
    );
    assert_eq!(f.faults.creates(), 1, "the bytes did land");
    assert_eq!(provider_keys(&f).await.len(), 1);

    f.shard.reconcile().await.unwrap();
    assert!(
        provider_keys(&f).await.is_empty(),
        "the guard deleted the late bytes"
    );
    // The guard itself is kept (see the record step: its "writer finished" mark is made in a
    // session that ends in the refusal), so it goes on deleting the key with back-off.
    assert!(
        f.shard
            .list("ws", "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_racing_a_workspace_deletion_either_committed_before_it_or_is_refused() {
    // Committed first: the deletion removes the entry and releases its blocks.
    let f = fixture();
    publish(&f, "ws", "first.bin", b"commit1!").await;
    delete_ws(&f, "ws").await;
    assert!(matches!(
        f.shard.stat("ws", "first.bin").await,
        Err(Error::NotFound(_))
    ));
    f.shard.reconcile().await.unwrap();
    assert!(provider_keys(&f).await.is_empty());

    // Fenced first (its pages not run yet): the complete upload's commit is refused.
    let up = begin(&f, "ws", "second.bin", 8).await.unwrap();
    f.shard
        .put_block(writer(), block(&up, 0, b"commit2!"))
        .await
        .unwrap();
    f.shard
        .gate
        .write(|w| fence(w, "ws", 1_000, ""))
        .await
        .unwrap();
    assert_fenced(commit(&f, &up, b"commit2!").await, "commit after the fence");
    // Then the deletion completes: the upload is ended and stays uncommittable.
    delete_ws(&f, "ws").await;
    let err = commit(&f, &up, b"commit2!").await.unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(matches!(
        f.shard.stat("ws", "second.bin").await,
        Err(Error::NotFound(_))
    ));
    f.shard.reconcile().await.unwrap();
    assert!(
        provider_keys(&f).await.is_empty(),
        "no live entry, no bytes left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_workspace_deletion_never_deletes_the_fresh_workspace_of_the_same_name() {
    let f = fixture();
    write(&f, "ws", "old.txt", b"old").await.unwrap();
    let req = pb::DeleteWorkspaceRequest {
        workspace: "ws".into(),
        request_id: "delete-once".into(),
    };
    let first = f.shard.delete_workspace(req.clone()).await.unwrap();
    assert_eq!(first.entries_removed, 1);
    write(&f, "ws", "new.txt", b"new").await.unwrap();
    let again = f.shard.delete_workspace(req).await.unwrap();
    assert_eq!(again, first, "the retry answers what the deletion did");
    assert_eq!(
        f.shard.read("ws", "new.txt").await.unwrap().data,
        b"new".as_slice()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_cut_short_after_its_fence_is_finished_by_the_next_reconciler_pass() {
    let f = fixture();
    for i in 0..(super::PAGE + 3) {
        write(&f, "ws", &format!("f{i:04}"), b"x").await.unwrap();
    }
    // The fence and one page committed, then the process stopped.
    let accounts = f.shard.accounts.clone();
    f.shard
        .gate
        .write(move |w| {
            fence(w, "ws", 1_000, "")?;
            super::release_page(w, &accounts, "ws", 1_000)
        })
        .await
        .unwrap();
    assert_eq!(
        f.shard.list("ws", "", 0, "").await.unwrap().entries.len(),
        3
    );
    assert_fenced(write(&f, "ws", "x", b"x").await, "Write while unfinished");

    f.shard.reconcile().await.unwrap();
    assert!(
        f.shard
            .list("ws", "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    write(&f, "ws", "x", b"x").await.unwrap();
}

// Catches: a retry answering zeros (or only its own pages) for a deletion that a crash cut
// short and the reconciler finished: the completing session must record the totals as the
// fencing call's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_deletion_the_reconciler_finished_answers_its_totals() {
    let f = fixture();
    let n = super::PAGE + 3;
    for i in 0..n {
        write(&f, "ws", &format!("f{i:04}"), b"x").await.unwrap();
    }
    let req = pb::DeleteWorkspaceRequest {
        workspace: "ws".into(),
        request_id: "delete-crashed".into(),
    };
    // The call's first session committed (fence, replay record, one page), then the
    // process stopped.
    let key = crate::shard::replay::RequestKey::new(
        "ws",
        &req.request_id,
        "DeleteWorkspace",
        &pb::DeleteWorkspaceRequest {
            request_id: String::new(),
            ..req.clone()
        },
    );
    let accounts = f.shard.accounts.clone();
    f.shard
        .gate
        .write(move |w| {
            fence(w, "ws", 1_000, &key.request_id)?;
            key.record(w, &pb::DeleteWorkspaceResponse::default(), 1_000)?;
            super::release_page(w, &accounts, "ws", 1_000)
        })
        .await
        .unwrap();
    f.shard.reconcile().await.unwrap();

    let again = f.shard.delete_workspace(req).await.unwrap();
    assert_eq!(again.entries_removed, n as u64);
}

/// Occupies every bulk permit (the fixture has two) until the returned senders are dropped
/// or fired: a CommitUpload then waits to hash its blocks, after its lease was extended.
async fn hold_bulk(f: &Fixture) -> Vec<tokio::sync::oneshot::Sender<()>> {
    let mut releases = Vec::new();
    for _ in 0..2 {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let bulk = f.shard.bulk.clone();
        tokio::spawn(async move {
            bulk.run(async move {
                let _ = started.send(());
                let _ = released.await;
            })
            .await
        });
        within(running).await.unwrap();
        releases.push(release);
    }
    releases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_verified_before_the_fence_is_refused_by_its_commit_session() {
    let f = fixture();
    let up = begin(&f, "ws", "late.bin", 8).await.unwrap();
    f.shard
        .put_block(writer(), block(&up, 0, b"lateblck"))
        .await
        .unwrap();
    // A known lease, so the commit's own lease extension is visible.
    let id = up.upload_id.clone();
    let marker = f
        .shard
        .gate
        .write(move |w| {
            let mut u = w.upload(&id)?.unwrap();
            u.lease_expires_ms -= 1000;
            let marker = u.lease_expires_ms;
            w.put_upload(&id, &u)?;
            Ok(marker)
        })
        .await
        .unwrap();
    // The window under test is the read-back's: without a running digest (as after a
    // restart) the commit reads the block back, at bulk priority, after extending the lease.
    f.shard.forget_running_digests();
    let releases = hold_bulk(&f).await;
    let shard = f.shard.clone();
    let req = pb::CommitUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        sha256: Sha256::digest(b"lateblck").to_vec(),
        request_id: rid("commit"),
    };
    let committing = tokio::spawn(async move { shard.commit_upload(writer(), req).await });
    // The commit proved the upload live and extended its lease; it now waits to hash.
    within(async {
        loop {
            let id = up.upload_id.clone();
            let lease = f
                .shard
                .gate
                .read(move |r| Ok(r.upload(&id)?.unwrap().lease_expires_ms))
                .await
                .unwrap();
            if lease > marker {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    // The deletion's fence lands between the verification and the commit session.
    f.shard
        .gate
        .write(|w| fence(w, "ws", 1_000, ""))
        .await
        .unwrap();
    drop(releases);
    assert_fenced(
        within(committing).await.unwrap(),
        "commit session after the fence",
    );
    assert!(matches!(
        f.shard.stat("ws", "late.bin").await,
        Err(Error::NotFound(_))
    ));
}
