//! Sequencer tests against a real redb store and a fault-injecting in-memory provider.

use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::shard::ShardConfig;
use crate::shard::clock::Clock;
use crate::shard::fixture::{Fixture, shard_on};
use crate::token::{Claims, Role};

/// Fails a test that would otherwise hang forever (e.g. on a gate held across provider I/O).
/// This is a deadlock detector, not a timing assertion: healthy runs finish in milliseconds.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("operation blocked: was the gate held across provider I/O?")
}

/// A fixture whose shard clock is manual: leases run out when the test advances it.
fn manual_clock_fixture(block_size: u64, lease: Duration) -> Fixture {
    fixture_on(
        ShardConfig {
            block_size,
            upload_lease: lease,
            ..ShardConfig::default()
        },
        Clock::manual(),
    )
}

fn fixture(block_size: u64, lease: Duration) -> Fixture {
    fixture_with(ShardConfig {
        block_size,
        upload_lease: lease,
        ..ShardConfig::default()
    })
}

fn fixture_with(cfg: ShardConfig) -> Fixture {
    fixture_on(cfg, Clock::wall())
}

/// A fixture whose shard judges leases by `clock` (e.g. [`Clock::manual`]).
fn fixture_on(cfg: ShardConfig, clock: Clock) -> Fixture {
    shard_on(3, cfg, clock)
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
        block_sha256: Vec::new(),
        block_crc32c: Some(nokv_proto::block_checksum::crc32c(data)),
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

/// Puts the 4-byte blocks of `body` in the order of `indices` (a fixture with block size 4).
/// Commits `up` declaring the sha256 of `body` and checks the published entry carries it.
async fn commit_publishes(f: &Fixture, up: &pb::BeginUploadResponse, body: &[u8], rid: &str) {
    let done = f
        .shard
        .commit_upload(writer(), commit(up, body, rid))
        .await
        .unwrap();
    assert_eq!(done.entry.unwrap().sha256, Sha256::digest(body).to_vec());
}

async fn put_blocks(f: &Fixture, up: &pb::BeginUploadResponse, body: &[u8], indices: &[u32]) {
    for &i in indices {
        let part = &body[4 * i as usize..4 * i as usize + 4];
        f.shard
            .put_block(writer(), block(up, i, part, &format!("b{i}")))
            .await
            .unwrap();
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
    assert_accounted(&f).await;
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
    // Issue 8 item 11: release only once the duplicate is parked on the block claim, so the
    // test never passes by the duplicate arriving after the first was recorded.
    // Mutation caught: `let claim = self.claims.claim(&upload_id, index).await;` in put_block
    // replaced by `let claim = ();` → the duplicate never parks and this wait fails (verified
    // red).
    within(f.shard.claims.wait_parked(1)).await;
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
}

#[tokio::test]
async fn a_wrong_digest_or_length_is_refused_before_any_provider_write() {
    let f = fixture(8, Duration::from_secs(60));
    let up = begin(&f, "a.bin", 12).await;
    let mut bad_crc = block(&up, 0, b"12345678", "r1");
    bad_crc.block_crc32c = Some(nokv_proto::block_checksum::crc32c(b"other"));
    let err = f.shard.put_block(writer(), bad_crc).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    // Every declared checksum is checked: a wrong sha256 beside a right CRC is refused too.
    let mut bad_sha = block(&up, 0, b"12345678", "r1-sha");
    bad_sha.block_sha256 = Sha256::digest(b"other").to_vec();
    let err = f.shard.put_block(writer(), bad_sha).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    // A block with no checksum at all proves nothing and is refused as malformed.
    let mut none = block(&up, 0, b"12345678", "r1-none");
    none.block_crc32c = None;
    let err = f.shard.put_block(writer(), none).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
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
    // Item 5: the aborted upload's uploaded block is collectable, not leaked.
    let classes = assert_accounted(&f).await;
    assert_eq!(classes.len(), 1, "{classes:?}");
    assert_eq!(classes[0].1, KeyClass::Collectable, "{classes:?}");
}

#[tokio::test]
async fn an_expired_upload_is_refused_at_put_block_and_commit() {
    let f = manual_clock_fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.clock.advance(Duration::from_secs(60));
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
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
    // Issue 8 (the defect): the refusal commits the guard as finished. Catches the mutation
    // `return Ok(Err(..))` → `return Err(..)` in record_block's NotWritten branch (the
    // refusal rolls the session back): red, the guard stays an unknown writer's.
    let counts = f.shard.counts().await.unwrap();
    assert_eq!(
        (counts.guards, counts.unknown_guards),
        (1, 0),
        "one guard, finished"
    );
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    assert_eq!(f.faults.creates(), 1);
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    // The finished writer's guard is settled by the first pass that deletes its key.
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.settled_guards), (1, 1));
    assert_eq!(f.shard.counts().await.unwrap().guards, 0);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.settled_guards), (0, 0));
    assert_eq!(
        f.faults.deletes(),
        1,
        "the refused key is deleted exactly once"
    );
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
}

#[tokio::test]
async fn an_expired_upload_is_claimed_and_its_blocks_deleted() {
    let f = manual_clock_fixture(4, Duration::from_secs(60));
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
    f.clock.advance(Duration::from_secs(60));
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.expired_uploads, pass.deleted_keys), (1, 1));
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseExpired(_)), "{err:?}");
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
}

#[tokio::test]
async fn a_commit_whose_declared_sha256_does_not_match_the_bytes_is_refused_and_changes_nothing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 8).await;
    put_blocks(&f, &up, b"abcdefgh", &[0, 1]).await;
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
    commit_publishes(&f, &up, b"abcdefgh", "c-right").await;
    assert_accounted(&f).await;
}

