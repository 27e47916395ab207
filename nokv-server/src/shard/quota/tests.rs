//! Quota and admission tests against a real redb store and a fault-injecting in-memory
//! provider (which counts provider creates), on a manual shard clock.

use std::collections::BTreeMap;
use std::time::Duration;

use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::meta::{UsageRecord, UsageTotals};
use crate::shard::ShardConfig;
use crate::shard::admission::Caps;
use crate::shard::clock::Clock;
use crate::shard::fixture::{Fixture, shard_on};
use crate::token::{Claims, Role};

const LEASE: Duration = Duration::from_secs(60);

fn config(caps: Caps) -> ShardConfig {
    ShardConfig {
        block_size: 4,
        upload_lease: LEASE,
        admission: caps,
        ..ShardConfig::default()
    }
}

fn fixture() -> Fixture {
    fixture_with(3, config(Caps::default()))
}

fn fixture_with(id: u32, cfg: ShardConfig) -> Fixture {
    shard_on(id, cfg, Clock::manual())
}

fn writer() -> Claims {
    Claims {
        workspaces: vec!["*".into()],
        role: Role::Write,
        expires: u64::MAX,
    }
}

fn next_id() -> String {
    crate::ids::random_hex(8)
}

async fn begin(f: &Fixture, ws: &str, size: u64) -> crate::error::Result<pb::BeginUploadResponse> {
    begin_at(f, ws, &format!("art-{}", next_id()), size).await
}

/// An upload that will publish at `path` (replacing whatever is there).
async fn begin_at(
    f: &Fixture,
    ws: &str,
    path: &str,
    size: u64,
) -> crate::error::Result<pb::BeginUploadResponse> {
    f.shard
        .begin_upload(pb::BeginUploadRequest {
            workspace: ws.into(),
            path: path.into(),
            size,
            request_id: next_id(),
            ..Default::default()
        })
        .await
}

/// Uploads every block of `body` and commits it.
async fn publish(f: &Fixture, up: &pb::BeginUploadResponse, body: &[u8]) {
    for (i, chunk) in body.chunks(4).enumerate() {
        f.shard
            .put_block(
                writer(),
                pb::PutBlockRequest {
                    upload_id: up.upload_id.clone(),
                    upload_token: up.upload_token.clone(),
                    index: i as u32,
                    block_sha256: Vec::new(),
                    block_crc32c: Some(nokv_proto::block_checksum::crc32c(chunk)),
                    data: chunk.to_vec().into(),
                    request_id: next_id(),
                },
            )
            .await
            .unwrap();
    }
    f.shard
        .commit_upload(
            writer(),
            pb::CommitUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                sha256: Sha256::digest(body).to_vec(),
                request_id: next_id(),
            },
        )
        .await
        .unwrap();
}

async fn abort(f: &Fixture, up: &pb::BeginUploadResponse) {
    f.shard
        .abort_upload(
            writer(),
            pb::AbortUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                request_id: next_id(),
            },
        )
        .await
        .unwrap();
}

