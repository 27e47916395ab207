//! The node's lease: its keep-alive task, its revocation, and registering `nodes/<id>` under
//! it, with the [`Lineage`] that lets a runtime take its own id over.
//!
//! Invariants:
//! * one keep-alive task per lease, one request every TTL/3; the acknowledge deadline is
//!   extended only by a *confirmed* keep-alive, from the time the request was sent, so a lost
//!   or late answer never extends it (fail closed);
//! * a confirmation with TTL 0 (etcd no longer knows the lease) revokes the deadline for good:
//!   the membership must rejoin with a new lease;
//! * a lease joins the [`Lineage`] before any key is put under it, and leaves it only once etcd
//!   confirmed it revoked (or unknown);
//! * registration revokes an existing holder of `nodes/<id>` only when its lease is in this
//!   runtime's lineage; any other lease is waited out (bounded by its remaining TTL), never
//!   revoked, and still being renewed means `NodeIdInUse`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use parking_lot::Mutex;

use super::records::{Keys, NodeRecord, encode};
use super::settings::EtcdSettings;
use crate::control::ControlError;
use crate::control::deadline::AckDeadline;

type Result<T, E = ControlError> = std::result::Result<T, E>;

/// The leases one node runtime granted for its id in this process: the current one and every
/// earlier one that may still exist (abandoned after a lapse, or granted by a join attempt
/// that failed; a lease is forgotten once etcd confirmed it revoked). Shared by the
/// memberships of one runtime: [`EtcdControl::join`] starts a lineage,
/// [`EtcdControl::rejoin`] continues it.
///
/// Membership is the proof a takeover needs: a lease in the lineage other than the joining
/// one is this process's own, and nothing acknowledges under it any more (a lease joins the
/// lineage before any key is put under it, and a rejoin abandons the old membership before it
/// grants the new lease), so revoking it frees nothing a live owner relies on. A lease not in
/// it may be a second live process started with the same id: that one is waited out, never
/// revoked. etcd chooses lease ids and nokv never asks for a particular one, so no other
/// process can hold a lease whose id is in this set.
#[derive(Clone, Debug, Default)]
pub(super) struct Lineage(Arc<Mutex<BTreeSet<i64>>>);

impl Lineage {
    pub(super) fn add(&self, lease: i64) {
        self.0.lock().insert(lease);
    }

    pub(super) fn forget(&self, lease: i64) {
        self.0.lock().remove(&lease);
    }

    pub(super) fn contains(&self, lease: i64) -> bool {
        self.0.lock().contains(&lease)
    }
}

/// Slack over a lease's reported remaining TTL before its keys are gone (etcd checks expiry
/// every 500 ms and reports whole seconds).
const LEASE_EXPIRY_SLACK: Duration = Duration::from_secs(2);

/// Revokes `lease`, bounded by `bound`: true when etcd confirmed it gone (revoked now, or
/// already unknown to it), false when etcd did not answer or refused (logged).
pub(super) async fn revoke_lease(client: &mut Client, lease: i64, bound: Duration) -> bool {
    match tokio::time::timeout(bound, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => true,
        Ok(Err(error)) if lease_not_found(&error) => true,
        Ok(Err(error)) => {
            tracing::warn!(lease, %error, "could not revoke a lease; it expires by itself");
            false
        }
        Err(_) => {
            tracing::warn!(lease, "revoking a lease timed out; it expires by itself");
            false
        }
    }
}

/// etcd's answer to an operation on a lease it does not know (expired or revoked).
fn lease_not_found(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::NotFound)
}

