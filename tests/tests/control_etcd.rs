//! The etcd control plane (issue 10 items 2-3) against a real etcd started by each test:
//! cluster record, node lease and acknowledge deadline, fenced shard acquisition, release,
//! balance. The control module has no black-box surface yet (it is not wired into the daemon),
//! so these drive `nokv_server::control` directly.

use std::time::Duration;

use nokv_server::control::ControlError;
use nokv_server::control::etcd::{
    Acquisition, CheckpointRef, ClusterConfig, ConfigOutcome, EtcdControl, EtcdSettings, ShardState,
};
use nokv_tests::Etcd;

/// Bound on waiting for a lease-driven condition (several TTLs of the short test lease).
const CONDITION_BOUND: Duration = Duration::from_secs(30);
/// A short lease so expiry-driven tests finish quickly (etcd's minimum is about 2 s).
const SHORT_TTL: Duration = Duration::from_secs(2);

fn config(shards: u32) -> ClusterConfig {
    ClusterConfig {
        shards,
        bucket: "nokv".into(),
        prefix: "cluster-a".into(),
    }
}

fn checkpoint(shard: u32, epoch: u64) -> CheckpointRef {
    CheckpointRef {
        key: format!("cluster-a/meta/{shard}/ckpt/{epoch}-x"),
        sha256: "00".repeat(32),
        size: 4096,
        epoch,
        created_unix_ms: 1,
    }
}

fn settings(etcd: &Etcd, node: &str, config: ClusterConfig) -> EtcdSettings {
    EtcdSettings::new(
        vec![etcd.endpoint()],
        "test",
        node,
        format!("{node}.local:7443"),
        config,
    )
}

async fn join(etcd: &Etcd, node: &str, shards: u32) -> std::sync::Arc<EtcdControl> {
    EtcdControl::join(settings(etcd, node, config(shards)))
        .await
        .expect("join")
        .0
}

#[tokio::test]
async fn the_first_node_creates_the_cluster_record_and_a_node_with_other_settings_refuses_to_join()
{
    let etcd = Etcd::start();
    let (_a, outcome) = EtcdControl::join(settings(&etcd, "a", config(16)))
        .await
        .unwrap();
    assert_eq!(outcome, ConfigOutcome::Created);
    let (_b, outcome) = EtcdControl::join(settings(&etcd, "b", config(16)))
        .await
        .unwrap();
    assert_eq!(outcome, ConfigOutcome::Joined);

    let refused = EtcdControl::join(settings(&etcd, "c", config(8))).await;
    match refused {
        Err(ControlError::ConfigMismatch {
            field,
            recorded,
            ours,
            ..
        }) => {
            assert_eq!(
                (field, recorded.as_str(), ours.as_str()),
                ("shards", "16", "8")
            );
        }
        Err(other) => panic!("expected ConfigMismatch, got {other}"),
        Ok(_) => panic!("a node with another shard count joined"),
    }
    let mut other_bucket = config(16);
    other_bucket.bucket = "elsewhere".into();
    let refused = EtcdControl::join(settings(&etcd, "d", other_bucket)).await;
    let message = match refused {
        Err(
            error @ ControlError::ConfigMismatch {
                field: "bucket", ..
            },
        ) => error.to_string(),
        Err(other) => panic!("expected a bucket mismatch, got {other}"),
        Ok(_) => panic!("a node with another bucket joined"),
    };
    assert!(
        message.contains("elsewhere") && message.contains("nokv"),
        "{message}"
    );

    // The refusals changed nothing: the record still holds the first node's settings.
    let (_e, outcome) = EtcdControl::join(settings(&etcd, "e", config(16)))
        .await
        .unwrap();
    assert_eq!(outcome, ConfigOutcome::Joined);
}

