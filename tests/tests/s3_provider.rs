//! The S3 provider against moto's S3 server, not only in memory: the object provider's
//! create-if-absent refuses an existing key and keeps its first bytes; a lost CommitUpload
//! response on an S3-backed daemon is replayed to one revision; and one reconciler pass
//! deletes collectable keys from the bucket (and only those).

use std::path::Path;

use bytes::Bytes;
use nokv_client::Client;
use nokv_client::publish::PublishOptions;
use nokv_client::sdk::LostResponses;
use nokv_server::meta::{MetaStore, Tables};
use nokv_server::object::{ObjectProvider, ProviderConfig, PutOutcome};
use nokv_server::shard::accounting::{KeyClass, Ledger};
use nokv_tests::{Daemon, Moto, pseudo_random_bytes};
use sha2::{Digest, Sha256};

/// The server's block size (4 MiB).
const BLOCK: usize = 4 << 20;
/// Key prefix the daemons of these tests write under.
const PREFIX: &str = "art";
/// moto accepts any credentials; the daemon needs some to sign its requests.
const CREDENTIALS: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
];

/// A fresh moto with one bucket.
fn moto_with_bucket(bucket: &str) -> Moto {
    let moto = Moto::start();
    moto.create_bucket(bucket);
    moto
}

/// The object provider on `bucket` in `moto` under [`PREFIX`], as the daemon opens it.
fn s3_provider(moto: &Moto, bucket: &str) -> ObjectProvider {
    ObjectProvider::open(
        &ProviderConfig::S3 {
            endpoint: Some(moto.endpoint()),
            bucket: bucket.into(),
            region: "us-east-1".into(),
            allow_http: true,
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
        },
        PREFIX,
    )
    .expect("open the S3 provider")
}

