//! Ledger tests against a real redb store and the fault-injecting in-memory provider.

use std::time::Duration;

use super::*;
use crate::meta::GuardRecord;
use crate::shard::ShardConfig;
use crate::shard::accounting::KeyClass;
use crate::shard::clock::Clock;
use crate::shard::fixture::{Fixture, shard_on};

fn fixture(id: u32, cfg: ShardConfig) -> Fixture {
    shard_on(id, cfg, Clock::manual())
}

fn attempts(n: u32) -> ShardConfig {
    ShardConfig {
        delete_attempts: n,
        ..ShardConfig::default()
    }
}

/// Writes `key` to the provider and queues its delete; returns the operation id.
async fn queued(f: &Fixture, key: &str) -> u64 {
    assert_eq!(
        f.provider
            .create(key, bytes::Bytes::from_static(b"abcd"))
            .await,
        crate::object::PutOutcome::Written
    );
    let (k, now) = (key.to_string(), f.clock.now_ms());
    f.shard
        .gate
        .write(move |w| Ok(w.queue_delete(&k, "ws", 4, now)?))
        .await
        .unwrap()
}

async fn state_of(f: &Fixture, id: u64) -> OpState {
    f.shard.ledger_row(id).await.unwrap().unwrap().state
}

fn count(c: &crate::meta::Counts, st: OpState) -> u64 {
    c.operations[OpState::ALL.iter().position(|s| *s == st).unwrap()]
}

/// Mutation: `op.attempts >= max_attempts` → `false` in `record_attempt` (never dead-letters).
#[tokio::test]
async fn a_delete_failing_delete_attempts_times_becomes_a_dead_letter_and_leaves_the_queue() {
    let f = fixture(0, attempts(3));
    let id = queued(&f, "t/k1").await;
    f.faults.fail_next_deletes(3);
    for _ in 0..3 {
        f.shard.reconcile().await.unwrap();
    }
    assert_eq!(state_of(&f, id).await, OpState::DeadLetter);
    let row = f.shard.ledger_row(id).await.unwrap().unwrap();
    assert_eq!(row.attempts, 3);
    assert!(!row.last_error.contains("k1"), "secret-free: {row:?}");
    let c = f.shard.counts().await.unwrap();
    assert_eq!((c.collectable, count(&c, OpState::DeadLetter)), (0, 1));
    // Out of the automatic queue: the provider is healthy again, yet a pass leaves it alone.
    let pass = f.shard.reconcile().await.unwrap();
    assert_eq!(pass.deleted_keys, 0);
    assert_eq!(f.provider.list_keys().await.unwrap(), ["t/k1"]);
    // Its accounting stays: the key is still a delete intent, not leaked.
    let ledger = f.shard.ledger().await.unwrap();
    assert_eq!(ledger.classify("t/k1"), KeyClass::Collectable);
}

/// Mutation: `Attempt::Absent => op.state = DeleteState::Deleted` removed from
/// `record_attempt` (the retry would answer provider_error and keep the dead letter).
#[tokio::test]
async fn a_retry_after_the_outage_completes_deletes_the_key_and_releases_the_accounting() {
    let f = fixture(0, attempts(1));
    let id = queued(&f, "t/k1").await;
    f.faults.fail_next_deletes(2);
    f.shard.reconcile().await.unwrap();
    assert_eq!(state_of(&f, id).await, OpState::DeadLetter);
    // Still in the outage: provider_error, one more attempt, still a dead letter.
    assert_eq!(
        f.shard.retry_cleanup(id).await.unwrap(),
        RetryResult::ProviderError
    );
    let row = f.shard.ledger_row(id).await.unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (OpState::DeadLetter, 2));
    // After the outage.
    assert_eq!(
        f.shard.retry_cleanup(id).await.unwrap(),
        RetryResult::Completed
    );
    assert!(f.provider.list_keys().await.unwrap().is_empty());
    let c = f.shard.counts().await.unwrap();
    assert_eq!(
        (count(&c, OpState::DeadLetter), count(&c, OpState::Deleted)),
        (0, 1)
    );
    assert_eq!(c.oldest_unresolved_ms, None);
    assert_eq!(
        f.shard.ledger().await.unwrap().classify("t/k1"),
        KeyClass::Unaccounted,
        "no record holds the key any more"
    );
    // Idempotent: repeating it answers completed and does nothing.
    let deletes = f.faults.deletes();
    assert_eq!(
        f.shard.retry_cleanup(id).await.unwrap(),
        RetryResult::Completed
    );
    assert_eq!(f.faults.deletes(), deletes);
}

