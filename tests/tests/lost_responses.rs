//! Lost responses, injected at the SDK: the server executes a PutBlock or CommitUpload, the
//! response never reaches the client, and the SDK retries with the same request id. Retries
//! must converge — the artifact is published exactly once, every block is written once — and
//! the artifact must restore byte-identical.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nokv_client::publish::PublishOptions;
use nokv_client::sdk::{LostResponses, RetryPolicy};
use nokv_client::{Client, Reason};
use nokv_proto::v1 as pb;
use nokv_tests::{Daemon, files_under, pseudo_random_bytes};
use sha2::{Digest, Sha256};

/// The server's block size (4 MiB).
const BLOCK: usize = 4 << 20;

/// Sums of the per-shard (entries, guards) counts of admin health.
async fn health_totals(client: &Client) -> (u64, u64) {
    let h = client.health().await.expect("admin health");
    h.shards
        .iter()
        .fold((0, 0), |(e, g), s| (e + s.entries, g + s.guards))
}

fn write_source(dir: &Path, seed: u64, len: usize) -> (PathBuf, Vec<u8>) {
    let data = pseudo_random_bytes(seed, len);
    let path = dir.join(format!("src-{seed}"));
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

async fn restore_bytes(client: &Client, ws: &str, path: &str, dir: &Path) -> Vec<u8> {
    let dest = dir.join(format!("restored-{}", path.replace('/', "_")));
    client
        .restore(ws, path, &dest, 4, None)
        .await
        .expect("restore");
    std::fs::read(&dest).unwrap()
}

#[track_caller]
fn assert_entry_matches(entry: &pb::Entry, data: &[u8], blocks: u32) {
    assert_eq!(entry.kind, pb::EntryKind::Artifact as i32, "{entry:?}");
    assert_eq!(entry.size, data.len() as u64, "{entry:?}");
    assert_eq!(entry.sha256, Sha256::digest(data).to_vec(), "{entry:?}");
    assert_eq!(entry.block_count, blocks, "{entry:?}");
}

/// The fault hook is real: with retries disabled, a lost CommitUpload response fails the
/// publish with a transport error although the server did publish. This is what the retry
/// tests below must recover from.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_commit_response_without_retries_fails_although_the_server_published() {
    let d = Daemon::start(&["--provider", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = write_source(dir.path(), 1, BLOCK + 1);
    let faults = LostResponses::default();
    faults.lose("commit_upload", 1);
    let client = d
        .sdk()
        .await
        .with_retry(RetryPolicy {
            attempts: 1,
            first_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        })
        .with_lost_responses(faults);

    let err = client
        .publish_file("ws", "a/b.bin", &src, PublishOptions::default())
        .await
        .expect_err("the commit response was lost and not retried");
    assert_eq!(err.reason, Reason::Transport, "{err:?}");
    assert!(err.message.contains("commit_upload"), "{err:?}");

    let entry = client.stat("ws", "a/b.bin").await.expect("stat");
    assert_entry_matches(&entry, &data, 2);
    assert_eq!(entry.generation, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_put_block_and_commit_responses_converge_to_one_publish_that_restores_identical() {
    // The local provider, so the objects written can be counted on disk.
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = write_source(dir.path(), 2, 3 * BLOCK + 7);
    let faults = LostResponses::default();
    faults.lose("put_block", 2);
    faults.lose("commit_upload", 1);
    let client = d.sdk().await.with_lost_responses(faults);

    let entry = client
        .publish_file("ws", "ckpt/step-100.bin", &src, PublishOptions::default())
        .await
        .expect("publish converges despite lost responses");
    assert_entry_matches(&entry, &data, 4);
    assert_eq!(entry.generation, 1, "published once: {entry:?}");

    let st = client.stat("ws", "ckpt/step-100.bin").await.expect("stat");
    assert_eq!(st.generation, 1, "published once, not twice: {st:?}");
    assert_eq!(st.revision, entry.revision);

    // Each block was written to the provider exactly once: a PutBlock re-executed instead of
    // replayed would have written a second object under a fresh attempt key.
    let objects = files_under(&d.data_dir().join("objects"));
    assert_eq!(objects.len(), 4, "block objects on disk: {objects:?}");
    // Nothing left half-done: one entry, no cleanup guards outstanding.
    assert_eq!(health_totals(&client).await, (1, 0));

    let restored = restore_bytes(&client, "ws", "ckpt/step-100.bin", dir.path()).await;
    assert!(restored == data, "restore is byte-identical");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_commit_whose_response_was_lost_returns_the_same_entry() {
    let d = Daemon::start(&["--provider", "memory"]);
    let dir = tempfile::tempdir().unwrap();
    let (src, data) = write_source(dir.path(), 3, 2 * BLOCK);
    let faults = LostResponses::default();
    faults.lose("commit_upload", 1);
    let client = d.sdk().await.with_lost_responses(faults);

    let entry = client
        .publish_file("ws", "out/report.bin", &src, PublishOptions::default())
        .await
        .expect("publish converges after a lost commit response");
    let st = client.stat("ws", "out/report.bin").await.expect("stat");
    // The replayed answer is the recorded one: same revision, generation, digests, time.
    assert_eq!(
        entry, st,
        "the retried commit's entry is the published entry"
    );
    assert_entry_matches(&st, &data, 2);
    assert_eq!(st.generation, 1);
    assert_eq!(health_totals(&client).await, (1, 0));

    let restored = restore_bytes(&client, "ws", "out/report.bin", dir.path()).await;
    assert!(restored == data, "restore is byte-identical");
}
