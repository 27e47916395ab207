//! Sequencer tests against a real redb store and a fault-injecting in-memory provider.

use std::sync::Arc;
use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::object::fault::{Faults, FaultyStore};
use crate::shard::{Shard, ShardConfig};
use crate::token::{Claims, Role, Signer};

/// Fails a test that would otherwise hang forever (e.g. on a gate held across provider I/O).
/// This is a deadlock detector, not a timing assertion: healthy runs finish in milliseconds.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("operation blocked: was the gate held across provider I/O?")
}

struct Fixture {
    _dir: tempfile::TempDir,
    shard: Arc<Shard>,
    faults: Faults,
    provider: ObjectProvider,
}

fn fixture(block_size: u64, lease: Duration) -> Fixture {
    fixture_with(ShardConfig {
        block_size,
        upload_lease: lease,
        ..ShardConfig::default()
    })
}

fn fixture_with(cfg: ShardConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let faults = Faults::default();
    let mem: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let faulty: Arc<dyn object_store::ObjectStore> =
        Arc::new(FaultyStore::new(mem.clone(), faults.clone()));
    let provider = ObjectProvider::from_stores("memory", "t".into(), faulty, mem);
    let bulk = Arc::new(crate::bulk::Bulk::new(2, None).unwrap());
    let shard = Shard::open(3, meta, provider.clone(), bulk, Signer::new(b"k"), cfg);
    Fixture {
        _dir: dir,
        shard,
        faults,
        provider,
    }
}

/// A block-memory budget that never makes these tests wait.
fn memory() -> crate::memory::BlockMemory {
    crate::memory::BlockMemory::new(1 << 30, Duration::from_secs(30))
}

fn writer() -> Claims {
    Claims {
        workspaces: vec!["ws".into()],
        role: Role::Write,
        expires: u64::MAX,
    }
}

async fn begin(f: &Fixture, path: &str, size: u64) -> pb::BeginUploadResponse {
    f.shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: "ws".into(),
            path: path.into(),
            size,
            request_id: format!("begin-{path}"),
            ..Default::default()
        })
        .await
        .unwrap()
}

fn block(up: &pb::BeginUploadResponse, index: u32, data: &[u8], rid: &str) -> pb::PutBlockRequest {
    pb::PutBlockRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        index,
        block_sha256: Sha256::digest(data).to_vec(),
        data: data.to_vec().into(),
        request_id: rid.into(),
    }
}

fn commit(up: &pb::BeginUploadResponse, body: &[u8], rid: &str) -> pb::CommitUploadRequest {
    pb::CommitUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        sha256: Sha256::digest(body).to_vec(),
        request_id: rid.into(),
    }
}