/// A fixture whose replay window is zero, so ended uploads are prunable at once.
fn fixture_without_replay_window(lease: Duration) -> Fixture {
    fixture_with(ShardConfig {
        block_size: 4,
        upload_lease: lease,
        replay_ttl: Duration::ZERO,
        history_retention: Duration::ZERO,
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
}

// Catches: a reconcile pass that opens a write session with nothing to do (release_retired
// used to check inside its session): on an idle shard every pass then costs a batch, and in a
// cluster marks the shard changed since its checkpoint.
#[tokio::test]
async fn an_idle_shards_reconcile_pass_opens_no_write_session() {
    let f = fixture_with(ShardConfig {
        block_size: 4,
        ..ShardConfig::default()
    });
    publish_one(&f, "art", b"old!", "1").await;
    // A replaced revision within its retired grace: retired, not yet due.
    publish_one(&f, "art", b"new!", "2").await;
    f.shard.reconcile().await.unwrap();
    let before = f.shard.gate.stats();
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.released_revisions, 0);
    assert_eq!(f.shard.gate.stats().sessions, before.sessions);
}

/// A shard with no retired grace and artifact `art` published once; returns its revision.
async fn published_without_retired_grace() -> (Fixture, u64) {
    let f = fixture_with(ShardConfig {
        block_size: 4,
        retired_grace: Duration::ZERO,
        ..ShardConfig::default()
    });
    publish_one(&f, "art", b"old!", "1").await;
    let old = f.shard.get_manifest("ws", "art").await.unwrap().revision;
    (f, old)
}

// Catches: a block read that found its key while the revision was live, then waited for
// block memory while the grace ended and the block was deleted, answering `Internal` ("a
// referenced object is missing") instead of the replaced-artifact answer.
#[tokio::test]
async fn a_block_read_that_waited_past_the_retired_grace_says_the_artifact_was_replaced() {
    let (f, old) = published_without_retired_grace().await;
    let budget = crate::memory::BlockMemory::new(4, Duration::from_secs(600));
    let taken = budget.reserve(4).await.unwrap();
    let mut read = Box::pin(f.shard.read_block("ws", old, 0, &budget));
    // Polled once, the read has its key and waits for block memory.
    assert!(futures::poll!(read.as_mut()).is_pending());
    publish_one(&f, "art", b"new!", "2").await;
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.released_revisions, pass.deleted_keys), (1, 1));
    drop(taken);
    let err = read.await.unwrap_err();
    assert!(
        matches!(&err, Error::NotFound(m) if m.contains("replaced")),
        "{err:?}"
    );
}

#[tokio::test]
async fn after_the_retired_grace_reading_a_replaced_revision_says_the_artifact_was_replaced() {
    let (f, old) = published_without_retired_grace().await;
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
    assert_accounted(&f).await;
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
    assert_accounted(&f).await;
}

// ---------------------------------------------------------------------------------------
// Issue 8, engineer F: the guard-settling defect, the record step, accounting, faults.
// Every test names the one-line mutation it catches; each was made locally and went red.
// ---------------------------------------------------------------------------------------

use crate::meta::{BlockRecord, GuardRecord, ReplayRecord, UploadRecord, UploadState, WriterState};
use crate::object::PutOutcome;
use crate::shard::accounting::KeyClass;
use crate::shard::replay::RequestKey;

/// Issue 8 item 5: every key the provider holds is referenced, guarded or collectable, by
/// the one classification the shard has (shard/accounting.rs). Returns each key's class.
async fn assert_accounted(f: &Fixture) -> Vec<(String, KeyClass)> {
    let ledger = f.shard.ledger().await.unwrap();
    let classes: Vec<(String, KeyClass)> = f
        .provider
        .list_keys()
        .await
        .unwrap()
        .into_iter()
        .map(|k| {
            let class = ledger.classify(&k);
            (k, class)
        })
        .collect();
    let bad: Vec<_> = classes
        .iter()
        .filter(|(_, c)| {
            matches!(
                c,
                KeyClass::Unaccounted | KeyClass::CollectableButReferenced
            )
        })
        .collect();
    assert!(bad.is_empty(), "provider keys not accounted for: {bad:?}");
    classes
}

fn abort(up: &pb::BeginUploadResponse, rid: &str) -> pb::AbortUploadRequest {
    pb::AbortUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
        request_id: rid.into(),
    }
}

// The defect: a refused attempt's guard must be committed as finished.

/// Before the fix this scenario settled 0 guards and left 1 unknown-writer guard for good;
/// after it, 1 guard is settled and none is left.
/// Mutation: `return Ok(Err(..))` → `return Err(..)` in record_block's NotWritten branch.
#[tokio::test]
async fn a_refused_write_then_abort_settles_its_guard_in_one_pass_and_deletes_its_key_once() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.faults.refuse_next();
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    f.shard
        .abort_upload(writer(), abort(&up, "ab"))
        .await
        .unwrap();
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.settled_guards), (1, 1));
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        0,
        "the guard is gone"
    );
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.settled_guards), (0, 0));
    assert_eq!(f.faults.deletes(), 1, "its key was deleted exactly once");
    assert_accounted(&f).await;
}

// Item 3: the record step of a superseded or fenced attempt.

/// What one record step may change, read inside its own session.
#[derive(Debug, PartialEq)]
struct RecordState {
    upload: Option<UploadRecord>,
    blocks: Vec<(u32, BlockRecord)>,
    guards: Vec<(String, GuardRecord)>,
    collectable: Vec<String>,
    replay: Option<ReplayRecord>,
}