/// The daemon flags that point it at `bucket` in `moto` under [`PREFIX`], plus `extra`.
fn s3_args(moto: &Moto, bucket: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--provider",
        "s3",
        "--s3-endpoint",
        &moto.endpoint(),
        "--s3-bucket",
        bucket,
        "--s3-prefix",
        PREFIX,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Starts (or restarts) an S3-backed daemon on `dir`.
fn s3_daemon_in(dir: &Path, moto: &Moto, bucket: &str, extra: &[&str]) -> Daemon {
    let args = s3_args(moto, bucket, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_in_with_env(dir, &args, &CREDENTIALS)
}

/// Sums of the per-shard (entries, guards) counts of admin health.
async fn health_totals(client: &Client) -> (u64, u64) {
    let h = client.health().await.expect("admin health");
    h.shards
        .iter()
        .fold((0, 0), |(e, g), s| (e + s.entries, g + s.guards))
}

/// Classifies every key of `bucket` under [`PREFIX`] with the server's own accounting
/// ([`Ledger`], the classification `nokv admin audit` uses) read from the node file of the
/// stopped daemon's `data_dir` (keys are `PREFIX/sSHARD/u/UPLOAD/INDEX-ATTEMPT`); panics
/// naming any key none of them accounts for, which would be a leak nothing will ever delete.
fn account_bucket(moto: &Moto, bucket: &str, data_dir: &Path) -> Vec<(String, KeyClass)> {
    let mut out = Vec::new();
    let file = data_dir.join("shards").join("node.redb");
    let store = MetaStore::open_node(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    for key in moto.list_keys(bucket, PREFIX) {
        let parts: Vec<&str> = key.split('/').collect();
        let shard = match parts.as_slice() {
            [_, s, "u", _, _] => s.trim_start_matches('s'),
            _ => panic!("key outside the block layout: {key}"),
        };
        let shard: u32 = shard.parse().expect("shard number");
        let ledger = store
            .read_in(Tables::shard(shard), Ledger::read)
            .unwrap_or_else(|e| panic!("read shard {shard} of {}: {e}", file.display()));
        match ledger.classify(&key) {
            KeyClass::Unaccounted | KeyClass::CollectableButReferenced => {
                panic!(
                    "{key} is {:?}: leaked or live bytes queued for deletion",
                    ledger.classify(&key)
                )
            }
            class => out.push((key, class)),
        }
    }
    out
}

/// Asserts every key of the bucket is referenced (nothing guarded or waiting for deletion).
#[track_caller]
fn assert_every_key_referenced(moto: &Moto, bucket: &str, data_dir: &Path) {
    let accounted = account_bucket(moto, bucket, data_dir);
    assert!(
        accounted.iter().all(|(_, c)| *c == KeyClass::Referenced),
        "{accounted:?}"
    );
}

/// Publishes `len` pseudo-random bytes (from `seed`) to `ws:path`; returns the bytes.
async fn publish(
    client: &Client,
    dir: &Path,
    ws: &str,
    path: &str,
    seed: u64,
    len: usize,
) -> Vec<u8> {
    let data = pseudo_random_bytes(seed, len);
    let src = dir.join(format!("src-{seed}"));
    std::fs::write(&src, &data).unwrap();
    client
        .publish_file(ws, path, &src, PublishOptions::default())
        .await
        .expect("publish");
    data
}

/// Create-if-absent is the provider's only write, and what makes an attempt key unique: a
/// second create of a key must not replace it. The in-memory test proves this of
/// object_store's memory store; moto proves the S3 request (`If-None-Match: *`) carries it.
/// The refused create is classified like the in-memory one (`Unknown`: an S3 answer proves
/// nothing about what landed, so the attempt's guard stays).
///
/// Mutation caught (verified red): `mode: PutMode::Create` → `mode: PutMode::Overwrite` in
/// `ObjectProvider::create` (object.rs).
#[tokio::test(flavor = "multi_thread")]
async fn a_create_of_an_existing_key_on_s3_is_refused_and_the_first_bytes_stay() {
    // The provider's HTTP client needs the process's crypto provider, as in the daemon.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bucket = "nokv-create";
    let moto = moto_with_bucket(bucket);
    let provider = s3_provider(&moto, bucket);
    provider.check().await.expect("the bucket answers");
    let key = provider.block_key(0, "upload", 0, "attempt");

    assert_eq!(
        provider.create(&key, Bytes::from_static(b"first")).await,
        PutOutcome::Written
    );
    let second = provider.create(&key, Bytes::from_static(b"second")).await;
    assert_eq!(
        second,
        PutOutcome::Exists,
        "a second create of {key} must be refused as taken, not written"
    );
    assert_eq!(
        provider.get(&key).await.unwrap(),
        Bytes::from_static(b"first")
    );
    // Seen from outside the provider too: the bucket holds the first bytes under the key.
    assert_eq!(moto.list_keys(bucket, PREFIX), vec![key.clone()]);
    let (status, stored) = moto.s3("GET", &format!("/{bucket}/{key}"), b"");
    assert_eq!(status, 200, "GET {key}");
    assert_eq!(stored, b"first");
}

/// The provider log's fence on real S3 semantics (If-None-Match), as an ordered interleaving
/// (moto checks the condition, then writes: a true race would test moto, not us): the
/// deposed writer's next segment is refused once a taker's fence holds its key, and a reader
/// stops at the fence even though a later segment of the writer landed.
#[tokio::test(flavor = "multi_thread")]
async fn a_fence_in_a_log_stream_on_s3_refuses_the_deposed_writers_next_segment() {
    use nokv_server::provider_log::{Kind, LogError, Segment, StreamId, stream};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bucket = "nokv-log";
    let moto = moto_with_bucket(bucket);
    let provider = s3_provider(&moto, bucket);
    let id = StreamId {
        node: "n1".into(),
        incarnation: 9,
    };
    let segment = |first, last| Segment {
        kind: Kind::Records,
        node: "n1".into(),
        incarnation: 9,
        first,
        last,
        shards: vec![(2, 3)],
        body: vec![first as u8; 100],
    };
    stream::append(&provider, &id, &segment(1, 4))
        .await
        .unwrap();
    stream::append(&provider, &id, &segment(5, 5))
        .await
        .unwrap();
    // The writer's 6..=7 is in flight; 8..=9 lands first.
    stream::append(&provider, &id, &segment(8, 9))
        .await
        .unwrap();
    assert_eq!(
        stream::fence(&provider, &id, 1, "n2", 2, 4).await.unwrap(),
        6
    );
    match stream::append(&provider, &id, &segment(6, 7)).await {
        Err(LogError::Fenced { at: 6, by, .. }) => assert_eq!(by, "n2"),
        other => panic!("the deposed writer's segment was not refused: {other:?}"),
    }
    let tail = stream::read(&provider, &id, 1).await.unwrap();
    let ranges: Vec<(u64, u64)> = tail.segments.iter().map(|s| (s.first, s.last)).collect();
    assert_eq!(ranges, vec![(1, 4), (5, 5)]);
    assert_eq!(tail.fenced, Some((6, "n2".to_string())));
}

/// A CommitUpload executed on the S3-backed daemon whose response never reached the SDK is
/// retried with the same request id and answered from the recorded outcome: one revision,
/// generation 1, and the bucket holds exactly the artifact's blocks.
///
/// Mutation caught (verified red): deleting `if let Some(done) = key.recorded(w)? { return
/// done; }` in the commit session of `Shard::commit_upload` (shard/sequencer.rs): the retry
/// then meets a committed upload and the publish fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_commit_upload_response_on_s3_is_replayed_into_one_revision() {
    let bucket = "nokv-lost";
    let moto = moto_with_bucket(bucket);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = tempfile::tempdir().unwrap();
    let d = s3_daemon_in(data_dir.path(), &moto, bucket, &[]);
    let faults = LostResponses::default();
    faults.lose("commit_upload", 1);
    let client = d.sdk().await.with_lost_responses(faults);

    let data = pseudo_random_bytes(10, 2 * BLOCK + 3);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    let entry = client
        .publish_file("ws", "out/model.bin", &src, PublishOptions::default())
        .await
        .expect("publish converges after a lost commit response");
    let st = client.stat("ws", "out/model.bin").await.expect("stat");
    assert_eq!(entry, st, "the retried commit answers the published entry");
    assert_eq!(st.generation, 1, "published once: {st:?}");
    assert_eq!(st.sha256, Sha256::digest(&data).to_vec());
    assert_eq!(
        health_totals(&client).await,
        (1, 0),
        "one entry, no guards left"
    );
    assert_eq!(
        moto.list_keys(bucket, PREFIX).len(),
        3,
        "the bucket holds the artifact's three blocks, each once"
    );

    let dest = dir.path().join("restored");
    client
        .restore("ws", "out/model.bin", &dest, 4, None)
        .await
        .expect("restore");
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "restore is byte-identical"
    );
    drop(client);
    assert!(d.terminate().success());
    assert_every_key_referenced(&moto, bucket, data_dir.path());
}

/// Replacing an artifact makes its old blocks collectable once the retired grace ends; one
/// reconciler pass deletes exactly those keys from the bucket and keeps the live ones. The
/// daemon is restarted with `--retired-grace 0s` to trigger the pass deterministically (the
/// reconciler's first pass runs at start-up); until then the default grace keeps the old
/// revision, so no earlier pass can have collected anything.
///
/// Mutations caught (verified red): in `Shard::collect_keys` (shard/reconciler.rs),
/// `match self.object.delete(&key).await` → `match Ok::<(), crate::object::ObjectError>(())`
/// (the keys are forgotten but stay in the bucket: red at the accounting, "leaked"); in
/// `Shard::release_retired`, deleting `w.add_collectable(&b.key, *rev)?;` (the revision is
/// dropped, its keys never collected: red at the pass's counts).
#[tokio::test(flavor = "multi_thread")]
async fn one_reconciler_pass_deletes_the_collectable_keys_of_a_replaced_artifact_from_s3() {
    let bucket = "nokv-reconcile";
    let moto = moto_with_bucket(bucket);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = tempfile::tempdir().unwrap();

    let d = s3_daemon_in(data_dir.path(), &moto, bucket, &[]);
    let client = d.sdk().await;
    publish(&client, dir.path(), "ws", "ckpt.bin", 20, BLOCK + 1).await;
    let old_keys = moto.list_keys(bucket, PREFIX);
    assert_eq!(old_keys.len(), 2, "{old_keys:?}");
    let new = publish(&client, dir.path(), "ws", "ckpt.bin", 21, 7).await;
    let mut live_keys = moto.list_keys(bucket, PREFIX);
    live_keys.retain(|k| !old_keys.contains(k));
    assert_eq!(
        live_keys.len(),
        1,
        "the replacement's one block: {live_keys:?}"
    );
    drop(client);
    assert!(d.terminate().success());
    // The default grace kept the replaced revision readable: nothing was collected yet, and
    // all three keys belong to a revision (the retired one or the live one).
    assert_eq!(moto.list_keys(bucket, PREFIX).len(), 3);
    assert_every_key_referenced(&moto, bucket, data_dir.path());

    let mut d = s3_daemon_in(data_dir.path(), &moto, bucket, &["--retired-grace", "0s"]);
    let pass = d.wait_for_log_line("reconciled");
    assert!(
        pass.contains("released_revisions: 1") && pass.contains("deleted_keys: 2"),
        "one pass released the old revision and deleted its two keys: {pass}"
    );
    assert!(pass.contains("failed_deletes: 0"), "{pass}");

    let client = d.sdk().await;
    assert_eq!(
        health_totals(&client).await,
        (1, 0),
        "one entry, no guards left"
    );
    let dest = dir.path().join("restored");
    client
        .restore("ws", "ckpt.bin", &dest, 4, None)
        .await
        .expect("the live artifact still restores");
    assert!(
        std::fs::read(&dest).unwrap() == new,
        "restore is byte-identical"
    );
    drop(client);
    assert!(d.terminate().success());
    // Every key left in the bucket is the live revision's: the metadata forgot no key it
    // left behind, and the pass deleted every key it forgot.
    assert_every_key_referenced(&moto, bucket, data_dir.path());
    assert_eq!(moto.list_keys(bucket, PREFIX), live_keys);
}