/// Mutation: `if !self.retries.begin(id)` → `if false` (both calls delete and settle; the
/// provider sees two deletes).
#[tokio::test]
async fn two_concurrent_retries_settle_once() {
    let f = fixture(0, attempts(1));
    let id = queued(&f, "t/k1").await;
    f.faults.fail_next_deletes(1);
    f.shard.reconcile().await.unwrap();
    let before = f.faults.deletes();
    let (a, b) = tokio::join!(f.shard.retry_cleanup(id), f.shard.retry_cleanup(id));
    let mut results = vec![a.unwrap(), b.unwrap()];
    results.sort_by_key(|r| r.name());
    assert_eq!(
        results,
        [RetryResult::AlreadyInProgress, RetryResult::Completed]
    );
    assert_eq!(f.faults.deletes() - before, 1, "one provider delete");
    let c = f.shard.counts().await.unwrap();
    assert_eq!(
        (count(&c, OpState::Deleted), count(&c, OpState::DeadLetter)),
        (1, 0)
    );
}

/// Caller cancellation: a retry whose caller goes away still records its outcome, so the
/// attempt it made is never lost nor double-counted.
/// Mutation: awaiting the provider work inline instead of in the spawned task.
#[tokio::test]
async fn a_cancelled_retry_still_records_its_outcome() {
    let f = fixture(0, attempts(1));
    let id = queued(&f, "t/k1").await;
    f.faults.fail_next_deletes(1);
    f.shard.reconcile().await.unwrap();
    // Poll the retry once (it spawns its task and waits), then drop it: the caller left.
    {
        let call = f.shard.retry_cleanup(id);
        tokio::pin!(call);
        let _ = futures::poll!(call.as_mut());
    }
    // The task finishes on its own; a second retry either joins it or sees it settled.
    loop {
        match f.shard.retry_cleanup(id).await.unwrap() {
            RetryResult::AlreadyInProgress => tokio::task::yield_now().await,
            r => {
                assert_eq!(r, RetryResult::Completed);
                break;
            }
        }
    }
    let row = f.shard.ledger_row(id).await.unwrap().unwrap();
    assert_eq!((row.state, row.attempts), (OpState::Deleted, 2));
}

#[tokio::test]
async fn an_upload_operation_cannot_be_retried_and_an_unknown_one_is_not_found() {
    let f = fixture(0, attempts(1));
    let id = f
        .shard
        .gate
        .write(|w| {
            w.put_upload(
                "u1",
                &crate::meta::UploadRecord::open("ws", "p", 4, 1, 0, 10, ""),
            )?;
            Ok(w.upload("u1")?.unwrap().operation)
        })
        .await
        .unwrap();
    assert!(matches!(
        f.shard.retry_cleanup(id).await,
        Err(Error::FailedPrecondition(_))
    ));
    assert!(matches!(
        f.shard.retry_cleanup(999).await,
        Err(Error::NotFound(_))
    ));
}