fn record_state(w: &crate::meta::WriteView, upload_id: &str) -> RecordState {
    RecordState {
        upload: w.upload(upload_id).unwrap(),
        blocks: w.blocks(upload_id).unwrap(),
        guards: w.guards().unwrap(),
        collectable: w.collectable_keys().unwrap(),
        replay: w.replay("ws", "direct").unwrap(),
    }
}

/// Admits one attempt of block 0 through the real PutBlock and holds its provider create.
/// Returns the running put and the attempt's key.
async fn admit_held(
    f: &Fixture,
    up: &pb::BeginUploadResponse,
) -> (
    tokio::task::JoinHandle<crate::error::Result<pb::PutBlockResponse>>,
    String,
) {
    f.faults.hold_creates();
    let (s, req) = (f.shard.clone(), block(up, 0, b"abcd", "held"));
    let put = tokio::spawn(async move { s.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;
    let (id, index) = (up.upload_id.clone(), 0);
    let key = f
        .shard
        .gate
        .read(move |r| Ok(r.block(&id, index)?.expect("admitted").key))
        .await
        .unwrap();
    (put, key)
}

/// Sets the upload's lease to have ended (what the passing of time does to the record).
async fn end_lease(f: &Fixture, up: &pb::BeginUploadResponse) {
    let id = up.upload_id.clone();
    let now = f.clock.now_ms();
    f.shard
        .gate
        .write(move |w| {
            let mut u = w.upload(&id)?.unwrap();
            u.lease_expires_ms = now - 1;
            w.put_upload(&id, &u)?;
            Ok(())
        })
        .await
        .unwrap();
}

/// Calls the record step directly for the attempt `key` whose write succeeded, after
/// `fence` changed the upload; asserts it refuses with `expected` and changes nothing but
/// marking its own guard finished; then lets the held real sequence finish (it refuses too).
async fn assert_record_refused(
    f: &Fixture,
    up: &pb::BeginUploadResponse,
    put: tokio::task::JoinHandle<crate::error::Result<pb::PutBlockResponse>>,
    key: String,
    expected: fn(&Error) -> bool,
) {
    let (id, k) = (up.upload_id.clone(), key.clone());
    let request = block(up, 0, b"abcd", "");
    let now = f.clock.now_ms();
    let (outcome, before, after) = f
        .shard
        .gate
        .write(move |w| {
            let rk = RequestKey::new("ws", "direct", "PutBlock", &request);
            let before = record_state(w, &id);
            let outcome =
                super::record_block(w, &rk, &id, 0, &k, PutOutcome::Written, 60_000, now)?;
            Ok((outcome, before, record_state(w, &id)))
        })
        .await
        .unwrap();
    let err = outcome.unwrap_err();
    assert!(expected(&err), "{err:?}");
    let own = |s: &RecordState| s.guards.iter().find(|(g, _)| *g == key).cloned();
    let (own_before, own_after) = (own(&before).expect("guarded"), own(&after).unwrap());
    assert_eq!(own_after.1.writer, WriterState::Finished as i32);
    let mut expected_after = before;
    for (g, rec) in &mut expected_after.guards {
        if *g == key {
            *rec = own_after.1.clone();
        }
    }
    assert_eq!(after, expected_after, "only its own guard changed");
    assert_ne!(own_before, own_after);
    // The committed state says the same: the block is not uploaded, the guard is finished.
    let id = up.upload_id.clone();
    let block_state = f
        .shard
        .gate
        .read(move |r| Ok(r.block(&id, 0)?.map(|b| (b.key, b.state))))
        .await
        .unwrap();
    assert_ne!(
        block_state.map(|(_, s)| s),
        Some(crate::meta::BlockState::Uploaded as i32)
    );
    assert_eq!(f.shard.counts().await.unwrap().unknown_guards, 0);
    f.faults.release(1);
    let err = within(put).await.unwrap().unwrap_err();
    assert!(expected(&err), "the real record step refuses too: {err:?}");
    assert_accounted(f).await;
}

/// Mutation: drop `finished(w)?;` before `return Ok(Err(e))` in record_block's fence branch
/// (the attempt's guard stays unknown); also the defect itself (`Ok(Err(e))` → `Err(e)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_step_for_an_aborted_upload_refuses_and_changes_nothing_but_its_guard() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let (put, key) = admit_held(&f, &up).await;
    f.shard
        .abort_upload(writer(), abort(&up, "ab"))
        .await
        .unwrap();
    assert_record_refused(
        &f,
        &up,
        put,
        key,
        |e| matches!(e, Error::FailedPrecondition(m) if m.contains("aborted")),
    )
    .await;
}

/// Mutation: `require_open_and_live(&upload, now)` → `Ok(())` in record_block (the block
/// still names this attempt, so only the lease fence refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_step_after_the_lease_ended_refuses_and_changes_nothing_but_its_guard() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let (put, key) = admit_held(&f, &up).await;
    end_lease(&f, &up).await;
    assert_record_refused(&f, &up, put, key, |e| matches!(e, Error::LeaseExpired(_))).await;
}

/// Mutation: `Ok(Err(e))` → `Err(e)` in record_block's fence branch (the reclaimed
/// attempt's guard stays unknown and is never settled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_step_for_a_reclaimed_upload_refuses_and_changes_nothing_but_its_guard() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let (put, key) = admit_held(&f, &up).await;
    end_lease(&f, &up).await;
    assert_eq!(f.shard.reconcile().await.unwrap().expired_uploads, 1);
    assert_record_refused(
        &f,
        &up,
        put,
        key,
        |e| matches!(e, Error::LeaseExpired(m) if m.contains("cleaned up")),
    )
    .await;
}

