//! Issue 45, item 6: with provider durability a reconciler delete follows the session that made
//! the key collectable only once that session is durable in the provider. The reconciler reads
//! the state readers see, and a batch is shown only after its log segment (and every earlier
//! one) exists: while the segment of a delete is held at the (fault-injecting, fake) provider,
//! a reconciler pass deletes nothing; once it lands, a pass deletes the released block.
//! Verified red by answering rounds without waiting for their segment's send.

use std::sync::Arc;
use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::meta::{MetaStore, Tables};
use crate::object::fault::{Faults, MemoryFake};
use crate::provider_log::{LogWriter, StreamId};
use crate::shard::fence::Fence;
use crate::shard::gate::{Committer, Gate};
use crate::shard::{Shard, ShardConfig};
use crate::token::{Claims, Role, Signer};

fn rid(what: &str) -> String {
    format!("{what}-{}", crate::ids::random_hex(4))
}

fn writer() -> Claims {
    Claims {
        workspaces: vec!["*".into()],
        role: Role::Write,
        expires: u64::MAX,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_deletes_a_released_block_only_after_the_release_is_durable_in_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Faults::default();
    let provider = MemoryFake::new(faults.clone()).faulty();
    // Several segments in flight, as `--log-segments-in-flight` allows: a later session's
    // segment does not queue behind the held one, so nothing but the rule under test keeps
    // the pass from seeing the delete.
    let log = Arc::new(LogWriter::with_in_flight(
        provider.clone(),
        tokio::runtime::Handle::current(),
        Duration::ZERO,
        4,
    ));
    log.begin(StreamId {
        node: "n1".into(),
        incarnation: 1,
    });
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let committer = Committer::start_with(meta, "t".into(), Some(log));
    let gate = Gate::on(committer, Tables::canonical(), Fence::local(5));
    let cfg = ShardConfig {
        block_size: 8,
        upload_lease: Duration::from_secs(600),
        retired_grace: Duration::ZERO,
        ..ShardConfig::default()
    };
    let bulk = Arc::new(crate::bulk::Bulk::new(2, None).unwrap());
    let shard = Shard::on(5, gate, provider, bulk, Signer::new(b"k"), cfg);

    // An artifact of one block.
    let body = b"8 bytes!";
    let up = shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: "ws".into(),
            path: "a.bin".into(),
            size: 8,
            request_id: rid("begin"),
            ..Default::default()
        })
        .await
        .unwrap();
    shard
        .put_block(
            writer(),
            pb::PutBlockRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                index: 0,
                block_sha256: Vec::new(),
                block_crc32c: Some(nokv_proto::block_checksum::crc32c(body)),
                data: body.to_vec().into(),
                request_id: rid("put"),
            },
        )
        .await
        .unwrap();
    shard
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
        .unwrap();

    // Settle what the upload left to reconcile, so the pass below has only the delete to find.
    shard.reconcile().await.unwrap();

    // Its delete commits locally, but its segment is held at the provider.
    faults.hold_creates();
    let deleting = {
        let shard = shard.clone();
        tokio::spawn(async move {
            shard
                .delete(pb::DeleteRequest {
                    workspace: "ws".into(),
                    path: "a.bin".into(),
                    request_id: rid("delete"),
                    ..Default::default()
                })
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), faults.wait_held(1))
        .await
        .expect("the delete's segment never reached the provider");
    // A reconciler pass now reads the state readers see: the delete is not in it yet, so the
    // pass finds nothing to do and ends without a write session of its own.
    let pass = tokio::time::timeout(Duration::from_secs(30), shard.reconcile())
        .await
        .expect("a pass with nothing to collect waited")
        .unwrap();
    assert_eq!(pass.deleted_keys, 0);
    assert_eq!(
        faults.deletes(),
        0,
        "a block was deleted before the session releasing it was durable in the provider"
    );

    // Once the segments land, the delete is acknowledged and a pass deletes the block.
    faults.release(1000);
    deleting.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while faults.deletes() == 0 {
            shard.reconcile().await.unwrap();
        }
    })
    .await
    .expect("the released block was never deleted");
}
