//! The node's inventory: drives the per-shard scans of [`crate::shard::inventory`] over the
//! shards this node serves (in cluster mode, only those: `Node::shards`), and answers the
//! admin calls about them.
//!
//! The driver is one background task. Every tick it starts a scan on each served shard
//! whose last scan completed `--inventory-interval` ago (judged from the shard's durable
//! record, so restarts add no scans; `off` never starts one by itself), then works every
//! running scan page by page — including a scan a restart interrupted, which resumes from its
//! stored cursor — and prunes stale observations of idle shards (`--history-retention`).
//! `nokv admin inventory start` starts scans and wakes the task. Shutdown waits for at most
//! the page in progress (each page commits or changes nothing).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::Result;
use crate::node::Node;
use crate::shard::Shard;
use crate::shard::inventory::{Scope, Status, Step};

/// Objects listed per page unless set otherwise (`--inventory-page-size`, hidden: tests).
pub const DEFAULT_PAGE: usize = 1000;

/// The inventory's settings, resolved from the server configuration.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    /// Time between periodic scans of a shard; `None`: only `admin inventory start` scans.
    pub interval: Option<Duration>,
    pub page: usize,
    /// Observations not seen for this long are pruned.
    pub retention: Duration,
}

/// One shard's part of an inventory answer.
#[derive(Debug, Clone)]
pub struct ShardInventory {
    pub shard: u32,
    pub status: Status,
    pub started: bool,
}

impl Node {
    /// The key space shard `shard` scans: shard 0 also scans the keys that belong to no
    /// shard of the placement.
    pub fn inventory_scope(&self, shard: &Shard) -> Scope {
        if shard.id == 0 {
            Scope::OwnAndForeign {
                shard_count: self.shard_count(),
            }
        } else {
            Scope::Own
        }
    }

    /// Starts a scan on every served shard that is not scanning and wakes the driver.
    pub async fn inventory_start(&self) -> Result<Vec<ShardInventory>> {
        let mut out = Vec::new();
        for shard in self.shards() {
            let started = shard.start_inventory().await?;
            out.push(ShardInventory {
                shard: shard.id,
                status: shard.inventory_status().await?,
                started,
            });
        }
        self.inventory_wake.notify_one();
        Ok(out)
    }

    pub async fn inventory_status(&self) -> Result<Vec<ShardInventory>> {
        let mut out = Vec::new();
        for shard in self.shards() {
            out.push(ShardInventory {
                shard: shard.id,
                status: shard.inventory_status().await?,
                started: false,
            });
        }
        Ok(out)
    }

    /// Up to `limit` observations of the served shards, by shard then key, and the total.
    pub async fn quarantine(
        &self,
        limit: usize,
    ) -> Result<(Vec<(u32, String, crate::meta::QuarantineRecord)>, u64)> {
        let mut out = Vec::new();
        let mut total = 0;
        for shard in self.shards() {
            total += shard.inventory_status().await?.quarantined;
            if out.len() < limit {
                let page = shard.quarantine(None, limit - out.len()).await?;
                out.extend(page.into_iter().map(|(k, o)| (shard.id, k, o)));
            }
        }
        Ok((out, total))
    }
}

/// Longest wait between two looks at the schedule when scans are periodic.
const TICK: Duration = Duration::from_secs(60);

/// The driver task (see the module doc) until `stop` flips.
pub async fn run(node: Arc<Node>, settings: InventorySettings, mut stop: watch::Receiver<bool>) {
    loop {
        for shard in node.shards() {
            let work = drive(&node, &shard, &settings);
            tokio::select! {
                _ = stop.changed() => return,
                r = work => if let Err(e) = r {
                    tracing::warn!(shard = shard.id, error = %e, "inventory failed; will retry");
                }
            }
        }
        let tick = settings.interval.map_or(TICK, |i| i.min(TICK));
        tokio::select! {
            _ = stop.changed() => return,
            _ = node.inventory_wake.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

/// One shard's turn: a due start, every page of a running scan, pruning when idle.
async fn drive(node: &Node, shard: &Shard, settings: &InventorySettings) -> Result<()> {
    if let Some(interval) = settings.interval {
        shard.start_inventory_if_due(interval).await?;
    }
    let scope = node.inventory_scope(shard);
    while let Step::Page { last } = shard.inventory_page(scope, settings.page).await? {
        if last {
            let s = shard.inventory_status().await?;
            tracing::info!(
                shard = shard.id,
                objects = s.record.objects,
                pages = s.record.pages,
                quarantined = s.quarantined,
                "inventory scan complete"
            );
            break;
        }
    }
    let pruned = shard.prune_quarantine(settings.retention).await?;
    if pruned > 0 {
        tracing::info!(
            shard = shard.id,
            pruned,
            "stale quarantine observations pruned"
        );
    }
    Ok(())
}