/// Mutation: `let current = block.as_ref().is_some_and(|b| b.key == object_key)` →
/// `block.is_some()` in record_block (the attempt would mark another attempt's block
/// uploaded under its own bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_step_for_a_block_that_names_another_attempt_refuses_and_changes_nothing_but_its_guard()
 {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let (put, key) = admit_held(&f, &up).await;
    // What a newer admission of the same block writes: the block names its own key.
    let id = up.upload_id.clone();
    f.shard
        .gate
        .write(move |w| {
            let mut b = w.block(&id, 0)?.unwrap();
            b.key = format!("{}-newer", b.key);
            w.put_block(&id, 0, &b)?;
            Ok(())
        })
        .await
        .unwrap();
    assert_record_refused(
        &f,
        &up,
        put,
        key,
        |e| matches!(e, Error::FailedPrecondition(m) if m.contains("superseded")),
    )
    .await;
}

// Item 6: replay versus the "already uploaded" shortcut; the claim re-check.

/// A retried PutBlock answers from its replay record, not from the upload's state.
/// Mutation: delete the `if let Some(done) = key.recorded(w)? { .. }` line of PutBlock's
/// admit session (the retry then meets a committed upload: FailedPrecondition).
#[tokio::test]
async fn a_retried_put_block_answers_its_recorded_outcome_even_after_the_commit() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let first = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    let again = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(f.faults.creates(), 1);
    assert_accounted(&f).await;
}

/// Mutation: delete the "already uploaded" shortcut (`if let Some(b) = w.block(..)? && b.state
/// == Uploaded { .. }`) in PutBlock's admit: the same bytes are written again under a new
/// key and the uploaded key loses its reference.
#[tokio::test]
async fn the_same_block_under_a_new_request_id_is_answered_without_a_second_write() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let again = f
        .shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0-new-id"))
        .await
        .unwrap();
    assert_eq!(again.index, 0);
    assert_eq!(f.faults.creates(), 1, "no second provider write");
    assert_eq!(f.shard.counts().await.unwrap().guards, 0);
    assert_accounted(&f).await;
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    assert_accounted(&f).await;
}

/// Mutation: delete the `if b.sha256 != digest { return Err(DigestMismatch) }` check of the
/// shortcut in PutBlock's admit (other content would be answered as uploaded).
#[tokio::test]
async fn other_content_for_an_uploaded_block_is_refused_with_digest_mismatch_and_changes_nothing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let err = f
        .shard
        .put_block(writer(), block(&up, 0, b"wxyz", "b0-other"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 1);
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    let m = f.shard.get_manifest("ws", "art").await.unwrap();
    assert_eq!(
        &f.shard
            .read_block("ws", m.revision, 0, &memory())
            .await
            .unwrap()[..],
        b"abcd"
    );
    assert_accounted(&f).await;
}

#[tokio::test]
async fn the_manifest_records_each_blocks_declared_checksums_and_old_sha256_blocks_still_publish() {
    use nokv_proto::block_checksum::{BlockChecksums, crc32c};
    let f = fixture(4, Duration::from_secs(60));
    // The client's way: CRC-32C blocks.
    let up = begin(&f, "crc", 8).await;
    put_blocks(&f, &up, b"abcdefgh", &[0, 1]).await;
    commit_publishes(&f, &up, b"abcdefgh", "c-crc").await;
    let m = f.shard.get_manifest("ws", "crc").await.unwrap();
    let crcs: Vec<_> = m
        .blocks
        .iter()
        .map(|b| (b.crc32c, b.sha256.len()))
        .collect();
    assert_eq!(
        crcs,
        [(Some(crc32c(b"abcd")), 0), (Some(crc32c(b"efgh")), 0)]
    );
    let mut manifest = Sha256::new();
    manifest.update(crc32c(b"abcd").to_be_bytes());
    manifest.update(crc32c(b"efgh").to_be_bytes());
    assert_eq!(
        m.entry.unwrap().manifest_sha256,
        manifest.finalize().to_vec()
    );

    // A client from before CRC-32C declares sha256 blocks; one may declare both.
    let up = begin(&f, "sha", 8).await;
    let mut first = block(&up, 0, b"abcd", "s0");
    (first.block_sha256, first.block_crc32c) = (Sha256::digest(b"abcd").to_vec(), None);
    let mut second = block(&up, 1, b"efgh", "s1");
    second.block_sha256 = Sha256::digest(b"efgh").to_vec();
    for b in [first, second] {
        f.shard.put_block(writer(), b).await.unwrap();
    }
    commit_publishes(&f, &up, b"abcdefgh", "c-sha").await;
    let m = f.shard.get_manifest("ws", "sha").await.unwrap();
    let recorded: Vec<_> = m.blocks.iter().map(BlockChecksums::from).collect();
    assert_eq!(
        recorded,
        [
            BlockChecksums {
                sha256: Sha256::digest(b"abcd").to_vec(),
                crc32c: None
            },
            BlockChecksums {
                sha256: Sha256::digest(b"efgh").to_vec(),
                crc32c: Some(crc32c(b"efgh"))
            },
        ]
    );
    // Blocks with a sha256 keep the manifest digest they always had: over the sha256s.
    let mut manifest = Sha256::new();
    manifest.update(Sha256::digest(b"abcd"));
    manifest.update(Sha256::digest(b"efgh"));
    assert_eq!(
        m.entry.unwrap().manifest_sha256,
        manifest.finalize().to_vec()
    );
    assert_accounted(&f).await;
}

