//! Small-file operations on a real shard: a retried mutation answers what its first attempt
//! answered, even when the state changed in between (see [`super::super::replay`]).

use std::sync::Arc;

use nokv_proto::v1 as pb;

use crate::error::Error;
use crate::meta::MetaStore;
use crate::object::fault::{Faults, MemoryFake};
use crate::shard::{Shard, ShardConfig};
use crate::token::Signer;

/// A shard on a fresh store; small files never reach the provider, so it is in memory.
fn shard() -> (tempfile::TempDir, Arc<Shard>) {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let provider = MemoryFake::new(Faults::default()).clean();
    let bulk = Arc::new(crate::bulk::Bulk::new(1, None).unwrap());
    let shard = Shard::open(
        0,
        meta,
        provider,
        bulk,
        Signer::new(b"k"),
        ShardConfig::default(),
    );
    (dir, shard)
}

fn write(path: &str, data: &[u8], mode: pb::WriteMode, if_gen: u64, id: &str) -> pb::WriteRequest {
    pb::WriteRequest {
        workspace: "ws".into(),
        path: path.into(),
        data: data.to_vec().into(),
        mode: mode as i32,
        if_generation: if_gen,
        request_id: id.into(),
    }
}

fn rm(path: &str, if_gen: u64, id: &str) -> pb::DeleteRequest {
    pb::DeleteRequest {
        workspace: "ws".into(),
        path: path.into(),
        if_generation: if_gen,
        request_id: id.into(),
    }
}

async fn body(shard: &Shard, path: &str) -> Vec<u8> {
    shard.read("ws", path).await.unwrap().data.to_vec()
}

// Catches: refusals not recorded for replay — `execute` answering `Ok(Err(e))` without its
// `w.put_replay`, or `refusal_record` returning `None` for `NotFound`; the retry would then
// delete the file created in between. (Verified red.)
#[tokio::test]
async fn a_retried_rm_that_was_refused_not_found_stays_not_found_after_the_file_is_created() {
    let (_d, shard) = shard();
    let err = shard.delete(rm("a", 0, "rm-1")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");

    let created = shard
        .write(write("a", b"new", pb::WriteMode::CreateOnly, 0, "w-1"))
        .await
        .unwrap();

    let err = shard.delete(rm("a", 0, "rm-1")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    let entry = shard.stat("ws", "a").await.unwrap();
    assert_eq!(
        Some(&entry),
        created.entry.as_ref(),
        "the retry changed nothing"
    );
}

// Catches: the same two mutations as above for `GenerationMismatch`, and
// `refusal_from_record` losing the recorded generations. The retry would otherwise delete
// the file, whose generation now matches. (Verified red.)
#[tokio::test]
async fn a_retried_rm_refused_for_a_stale_generation_stays_refused_after_the_generation_matches() {
    let (_d, shard) = shard();
    let v1 = shard
        .write(write("a", b"one", pb::WriteMode::Upsert, 0, "w-1"))
        .await
        .unwrap()
        .entry
        .unwrap();
    let target = v1.generation + 1;
    let err = shard.delete(rm("a", target, "rm-1")).await.unwrap_err();
    let refused = |e: &Error| {
        matches!(e, Error::GenerationMismatch { expected, current }
            if *expected == target && *current == v1.generation)
    };
    assert!(refused(&err), "{err:?}");

    let v2 = shard
        .write(write("a", b"two", pb::WriteMode::Upsert, 0, "w-2"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(v2.generation, target, "the state now allows the rm");

    let err = shard.delete(rm("a", target, "rm-1")).await.unwrap_err();
    assert!(
        refused(&err),
        "the retry answers what the first attempt got: {err:?}"
    );
    assert_eq!(body(&shard, "a").await, b"two");
}

// Catches: as above, for a conditional write: the retry would overwrite the file whose
// generation now matches. (Verified red.)
#[tokio::test]
async fn a_retried_conditional_write_refused_for_a_stale_generation_stays_refused_after_the_generation_matches()
 {
    let (_d, shard) = shard();
    let v1 = shard
        .write(write("a", b"one", pb::WriteMode::CreateOnly, 0, "w-1"))
        .await
        .unwrap()
        .entry
        .unwrap();
    let target = v1.generation + 1;
    let stale = || write("a", b"late", pb::WriteMode::IfGeneration, target, "w-late");
    let err = shard.write(stale()).await.unwrap_err();
    assert!(matches!(err, Error::GenerationMismatch { .. }), "{err:?}");

    shard
        .write(write("a", b"two", pb::WriteMode::Upsert, 0, "w-2"))
        .await
        .unwrap();

    let err = shard.write(stale()).await.unwrap_err();
    assert!(
        matches!(err, Error::GenerationMismatch { expected, current }
            if expected == target && current == v1.generation),
        "{err:?}"
    );
    assert_eq!(body(&shard, "a").await, b"two");
}
