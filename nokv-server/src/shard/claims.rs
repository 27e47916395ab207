//! In-process claims on single blocks of an upload. A PutBlock holds the claim of its
//! (upload, index) across both sessions and the provider write, so a duplicate that arrives
//! while the first is in flight waits and then answers from what the first recorded. This
//! is not a durability mechanism — the attempt keys and fences in the metadata are — it only
//! keeps duplicates from paying for a second provider write.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Key = (String, u32);

#[derive(Default)]
pub struct BlockClaims {
    map: Arc<Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>>,
}

/// Held while one request works on a block; dropping it lets the next duplicate in.
pub struct BlockClaim {
    key: Key,
    lock: Arc<AsyncMutex<()>>,
    map: Arc<Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl BlockClaims {
    pub async fn claim(&self, upload: &str, index: u32) -> BlockClaim {
        let key = (upload.to_string(), index);
        let lock = self.map.lock().entry(key.clone()).or_default().clone();
        let guard = lock.clone().lock_owned().await;
        BlockClaim {
            key,
            lock,
            map: self.map.clone(),
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for BlockClaim {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = self.map.lock();
        // Only the map and this claim hold the lock: nobody waits, so forget the entry.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}