#[tokio::test]
async fn a_retry_of_a_recorded_block_is_the_same_block_only_if_a_shared_checksum_agrees() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    // The same bytes declared with the CRC and a sha256: the CRC agrees, answered, no write.
    let mut both = block(&up, 0, b"abcd", "b0-both");
    both.block_sha256 = Sha256::digest(b"abcd").to_vec();
    f.shard.put_block(writer(), both).await.unwrap();
    assert_eq!(f.faults.creates(), 1);
    // A sha256 alone shares nothing with the recorded CRC: the server cannot tell, refuses.
    let mut sha_only = block(&up, 0, b"abcd", "b0-sha");
    (sha_only.block_sha256, sha_only.block_crc32c) = (Sha256::digest(b"abcd").to_vec(), None);
    let err = f.shard.put_block(writer(), sha_only).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    assert_eq!(f.faults.creates(), 1);
    commit_publishes(&f, &up, b"abcd", "c").await;
    assert_accounted(&f).await;
}

/// The listing is taken at a clock reading past the lease (a stale view); the upload is
/// renewed before the claim. Mutation: drop `|| u.lease_expires_ms > now_ms()` from
/// claim_page's re-check.
#[tokio::test]
async fn a_stale_candidate_list_never_claims_an_upload_renewed_since_the_listing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let later = f.clock.now_ms() + 120_000;
    let candidates = f.shard.expired_candidates(later).await.unwrap();
    assert_eq!(candidates, vec![up.upload_id.clone()]);
    f.shard
        .renew_upload(
            writer(),
            pb::RenewUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(f.shard.claim_page(candidates).await.unwrap(), 0);
    assert_eq!(f.shard.counts().await.unwrap().collectable, 0);
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    assert_accounted(&f).await;
}

/// The upload is committed between listing and claiming, and its lease has run out by the
/// claim. Mutation: drop `u.state != UploadState::Open as i32 ||` from claim_page's re-check.
#[tokio::test]
async fn a_stale_candidate_list_never_claims_an_upload_committed_since_the_listing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    let later = f.clock.now_ms() + 120_000;
    let candidates = f.shard.expired_candidates(later).await.unwrap();
    assert_eq!(candidates, vec![up.upload_id.clone()]);
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    end_lease(&f, &up).await;
    assert_eq!(f.shard.claim_page(candidates).await.unwrap(), 0);
    let id = up.upload_id.clone();
    let state = f
        .shard
        .gate
        .read(move |r| Ok(r.upload(&id)?.unwrap().state))
        .await
        .unwrap();
    assert_eq!(state, UploadState::Committed as i32);
    let classes = assert_accounted(&f).await;
    assert_eq!(classes.len(), 1);
    assert_eq!(
        classes[0].1,
        KeyClass::Referenced,
        "the published block stays live"
    );
}

// Item 7: deletes (and reads) that fail.

/// Mutation: in collect_keys, `Err(e) => { pass.failed_deletes += 1; .. }` also pushes the
/// key to `deleted` (the record is forgotten although the bytes are still there).
#[tokio::test]
async fn a_collectable_delete_that_fails_keeps_its_record_and_is_retried_next_pass() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    f.shard
        .abort_upload(writer(), abort(&up, "ab"))
        .await
        .unwrap();
    f.faults.fail_next_deletes(1);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.failed_deletes), (0, 1));
    assert_eq!(
        f.shard.counts().await.unwrap().collectable,
        1,
        "record kept"
    );
    let classes = assert_accounted(&f).await;
    assert_eq!(classes.len(), 1);
    assert_eq!(classes[0].1, KeyClass::Collectable);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!((pass.deleted_keys, pass.failed_deletes), (1, 0));
    assert_eq!(f.shard.counts().await.unwrap().collectable, 0);
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    assert_accounted(&f).await;
}

/// A finished writer's bytes landed (its record step was refused: the upload was aborted
/// while the write was in flight); the first delete fails. Mutation: drop the `continue;`
/// after a failed `delete_attempt` in sweep_guards (the guard would be settled with its
/// bytes still on the provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_delete_fails_is_kept_and_retried_next_pass() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    let (put, key) = admit_held(&f, &up).await;
    f.shard
        .abort_upload(writer(), abort(&up, "ab"))
        .await
        .unwrap();
    f.faults.release(1);
    within(put).await.unwrap().unwrap_err();
    assert_eq!(f.provider.list_keys().await.unwrap(), vec![key.clone()]);
    f.faults.fail_next_deletes(1);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(
        (pass.deleted_keys, pass.settled_guards, pass.failed_deletes),
        (0, 0, 1)
    );
    assert_eq!(f.shard.counts().await.unwrap().guards, 1, "guard kept");
    let classes = assert_accounted(&f).await;
    assert_eq!(classes, vec![(key, KeyClass::Guarded)]);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(
        (pass.deleted_keys, pass.settled_guards, pass.failed_deletes),
        (1, 1, 0)
    );
    assert_eq!(f.shard.counts().await.unwrap().guards, 0);
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    assert_accounted(&f).await;
}

/// Mutation: `let bytes = object.get(&k).await?;` → `.await.unwrap_or_default();` in
/// verify_declared_digest (a failed read would be hashed as empty bytes).
#[tokio::test]
async fn a_commit_whose_block_read_fails_answers_unavailable_and_publishes_nothing() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 4).await;
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    // As after a restart: no running digest, so the commit reads the block back.
    f.shard.forget_running_digests();
    f.faults.fail_next_reads(1);
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(matches!(
        f.shard.stat("ws", "art").await,
        Err(Error::NotFound(_))
    ));
    // The same request retried once the provider answers again publishes.
    f.shard
        .commit_upload(writer(), commit(&up, b"abcd", "c"))
        .await
        .unwrap();
    assert_accounted(&f).await;
}

