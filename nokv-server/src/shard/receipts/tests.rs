//! Receipt tests against a real redb store and an in-memory provider.

use std::sync::Arc;
use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::object::fault::{Faults, MemoryFake};
use crate::shard::{Shard, ShardConfig};
use crate::token::{Claims, Role, Signer};

/// Block size of these tests: three blocks for a 20-byte body.
const BLOCK: u64 = 8;

struct Fixture {
    _dir: tempfile::TempDir,
    shard: Arc<Shard>,
    provider: ObjectProvider,
}

fn fixture(cfg: ShardConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let provider = MemoryFake::new(Faults::default()).clean();
    let bulk = Arc::new(crate::bulk::Bulk::new(2, None).unwrap());
    let shard = Shard::open(1, meta, provider.clone(), bulk, Signer::new(b"k"), cfg);
    Fixture {
        _dir: dir,
        shard,
        provider,
    }
}

fn live_lease() -> ShardConfig {
    ShardConfig {
        block_size: BLOCK,
        upload_lease: Duration::from_secs(600),
        ..ShardConfig::default()
    }
}

fn writer() -> Claims {
    Claims {
        workspaces: vec!["ws".into()],
        role: Role::Write,
        expires: u64::MAX,
    }
}

const BODY: &[u8] = b"abcdefghijklmnopqrst";

fn begin_req(receipt: &str, path: &str, body: &[u8], rid: &str) -> pb::BeginUploadRequest {
    pb::BeginUploadRequest {
        workspace: "ws".into(),
        path: path.into(),
        size: body.len() as u64,
        request_id: rid.into(),
        receipt: receipt.into(),
        sha256: Sha256::digest(body).to_vec(),
    }
}

async fn begin(f: &Fixture, receipt: &str, rid: &str) -> pb::BeginUploadResponse {
    f.shard
        .begin_upload(begin_req(receipt, "out/a.bin", BODY, rid))
        .await
        .unwrap()
}

async fn put(f: &Fixture, up: &pb::BeginUploadResponse, index: u32) {
    let data = BODY.chunks(BLOCK as usize).nth(index as usize).unwrap();
    f.shard
        .put_block(
            writer(),
            pb::PutBlockRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                index,
                block_sha256: Vec::new(),
                block_crc32c: Some(nokv_proto::block_checksum::crc32c(data)),
                data: data.to_vec().into(),
                request_id: format!("put-{}-{index}", up.upload_id),
            },
        )
        .await
        .unwrap();
}

async fn commit(
    f: &Fixture,
    up: &pb::BeginUploadResponse,
    body: &[u8],
) -> crate::error::Result<pb::Entry> {
    f.shard
        .commit_upload(
            writer(),
            pb::CommitUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                sha256: Sha256::digest(body).to_vec(),
                request_id: format!("commit-{}", up.upload_id),
            },
        )
        .await
        .map(|c| c.entry.unwrap())
}

#[tokio::test]
async fn a_receipt_resumes_its_open_upload_and_names_the_blocks_already_recorded() {
    let f = fixture(live_lease());
    let first = begin(&f, "r1", "b1").await;
    assert!(first.recorded_blocks.is_empty());
    assert_eq!(first.block_count, 3);
    put(&f, &first, 0).await;
    put(&f, &first, 2).await;

    // The client died; its rerun begins again under the same receipt with a new request id.
    let again = begin(&f, "r1", "b2").await;
    assert_eq!(again.upload_id, first.upload_id, "the same upload resumes");
    assert_eq!(again.upload_token, first.upload_token);
    assert_eq!(again.recorded_blocks, [0, 2]);
    assert!(again.committed.is_none());
    assert!(again.lease_expires_ms >= first.lease_expires_ms);

    put(&f, &again, 1).await;
    let entry = commit(&f, &again, BODY).await.unwrap();
    assert_eq!(entry.size, BODY.len() as u64);
    assert_eq!(f.shard.counts().await.unwrap().uploads, 0);
}

#[tokio::test]
async fn a_committed_receipt_answers_the_published_entry_and_opens_no_upload() {
    let f = fixture(live_lease());
    let up = begin(&f, "r1", "b1").await;
    for i in 0..3 {
        put(&f, &up, i).await;
    }
    let published = commit(&f, &up, BODY).await.unwrap();
    let keys = f.provider.list_keys().await.unwrap().len();

    let rerun = begin(&f, "r1", "b2").await;
    assert_eq!(rerun.committed.as_ref(), Some(&published));
    assert!(rerun.upload_id.is_empty() && rerun.upload_token.is_empty());
    assert_eq!(
        f.shard.counts().await.unwrap().uploads,
        0,
        "no upload opened"
    );
    assert_eq!(
        f.provider.list_keys().await.unwrap().len(),
        keys,
        "nothing written"
    );
    let now = f.shard.stat("ws", "out/a.bin").await.unwrap();
    assert_eq!(now.generation, published.generation, "nothing republished");
}

