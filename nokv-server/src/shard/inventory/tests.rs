//! Inventory tests against a real redb store and the local-filesystem provider (whose
//! listings come in no particular order, so paging must sort).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Scope, Step};
use crate::meta::{GuardRecord, MetaStore, WriterState};
use crate::object::{ObjectProvider, ProviderConfig, PutOutcome};
use crate::shard::clock::Clock;
use crate::shard::{Shard, ShardConfig};
use crate::token::Signer;

const SCOPE: Scope = Scope::OwnAndForeign { shard_count: 2 };

fn provider(dir: &Path) -> ObjectProvider {
    ObjectProvider::open(
        &ProviderConfig::Local {
            root: dir.join("objects"),
        },
        "pfx",
    )
    .unwrap()
}

/// Shard 0 on the store file in `dir` (created on first use, reopened after).
fn open_shard(dir: &Path, clock: &Clock) -> Arc<Shard> {
    let file = dir.join("s.redb");
    let meta = if file.exists() {
        MetaStore::open(&file).unwrap()
    } else {
        MetaStore::create(&file).unwrap()
    };
    Shard::open_with_clock(
        0,
        meta,
        provider(dir),
        Arc::new(crate::bulk::Bulk::new(1, None).unwrap()),
        Signer::new(b"k"),
        ShardConfig::default(),
        clock.clone(),
    )
}

async fn put(p: &ObjectProvider, key: &str) {
    assert_eq!(
        p.create(key, Bytes::from_static(b"bytes")).await,
        PutOutcome::Written
    );
}

/// Pages until the running scan completes; returns how many pages that took. A scan that
/// does not complete within far more pages than these tests' objects fails the test.
async fn finish(shard: &Shard, limit: usize) -> usize {
    let mut pages = 0;
    loop {
        assert!(
            pages < 1000,
            "the scan never completes (is it advancing its cursor?)"
        );
        match shard.inventory_page(SCOPE, limit).await.unwrap() {
            Step::Idle => return pages,
            Step::Page { last } => {
                pages += 1;
                if last {
                    return pages;
                }
            }
        }
    }
}

async fn scan(shard: &Shard, limit: usize) {
    assert!(shard.start_inventory().await.unwrap());
    finish(shard, limit).await;
}

async fn observed(shard: &Shard) -> BTreeSet<String> {
    shard
        .quarantine(None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

// Catches: quarantining checkpoints or another shard's keys, missing foreign keys, and any
// delete of an observed object.
#[tokio::test]
async fn a_foreign_object_is_quarantined_and_still_exists_after_several_scans() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let shard = open_shard(dir.path(), &clock);
    let p = provider(dir.path());
    let stray = p.block_key(0, "stray", 0, "a");
    let guarded = p.block_key(0, "up", 0, "b");
    let others = p.block_key(1, "up", 0, "c");
    let foreign = ["pfx/loose.bin", "pfx/s0007/x", "pfx/zzz/deep/y"];
    for key in [&stray, &guarded, &others]
        .into_iter()
        .map(String::as_str)
        .chain(foreign)
    {
        put(&p, key).await;
    }
    put(&p, &p.checkpoint_key(0, 1)).await;
    let g = guarded.clone();
    shard
        .gate
        .write(move |w| {
            let rec = GuardRecord {
                upload_id: "up".into(),
                writer: WriterState::Unknown as i32,
                ..Default::default()
            };
            Ok(w.put_guard(&g, &rec)?)
        })
        .await
        .unwrap();

    let want: BTreeSet<String> = foreign
        .iter()
        .map(|k| k.to_string())
        .chain([stray.clone()])
        .collect();
    let mut first_seen = None;
    for _ in 0..3 {
        scan(&shard, 2).await;
        clock.advance(Duration::from_secs(60));
        assert_eq!(observed(&shard).await, want);
        let rec = shard
            .quarantine(None, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|(k, _)| *k == stray)
            .unwrap()
            .1;
        assert_eq!(rec.size, 5);
        assert_eq!(
            *first_seen.get_or_insert(rec.first_seen_ms),
            rec.first_seen_ms
        );
        for key in &want {
            assert!(p.get(key).await.is_ok(), "{key} was deleted");
        }
    }
    let status = shard.inventory_status().await.unwrap();
    assert_eq!(status.quarantined, 4);
    assert_eq!(status.record.completed, 3);
    assert!(!status.record.running);
}

// Catches: a page that lists from the start instead of after the stored cursor (objects
// would be counted twice), and a cursor committed apart from its page.
#[tokio::test]
async fn a_scan_stopped_between_pages_resumes_after_a_restart_from_its_stored_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let p = provider(dir.path());
    for i in 0..7 {
        put(&p, &p.block_key(0, "stray", i, "a")).await;
    }
    {
        let shard = open_shard(dir.path(), &clock);
        assert!(shard.start_inventory().await.unwrap());
        for _ in 0..2 {
            assert_eq!(
                shard.inventory_page(SCOPE, 2).await.unwrap(),
                Step::Page { last: false }
            );
        }
        // Idempotent: a running scan is not restarted.
        assert!(!shard.start_inventory().await.unwrap());
        assert_eq!(observed(&shard).await.len(), 4);
    }
    // The process is gone; a new one opens the same store.
    let shard = open_shard(dir.path(), &clock);
    let before = shard.inventory_status().await.unwrap().record;
    assert!(before.running && !before.cursor.is_empty());
    assert_eq!((before.pages, before.objects), (2, 4));
    assert_eq!(finish(&shard, 2).await, 2, "two more pages: 2 + 1 objects");
    let after = shard.inventory_status().await.unwrap().record;
    assert_eq!((after.pages, after.objects, after.completed), (4, 7, 1));
    assert_eq!(observed(&shard).await.len(), 7);
}