fn small_write(path: &str) -> pb::WriteRequest {
    pb::WriteRequest {
        workspace: "ws".into(),
        path: path.into(),
        data: vec![7; 4096].into(),
        request_id: format!("w-{path}"),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_provider_create_blocks_neither_reads_nor_small_writes_nor_other_uploads() {
    let f = fixture(8, Duration::from_secs(60));
    let a = begin(&f, "a.bin", 8).await;
    let b = begin(&f, "b.bin", 8).await;
    f.faults.hold_creates();

    let shard = f.shard.clone();
    let put_a = block(&a, 0, b"aaaaaaaa", "pa");
    let first = tokio::spawn(async move { shard.put_block(writer(), put_a).await });
    within(f.faults.wait_held(1)).await;

    // While A's create is in flight the shard keeps serving.
    within(f.shard.write(small_write("notes.txt")))
        .await
        .unwrap();
    assert_eq!(
        within(f.shard.stat("ws", "notes.txt")).await.unwrap().size,
        4096
    );
    let listed = within(f.shard.list("ws", "", 0, "")).await.unwrap();
    assert_eq!(listed.entries.len(), 1);

    // Another upload's block reaches the provider too (both are now held there).
    let shard = f.shard.clone();
    let put_b = block(&b, 0, b"bbbbbbbb", "pb");
    let second = tokio::spawn(async move { shard.put_block(writer(), put_b).await });
    within(f.faults.wait_held(2)).await;

    f.faults.release(2);
    within(first).await.unwrap().unwrap();
    within(second).await.unwrap().unwrap();
    assert_eq!(f.faults.creates(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_of_one_put_block_write_once_and_share_the_outcome() {
    let f = fixture(8, Duration::from_secs(60));
    let up = begin(&f, "a.bin", 8).await;
    f.faults.hold_creates();
    let req = block(&up, 0, b"12345678", "same-id");
    let (s1, s2) = (f.shard.clone(), f.shard.clone());
    let (r1, r2) = (req.clone(), req.clone());
    let one = tokio::spawn(async move { s1.put_block(writer(), r1).await });
    within(f.faults.wait_held(1)).await;
    let two = tokio::spawn(async move { s2.put_block(writer(), r2).await });
    f.faults.release(1);
    let (one, two) = (
        within(one).await.unwrap().unwrap(),
        within(two).await.unwrap().unwrap(),
    );
    assert_eq!(one, two);
    assert_eq!(f.faults.creates(), 1, "the duplicate must not write again");
    assert_eq!(f.shard.claims.held(), 0);

    let reused = block(&up, 0, b"87654321", "same-id");
    let err = f.shard.put_block(writer(), reused).await.unwrap_err();
    assert!(matches!(err, Error::RequestIdReused(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_block_whose_caller_went_away_is_still_written_and_recorded() {
    let f = fixture(8, Duration::from_secs(60));
    let up = begin(&f, "a.bin", 8).await;
    f.faults.hold_creates();
    let s = f.shard.clone();
    let req = block(&up, 0, b"12345678", "gone");
    let caller = tokio::spawn(async move { s.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;
    caller.abort();
    let _ = caller.await;
    f.faults.release(1);
    // The retry waits for the detached sequence and answers from what it recorded.
    let again = within(
        f.shard
            .put_block(writer(), block(&up, 0, b"12345678", "gone")),
    )
    .await
    .unwrap();
    assert_eq!(again.index, 0);
    assert_eq!(f.faults.creates(), 1, "the retry did not write again");
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        0,
        "the first write was recorded"
    );
}

#[tokio::test]
async fn a_wrong_digest_or_length_is_refused_before_any_provider_write() {
    let f = fixture(8, Duration::from_secs(60));
    let up = begin(&f, "a.bin", 12).await;
    let mut bad_digest = block(&up, 0, b"12345678", "r1");
    bad_digest.block_sha256 = Sha256::digest(b"other").to_vec();
    let err = f.shard.put_block(writer(), bad_digest).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    // Block 1 of a 12-byte artifact must be 4 bytes.
    let err = f
        .shard
        .put_block(writer(), block(&up, 1, b"12345678", "r2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = f
        .shard
        .put_block(writer(), block(&up, 2, b"1234", "r3"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 0);
    assert!(f.provider.list_keys().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_may_arrive_out_of_order_and_commit_waits_for_every_one() {
    let f = fixture(4, Duration::from_secs(60));
    let body = b"0123456789abcdefXY";
    let up = begin(&f, "art", body.len() as u64).await;
    assert_eq!(up.block_count, 5);
    let mut tasks = Vec::new();
    for i in [4u32, 2, 0, 3] {
        let s = f.shard.clone();
        let chunk = &body[(i as usize * 4)..((i as usize + 1) * 4).min(body.len())];
        let req = block(&up, i, chunk, &format!("b{i}"));
        tasks.push(tokio::spawn(
            async move { s.put_block(writer(), req).await },
        ));
    }
    for t in tasks {
        within(t).await.unwrap().unwrap();
    }
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, body, "c"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FailedPrecondition(ref m) if m.contains("block 1")),
        "{err:?}"
    );
    f.shard
        .put_block(writer(), block(&up, 1, b"4567", "b1"))
        .await
        .unwrap();
    let entry = f
        .shard
        .commit_upload(writer(), commit(&up, body, "c"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(
        (entry.size, entry.block_count, entry.generation),
        (18, 5, 1)
    );
    // A retried commit with the same request id returns the same entry.
    let again = f
        .shard
        .commit_upload(writer(), commit(&up, body, "c"))
        .await
        .unwrap();
    assert_eq!(again.entry.unwrap(), entry);

    let m = f.shard.get_manifest("ws", "art").await.unwrap();
    let mut restored = Vec::new();
    for b in &m.blocks {
        restored.extend_from_slice(
            &f.shard
                .read_block("ws", m.revision, b.index, &memory())
                .await
                .unwrap(),
        );
    }
    assert_eq!(restored, body);
}

#[tokio::test]
async fn commit_after_abort_is_refused_and_its_blocks_become_collectable() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let abort = pb::AbortUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        request_id: "ab".into(),
    };
    f.shard.abort_upload(writer(), abort).await.unwrap();
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0-again"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert!(matches!(
        f.shard.stat("ws", "art").await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn an_expired_upload_is_refused_at_put_block_and_commit() {
    let f = fixture(4, Duration::from_millis(200));
    let up = begin(&f, "art", 4).await;
    // Let the lease run out on the shard clock (this waits for time itself, not for a signal).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseExpired(_)), "{err:?}");
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseExpired(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 0);
}

#[tokio::test]
async fn a_lost_provider_response_keeps_its_guard_and_a_retry_writes_a_fresh_key() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.lose_next_response();
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        1,
        "unknown writer stays guarded"
    );
    // The SDK retries with the same request id: a fresh attempt key is written and recorded.
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let keys = f.provider.list_keys().await.unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        1,
        "only the lost attempt is guarded"
    );
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_refused_connection_settles_its_guard_as_finished() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.refuse_next();
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 0);
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    assert_eq!(f.faults.creates(), 1);
}

#[tokio::test]
async fn a_token_for_another_workspace_cannot_touch_the_upload() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let other = Claims {
        workspaces: vec!["other".into()],
        role: Role::Write,
        expires: u64::MAX,
    };
    let err = f
        .shard
        .put_block(other, block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let mut forged = block(&up, 0, b"abcd", "b1");
    forged.upload_token = "00".repeat(32);
    let err = f.shard.put_block(writer(), forged).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 0);
}

// Reconciliation of what uploads leave behind (shard/reconciler.rs).

async fn publish_one(f: &Fixture, path: &str, body: &[u8; 4], rid: &str) {
    let up = f
        .shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: "ws".into(),
            path: path.into(),
            size: 4,
            request_id: format!("begin-{rid}"),
            ..Default::default()
        })
        .await
        .unwrap();
    f.shard
        .put_block(writer(), block(&up, 0, body, &format!("b-{rid}")))
        .await
        .unwrap();
    f.shard
        .commit_upload(writer(), commit(&up, body, &format!("c-{rid}")))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replaced_artifacts_blocks_are_deleted_and_the_live_ones_kept() {
    let f = fixture_with(ShardConfig {
        block_size: 4,
        retired_grace: Duration::ZERO,
        ..ShardConfig::default()
    });
    publish_one(&f, "art", b"old!", "1").await;
    publish_one(&f, "art", b"new!", "2").await;
    assert_eq!(f.provider.list_keys().await.unwrap().len(), 2);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.deleted_keys, 1);
    assert_eq!(f.provider.list_keys().await.unwrap().len(), 1);
    let m = f.shard.get_manifest("ws", "art").await.unwrap();
    assert_eq!(
        &f.shard
            .read_block("ws", m.revision, 0, &memory())
            .await
            .unwrap()[..],
        b"new!"
    );
    assert_eq!(f.shard.counts().await.unwrap().collectable, 0);
}

#[tokio::test]
async fn an_expired_upload_is_claimed_and_its_blocks_deleted() {
    let f = fixture(4, Duration::from_millis(300));
    let up = begin(&f, "art", 8).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    assert_eq!(
        f.shard.reconcile().await.unwrap().expired_uploads,
        0,
        "lease still live"
    );
    assert_eq!(f.provider.list_keys().await.unwrap().len(), 1);
    // Let the lease run out on the shard clock (waiting for time itself, not for a signal).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.expired_uploads, pass.deleted_keys), (1, 1));
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseExpired(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_key_of_a_live_upload_is_never_deleted_while_its_write_is_in_flight() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.hold_creates();
    let s = f.shard.clone();
    let req = block(&up, 0, b"abcd", "b0");
    let put = tokio::spawn(async move { s.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;
    let pass = within(f.shard.reconcile()).await.unwrap();
    assert_eq!(pass.deleted_keys, 0);
    f.faults.release(1);
    within(put).await.unwrap().unwrap();
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    f.shard.reconcile().await.unwrap();
    assert_eq!(
        f.provider.list_keys().await.unwrap().len(),
        1,
        "the published block stays"
    );
}

#[tokio::test]
async fn an_unknown_writers_guard_outlives_the_delete_of_its_late_bytes() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.lose_next_response();
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)));
    let abort = pb::AbortUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        request_id: "ab".into(),
    };
    f.shard.abort_upload(writer(), abort).await.unwrap();
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.settled_guards), (1, 0));
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        1,
        "the writer may still land bytes"
    );
}

#[tokio::test]
async fn a_commit_whose_declared_sha256_does_not_match_the_bytes_is_refused_and_changes_nothing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 8).await;
    for (i, part) in [b"abcd", b"efgh"].iter().enumerate() {
        f.shard
            .put_block(writer(), block(&up, i as u32, *part, &format!("b{i}")))
            .await
            .unwrap();
    }
    // Every block digest matches; only the whole-file digest is false.
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcdefgX", "c-wrong"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    let err = f.shard.stat("ws", "art").await.unwrap_err();
    assert!(
        matches!(err, Error::NotFound(_)),
        "nothing published: {err:?}"
    );
    assert_eq!(f.shard.counts().await.unwrap().uploads, 1, "still open");
    // The upload can still be committed with the true digest.
    let done = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcdefgh", "c-right"))
        .await
        .unwrap();
    assert_eq!(
        done.entry.unwrap().sha256,
        Sha256::digest(b"abcdefgh").to_vec()
    );
}