/// Issue 46: blocks recorded in order join the running digest, and the commit proves the
/// declared sha256 without reading any block back (every read would fail here). Mutation:
/// never use the running digest (`finish` → the empty prefix) and the commit answers
/// `Unavailable`.
#[tokio::test]
async fn a_commit_proves_the_declared_digest_from_the_running_digest_without_reading_back() {
    commits_reading_nothing_back(b"abcdefghijkl", &[0, 1, 2]).await;
}

/// Blocks recorded out of order, as an uploader with several in flight has them: each one
/// ahead of its turn is held until the gap before it fills, and the commit reads nothing back
/// (every read would fail here). Mutation: end the prefix at the first block ahead (never
/// hold one) and the commit answers `Unavailable`.
#[tokio::test]
async fn a_commit_after_blocks_recorded_out_of_order_reads_nothing_back() {
    commits_reading_nothing_back(b"abcdefghijklmnop", &[1, 3, 0, 2]).await;
}

/// Puts the 4-byte blocks of `body` in the order of `indices`, then commits while every
/// provider read fails: the commit publishes only if it proves the digest without reading
/// anything back.
async fn commits_reading_nothing_back(body: &[u8], indices: &[u32]) {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", body.len() as u64).await;
    put_blocks(&f, &up, body, indices).await;
    f.faults.fail_next_reads(1000);
    commit_publishes(&f, &up, body, "c").await;
    f.faults.fail_next_reads(0);
    assert_accounted(&f).await;
}

/// With no room to hold blocks ahead (the node-wide bound reached), the prefix ends at the
/// first block ahead of its turn and the commit hashes the rest from the provider,
/// continuing the same digest.
#[tokio::test]
async fn past_the_hold_bound_a_commit_reads_back_the_rest_and_publishes() {
    let f = fixture_with(ShardConfig {
        block_size: 4,
        held_ahead: crate::shard::upload_digest::HeldAhead::new(0),
        ..ShardConfig::default()
    });
    let up = begin(&f, "art", 16).await;
    put_blocks(&f, &up, b"abcdefghijklmnop", &[0, 2, 1, 3]).await;
    f.faults.fail_next_reads(1);
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcdefghijklmnop", "c"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable(_)),
        "it did read back: {err:?}"
    );
    commit_publishes(&f, &up, b"abcdefghijklmnop", "c").await;
    assert_accounted(&f).await;
}

