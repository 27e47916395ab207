//! The whole-artifact SHA-256 of an upload, computed as its blocks are recorded, so that
//! CommitUpload need not read every block back from the provider to prove the declared digest
//! (see [`super::sequencer`]).
//!
//! SHA-256 is not composable: the whole-file digest needs the bytes in index order. Blocks
//! arrive with several in flight and may be recorded out of order, so each upload keeps the
//! hasher of its in-order prefix plus the few recorded blocks that ran ahead of it (their bytes
//! are held until their turn, at most [`AHEAD_BLOCKS`] per upload).
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
            r.abandon();
            return;
        }
        r.ahead.insert(index, (key.to_string(), data));
        while let Some((k, bytes)) = {
            let next = r.keys.len() as u32;
            r.ahead.remove(&next)
        } {
            r.hasher.update(&bytes);
            r.keys.push(k);
        }
        if r.ahead.len() > AHEAD_BLOCKS {
            r.abandon();
        }
    }

    /// The digest of the whole upload if it hashed exactly `keys` (the recorded attempt key of
    /// every block, in index order); `None` means: read the blocks back. Forgets the upload.
    pub fn finish(&self, upload_id: &str, keys: &[String]) -> Option<[u8; 32]> {
        let running = self.uploads.lock().remove(upload_id)?;
        let r = std::mem::take(&mut *running.lock());
        (!r.abandoned && r.ahead.is_empty() && r.keys == keys).then(|| r.hasher.finalize().into())
    }

    /// Forgets an upload (aborted, expired).
    pub fn forget(&self, upload_id: &str) {
        self.uploads.lock().remove(upload_id);
    }

    /// Forgets every upload (a test stands in for a restart with it).
    #[cfg(test)]
    pub fn forget_all(&self) {
        self.uploads.lock().clear();
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
            uploads.retain(|_, r| r.lock().touched.is_some_and(|t| t.elapsed() < lease));
            if uploads.len() >= MAX_UPLOADS {
                return None;
            }
        }
        Some(uploads.entry(upload_id.to_string()).or_default().clone())
    }
}

impl Running {
    fn abandon(&mut self) {
        self.abandoned = true;
        self.ahead.clear();
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