/// A fixture whose replay window is zero, so ended uploads are prunable at once.
fn fixture_without_replay_window(lease: Duration) -> Fixture {
    fixture_with(ShardConfig {
        block_size: 4,
        upload_lease: lease,
        replay_ttl: Duration::ZERO,
        ..ShardConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pass_claims_every_expired_upload_not_just_one_page() {
    // A zero lease: every upload is expired as soon as it is begun.
    let f = fixture(4, Duration::ZERO);
    let begins: Vec<_> = (0..250)
        .map(|i| {
            let s = f.shard.clone();
            tokio::spawn(async move {
                s.begin_upload(pb::BeginUploadRequest {
                    workspace: "ws".into(),
                    path: format!("a{i}"),
                    size: 4,
                    request_id: format!("begin-{i}"),
                    ..Default::default()
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for b in begins {
        b.await.unwrap();
    }
    assert_eq!(f.shard.reconcile().await.unwrap().expired_uploads, 250);
    assert_eq!(f.shard.counts().await.unwrap().uploads, 0);
}

#[tokio::test]
async fn ended_upload_records_are_pruned_after_the_replay_window_and_open_ones_kept() {
    let f = fixture_without_replay_window(Duration::from_secs(60));
    for i in 0..30 {
        let up = begin(&f, &format!("a{i}"), 4).await;
        let abort = pb::AbortUploadRequest {
            upload_id: up.upload_id.clone(),
            upload_token: up.upload_token.clone(),
            request_id: format!("ab{i}"),
        };
        f.shard.abort_upload(writer(), abort).await.unwrap();
    }
    publish_one(&f, "kept", b"abcd", "p").await;
    let open = begin(&f, "open", 4).await;
    let before = f.shard.counts().await.unwrap();
    assert_eq!((before.upload_records, before.uploads), (32, 1));
    f.shard.prune_replays().await.unwrap();
    assert_eq!(f.shard.prune_uploads().await.unwrap(), 31);
    let after = f.shard.counts().await.unwrap();
    assert_eq!(
        (after.upload_records, after.uploads),
        (1, 1),
        "only the open upload"
    );
    // The open upload is untouched and the published artifact still reads.
    f.shard
        .put_block(writer(), block(&open, 0, b"wxyz", "b-open"))
        .await
        .unwrap();
    let m = f.shard.get_manifest("ws", "kept").await.unwrap();
    assert_eq!(
        &f.shard
            .read_block("ws", m.revision, 0, &memory())
            .await
            .unwrap()[..],
        b"abcd"
    );
}

#[tokio::test]
async fn a_replaced_revision_stays_readable_until_the_retired_grace_has_passed() {
    let f = fixture(4, Duration::from_secs(60)); // default grace: 10 minutes
    publish_one(&f, "art", b"old!", "1").await;
    let old = f.shard.get_manifest("ws", "art").await.unwrap().revision;
    publish_one(&f, "art", b"new!", "2").await;
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.released_revisions, pass.deleted_keys), (0, 0));
    // A restore that fetched the old manifest before the overwrite completes from it.
    assert_eq!(
        &f.shard.read_block("ws", old, 0, &memory()).await.unwrap()[..],
        b"old!"
    );
    assert_eq!(f.provider.list_keys().await.unwrap().len(), 2);
}

#[tokio::test]
async fn after_the_retired_grace_reading_a_replaced_revision_says_the_artifact_was_replaced() {
    let f = fixture_with(ShardConfig {
        block_size: 4,
        retired_grace: Duration::ZERO,
        ..ShardConfig::default()
    });
    publish_one(&f, "art", b"old!", "1").await;
    let old = f.shard.get_manifest("ws", "art").await.unwrap().revision;
    publish_one(&f, "art", b"new!", "2").await;
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.released_revisions, pass.deleted_keys), (1, 1));
    let err = f
        .shard
        .read_block("ws", old, 0, &memory())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("replaced")),
        "{err:?}"
    );
    // A revision number never issued is plainly not found.
    let err = f
        .shard
        .read_block("ws", 999, 0, &memory())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if !m.contains("replaced")),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unknown_writers_guard_backs_off_instead_of_deleting_every_pass_and_is_counted() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.lose_next_response();
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    let abort = pb::AbortUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        request_id: "ab".into(),
    };
    f.shard.abort_upload(writer(), abort).await.unwrap();
    assert_eq!(f.shard.reconcile().await.unwrap().deleted_keys, 1);
    // The next pass comes well within the first back-off (a minute): no second delete.
    assert_eq!(f.shard.reconcile().await.unwrap().deleted_keys, 0);
    assert_eq!(f.shard.counts().await.unwrap().unknown_guards, 1);
}