/// Mutation: `|| w.guard(&op.key)?.is_some()` removed from `prune_page` (a deleted row whose
/// key is still guarded goes).
#[tokio::test]
async fn pruning_removes_old_terminal_rows_in_pages_and_never_one_that_still_owns_bytes() {
    let f = fixture(
        0,
        ShardConfig {
            replay_ttl: Duration::ZERO,
            history_retention: Duration::from_secs(3600),
            ..attempts(1)
        },
    );
    let mut deleted = Vec::new();
    for i in 0..5 {
        deleted.push(queued(&f, &format!("t/d{i}")).await);
    }
    f.shard.reconcile().await.unwrap();
    let dead = queued(&f, "t/dead").await;
    f.faults.fail_next_deletes(1);
    f.shard.reconcile().await.unwrap();
    assert_eq!(state_of(&f, dead).await, OpState::DeadLetter);
    let pending = queued(&f, "t/pending").await;
    // A deleted attempt row whose unknown writer's guard stays (late bytes).
    let now = f.clock.now_ms();
    let accounts = f.shard.accounts.clone();
    let guarded = f
        .shard
        .gate
        .write(move |w| {
            w.put_guard(
                "t/guarded",
                &GuardRecord {
                    writer: crate::meta::WriterState::Unknown as i32,
                    ..Default::default()
                },
            )?;
            let id = w.guard_operation("t/guarded", now)?.unwrap();
            record_attempt(w, &accounts, id, &Attempt::Absent, now, 1)?;
            Ok(id)
        })
        .await
        .unwrap();
    // An open upload: unresolved.
    f.shard
        .gate
        .write(|w| {
            w.put_upload(
                "u1",
                &crate::meta::UploadRecord::open("ws", "p", 4, 1, 0, i64::MAX / 2, ""),
            )?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(f.shard.prune_operations().await.unwrap(), 0, "too young");
    f.clock.advance(Duration::from_secs(3601));
    // Bounded pages: 2 rows per session.
    let cutoff = f.shard.history_cutoff();
    let page = |n| f.shard.gate.write(move |w| prune_page(w, cutoff, n));
    assert_eq!(page(2).await.unwrap(), (2, 2));
    assert_eq!(f.shard.prune_operations().await.unwrap(), 3);
    for id in &deleted {
        assert!(f.shard.ledger_row(*id).await.unwrap().is_none());
    }
    for id in [dead, pending, guarded] {
        assert!(f.shard.ledger_row(id).await.unwrap().is_some(), "{id} kept");
    }
    let c = f.shard.counts().await.unwrap();
    assert_eq!(
        count(&c, OpState::Deleted),
        1,
        "only the guarded one is left"
    );
    assert_eq!(count(&c, OpState::Open), 1);
}

/// Counters change in the same sessions as the state: after a mix of queued, deleted,
/// dead-lettered, retried and pruned operations they equal a recount of the ledger.
/// Mutation: drop the `states.insert(o.state.name(), n - 1)` of `track`.
#[tokio::test]
async fn per_state_counters_equal_a_full_recount_of_the_ledger() {
    let f = fixture(0, attempts(2));
    for i in 0..12 {
        queued(&f, &format!("t/k{i}")).await;
    }
    f.faults.fail_next_deletes(14);
    f.shard.reconcile().await.unwrap();
    f.shard.reconcile().await.unwrap();
    f.shard
        .gate
        .write(|w| {
            for i in 0..3 {
                w.put_upload(
                    &format!("u{i}"),
                    &crate::meta::UploadRecord::open("ws", "p", 4, 1, 0, 10, ""),
                )?;
            }
            let mut u = w.upload("u1")?.unwrap();
            u.state = crate::meta::UploadState::Committed as i32;
            w.put_upload("u1", &u)?;
            w.remove_upload("u2")?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    let (rows, _) = f
        .shard
        .gate
        .read(|r| Ok(r.ledger_page(0, &|_| true, usize::MAX, usize::MAX)?))
        .await
        .unwrap();
    let c = f.shard.counts().await.unwrap();
    for st in OpState::ALL {
        let recount = rows.iter().filter(|r| r.state == st).count() as u64;
        assert_eq!(count(&c, st), recount, "{}", st.name());
    }
    assert!(count(&c, OpState::DeadLetter) > 0 && count(&c, OpState::Deleted) > 0);
}

/// Mutation: `Cursor { shard: *s, id: r.id }` → `id: r.id + 1` in `list` (skips one).
#[tokio::test]
async fn a_cursor_walk_over_more_than_250_operations_returns_each_exactly_once() {
    let shards: Vec<_> = (0..3).map(|i| fixture(i, attempts(1))).collect();
    for (i, f) in shards.iter().enumerate() {
        f.shard
            .gate
            .write(move |w| {
                for k in 0..(90 + i) {
                    w.queue_delete(&format!("t/{k}"), "ws", 1, 0)?;
                }
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
    }
    shards[1].faults.fail_next_deletes(usize::MAX);
    shards[1].shard.reconcile().await.unwrap();
    let all: Vec<_> = shards.iter().map(|f| f.shard.clone()).collect();
    let walk = |states: Vec<String>, limit| {
        let all = all.clone();
        async move {
            let mut seen = Vec::new();
            let mut after = String::new();
            loop {
                let q = PageQuery::parse(&states, Some(limit), &after).unwrap();
                let page = list(&all, &q).await.unwrap();
                assert!(page.rows.len() <= limit as usize);
                seen.extend(
                    page.rows
                        .iter()
                        .map(|(s, r)| (format_id(*s, r.id), r.state)),
                );
                match page.next {
                    Some(c) => after = c.encode(),
                    None => return seen,
                }
            }
        }
    };
    let seen = walk(vec![], 7).await;
    assert_eq!(seen.len(), 90 + 91 + 92);
    let unique: HashSet<_> = seen.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(unique.len(), seen.len(), "each exactly once");
    let dead = walk(vec!["dead_letter".into()], 100).await;
    assert_eq!(dead.len(), 91);
    assert!(
        dead.iter()
            .all(|(id, st)| id.starts_with("1-") && *st == OpState::DeadLetter)
    );
    let rest = walk(vec!["deleting".into(), "open".into()], 50).await;
    assert_eq!(rest.len(), 90 + 92);
}

#[test]
fn a_page_request_with_limit_0_or_101_nine_states_a_repeated_or_unknown_state_or_a_foreign_cursor_is_refused()
 {
    let states = |n: usize| -> Vec<String> {
        OpState::ALL
            .iter()
            .cycle()
            .take(n)
            .map(|s| s.name().to_string())
            .collect()
    };
    let refused = |s: &[String], limit, after: &str| {
        matches!(
            PageQuery::parse(s, limit, after),
            Err(Error::InvalidArgument(_))
        )
    };
    assert!(refused(&[], Some(0), ""));
    assert!(refused(&[], Some(101), ""));
    assert!(refused(&states(9), None, ""));
    assert!(refused(&states(8), None, ""), "8 states but one repeated");
    assert!(refused(&["finished".into()], None, ""));
    assert!(refused(&[], None, "3-17"));
    let ok = PageQuery::parse(&states(7), None, "").unwrap();
    assert_eq!((ok.limit, ok.states.len()), (DEFAULT_LIMIT, 7));
    assert_eq!(PageQuery::parse(&[], Some(100), "").unwrap().limit, 100);
    let c = Cursor { shard: 3, id: 17 };
    assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
    assert_eq!(parse_id(&format_id(3, 17)).unwrap(), (3, 17));
}

#[test]
fn a_provider_error_becomes_a_fixed_phrase_without_key_or_endpoint() {
    let e = ObjectError::Provider(
        "Error performing DELETE https://s3.example:9000/bucket/nokv/blocks/3/abc in 30s: connection refused".into(),
    );
    let s = secret_free(&e);
    assert_eq!(s, "delete failed: provider unreachable");
    assert!(!s.contains("https") && !s.contains("blocks"));
}