/// Registers `nodes/<id>` under `lease_id` with a create-if-absent transaction.
///
/// If the key exists under another lease of this runtime's [`Lineage`] (an abandoned lease
/// that etcd kept alive through an outage, or a failed attempt's), that lease is revoked and
/// the id taken over at once: it is provably this process's own and nothing acknowledges
/// under it. Any other lease is either a crashed predecessor of this node (kill -9, then
/// restart within a TTL) or a live second process with the same id. The two are told apart by
/// waiting, bounded by the old lease's remaining TTL, for etcd to delete the key: a dead lease
/// expires, a live one is renewed and the join fails with `NodeIdInUse`.
pub(super) async fn register_node(
    client: &mut Client,
    keys: &Keys,
    settings: &EtcdSettings,
    lease_id: i64,
    lineage: &Lineage,
) -> Result<()> {
    let key = keys.node(&settings.node_id);
    let value = encode(&NodeRecord {
        endpoint: settings.advertise.clone(),
    });
    let in_use = || ControlError::NodeIdInUse {
        cluster: settings.cluster.clone(),
        node: settings.node_id.clone(),
    };
    let mut waited = false;
    loop {
        let response = client
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease_id)),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]),
            )
            .await?;
        if response.succeeded() {
            return Ok(());
        }
        let revision = response.header().map_or(0, |h| h.revision());
        let old_lease = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.lease()),
                _ => None,
            })
            .unwrap_or(0);
        if old_lease != 0 && old_lease != lease_id && lineage.contains(old_lease) {
            match client.lease_revoke(old_lease).await {
                Ok(_) => {}
                Err(error) if lease_not_found(&error) => {}
                Err(error) => return Err(error.into()),
            }
            lineage.forget(old_lease);
            tracing::info!(
                node = %settings.node_id,
                old_lease,
                "took the node id over from this process's own earlier lease (revoked it)"
            );
            // The key went with the lease: the next transaction creates it under ours.
            continue;
        }
        if waited || old_lease == 0 {
            return Err(in_use());
        }
        waited = true;
        let left = client.lease_time_to_live(old_lease, None).await?.ttl();
        let bound = Duration::from_secs(left.max(0) as u64) + LEASE_EXPIRY_SLACK;
        tracing::info!(
            node = %settings.node_id,
            old_lease,
            ?bound,
            "node id held by an earlier lease; waiting for it to expire"
        );
        // Watch from just after the revision we read at: a deletion in between is not missed.
        let mut watch = client
            .watch(
                key.clone(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await?;
        let deleted = tokio::time::timeout(bound, async {
            while let Some(message) = watch.message().await? {
                if message
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(true);
                }
            }
            Ok::<_, etcd_client::Error>(false)
        })
        .await;
        match deleted {
            Ok(Ok(true)) => continue,
            Ok(Ok(false)) | Err(_) => return Err(in_use()),
            Ok(Err(error)) => return Err(error.into()),
        }
    }
}

/// Keeps the lease alive on one stream, a keep-alive every `ttl / 3`, extending `deadline`
/// from the *send* time of each confirmed request. A stream error reopens the stream at the
/// next period (the deadline simply stops advancing meanwhile: fail closed). A confirmation
/// with TTL 0 means etcd no longer knows the lease (expired or revoked): the deadline is
/// revoked and the task ends — the node must rejoin with a new lease.
pub(super) async fn keep_alive_loop(
    mut client: Client,
    lease_id: i64,
    ttl: Duration,
    margin: Duration,
    deadline: Arc<AckDeadline>,
) {
    let period = ttl / 3;
    loop {
        let opened = tokio::time::timeout(period, client.lease_keep_alive(lease_id)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            // The client's words for a first answer with TTL 0: etcd no longer knows the
            // lease, the same end as below (retrying it would never succeed).
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(why))) if why == "lease not found" => {
                tracing::error!(
                    lease = lease_id,
                    "the node's lease is gone; acknowledging nothing more"
                );
                deadline.revoke();
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = lease_id, %error, "cannot open the keep-alive stream");
                tokio::time::sleep(period).await;
                continue;
            }
            Err(_) => {
                tracing::warn!(lease = lease_id, "opening the keep-alive stream timed out");
                continue;
            }
        };
        loop {
            let sent = Instant::now();
            let round = tokio::time::timeout(period, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match round {
                Ok(Ok(Some(response))) if response.ttl() > 0 => {
                    deadline.extend(sent, Duration::from_secs(response.ttl() as u64), margin);
                }
                Ok(Ok(Some(_))) => {
                    tracing::error!(
                        lease = lease_id,
                        "the node's lease is gone; acknowledging nothing more"
                    );
                    deadline.revoke();
                    return;
                }
                Ok(Ok(None)) => {
                    tracing::warn!(lease = lease_id, "keep-alive stream closed");
                    break;
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = lease_id, %error, "keep-alive failed");
                    break;
                }
                Err(_) => {
                    tracing::warn!(lease = lease_id, "keep-alive timed out");
                    break;
                }
            }
            tokio::time::sleep_until((sent + period).into()).await;
        }
        tokio::time::sleep(period).await;
    }
}
