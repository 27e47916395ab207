//! The etcd key layout under `/nokv/<cluster>/` and the records stored at those keys.
//!
//! Invariants:
//! * every key nokv writes is one of [`Keys`]: `config`, `nodes/<id>`, `shards/<s>/record`,
//!   `shards/<s>/owner`; anything else under the prefix is ignored when read;
//! * `config` ([`ClusterConfig`]) is written once and never changed;
//! * `nodes/<id>` ([`NodeRecord`]) and `shards/<s>/owner` ([`OwnerKey`]) live under a node's
//!   lease, so their presence means a live node and a live ownership;
//! * `shards/<s>/record` ([`ShardRecord`]) has no lease: it outlives its owner and carries the
//!   epoch forward;
//! * values are JSON ([`encode`]/[`decode`]); a value that does not decode is reported as
//!   [`ControlError::Corrupt`], never skipped silently.

use serde::{Deserialize, Serialize};

use crate::control::{ControlError, Epoch};

type Result<T, E = ControlError> = std::result::Result<T, E>;

/// The immutable cluster record: settings every node must share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// Number of shards, fixed at cluster creation (placement depends on it).
    pub shards: u32,
    /// Provider bucket all nodes write to.
    pub bucket: String,
    /// Key prefix inside the bucket.
    pub prefix: String,
}

/// `nodes/<id>`: where a live node answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub endpoint: String,
}

/// Lifecycle state of a shard's ownership record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardState {
    /// The owner serves the shard.
    Serving,
    /// The owner refuses new requests (NotOwner + hint) while in-flight ones finish.
    Draining,
    /// The owner released the shard gracefully; any node may take it at `epoch + 1`.
    Handoff,
}

/// `shards/<s>/record`: the shard's durable ownership record (no lease).
///
/// `owner`/`endpoint` name the current owner while `Serving`/`Draining`, and the last owner in
/// `Handoff`. A record still `Serving` whose owner key is gone means its owner crashed: any node
/// takes it over when its log is in the provider (`log`), else the balance step leaves it for
/// that node to take back (local durability).
/// `checkpoint` is the snapshot recorded by the last graceful release, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub epoch: Epoch,
    pub state: ShardState,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointRef>,
    /// False from an acquisition until the owner's first write session: an owner must set it
    /// (a transaction guarded by its owner key) before it commits anything. A record whose
    /// owner lapsed with `changed == false` still equals its checkpoint, so another node may
    /// take the shard from that checkpoint without losing an acknowledged write.
    #[serde(default)]
    pub changed: bool,
    /// A handoff addressed to one node (`nokv admin shard move`): only that node takes it
    /// while it is alive.
    #[serde(default)]
    pub target: Option<String>,
    /// `--metadata-durability provider`: where the owner's log for this shard begins. The
    /// shard's durable state is then exactly `checkpoint` (none: empty) plus the records of
    /// `log.stream` that touch this shard, from `log.from_seq` up to the stream's fence — so
    /// any node can take it over after its owner's lease lapsed, with nothing but the
    /// provider. Set before the owner serves the shard; cleared when a checkpoint replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogRef>,
}

/// Where a shard's part of a node's provider log begins (see [`ShardRecord::log`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRef {
    /// The stream, `<node>.<incarnation>` (`provider_log::StreamId::name`).
    pub stream: String,
    /// Every record of this ownership has at least this sequence number.
    pub from_seq: u64,
    /// The epoch the stream's writer held the shard at when it recorded this log: from
    /// `from_seq` on its segments name the shard at this epoch — or at a later one, up to the
    /// record's, if the writer took the shard back and its load stopped after adopting the new
    /// epoch (a write in its stream) but before recording a log of its own. The record's
    /// epoch alone cannot tell a taker this: an acquisition carries the log over unchanged
    /// until the new owner's load replaces it (see [`crate::takeover`]). 0 in records from
    /// before it was kept: read as the record's epoch.
    #[serde(default)]
    pub epoch: Epoch,
}

/// A consistent snapshot of a shard's metadata uploaded by a releasing owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Provider key (`<prefix>/meta/<shard>/ckpt/<epoch>-...`), unique per upload.
    pub key: String,
    /// Hex SHA-256 of the object; the next owner refuses a checkpoint that does not match.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Epoch of the owner that took it; must equal the record's epoch when recorded.
    pub epoch: Epoch,
    /// Wall-clock creation time (milliseconds since the Unix epoch), for operators only.
    pub created_unix_ms: u64,
}

/// Everything under `/nokv/<cluster>/`, read at one etcd revision (for `nokv admin cluster`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    /// The cluster's name (`--cluster`); empty for the embedded default.
    pub cluster: String,
    pub config: Option<ClusterConfig>,
    /// Live nodes (their keys exist only while their leases do), sorted by id.
    pub nodes: Vec<(String, NodeRecord)>,
    /// One entry per shard `0..shards`.
    pub shards: Vec<ShardView>,
}

/// One shard in a [`ClusterView`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardView {
    pub shard: u32,
    pub record: Option<ShardRecord>,
    /// Present exactly while some node's lease holds the shard.
    pub owner: Option<OwnerKey>,
}

/// `shards/<s>/owner`: present exactly while the named node owns the shard at `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerKey {
    pub node: String,
    pub epoch: Epoch,
}

/// Key layout under `/nokv/<cluster>/`.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    pub(super) root: String,
}

impl Keys {
    pub(super) fn new(cluster: &str) -> Keys {
        Keys {
            root: format!("/nokv/{cluster}/"),
        }
    }
    pub(super) fn config(&self) -> String {
        format!("{}config", self.root)
    }
    pub(super) fn nodes(&self) -> String {
        format!("{}nodes/", self.root)
    }
    pub(super) fn node(&self, id: &str) -> String {
        format!("{}nodes/{id}", self.root)
    }
    pub(super) fn shards(&self) -> String {
        format!("{}shards/", self.root)
    }
    pub(super) fn record(&self, shard: u32) -> String {
        format!("{}shards/{shard}/record", self.root)
    }
    pub(super) fn owner(&self, shard: u32) -> String {
        format!("{}shards/{shard}/owner", self.root)
    }
    /// `(shard, is_owner_key)` of a key under `shards/`.
    pub(super) fn parse_shard_key(&self, key: &[u8]) -> Option<(u32, bool)> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.shards())?;
        let (shard, kind) = rest.split_once('/')?;
        let shard = shard.parse().ok()?;
        match kind {
            "owner" => Some((shard, true)),
            "record" => Some((shard, false)),
            _ => None,
        }
    }
}

/// A record as stored in etcd (JSON).
pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("control records serialize")
}

/// A record read from `key`; [`ControlError::Corrupt`] when it does not decode.
pub(super) fn decode<T: for<'de> Deserialize<'de>>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| ControlError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}
