//! Shard checkpoints against moto's S3 server: the handoff mechanism (snapshot, upload,
//! verified download, install) through a real S3 API rather than a file system, with the
//! checkpoint stored under `<prefix>/meta/<shard>/ckpt/` beside the block keys.

use std::sync::Arc;

use nokv_proto::v1 as pb;
use nokv_server::error::Error;
use nokv_server::meta::MetaStore;
use nokv_server::object::{ObjectProvider, ProviderConfig};
use nokv_server::shard::checkpoint::{self, Checkpoint};
use nokv_server::shard::{Shard, ShardConfig};
use nokv_server::token::Signer;
use nokv_tests::Moto;

const PREFIX: &str = "art";

// Catches: a checkpoint that does not survive the S3 round trip (wrong key layout, a size or
// digest recorded for other bytes than were uploaded), and a restore that installs a
// checkpoint whose declared digest is wrong.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_uploaded_to_s3_restores_every_entry_on_another_node_and_a_wrong_digest_is_refused()
 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let moto = Moto::start();
    moto.create_bucket("nokv-ckpt");
    let cfg = ProviderConfig::S3 {
        endpoint: Some(moto.endpoint()),
        bucket: "nokv-ckpt".into(),
        region: "us-east-1".into(),
        allow_http: false,
        access_key_id: Some("test".into()),
        secret_access_key: Some("test".into()),
    };
    let provider = ObjectProvider::open(&cfg, PREFIX).unwrap();

    let owner = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&owner.path().join("0002.redb")).unwrap();
    let bulk = Arc::new(nokv_server::bulk::Bulk::new(1, None).unwrap());
    let shard = Shard::open(
        2,
        meta,
        provider.clone(),
        bulk,
        Signer::new(b"k"),
        ShardConfig::default(),
    );
    for i in 0..20 {
        shard
            .write(pb::WriteRequest {
                workspace: "ws".into(),
                path: format!("f{i}"),
                data: format!("body {i}").into_bytes().into(),
                request_id: format!("w{i}"),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    let scratch = owner.path().join("0002.ckpt");
    let ckpt = checkpoint::take(&shard, &provider, 3, &scratch)
        .await
        .unwrap();
    assert!(!scratch.exists());
    let keys = moto.list_keys("nokv-ckpt", PREFIX);
    assert_eq!(keys, vec![ckpt.key.clone()]);
    assert!(ckpt.key.starts_with("art/meta/0002/ckpt/"), "{}", ckpt.key);

    let next = tempfile::tempdir().unwrap();
    let dest = next.path().join("0002.redb");
    let wrong = Checkpoint {
        sha256: "00".repeat(32),
        ..ckpt.clone()
    };
    let err = checkpoint::restore(&provider, &wrong, &dest)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
    assert!(!dest.exists(), "a refused checkpoint installs nothing");

    checkpoint::restore(&provider, &ckpt, &dest).await.unwrap();
    let restored = MetaStore::open(&dest).unwrap();
    for i in 0..20 {
        let name = format!("f{i}");
        let body = restored.read(|r| r.inline("ws", &name)).unwrap();
        assert_eq!(body, Some(format!("body {i}").into_bytes()), "{name}");
    }

    checkpoint::discard(&provider, &ckpt.key).await.unwrap();
    assert!(moto.list_keys("nokv-ckpt", PREFIX).is_empty());
}