#[tokio::test]
async fn two_nodes_acquiring_the_same_shard_at_once_yield_exactly_one_owner_at_the_next_epoch() {
    let etcd = Etcd::start();
    let a = join(&etcd, "a", 16).await;
    let b = join(&etcd, "b", 16).await;

    for expected_epoch in 1..=3 {
        let (ra, rb) = tokio::join!(a.acquire(3), b.acquire(3));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let (winner, loser) = match (ra, rb) {
            (Acquisition::Acquired(e), Acquisition::Refused) => {
                assert_eq!(e, expected_epoch);
                (&a, &b)
            }
            (Acquisition::Refused, Acquisition::Acquired(e)) => {
                assert_eq!(e, expected_epoch);
                (&b, &a)
            }
            other => panic!("exactly one acquisition must win, got {other:?}"),
        };
        assert_eq!(winner.holding(3).map(|(e, _)| e).unwrap(), expected_epoch);
        assert!(matches!(
            loser.holding(3).map(|(e, _)| e),
            Err(ControlError::NotOwner { shard: 3 })
        ));
        let (record, _) = a.record(3).await.unwrap();
        let record = record.unwrap();
        assert_eq!(record.epoch, expected_epoch);
        assert_eq!(record.state, ShardState::Serving);
        assert_eq!(record.owner.as_deref(), Some(winner.node_id()));
        let owner = a.owner(3).await.unwrap().unwrap();
        assert_eq!(
            (owner.node.as_str(), owner.epoch),
            (winner.node_id(), expected_epoch)
        );

        // The previous release's checkpoint travels with the record to the new owner.
        let previous = (expected_epoch > 1).then(|| checkpoint(3, expected_epoch - 1));
        assert_eq!(record.checkpoint, previous);

        // A checkpoint of another epoch is refused and changes nothing.
        assert!(matches!(
            winner
                .release(3, Some(checkpoint(3, expected_epoch + 7)), None)
                .await,
            Err(ControlError::InvalidArgument(_))
        ));
        assert_eq!(winner.holding(3).map(|(e, _)| e).unwrap(), expected_epoch);

        // Graceful release: acknowledging stops, the owner key goes, the record says handoff
        // and points at the checkpoint.
        assert!(
            winner
                .release(3, Some(checkpoint(3, expected_epoch)), None)
                .await
                .unwrap()
        );
        assert!(winner.holding(3).map(|(e, _)| e).is_err());
        assert_eq!(a.owner(3).await.unwrap(), None);
        let record = a.record(3).await.unwrap().0.unwrap();
        assert_eq!(record.state, ShardState::Handoff);
        assert_eq!(record.checkpoint, Some(checkpoint(3, expected_epoch)));
    }
}

#[tokio::test]
async fn an_owner_whose_lease_is_revoked_loses_the_shard_and_another_node_acquires_it_at_a_higher_epoch()
 {
    let etcd = Etcd::start();
    let a = EtcdControl::join(settings(&etcd, "a", config(16)).with_node_ttl(SHORT_TTL))
        .await
        .unwrap()
        .0;
    let b = join(&etcd, "b", 16).await;
    assert_eq!(a.acquire(5).await.unwrap(), Acquisition::Acquired(1));
    assert_eq!(b.acquire(5).await.unwrap(), Acquisition::Refused);

    // The lease ends behind the owner's back (as an expiry would).
    let mut raw = etcd_client_for(&etcd).await;
    raw.lease_revoke(a.lease_id()).await.unwrap();
    assert_eq!(
        b.owner(5).await.unwrap(),
        None,
        "the owner key goes with the lease"
    );

    assert_eq!(b.acquire(5).await.unwrap(), Acquisition::Acquired(2));
    assert_eq!(b.holding(5).map(|(e, _)| e).unwrap(), 2);

    // The deposed owner learns it at its next keep-alive and acknowledges nothing more.
    tokio::time::timeout(CONDITION_BOUND, a.deadline().passed())
        .await
        .expect("the deposed owner's deadline passes");
    assert!(matches!(
        a.holding(5).map(|(e, _)| e),
        Err(ControlError::NotOwner { shard: 5 })
    ));
    // Its late release changes nothing: the new owner's record and key stay.
    assert!(!a.release(5, None, None).await.unwrap());
    let (record, _) = b.record(5).await.unwrap();
    let record = record.unwrap();
    assert_eq!(
        (record.epoch, record.state, record.owner.as_deref()),
        (2, ShardState::Serving, Some("b"))
    );
    assert_eq!(b.owner(5).await.unwrap().unwrap().node, "b");
}

