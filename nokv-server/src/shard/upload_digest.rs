//! The whole-artifact SHA-256 of an upload, computed as its blocks are recorded, so that
//! CommitUpload need not read every block back from the provider to prove the declared digest
//! (see [`super::sequencer`]).
//!
//! SHA-256 is not composable: the whole-file digest needs the bytes in index order. Blocks
//! arrive with several in flight and may be recorded out of order, so each upload keeps the
//! hasher of its in-order prefix plus the few recorded blocks that ran ahead of it (their bytes
//! are held until their turn: at most [`AHEAD_BLOCKS`] per upload and [`MAX_AHEAD_BYTES`]
//! across the shard's uploads, so the memory it costs is bounded whatever the clients do).
//!
//! It is an optimisation with an exact fallback, never a source of truth:
//! * it lives in memory only — after a restart, a handoff, or for an upload it gave up on
//!   (too many blocks ahead, a block recorded twice, the table full) commit reads the blocks
//!   back as before;
//! * it remembers the attempt key of every block it hashed, and commit uses its digest only
//!   if those are exactly the recorded keys of every block, in order. Attempt keys are random
//!   and written once, so equal keys mean the hashed bytes are the bytes the provider holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Recorded blocks an upload may hold ahead of its in-order prefix before it is given up
/// (the commit then reads back): a client's blocks in flight, with room to spare.
pub const AHEAD_BLOCKS: usize = 8;

/// Uploads tracked at once per shard; past it a new upload is not tracked.
pub const MAX_UPLOADS: usize = 64;

/// Bytes of blocks held ahead across a shard's uploads: the memory this optimisation may
/// cost, whatever the number of uploads. A block that would pass it gives its upload up.
pub const MAX_AHEAD_BYTES: u64 = 64 << 20;

/// One upload's running digest.
#[derive(Default)]
struct Running {
    hasher: Sha256,
    /// The attempt keys of blocks `0..keys.len()`, all hashed.
    keys: Vec<String>,
    /// Recorded blocks past the prefix: index → (attempt key, bytes).
    ahead: BTreeMap<u32, (String, Bytes)>,
    /// Given up: commit reads back.
    abandoned: bool,
    touched: Option<Instant>,
}

/// The running digests of a shard's open uploads.
#[derive(Default)]
pub struct UploadDigests {
    uploads: Mutex<HashMap<String, Arc<Mutex<Running>>>>,
    /// Bytes held in every upload's `ahead` (bounded by [`MAX_AHEAD_BYTES`]).
    held: std::sync::atomic::AtomicU64,
}

impl UploadDigests {
    /// Block `index` of `upload_id` was recorded under `key` with `data`. Hashes whatever
    /// became in order (call it on a bulk thread: it may hash several blocks).
    pub fn recorded(&self, upload_id: &str, index: u32, key: &str, data: Bytes, lease: Duration) {
        let Some(running) = self.running(upload_id, lease) else {
            return;
        };
        let mut r = running.lock();
        r.touched = Some(Instant::now());
        if r.abandoned {
            return;
        }
        let next = r.keys.len() as u32;
        if index < next || r.ahead.contains_key(&index) {
            // Recorded again (a superseded attempt, a retry): the bytes hashed may not be the
            // bytes kept. Give up rather than reason about it.
            self.abandon(&mut r);
            return;
        }
        if index > next {
            let len = data.len() as u64;
            if r.ahead.len() >= AHEAD_BLOCKS || !self.hold(len) {
                self.abandon(&mut r);
                return;
            }
            r.ahead.insert(index, (key.to_string(), data));
            return;
        }
        r.hasher.update(&data);
        r.keys.push(key.to_string());
        while let Some((k, bytes)) = {
            let next = r.keys.len() as u32;
            r.ahead.remove(&next)
        } {
            r.hasher.update(&bytes);
            r.keys.push(k);
            self.release(bytes.len() as u64);
        }
    }

