//! The command gate of one shard: reads share it, write sessions hold it exclusively.
//!
//! A write session is a synchronous closure over a [`WriteView`] that runs on a blocking
//! thread and commits durably before the gate is released. Because the closure is not async
//! it cannot await anything — in particular no provider I/O can happen while the gate is
//! held. Callers that need provider I/O (the upload sequencer) split their work into two
//! sessions with the I/O between them.

use std::sync::Arc;

use tokio::sync::RwLock;

use crate::error::{Error, Result};
use crate::meta::{MetaStore, ReadView, WriteView};

pub struct Gate {
    lock: Arc<RwLock<()>>,
    meta: Arc<MetaStore>,
}

impl Gate {
    pub fn new(meta: MetaStore) -> Gate {
        Gate {
            lock: Arc::new(RwLock::new(())),
            meta: Arc::new(meta),
        }
    }

    /// Runs `f` on a snapshot while holding the gate shared.
    pub async fn read<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        let _shared = self.lock.read().await;
        self.meta.read(f)
    }

    /// Runs `f` as one write session: exclusive gate, one durable commit (or nothing at all
    /// when `f` fails). The session finishes even if the caller stops waiting, so a
    /// cancelled request can never leave half a session behind.
    pub async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriteView) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let exclusive = self.lock.clone().write_owned().await;
        let meta = self.meta.clone();
        tokio::task::spawn_blocking(move || {
            let _held = exclusive;
            meta.write(f)
        })
        .await
        .map_err(|e| Error::Internal(format!("write session panicked: {e}")))?
    }
}