#[tokio::test]
async fn the_acknowledge_deadline_stops_advancing_when_keep_alives_stop() {
    let etcd = Etcd::start();
    let a = EtcdControl::join(settings(&etcd, "a", config(4)).with_node_ttl(SHORT_TTL))
        .await
        .unwrap()
        .0;
    assert_eq!(a.acquire(0).await.unwrap(), Acquisition::Acquired(1));
    let first = a.deadline().until();
    // Keep-alives extend it while etcd answers.
    tokio::time::timeout(CONDITION_BOUND, async {
        while a.deadline().until() <= first {
            a.deadline().moved().await;
        }
    })
    .await
    .expect("a keep-alive extends the deadline");
    assert_eq!(a.holding(0).map(|(e, _)| e).unwrap(), 1);

    // etcd goes away: no keep-alive is confirmed any more.
    drop(etcd);
    tokio::time::timeout(CONDITION_BOUND, a.deadline().passed())
        .await
        .expect("the deadline passes without keep-alives");
    let last = a.deadline().until();
    assert!(matches!(
        a.holding(0).map(|(e, _)| e),
        Err(ControlError::NotOwner { shard: 0 })
    ));
    assert!(matches!(a.acquire(1).await, Err(ControlError::LeaseLost)));
    assert_eq!(a.deadline().until(), last, "nothing extended it since");
}

/// Nodes a, b and c joined to a 16-shard cluster, none holding anything yet.
async fn three_nodes_of_16_shards(etcd: &Etcd) -> [std::sync::Arc<EtcdControl>; 3] {
    [
        join(etcd, "a", 16).await,
        join(etcd, "b", 16).await,
        join(etcd, "c", 16).await,
    ]
}

#[tokio::test]
async fn a_balance_step_takes_free_shards_up_to_an_even_share_of_the_live_nodes() {
    let etcd = Etcd::start();
    let nodes = three_nodes_of_16_shards(&etcd).await;
    let mut total = 0;
    for node in &nodes {
        let report = node.balance_step().await.unwrap();
        assert_eq!(report.target, 6, "ceil(16 / 3)");
        total += report.acquired.len();
        assert!(node.owned().len() <= 6);
    }
    assert_eq!(total, 16, "every shard is owned");
    let mut counts: Vec<_> = nodes.iter().map(|n| n.owned().len()).collect();
    counts.sort_unstable();
    assert_eq!(counts, [4, 6, 6]);
    // The last node holds fewer than floor(16 / 3) = 5: a full node hands one off, the
    // starved one does not.
    assert_eq!(nodes[0].balance_step().await.unwrap().surplus, 1);
    assert_eq!(nodes[2].balance_step().await.unwrap().surplus, 0);

    let view = nodes[0].cluster_view().await.unwrap();
    assert_eq!(view.config, Some(config(16)));
    let ids: Vec<_> = view.nodes.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(view.nodes[1].1.endpoint, "b.local:7443");
    for shard in &view.shards {
        let (owner, record) = (
            shard.owner.as_ref().unwrap(),
            shard.record.as_ref().unwrap(),
        );
        assert_eq!(
            (owner.epoch, record.epoch, record.state),
            (1, 1, ShardState::Serving)
        );
        assert_eq!(record.owner.as_deref(), Some(owner.node.as_str()));
    }

    // A shard handed off with a checkpoint is free; one released without a checkpoint (its
    // data is on its last owner's disk only) and one whose owner vanished without release (a
    // crash) wait for their node.
    let a = &nodes[0];
    let (handed, kept, crashed) = (a.owned()[0].0, a.owned()[1].0, a.owned()[2].0);
    assert!(
        a.release(handed, Some(checkpoint(handed, 1)), None)
            .await
            .unwrap()
    );
    assert!(a.release(kept, None, None).await.unwrap());
    let c = &nodes[2];
    let (mut raw, owner_key) = (
        etcd_client_for(&etcd).await,
        format!("/nokv/test/shards/{crashed}/owner"),
    );
    raw.delete(owner_key, None).await.unwrap();
    let report = c.balance_step().await.unwrap();
    assert_eq!(report.acquired, vec![(handed, 2)]);
    assert!(c.owned().iter().all(|(s, _)| *s != crashed && *s != kept));
}