async fn write(f: &Fixture, ws: &str, path: &str, len: usize) -> crate::error::Result<()> {
    f.shard
        .write(pb::WriteRequest {
            workspace: ws.into(),
            path: path.into(),
            data: vec![1; len].into(),
            request_id: next_id(),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// Block 0 of `up` written with its response lost: its attempt stays unsettled (an
/// unknown writer's guard). A no-op on an upload that is no longer open.
async fn lost_block(f: &Fixture, up: &pb::BeginUploadResponse) {
    let id = up.upload_id.clone();
    let rec = f.shard.gate.read(|r| Ok(r.upload(&id)?)).await.unwrap();
    let Some(rec) = rec.filter(|u| {
        u.state == crate::meta::UploadState::Open as i32 && u.lease_expires_ms > f.clock.now_ms()
    }) else {
        return;
    };
    let data = vec![5u8; rec.size.min(4) as usize];
    f.faults.lose_next_response();
    let put = f
        .shard
        .put_block(
            writer(),
            pb::PutBlockRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                index: 0,
                block_sha256: Vec::new(),
                block_crc32c: Some(nokv_proto::block_checksum::crc32c(&data)),
                data: data.clone().into(),
                request_id: next_id(),
            },
        )
        .await;
    assert!(put.is_err(), "outcome unknown");
}

async fn delete_workspace(f: &Fixture, ws: &str) {
    f.shard
        .delete_workspace(pb::DeleteWorkspaceRequest {
            workspace: ws.into(),
            request_id: next_id(),
        })
        .await
        .unwrap();
}

async fn usage(f: &Fixture, ws: &str) -> (u64, u64, u64) {
    let u = f.shard.usage(ws).await.unwrap();
    (u.used_bytes, u.reserved_bytes, u.reservations)
}

/// Every stored counter equals the recount, reservations equal unresolved uploads, and the
/// node census holds the shard's count.
async fn assert_counters_match_recount(f: &Fixture, context: &str) {
    let recount = f.shard.recount_usage().await.unwrap();
    let stored: BTreeMap<String, UsageRecord> = f
        .shard
        .gate
        .read(|r| Ok(r.usage_records()?))
        .await
        .unwrap()
        .into_iter()
        .map(|(ws, u)| (ws, UsageRecord { quota: None, ..u }))
        .filter(|(_, u)| !u.is_empty())
        .collect();
    assert_eq!(stored, recount.workspaces, "{context}: workspace counters");
    let totals: UsageTotals = f.shard.usage_totals().await.unwrap();
    assert_eq!(totals, recount.totals, "{context}: shard totals");
    let c = f.shard.counts().await.unwrap();
    assert_eq!(
        totals.reservations,
        c.uploads + c.deleting_uploads,
        "{context}: reservations == unresolved uploads"
    );
    assert_eq!(
        f.shard.accounts.caps().census.total(),
        totals.reservations,
        "{context}: census"
    );
}

/// Mutations: drop `accounts.reserve(w, &mut rec)?` in `begin_upload`, or `>` → `>=`... the
/// quota comparison in `Accounts::reserve` (the exact fit would then be refused).
#[tokio::test]
async fn a_begin_upload_past_the_quota_is_refused_before_any_provider_write_and_changes_nothing() {
    let f = fixture();
    f.shard.set_quota("ws", Some(10)).await.unwrap();
    write(&f, "ws", "notes", 4).await.unwrap();
    let err = begin(&f, "ws", 8).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::ResourceExhausted
    );
    assert_eq!(f.faults.creates(), 0, "no provider write");
    assert_eq!(f.shard.counts().await.unwrap().upload_records, 0);
    assert_eq!(usage(&f, "ws").await, (4, 0, 0), "nothing reserved");
    // Exactly up to the quota is admitted; one byte more is not.
    let up = begin(&f, "ws", 6).await.unwrap();
    assert_eq!(usage(&f, "ws").await, (4, 6, 1));
    let err = begin(&f, "ws", 1).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    // Another workspace is not limited by it.
    begin(&f, "other", 100).await.unwrap();
    // The commit consumes the reservation: the bytes become used.
    publish(&f, &up, b"abcdef").await;
    assert_eq!(usage(&f, "ws").await, (10, 0, 0));
    assert_counters_match_recount(&f, "after commit").await;
}

/// Mutations: drop `accounts.release(...)` in `abort_upload`, in `claim_page`, or in
/// `release_page` (workspace deletion): the matching step below stays reserved.
#[tokio::test]
async fn abort_expiry_reclaim_and_workspace_deletion_each_release_the_reservation() {
    let f = fixture();
    f.shard.set_quota("ws", Some(8)).await.unwrap();

    let up = begin(&f, "ws", 8).await.unwrap();
    assert_eq!(usage(&f, "ws").await, (0, 8, 1));
    abort(&f, &up).await;
    assert_eq!(usage(&f, "ws").await, (0, 0, 0), "abort releases");

    begin(&f, "ws", 8).await.unwrap();
    f.clock.advance(LEASE);
    assert_eq!(f.shard.reconcile().await.unwrap().expired_uploads, 1);
    assert_eq!(usage(&f, "ws").await, (0, 0, 0), "expiry reclaim releases");

    let up = begin(&f, "ws", 8).await.unwrap();
    assert_eq!(usage(&f, "ws").await, (0, 8, 1));
    delete_workspace(&f, "ws").await;
    let u = f.shard.usage("ws").await.unwrap();
    assert_eq!(u, UsageRecord::default(), "deletion releases, quota gone");
    let err = f
        .shard
        .commit_upload(
            writer(),
            pb::CommitUploadRequest {
                upload_id: up.upload_id.clone(),
                upload_token: up.upload_token.clone(),
                sha256: vec![0; 32],
                request_id: next_id(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    assert_counters_match_recount(&f, "after deletion").await;
}

/// Mutation: release in `claim_page` also for the `Deleting` branch (the reservation would
/// go while the attempt may still land), or drop the release in `resolve_if_reclaimed`.
#[tokio::test]
async fn a_claimed_upload_whose_attempt_is_unsettled_keeps_its_reservation_until_reclaimed() {
    let f = fixture();
    let up = begin(&f, "ws", 4).await.unwrap();
    lost_block(&f, &up).await;
    f.clock.advance(LEASE);
    f.faults.fail_next_deletes(1);
    f.shard.reconcile().await.unwrap();
    assert_eq!(f.shard.counts().await.unwrap().deleting_uploads, 1);
    assert_eq!(
        usage(&f, "ws").await,
        (0, 4, 1),
        "unsettled: still reserved"
    );
    assert_counters_match_recount(&f, "deleting").await;
    // The unknown writer's guard retries its delete after its back-off.
    f.clock
        .advance(crate::shard::reconciler::unknown_retry_after(1));
    f.shard.reconcile().await.unwrap();
    assert_eq!(f.shard.counts().await.unwrap().deleting_uploads, 0);
    assert_eq!(usage(&f, "ws").await, (0, 0, 0), "reclaimed: released");
    assert_counters_match_recount(&f, "reclaimed").await;
}

/// Mutation: drop `accounts.charge_write(...)` in `write`, or the `release_entry` in
/// `delete`.
#[tokio::test]
async fn small_file_writes_count_against_the_quota_and_one_past_it_changes_nothing() {
    let f = fixture();
    f.shard.set_quota("ws", Some(10)).await.unwrap();
    write(&f, "ws", "a", 6).await.unwrap();
    let err = write(&f, "ws", "b", 6).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    assert!(f.shard.stat("ws", "b").await.is_err(), "nothing written");
    // Replacing a file counts only the growth.
    write(&f, "ws", "a", 10).await.unwrap();
    assert_eq!(usage(&f, "ws").await, (10, 0, 0));
    // A reservation and a file compete for the same quota.
    let err = begin(&f, "ws", 1).await.unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    f.shard
        .delete(pb::DeleteRequest {
            workspace: "ws".into(),
            path: "a".into(),
            request_id: next_id(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(usage(&f, "ws").await, (0, 0, 0), "delete releases");
    // No quota: unlimited; removing it keeps the counts.
    f.shard.set_quota("ws", None).await.unwrap();
    write(&f, "ws", "big", 1000).await.unwrap();
    assert_counters_match_recount(&f, "files").await;
}

/// Mutation: `in_workspace >= ...` → `in_workspace > ...` in `Caps::admit`, or count the
/// workspace's uploads from another counter.
#[tokio::test]
async fn the_per_workspace_admission_cap_refuses_the_upload_past_it_and_abort_makes_room() {
    let f = fixture_with(
        3,
        config(Caps {
            max_unresolved_uploads_per_workspace: 3,
            ..Caps::default()
        }),
    );
    let mut ups = Vec::new();
    for _ in 0..3 {
        ups.push(begin(&f, "ws", 4).await.unwrap());
    }
    let err = begin(&f, "ws", 4).await.unwrap_err();
    assert_eq!(err.reason(), "AdmissionCapReached");
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::ResourceExhausted
    );
    assert_eq!(
        usage(&f, "ws").await,
        (0, 12, 3),
        "the refusal reserved nothing"
    );
    begin(&f, "other", 4).await.unwrap();
    abort(&f, &ups[0]).await;
    begin(&f, "ws", 4).await.unwrap();
    assert_counters_match_recount(&f, "caps").await;
}

/// Mutation: `in_shard + self.census.others(shard)` → `in_shard` in `Caps::admit`.
#[tokio::test]
async fn the_node_admission_cap_counts_the_unresolved_uploads_of_every_shard_of_the_node() {
    let caps = Caps {
        max_unresolved_uploads: 3,
        ..Caps::default()
    };
    let a = fixture_with(0, config(caps.clone()));
    let b = fixture_with(1, config(caps));
    begin(&a, "ws", 4).await.unwrap();
    begin(&a, "ws", 4).await.unwrap();
    begin(&b, "ws2", 4).await.unwrap();
    let err = begin(&b, "ws2", 4).await.unwrap_err();
    assert_eq!(err.reason(), "AdmissionCapReached");
    let err = begin(&a, "ws", 4).await.unwrap_err();
    assert_eq!(err.reason(), "AdmissionCapReached");
    // Shard a leaves the node: its uploads no longer count here.
    drop(a);
    begin(&b, "ws2", 4).await.unwrap();
}

/// A small deterministic generator (splitmix64), so a failing mix can be replayed by seed.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Mutation: any one of the `accounts.*` calls removed from a session (begin, commit, abort,
/// claim, resolve, workspace deletion, write, delete) makes a comparison below fail.
#[tokio::test]
async fn every_counter_equals_a_full_recount_after_a_seeded_random_mix_of_operations() {
    let (mut saw_deleting, mut saw_refusal) = (false, false);
    for seed in [1u64, 7, 42] {
        let f = fixture();
        let mut rng = Mix(seed);
        let workspaces = ["a", "b", "c"];
        let mut open: Vec<pb::BeginUploadResponse> = Vec::new();
        for step in 0..120 {
            let ws = workspaces[rng.below(3) as usize];
            let context = format!("seed {seed} step {step}");
            match rng.below(9) {
                0 | 1 => {
                    let size = 1 + rng.below(12);
                    // Half of them publish over the small files' paths (a commit then
                    // replaces a file or an earlier artifact).
                    let path = match rng.below(2) {
                        0 => format!("f{}", rng.below(4)),
                        _ => format!("art-{}", next_id()),
                    };
                    match begin_at(&f, ws, &path, size).await {
                        Ok(up) => open.push(up),
                        Err(_) => saw_refusal = true,
                    }
                }
                2 if !open.is_empty() => {
                    let up = open.remove(rng.below(open.len() as u64) as usize);
                    let size = f
                        .shard
                        .gate
                        .read(|r| Ok(r.upload(&up.upload_id)?))
                        .await
                        .unwrap()
                        .unwrap();
                    if size.state == crate::meta::UploadState::Open as i32
                        && size.lease_expires_ms > f.clock.now_ms()
                    {
                        publish(&f, &up, &vec![9; size.size as usize]).await;
                    }
                }
                3 if !open.is_empty() => {
                    let up = open.remove(rng.below(open.len() as u64) as usize);
                    abort(&f, &up).await;
                }
                4 => {
                    // Leases run out; a lost response now and then leaves an attempt
                    // unsettled, so some claims go through `Deleting`.
                    if rng.below(2) == 0
                        && let Some(up) = open.last()
                    {
                        lost_block(&f, up).await;
                        f.faults.fail_next_deletes(1);
                    }
                    f.clock.advance(LEASE);
                    f.shard.reconcile().await.unwrap();
                }
                5 => {
                    let len = rng.below(20) as usize;
                    let _ = write(&f, ws, &format!("f{}", rng.below(4)), len).await;
                }
                6 => {
                    let _ = f
                        .shard
                        .delete(pb::DeleteRequest {
                            workspace: ws.into(),
                            path: format!("f{}", rng.below(4)),
                            request_id: next_id(),
                            ..Default::default()
                        })
                        .await;
                }
                7 => {
                    let quota = [None, Some(20), Some(60)][rng.below(3) as usize];
                    f.shard.set_quota(ws, quota).await.unwrap();
                }
                8 if rng.below(3) == 0 => delete_workspace(&f, ws).await,
                _ => f.shard.reconcile().await.map(|_| ()).unwrap(),
            }
            assert_counters_match_recount(&f, &context).await;
            saw_deleting |= f.shard.counts().await.unwrap().deleting_uploads > 0;
        }
    }
    assert!(
        saw_deleting,
        "the mix must reach claimed-but-unsettled uploads"
    );
    assert!(saw_refusal, "the mix must reach quota refusals");
}

/// Mutations: drop `accounts.reserve(w, &mut rec)?` in `begin_receipt_upload` (nothing
/// reserved), or reserve in its resume branch too (reserved twice).
#[tokio::test]
async fn a_receipt_upload_reserves_once_and_resuming_it_reserves_nothing_more() {
    let f = fixture();
    f.shard.set_quota("ws", Some(10)).await.unwrap();
    let req = |rid: &str| pb::BeginUploadRequest {
        workspace: "ws".into(),
        path: "art".into(),
        size: 8,
        sha256: Sha256::digest(b"abcdefgh").to_vec(),
        receipt: "r1".into(),
        request_id: rid.into(),
    };
    let first = f.shard.begin_upload(req("b1")).await.unwrap();
    assert_eq!(usage(&f, "ws").await, (0, 8, 1));
    let resumed = f.shard.begin_upload(req("b2")).await.unwrap();
    assert_eq!(resumed.upload_id, first.upload_id);
    assert_eq!(
        usage(&f, "ws").await,
        (0, 8, 1),
        "resuming reserves nothing more"
    );
    publish(&f, &first, b"abcdefgh").await;
    assert_eq!(usage(&f, "ws").await, (8, 0, 0));
    assert_counters_match_recount(&f, "receipt").await;
}