#[tokio::test]
async fn a_receipt_refuses_another_file_and_changes_nothing() {
    let f = fixture(live_lease());
    let up = begin(&f, "r1", "b1").await;
    let other_body = b"ABCDEFGHIJKLMNOPQRST";
    for (what, req) in [
        (
            "other digest",
            begin_req("r1", "out/a.bin", other_body, "x1"),
        ),
        (
            "other size",
            begin_req("r1", "out/a.bin", &BODY[..19], "x2"),
        ),
        ("other path", begin_req("r1", "out/b.bin", BODY, "x3")),
    ] {
        let err = f.shard.begin_upload(req).await.unwrap_err();
        assert!(matches!(err, Error::RequestIdReused(_)), "{what}: {err:?}");
    }
    assert_eq!(
        f.shard.counts().await.unwrap().uploads,
        1,
        "no upload opened"
    );
    // The receipt still resumes its own upload.
    assert_eq!(begin(&f, "r1", "b2").await.upload_id, up.upload_id);
}

#[tokio::test]
async fn a_receipt_without_a_whole_file_sha256_is_refused() {
    let f = fixture(live_lease());
    let mut req = begin_req("r1", "out/a.bin", BODY, "b1");
    req.sha256.clear();
    let err = f.shard.begin_upload(req).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(f.shard.counts().await.unwrap().uploads, 0);
}

#[tokio::test]
async fn an_expired_receipt_upload_is_never_resumed_a_new_upload_starts_under_the_receipt() {
    // A zero lease: every upload is expired the moment it is begun.
    let f = fixture(ShardConfig {
        block_size: BLOCK,
        upload_lease: Duration::ZERO,
        ..ShardConfig::default()
    });
    let first = begin(&f, "r1", "b1").await;
    let second = begin(&f, "r1", "b2").await;
    assert_ne!(second.upload_id, first.upload_id);
    assert!(second.recorded_blocks.is_empty());

    // Once the reconciler claimed the old uploads, the receipt starts yet another one.
    f.shard.reconcile().await.unwrap();
    let third = begin(&f, "r1", "b3").await;
    assert_ne!(third.upload_id, first.upload_id);
    assert_ne!(third.upload_id, second.upload_id);
}

#[tokio::test]
async fn a_commit_under_a_receipt_must_declare_the_receipts_sha256() {
    let f = fixture(live_lease());
    let other = b"ABCDEFGHIJKLMNOPQRST";
    // Begun as BODY, but the blocks and the commit are those of another file of that size.
    let up = begin(&f, "r1", "b1").await;
    for (index, data) in other.chunks(BLOCK as usize).enumerate() {
        f.shard
            .put_block(
                writer(),
                pb::PutBlockRequest {
                    upload_id: up.upload_id.clone(),
                    upload_token: up.upload_token.clone(),
                    index: index as u32,
                    block_sha256: Vec::new(),
                    block_crc32c: Some(nokv_proto::block_checksum::crc32c(data)),
                    data: data.to_vec().into(),
                    request_id: format!("p{index}"),
                },
            )
            .await
            .unwrap();
    }
    let err = commit(&f, &up, other).await.unwrap_err();
    assert!(matches!(err, Error::DigestMismatch(_)), "{err:?}");
    assert!(matches!(
        f.shard.stat("ws", "out/a.bin").await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn a_receipt_is_forgotten_together_with_its_pruned_upload_history() {
    // A zero replay TTL: ended uploads are pruned at the first pruning pass.
    let f = fixture(ShardConfig {
        replay_ttl: Duration::ZERO,
        history_retention: Duration::ZERO,
        ..live_lease()
    });
    let up = begin(&f, "r1", "b1").await;
    for i in 0..3 {
        put(&f, &up, i).await;
    }
    commit(&f, &up, BODY).await.unwrap();
    assert!(begin(&f, "r1", "b2").await.committed.is_some());

    assert_eq!(f.shard.prune_uploads().await.unwrap(), 1);
    let after = begin(&f, "r1", "b3").await;
    assert!(
        after.committed.is_none(),
        "the receipt was pruned with its upload"
    );
    assert_ne!(after.upload_id, up.upload_id);
}