// Catches: sweeping absence (or pruning stale observations) before the final page, and a
// completed scan that does not remove what it no longer saw.
#[tokio::test]
async fn an_incomplete_scan_never_removes_an_observation_or_marks_anything_absent() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let shard = open_shard(dir.path(), &clock);
    let p = provider(dir.path());
    let keys: Vec<String> = (0..4).map(|i| p.block_key(0, "stray", i, "a")).collect();
    for k in &keys {
        put(&p, k).await;
    }
    scan(&shard, 2).await;
    assert_eq!(observed(&shard).await.len(), 4);
    let completed_at = shard
        .inventory_status()
        .await
        .unwrap()
        .record
        .last_completed_ms;

    // Two objects go; a later scan has seen one page when it stops.
    p.delete(&keys[0]).await.unwrap();
    p.delete(&keys[3]).await.unwrap();
    clock.advance(Duration::from_secs(3600));
    assert!(shard.start_inventory().await.unwrap());
    assert_eq!(
        shard.inventory_page(SCOPE, 1).await.unwrap(),
        Step::Page { last: false }
    );
    assert_eq!(observed(&shard).await.len(), 4, "nothing marked absent");
    // Not even retention runs from an incomplete scan: everything is "stale" by now.
    assert_eq!(shard.prune_quarantine(Duration::ZERO).await.unwrap(), 0);
    assert_eq!(observed(&shard).await.len(), 4);
    let rec = shard.inventory_status().await.unwrap().record;
    assert_eq!(rec.last_completed_ms, completed_at);
    assert_eq!(rec.completed, 1);

    // Complete: the absent ones go, the present ones stay.
    finish(&shard, 1).await;
    let want: BTreeSet<String> = [keys[1].clone(), keys[2].clone()].into();
    assert_eq!(observed(&shard).await, want);
}

// Catches: keeping an observation of a key that is now accounted for until some complete
// scan (the page that sees it accounted for is evidence enough).
#[tokio::test]
async fn an_observation_whose_key_becomes_accounted_for_is_removed_by_the_next_page_that_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let shard = open_shard(dir.path(), &clock);
    let p = provider(dir.path());
    let key = p.block_key(0, "a-late", 0, "a");
    let stray = p.block_key(0, "b-stray", 0, "a");
    put(&p, &key).await;
    put(&p, &stray).await;
    scan(&shard, 10).await;
    assert_eq!(observed(&shard).await.len(), 2);
    let k = key.clone();
    shard
        .gate
        .write(move |w| Ok(w.add_collectable(&k, 0)?))
        .await
        .unwrap();
    assert!(shard.start_inventory().await.unwrap());
    // One page of one object: the scan is still running.
    assert_eq!(
        shard.inventory_page(SCOPE, 1).await.unwrap(),
        Step::Page { last: false }
    );
    assert_eq!(observed(&shard).await, [stray.clone()].into());
    finish(&shard, 1).await;
    assert_eq!(observed(&shard).await, [stray].into());
    assert!(p.get(&key).await.is_ok(), "the scan deletes nothing");
}

// Catches: pruning observations that were seen recently, or pruning while idle not at all.
#[tokio::test]
async fn stale_observations_are_pruned_once_not_seen_for_the_retention_while_no_scan_runs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual();
    let shard = open_shard(dir.path(), &clock);
    let p = provider(dir.path());
    let old = p.block_key(0, "old", 0, "a");
    put(&p, &old).await;
    scan(&shard, 10).await;
    clock.advance(Duration::from_secs(40 * 86400));
    let fresh = p.block_key(0, "fresh", 0, "a");
    put(&p, &fresh).await;
    // Seen by a scan that has not completed yet: observed, but the old one is not re-seen.
    assert!(shard.start_inventory().await.unwrap());
    shard.inventory_page(SCOPE, 1).await.unwrap();
    let observed_now = observed(&shard).await;
    assert!(observed_now.contains(&fresh) && observed_now.contains(&old));
    let retention = Duration::from_secs(30 * 86400);
    assert_eq!(
        shard.prune_quarantine(retention).await.unwrap(),
        0,
        "scan runs"
    );
    finish(&shard, 1).await;
    // Both were seen by the completed scan; nothing is stale now.
    assert_eq!(shard.prune_quarantine(retention).await.unwrap(), 0);
    clock.advance(Duration::from_secs(31 * 86400));
    assert_eq!(shard.prune_quarantine(retention).await.unwrap(), 2);
    assert!(observed(&shard).await.is_empty());
    assert!(p.get(&old).await.is_ok() && p.get(&fresh).await.is_ok());
}