/// Three nodes after one balance step each, in join order: a and b hold 6 shards, c the
/// remaining 4 (fewer than floor(16 / 3) = 5).
async fn six_six_four(etcd: &Etcd) -> [std::sync::Arc<EtcdControl>; 3] {
    let nodes = three_nodes_of_16_shards(etcd).await;
    for node in &nodes {
        node.balance_step().await.unwrap();
    }
    let counts: Vec<_> = nodes.iter().map(|n| n.owned().len()).collect();
    assert_eq!(counts, [6, 6, 4]);
    nodes
}

#[tokio::test]
async fn a_full_node_hands_nothing_to_a_starved_node_while_a_free_shard_waits_for_it() {
    let etcd = Etcd::start();
    let nodes = six_six_four(&etcd).await;
    let (full, starved) = (&nodes[1], &nodes[2]);
    // One shard handed off with a checkpoint: free, and the starved node's to take.
    let a = &nodes[0];
    let handed = a.owned()[0].0;
    assert!(
        a.release(handed, Some(checkpoint(handed, 1)), None)
            .await
            .unwrap()
    );
    assert_eq!(full.balance_step().await.unwrap().surplus, 0);
    let report = starved.balance_step().await.unwrap();
    assert_eq!(report.acquired, vec![(handed, 2)]);
}

#[tokio::test]
async fn a_full_node_relieves_a_starved_node_whose_only_free_shard_waits_for_another_node() {
    let etcd = Etcd::start();
    let nodes = six_six_four(&etcd).await;
    let (full, starved) = (&nodes[1], &nodes[2]);
    // Released without a checkpoint: its data is on node a's disk only, so only a may take it.
    let a = &nodes[0];
    let kept = a.owned()[0].0;
    assert!(a.release(kept, None, None).await.unwrap());
    assert_eq!(full.balance_step().await.unwrap().surplus, 1);
    assert!(starved.balance_step().await.unwrap().acquired.is_empty());
}