/// The running digest is exact: a false declared sha256 is refused by it too, and nothing is
/// published.
#[tokio::test]
async fn the_running_digest_refuses_a_false_declared_sha256() {
    let f = fixture(4, Duration::from_secs(60));
    let up = begin(&f, "art", 8).await;
    put_blocks(&f, &up, b"abcdefgh", &[0, 1]).await;
    f.faults.fail_next_reads(1000);
    let err = f
        .shard
        .commit_upload(writer(), commit(&up, b"abcdefgX", "c"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    f.faults.fail_next_reads(0);
    assert!(matches!(
        f.shard.stat("ws", "art").await,
        Err(Error::NotFound(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Issue 9 (accounting): a claimed upload is unresolved exactly while a guard names it.
// ---------------------------------------------------------------------------------------------

async fn upload_state(f: &Fixture, id: &str) -> crate::meta::UploadState {
    let id = id.to_string();
    let u = f
        .shard
        .gate
        .read(move |r| Ok(r.upload(&id)?))
        .await
        .unwrap()
        .expect("upload record");
    crate::meta::UploadState::try_from(u.state).unwrap()
}

/// Mutations caught: dropping `resolve_if_reclaimed` from the guard sweep (the upload stays
/// `Deleting` and unresolved for ever); always claiming to `Reclaimed` (a claimed upload whose
/// attempt may still land would read as resolved).
#[tokio::test]
async fn a_claimed_upload_stays_unresolved_until_its_last_guard_settles_then_is_reclaimed() {
    let lease = Duration::from_secs(60);
    let f = manual_clock_fixture(4, lease);
    let up = begin(&f, "art", 4).await;
    f.faults.refuse_next();
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap_err();
    f.clock.advance(lease);
    f.faults.fail_next_deletes(1);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.expired_uploads, 1);
    assert_eq!(
        upload_state(&f, &up.upload_id).await,
        crate::meta::UploadState::Deleting
    );
    assert_eq!(f.shard.counts().await.unwrap().deleting_uploads, 1);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.settled_guards, 1);
    assert_eq!(
        upload_state(&f, &up.upload_id).await,
        crate::meta::UploadState::Reclaimed
    );
    assert_eq!(f.shard.counts().await.unwrap().deleting_uploads, 0);
    assert_accounted(&f).await;

    // An expired upload with no attempt in flight is resolved by its claim alone.
    let idle = begin(&f, "idle", 4).await;
    f.clock.advance(lease);
    f.shard.reconcile().await.unwrap();
    assert_eq!(
        upload_state(&f, &idle.upload_id).await,
        crate::meta::UploadState::Reclaimed
    );
    assert_accounted(&f).await;
}

// ---------------------------------------------------------------------------------------
// Issue 8 items 2 and 4 (engineer G): leases and the shard clock, the lease cut-off of a
// provider write, renew_upload. Every lease here runs out on a manual shard clock.

/// Polls `fut` until it is pending with `parked()` true, without letting it finish: the
/// caller then knows where the request waits (e.g. queued on the gate) and resumes it later.
async fn park<F: std::future::Future + Unpin>(fut: &mut F, parked: impl Fn() -> bool) {
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *fut).poll(cx) {
        std::task::Poll::Ready(_) => panic!("the request finished before it was parked"),
        std::task::Poll::Pending if parked() => std::task::Poll::Ready(()),
        std::task::Poll::Pending => std::task::Poll::Pending,
    })
    .await
}

/// Occupies the shard's committer with a write session that blocks until the returned
/// sender is used (or dropped); returns once the session runs.
async fn hold_committer(f: &Fixture) -> std::sync::mpsc::Sender<()> {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let s = f.shard.clone();
    tokio::spawn(async move {
        s.gate
            .write(move |_| {
                let _ = entered_tx.send(());
                let _ = release_rx.recv();
                Ok(())
            })
            .await
    });
    within(entered_rx).await.unwrap();
    release_tx
}

fn renew(up: &pb::BeginUploadResponse) -> pb::RenewUploadRequest {
    pb::RenewUploadRequest {
        upload_id: up.upload_id.clone(),
        upload_token: up.upload_token.clone(),
    }
}

/// Mutation caught: in `extend_lease` (or the admit / commit session) reading
/// `let now = clock.now_ms();` before `self.gate.write(..)` instead of inside the session →
/// the queued request is judged by a reading from before the lease ran out and succeeds
/// (verified red for extend_lease and for the admit session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_while_requests_queue_for_the_gate_refuses_them_when_they_get_it() {
    let lease = Duration::from_secs(60);
    let f = manual_clock_fixture(4, lease);
    // One upload per request, so that one request's renewal cannot save another's lease.
    let (to_renew, to_commit, to_put) = (
        begin(&f, "renewed", 4).await,
        begin(&f, "committed", 4).await,
        begin(&f, "put", 4).await,
    );
    let release = hold_committer(&f).await;

    // Each request is driven until it waits for the gate: renew and commit queue their
    // session on the first poll (everything before it is synchronous; this commit has no
    // blocks to verify); PutBlock queues its admit session in the poll that takes the claim.
    let mut renewing = Box::pin(f.shard.renew_upload(writer(), renew(&to_renew)));
    park(&mut renewing, || true).await;
    let mut committing = Box::pin(
        f.shard
            .commit_upload(writer(), commit(&to_commit, b"abcd", "c")),
    );
    park(&mut committing, || true).await;
    let mut putting = Box::pin(f.shard.put_block(writer(), block(&to_put, 0, b"abcd", "p")));
    within(park(&mut putting, || f.shard.claims.held() == 1)).await;

    // The lease runs out while all three wait; then the committer is released.
    f.clock.advance(lease);
    release.send(()).unwrap();

    for (what, err) in [
        ("renew", within(renewing).await.map(|_| ()).unwrap_err()),
        ("commit", within(committing).await.map(|_| ()).unwrap_err()),
        ("put", within(putting).await.map(|_| ()).unwrap_err()),
    ] {
        assert!(matches!(err, Error::LeaseExpired(_)), "{what}: {err:?}");
    }
    assert_eq!(f.faults.creates(), 0, "no block was admitted");
}

/// Mutation caught: the cut-off branch `() = clock.reached(deadline_ms) => ..` of the write
/// step replaced by `() = std::future::pending() => ..` → the held write is never cut off
/// and the PutBlock hangs (verified red).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_write_held_past_the_lease_ends_as_unknown_and_keeps_its_guard() {
    let lease = Duration::from_secs(60);
    let f = manual_clock_fixture(4, lease);
    let up = begin(&f, "art", 4).await;
    f.faults.hold_creates();
    let s = f.shard.clone();
    let req = block(&up, 0, b"abcd", "b0");
    let put = tokio::spawn(async move { s.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;

    f.clock.advance(lease);
    let err = within(put).await.unwrap().unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("outcome unknown")),
        "{err:?}"
    );
    let counts = f.shard.counts().await.unwrap();
    assert_eq!(
        (counts.guards, counts.unknown_guards),
        (1, 1),
        "the bytes may still land: the attempt stays guarded as an unknown writer"
    );
    assert_eq!(
        f.faults.creates(),
        0,
        "the held write was dropped, not sent"
    );
}

/// Mutations caught: dropping `upload.lease_expires_ms = now + lease_ms;` from
/// `extend_lease` → the lease is not extended; dropping `require_open_and_live(&upload, now)?`
/// from it → an expired upload is renewed (both verified red).
#[tokio::test]
async fn renew_upload_extends_the_lease_by_the_shard_clock_and_refuses_once_it_ran_out() {
    let lease = Duration::from_secs(60);
    let f = manual_clock_fixture(4, lease);
    let up = begin(&f, "art", 4).await;
    f.clock.advance(Duration::from_secs(30));
    let renewed = f.shard.renew_upload(writer(), renew(&up)).await.unwrap();
    assert_eq!(
        renewed.lease_expires_ms,
        f.clock.now_ms() + lease.as_millis() as i64
    );
    assert!(renewed.lease_expires_ms > up.lease_expires_ms);
    // Past the first lease but within the renewed one: the upload is still live.
    f.clock.advance(Duration::from_secs(40));
    f.shard
        .put_block(writer(), block(&up, 0, b"abcd", "b0"))
        .await
        .unwrap();
    // put_block renewed the lease too; let that one run out as well.
    f.clock.advance(lease);
    let err = f
        .shard
        .renew_upload(writer(), renew(&up))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseExpired(_)), "{err:?}");
}

