//! In-process claims on single blocks of an upload. A PutBlock holds the claim of its
//! (upload, index) across both sessions and the provider write, so a duplicate that arrives
//! while the first is in flight waits and then answers from what the first recorded. This
//! is not a durability mechanism — the attempt keys and fences in the metadata are — it only
//! keeps duplicates from paying for a second provider write.
//!
//! The number of requests parked on a claim someone else holds is observable
//! ([`BlockClaims::wait_parked`]), so a test can order "the duplicate is waiting" before "the
//! first one finishes" by a signal instead of by chance.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, watch};

type Key = (String, u32);

#[derive(Default)]
pub struct BlockClaims {
    map: Arc<Mutex<HashMap<Key, Arc<AsyncMutex<()>>>>>,
    /// Requests waiting right now for a claim another request holds.
    parked: watch::Sender<usize>,
}

/// Counts one parked request for as long as it lives (also when its caller goes away).
struct Parked<'a>(&'a watch::Sender<usize>);

impl<'a> Parked<'a> {
    fn new(count: &'a watch::Sender<usize>) -> Parked<'a> {
        count.send_modify(|n| *n += 1);
        Parked(count)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
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
        let guard = match lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                let _parked = Parked::new(&self.parked);
                lock.clone().lock_owned().await
            }
        };
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

    /// Waits until at least `n` requests are parked on claims.
    #[cfg(test)]
    pub async fn wait_parked(&self, n: usize) {
        let mut rx = self.parked.subscribe();
        let _ = rx.wait_for(|p| *p >= n).await;
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