async fn etcd_client_for(etcd: &Etcd) -> etcd_client::Client {
    etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_node_restarted_after_a_crash_rejoins_and_takes_its_shards_back_at_a_higher_epoch() {
    let etcd = Etcd::start();
    let short = |node| settings(&etcd, node, config(4)).with_node_ttl(SHORT_TTL);
    let a = EtcdControl::join(short("a")).await.unwrap().0;
    let b = EtcdControl::join(short("b")).await.unwrap().0;
    assert_eq!(a.acquire(2).await.unwrap(), Acquisition::Acquired(1));

    // A second live process with the same id is refused: its lease keeps being renewed.
    assert!(matches!(
        EtcdControl::join(short("a")).await,
        Err(ControlError::NodeIdInUse { .. })
    ));

    // Crash: keep-alives stop, nothing is released, the lease is left to expire.
    drop(a);
    let a = EtcdControl::join(short("a"))
        .await
        .expect("the restarted node rejoins once its old lease expired")
        .0;
    // The crashed owner's shard waited for it: the other node's balance leaves it alone...
    b.balance_step().await.unwrap();
    assert!(b.owned().iter().all(|(s, _)| *s != 2), "{:?}", b.owned());
    // ...and the restarted node takes it back at the next epoch.
    let report = a.balance_step().await.unwrap();
    assert!(report.acquired.contains(&(2, 2)), "{report:?}");
    assert_eq!(a.holding(2).map(|(e, _)| e).unwrap(), 2);
}

#[tokio::test]
async fn a_draining_shard_keeps_its_owner_and_epoch_and_only_its_owner_can_mark_it() {
    let etcd = Etcd::start();
    let a = join(&etcd, "a", 4).await;
    let b = join(&etcd, "b", 4).await;
    assert_eq!(a.acquire(1).await.unwrap(), Acquisition::Acquired(1));
    assert!(matches!(
        b.mark_draining(1).await,
        Err(ControlError::NotOwner { shard: 1 })
    ));
    a.mark_draining(1).await.unwrap();
    let record = a.record(1).await.unwrap().0.unwrap();
    assert_eq!(
        (record.epoch, record.state, record.owner.as_deref()),
        (1, ShardState::Draining, Some("a"))
    );
    // In-flight requests may still be acknowledged; nobody else can take the shard.
    assert_eq!(a.holding(1).map(|(e, _)| e).unwrap(), 1);
    assert_eq!(b.acquire(1).await.unwrap(), Acquisition::Refused);
}

#[tokio::test]
async fn an_owner_acknowledges_only_after_marking_the_shard_changed_and_a_deposed_owner_cannot_mark()
 {
    let etcd = Etcd::start();
    let a = join(&etcd, "a", 16).await;
    let b = join(&etcd, "b", 16).await;
    assert_eq!(a.acquire(6).await.unwrap(), Acquisition::Acquired(1));
    assert!(
        a.acknowledge_epoch(6).is_err(),
        "nothing may commit before etcd knows the shard can differ from its checkpoint"
    );
    a.mark_changed(6).await.unwrap();
    assert_eq!(a.acknowledge_epoch(6).unwrap(), 1);
    assert!(b.record(6).await.unwrap().0.unwrap().changed);

    // Deposed: its lease is gone and another node owns the shard.
    assert_eq!(b.acquire(7).await.unwrap(), Acquisition::Acquired(1));
    let mut raw = etcd_client_for(&etcd).await;
    raw.lease_revoke(b.lease_id()).await.unwrap();
    assert_eq!(a.acquire(7).await.unwrap(), Acquisition::Acquired(2));
    assert!(matches!(
        b.mark_changed(7).await,
        Err(ControlError::NotOwner { shard: 7 })
    ));
    assert!(
        !a.record(7).await.unwrap().0.unwrap().changed,
        "the deposed owner's mark must not land"
    );
}

#[tokio::test]
async fn a_release_without_a_checkpoint_keeps_the_old_pointer_only_if_the_owner_changed_nothing() {
    let etcd = Etcd::start();
    let a = join(&etcd, "a", 16).await;
    let b = join(&etcd, "b", 16).await;
    assert_eq!(a.acquire(9).await.unwrap(), Acquisition::Acquired(1));
    a.mark_changed(9).await.unwrap();
    assert!(a.release(9, Some(checkpoint(9, 1)), None).await.unwrap());

    // b takes it and gives it back before writing anything: epoch-1's checkpoint still holds
    // every acknowledged write, so the pointer stays and anyone may take the shard from it.
    assert_eq!(b.acquire(9).await.unwrap(), Acquisition::Acquired(2));
    assert!(b.release(9, None, None).await.unwrap());
    let record = a.record(9).await.unwrap().0.unwrap();
    assert_eq!(record.checkpoint, Some(checkpoint(9, 1)));

    // a takes it, writes (marks changed) and releases without a checkpoint: the pointer would
    // miss those writes, so it is cleared and the shard waits for a.
    assert_eq!(a.acquire(9).await.unwrap(), Acquisition::Acquired(3));
    a.mark_changed(9).await.unwrap();
    assert!(a.release(9, None, None).await.unwrap());
    let record = a.record(9).await.unwrap().0.unwrap();
    assert_eq!(record.checkpoint, None);
    assert_eq!(record.owner.as_deref(), Some("a"));
}
