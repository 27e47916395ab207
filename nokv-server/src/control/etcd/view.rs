//! Reading the cluster as a whole: one consistent snapshot ([`EtcdControl::cluster_view`])
//! and a stream of changes to re-read it on ([`EtcdControl::changes`]).
//!
//! Invariants: read only, nothing here writes to etcd; a view is read at one etcd revision
//! (one prefix get), so it never mixes two states; it lists exactly the shards `0..shards` of
//! this node's settings, and keys under the prefix that are not nokv's are ignored.

use etcd_client::{GetOptions, WatchOptions};

use super::EtcdControl;
use super::records::{ClusterView, ShardView, decode};
use crate::control::ControlError;

type Result<T, E = ControlError> = std::result::Result<T, E>;

impl EtcdControl {
    /// Reads the whole cluster prefix at one revision.
    pub async fn cluster_view(&self) -> Result<ClusterView> {
        let response = self
            .client
            .clone()
            .get(
                self.keys.root.clone(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        let mut view = ClusterView {
            cluster: self.settings.cluster.clone(),
            config: None,
            nodes: Vec::new(),
            shards: (0..self.settings.config.shards)
                .map(|shard| ShardView {
                    shard,
                    record: None,
                    owner: None,
                })
                .collect(),
        };
        let nodes_prefix = self.keys.nodes();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if key == self.keys.config() {
                view.config = Some(decode(&key, kv.value())?);
            } else if let Some(id) = key.strip_prefix(&nodes_prefix) {
                view.nodes.push((id.to_string(), decode(&key, kv.value())?));
            } else if let Some((shard, is_owner)) = self.keys.parse_shard_key(kv.key())
                && let Some(entry) = view.shards.get_mut(shard as usize)
            {
                if is_owner {
                    entry.owner = Some(decode(&key, kv.value())?);
                } else {
                    entry.record = Some(decode(&key, kv.value())?);
                }
            }
        }
        view.nodes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(view)
    }

    /// A stream of every change under the cluster prefix from now on (nodes joining or
    /// leaving, ownership records and owner keys). Carries no decoded data: the caller re-reads
    /// [`EtcdControl::cluster_view`] when it fires.
    pub async fn changes(&self) -> Result<etcd_client::WatchStream> {
        let stream = self
            .client
            .clone()
            .watch(
                self.keys.root.clone(),
                Some(WatchOptions::new().with_prefix()),
            )
            .await?;
        Ok(stream)
    }
}