/// Mutations caught: dropping `claims.require(&upload.workspace, Role::Write)?` from
/// `extend_lease` → another workspace's token renews; dropping its
/// `require_open_and_live(..)?` → an aborted or committed upload is renewed (verified red).
#[tokio::test]
async fn renew_upload_refuses_an_aborted_or_committed_upload_and_another_workspaces_token() {
    let f = manual_clock_fixture(4, Duration::from_secs(60));
    let other = Claims {
        workspaces: vec!["other".into()],
        role: Role::Write,
        expires: u64::MAX,
    };
    let open = begin(&f, "open", 4).await;
    let err = f.shard.renew_upload(other, renew(&open)).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let mut forged = renew(&open);
    forged.upload_token = "00".repeat(32);
    let err = f.shard.renew_upload(writer(), forged).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");

    let aborted = begin(&f, "aborted", 4).await;
    f.shard
        .abort_upload(writer(), abort(&aborted, "ab"))
        .await
        .unwrap();
    let err = f
        .shard
        .renew_upload(writer(), renew(&aborted))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("aborted")),
        "{err:?}"
    );

    let committed = begin(&f, "committed", 4).await;
    f.shard
        .put_block(writer(), block(&committed, 0, b"abcd", "b0"))
        .await
        .unwrap();
    f.shard
        .commit_upload(writer(), commit(&committed, b"abcd", "c"))
        .await
        .unwrap();
    let err = f
        .shard
        .renew_upload(writer(), renew(&committed))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::FailedPrecondition(m) if m.contains("committed")),
        "{err:?}"
    );
}

/// Seed 000 guard fairness: the guard queue takes at most a page per pass, oldest-checked
/// first, and records each attempt before its I/O — so guards whose deletes keep failing go to
/// the back and can never starve a new deletable guard. 120 failing guards (more than a page),
/// then one new guard: it is deleted and settled by the very next pass.
/// Mutation caught: sorting the due guards by `last_attempt_ms` descending (red: the new guard
/// waits behind the failing ones).
#[tokio::test]
async fn a_new_guard_is_deleted_within_a_pass_even_behind_more_than_a_page_of_failing_ones() {
    const FAILING: u32 = 120;
    let f = fixture(4, Duration::from_secs(60));
    let stuck = begin(&f, "stuck", 4 * u64::from(FAILING)).await;
    for i in 0..FAILING {
        f.faults.refuse_next();
        f.shard
            .put_block(writer(), block(&stuck, i, b"abcd", &format!("s{i}")))
            .await
            .unwrap_err();
    }
    f.shard
        .abort_upload(writer(), abort(&stuck, "abort-stuck"))
        .await
        .unwrap();
    f.faults.fail_deletes_of_keys_containing(&stuck.upload_id);
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.failed_deletes, 100, "one page of guards per pass");

    let fresh = begin(&f, "fresh", 4).await;
    f.faults.refuse_next();
    f.shard
        .put_block(writer(), block(&fresh, 0, b"abcd", "f0"))
        .await
        .unwrap_err();
    f.shard
        .abort_upload(writer(), abort(&fresh, "abort-fresh"))
        .await
        .unwrap();
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.settled_guards, 1, "{pass:?}");
    assert_eq!(
        f.shard.counts().await.unwrap().guards,
        u64::from(FAILING),
        "only the failing guards are left"
    );
    assert_accounted(&f).await;
}

/// Seed 000: a PUT held past the upload's expiry lands late — its unknown-writer guard
/// deletes the late bytes, and a new upload of the same path, published meanwhile, is
/// unaffected (its own key is referenced, never deleted).
/// Mutation caught: removing the guard before the write when the attempt is cut off (the late
/// bytes would be unaccounted and never deleted).
#[tokio::test]
async fn a_put_held_past_the_lease_lands_late_and_its_guard_deletes_it_without_touching_the_new_upload()
 {
    let lease = Duration::from_secs(60);
    let f = manual_clock_fixture(4, lease);
    let old = begin(&f, "art", 4).await;
    f.faults.hold_creates();
    let s = f.shard.clone();
    let req = block(&old, 0, b"late", "late-0");
    let put = tokio::spawn(async move { s.put_block(writer(), req).await });
    within(f.faults.wait_held(1)).await;
    f.clock.advance(lease);
    within(put).await.unwrap().unwrap_err();
    let late_key = f.shard.gate.read(|r| Ok(r.guards()?)).await.unwrap()[0]
        .0
        .clone();
    // The held bytes land after all (the provider finished the request late).
    f.faults.release(1);
    assert!(matches!(
        f.provider.create(&late_key, b"late".to_vec().into()).await,
        crate::object::PutOutcome::Written
    ));

    // A new upload of the same path publishes meanwhile.
    let new = f
        .shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: "ws".into(),
            path: "art".into(),
            size: 4,
            request_id: "begin-new".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    f.shard
        .put_block(writer(), block(&new, 0, b"new!", "new-0"))
        .await
        .unwrap();
    f.shard
        .commit_upload(writer(), commit(&new, b"new!", "commit-new"))
        .await
        .unwrap();

    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.expired_uploads, 1, "{pass:?}");
    let keys = f.provider.list_keys().await.unwrap();
    assert!(!keys.contains(&late_key), "the late bytes were deleted");
    assert_eq!(
        keys.len(),
        1,
        "only the new upload's block is left: {keys:?}"
    );
    // The unknown writer's guard stays (bytes may land again), but its first successful
    // delete resolved the claimed upload. Mutation caught: dropping the `deleted_ms` arm of
    // the guard sweep's settle session (the upload stays Deleting, unresolved for ever —
    // what the chaos harness found after kill -9 mid-PutBlock).
    let counts = f.shard.counts().await.unwrap();
    assert_eq!((counts.unknown_guards, counts.deleting_uploads), (1, 0));
    assert_eq!(
        upload_state(&f, &old.upload_id).await,
        crate::meta::UploadState::Reclaimed
    );
    let m = f.shard.get_manifest("ws", "art").await.unwrap();
    assert_eq!(
        &f.shard
            .read_block("ws", m.revision, 0, &memory())
            .await
            .unwrap()[..],
        b"new!"
    );
    assert_accounted(&f).await;
}