    /// Reserves `len` bytes of the shard's ahead budget.
    fn hold(&self, len: u64) -> bool {
        use std::sync::atomic::Ordering;
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h + len <= MAX_AHEAD_BYTES).then_some(h + len)
            })
            .is_ok()
    }

    fn release(&self, len: u64) {
        self.held
            .fetch_sub(len, std::sync::atomic::Ordering::AcqRel);
    }

    /// Gives an upload up (commit reads back), returning what it held.
    fn abandon(&self, r: &mut Running) {
        r.abandoned = true;
        let held: u64 = r.ahead.values().map(|(_, b)| b.len() as u64).sum();
        r.ahead.clear();
        self.release(held);
    }

    /// Bytes held ahead now, across the shard's uploads.
    pub fn held(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The digest of the whole upload if it hashed exactly `keys` (the recorded attempt key of
    /// every block, in index order); `None` means: read the blocks back. Forgets the upload.
    pub fn finish(&self, upload_id: &str, keys: &[String]) -> Option<[u8; 32]> {
        let running = self.uploads.lock().remove(upload_id)?;
        let mut r = std::mem::take(&mut *running.lock());
        let complete = !r.abandoned && r.ahead.is_empty() && r.keys == keys;
        self.abandon(&mut r);
        complete.then(|| r.hasher.finalize().into())
    }

    /// Forgets an upload (aborted, expired).
    pub fn forget(&self, upload_id: &str) {
        if let Some(running) = self.uploads.lock().remove(upload_id) {
            self.abandon(&mut running.lock());
        }
    }

    /// Forgets every upload (a test stands in for a restart with it).
    #[cfg(test)]
    pub fn forget_all(&self) {
        let ids: Vec<String> = self.uploads.lock().keys().cloned().collect();
        for id in ids {
            self.forget(&id);
        }
    }

    /// Uploads tracked now.
    pub fn tracked(&self) -> usize {
        self.uploads.lock().len()
    }

    fn running(&self, upload_id: &str, lease: Duration) -> Option<Arc<Mutex<Running>>> {
        let mut uploads = self.uploads.lock();
        if let Some(r) = uploads.get(upload_id) {
            return Some(r.clone());
        }
        if uploads.len() >= MAX_UPLOADS {
            // Uploads untouched for a whole lease are abandoned by their clients (the lease
            // has expired): their digests go first.
            uploads.retain(|_, r| {
                let mut r = r.lock();
                let live = r.touched.is_some_and(|t| t.elapsed() < lease);
                if !live {
                    self.abandon(&mut r);
                }
                live
            });
            if uploads.len() >= MAX_UPLOADS {
                return None;
            }
        }
        Some(uploads.entry(upload_id.to_string()).or_default().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(600);

    fn block(i: u8) -> Bytes {
        Bytes::from(vec![i; 1000 + usize::from(i)])
    }

    fn keys(n: u8) -> Vec<String> {
        (0..n).map(|i| format!("k{i}")).collect()
    }

    fn whole(n: u8) -> [u8; 32] {
        let mut h = Sha256::new();
        for i in 0..n {
            h.update(block(i));
        }
        h.finalize().into()
    }

    #[test]
    fn blocks_recorded_out_of_order_give_the_digest_of_the_bytes_in_index_order() {
        let d = UploadDigests::default();
        for i in [1u8, 0, 3, 2, 4] {
            d.recorded("u", u32::from(i), &format!("k{i}"), block(i), LEASE);
        }
        assert_eq!(d.finish("u", &keys(5)), Some(whole(5)));
        assert_eq!(d.tracked(), 0, "finished uploads are forgotten");
    }

    #[test]
    fn a_recorded_key_it_did_not_hash_means_read_back() {
        let d = UploadDigests::default();
        for i in 0..3u8 {
            d.recorded("u", u32::from(i), &format!("k{i}"), block(i), LEASE);
        }
        let mut recorded = keys(3);
        recorded[1] = "k1-retry".into();
        assert_eq!(d.finish("u", &recorded), None);
    }

    #[test]
    fn a_missing_block_or_a_block_recorded_twice_means_read_back() {
        let d = UploadDigests::default();
        d.recorded("u", 0, "k0", block(0), LEASE);
        d.recorded("u", 2, "k2", block(2), LEASE);
        assert_eq!(d.finish("u", &keys(3)), None, "block 1 never hashed");

        d.recorded("v", 0, "k0", block(0), LEASE);
        d.recorded("v", 0, "k0b", block(9), LEASE);
        d.recorded("v", 1, "k1", block(1), LEASE);
        assert_eq!(d.finish("v", &keys(2)), None, "block 0 recorded twice");
    }

    #[test]
    fn too_many_blocks_ahead_of_the_prefix_give_the_upload_up() {
        let d = UploadDigests::default();
        for i in 1..=(AHEAD_BLOCKS as u8 + 1) {
            d.recorded("u", u32::from(i), &format!("k{i}"), block(i), LEASE);
        }
        d.recorded("u", 0, "k0", block(0), LEASE);
        assert_eq!(d.finish("u", &keys(AHEAD_BLOCKS as u8 + 2)), None);
    }

    #[test]
    fn blocks_held_ahead_are_bounded_per_shard_and_released_when_hashed_or_given_up() {
        let d = UploadDigests::default();
        let big = |i: u8| Bytes::from(vec![i; (MAX_AHEAD_BYTES / 4) as usize]);
        // Two uploads each hold two quarter-budget blocks ahead: the budget is full.
        for u in ["a", "b"] {
            d.recorded(u, 1, "k1", big(1), LEASE);
            d.recorded(u, 2, "k2", big(2), LEASE);
        }
        assert_eq!(d.held(), MAX_AHEAD_BYTES);
        // A third upload's block ahead would pass it: that upload is given up, nothing held.
        d.recorded("c", 1, "k1", big(1), LEASE);
        assert_eq!(d.held(), MAX_AHEAD_BYTES);
        d.recorded("c", 0, "k0", big(0), LEASE);
        assert_eq!(d.finish("c", &keys(2)), None);
        // Block 0 of `a` arrives: its blocks ahead are hashed and their bytes released.
        d.recorded("a", 0, "k0", big(0), LEASE);
        assert_eq!(d.held(), MAX_AHEAD_BYTES / 2);
        assert!(d.finish("a", &keys(3)).is_some());
        // `b` is forgotten (aborted): what it held is released.
        d.forget("b");
        assert_eq!(d.held(), 0);
    }

    #[test]
    fn a_full_table_tracks_no_new_upload_until_an_abandoned_one_ages_out() {
        let d = UploadDigests::default();
        for u in 0..MAX_UPLOADS {
            d.recorded(&format!("u{u}"), 0, "k0", block(0), LEASE);
        }
        d.recorded("late", 0, "k0", block(0), LEASE);
        assert_eq!(d.finish("late", &keys(1)), None, "not tracked");
        // With a lease of zero every tracked upload counts as abandoned.
        d.recorded("later", 0, "k0", block(0), Duration::ZERO);
        assert_eq!(d.finish("later", &keys(1)), Some(whole(1)));
    }
}
