//! The whole-artifact SHA-256 of an upload, computed as its blocks are recorded, so that
//! CommitUpload reads back from the provider only the blocks it could not hash on the way —
//! none, for an upload whose blocks all arrived within the hold-ahead budget (see
//! [`super::sequencer`]).
//!
//! SHA-256 is not composable: the whole-file digest needs the bytes in index order, and an
//! uploader with several blocks in flight has them recorded out of order. A block recorded in
//! its turn is hashed at once (on a bulk thread, from the request's own bytes), followed by
//! every block held ahead that it makes contiguous. A block recorded *ahead* of its turn is
//! held — its bytes keep the block-memory reservation they arrived with (see
//! [`crate::memory`]) — until the gap before it is filled.
//!
//! Why holding cannot wedge uploads: held blocks are bounded node-wide by [`HeldAhead`], to as
//! many as the reservations they may pin (one PutBlock message each, whatever the block's
//! length) fill a quarter of the block-memory budget, so three quarters stay for the requests
//! that fill the gaps; a block past the bound is not held — the prefix ends there and commit
//! reads the rest back. Held blocks never wait for anything: they are hashed when their gap is
//! filled, or dropped when the prefix ends, the upload is finished, forgotten, or left
//! untouched for [`STALE_AFTER`] (see [`UploadDigests::release_stale`], called by every
//! maintenance pass).
//!
//! It is an optimisation with an exact fallback, never a source of truth:
//! * it lives in memory only — after a restart or a handoff, for an upload it gave up on (a
//!   block recorded twice) or one it never tracked (the table full), commit reads every block
//!   back as before;
//! * it remembers the attempt key of every block it hashed, and commit continues from it only
//!   if those are exactly the recorded keys of the first blocks, in order. Attempt keys are
//!   random and written once, so equal keys mean the hashed bytes are the bytes the provider
//!   holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Uploads tracked at once per shard; past it a new upload is not tracked.
pub const MAX_UPLOADS: usize = 64;

/// An upload whose held blocks wait this long without a block recorded gives them up (its
/// prefix ends): a gap that lasts is a failed block being retried, or an uploader gone.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// The node-wide bound on blocks held ahead of their turn, shared by every shard's
/// [`UploadDigests`]. Counted in blocks, not bytes: a short last block may still pin a whole
/// message's reservation.
#[derive(Debug)]
pub struct HeldAhead {
    blocks: AtomicUsize,
    max: usize,
}

impl HeldAhead {
    /// At most `max` blocks held at once.
    pub fn new(max: usize) -> Arc<HeldAhead> {
        Arc::new(HeldAhead {
            blocks: AtomicUsize::new(0),
            max,
        })
    }

    /// The bound for a node whose block-memory budget is `budget` bytes: the blocks whose
    /// reservations (at most one PutBlock message each) fit in a quarter of it.
    pub fn for_budget(budget: u64) -> Arc<HeldAhead> {
        Self::new((budget / 4 / nokv_proto::MAX_MESSAGE as u64) as usize)
    }

    /// Counts one more block held, unless that would pass the bound.
    fn try_hold(&self) -> bool {
        self.blocks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held + 1).filter(|total| *total <= self.max)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.blocks.fetch_sub(n, Ordering::AcqRel);
    }

    /// Blocks held now, node-wide.
    pub fn held(&self) -> usize {
        self.blocks.load(Ordering::Acquire)
    }
}

/// Blocks of one upload recorded ahead of their turn, by index, with their attempt key and
/// bytes. They count against [`HeldAhead`] until taken or dropped.
struct Ahead {
    blocks: BTreeMap<u32, (String, Bytes)>,
    bound: Arc<HeldAhead>,
}

impl Ahead {
    fn hold(&mut self, index: u32, key: &str, data: &Bytes) -> bool {
        if !self.bound.try_hold() {
            return false;
        }
        self.blocks.insert(index, (key.to_string(), data.clone()));
        true
    }

    fn take(&mut self, index: u32) -> Option<(String, Bytes)> {
        let taken = self.blocks.remove(&index)?;
        self.bound.release(1);
        Some(taken)
    }

    fn clear(&mut self) {
        self.bound.release(self.blocks.len());
        self.blocks.clear();
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One upload's running digest.
struct Running {
    hasher: Sha256,
    /// The attempt keys of blocks `0..keys.len()`, all hashed.
    keys: Vec<String>,
    ahead: Ahead,
    /// A block could not be held: the prefix ends here.
    ended: bool,
    /// Given up: commit reads every block back.
    abandoned: bool,
    touched: Instant,
}

impl Running {
    fn new(bound: Arc<HeldAhead>) -> Running {
        Running {
            hasher: Sha256::new(),
            keys: Vec::new(),
            ahead: Ahead {
                blocks: BTreeMap::new(),
                bound,
            },
            ended: false,
            abandoned: false,
            touched: Instant::now(),
        }
    }

    fn end(&mut self) {
        self.ended = true;
        self.ahead.clear();
    }
}

/// Where a commit's digest stands before it reads anything back.
pub struct Prefix {
    /// The digest state after the first `blocks` blocks.
    pub hasher: Sha256,
    pub blocks: usize,
}

/// The running digests of a shard's open uploads.
pub struct UploadDigests {
    uploads: Mutex<HashMap<String, Arc<Mutex<Running>>>>,
    bound: Arc<HeldAhead>,
}

impl UploadDigests {
    /// Digests whose held blocks count against the node-wide `bound`.
    pub fn new(bound: Arc<HeldAhead>) -> UploadDigests {
        UploadDigests {
            uploads: Mutex::default(),
            bound,
        }
    }

    /// Block `index` of `upload_id` was recorded under `key` with `data`: hashes it and the
    /// held blocks it makes contiguous if it is the prefix's next block, holds it if it is
    /// ahead (call it on a bulk thread).
    pub fn recorded(&self, upload_id: &str, index: u32, key: &str, data: &Bytes, lease: Duration) {
        let Some(running) = self.running(upload_id, lease) else {
            return;
        };
        let r = &mut *running.lock();
        r.touched = Instant::now();
        let next = r.keys.len() as u32;
        if index < next || r.ahead.blocks.contains_key(&index) {
            // Recorded again (a superseded attempt): the bytes hashed may not be the bytes
            // kept. Give up rather than reason about it.
            r.abandoned = true;
            r.ahead.clear();
        }
        if r.abandoned || r.ended {
            return;
        }
        if index > next {
            if !r.ahead.hold(index, key, data) {
                r.end();
            }
            return;
        }
        r.hasher.update(data);
        r.keys.push(key.to_string());
        while let Some((key, data)) = r.ahead.take(r.keys.len() as u32) {
            r.hasher.update(&data);
            r.keys.push(key);
        }
    }

    /// The hashed prefix of the upload if its keys are the first of `keys` (the recorded
    /// attempt key of every block, in index order); otherwise the empty prefix (read every
    /// block back). Forgets the upload and drops its held blocks.
    pub fn finish(&self, upload_id: &str, keys: &[String]) -> Prefix {
        let taken = self.uploads.lock().remove(upload_id);
        let Some(running) = taken else {
            return Prefix {
                hasher: Sha256::new(),
                blocks: 0,
            };
        };
        let mut r = running.lock();
        r.ahead.clear();
        if !r.abandoned && keys.starts_with(&r.keys) {
            Prefix {
                blocks: r.keys.len(),
                hasher: std::mem::take(&mut r.hasher),
            }
        } else {
            Prefix {
                hasher: Sha256::new(),
                blocks: 0,
            }
        }
    }

    /// Forgets an upload (aborted, expired).
    pub fn forget(&self, upload_id: &str) {
        self.uploads.lock().remove(upload_id);
    }

    /// Ends the prefix of every upload that has held blocks and no block recorded for `idle`
    /// (see [`STALE_AFTER`]), releasing them.
    pub fn release_stale(&self, idle: Duration) {
        let uploads: Vec<_> = self.uploads.lock().values().cloned().collect();
        for running in uploads {
            let mut r = running.lock();
            if !r.ahead.blocks.is_empty() && r.touched.elapsed() >= idle {
                r.end();
            }
        }
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
            uploads.retain(|_, r| r.lock().touched.elapsed() < lease);
            if uploads.len() >= MAX_UPLOADS {
                return None;
            }
        }
        let running = Arc::new(Mutex::new(Running::new(self.bound.clone())));
        uploads.insert(upload_id.to_string(), running.clone());
        Some(running)
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

    fn digest_of(n: u8) -> Vec<u8> {
        let mut h = Sha256::new();
        for i in 0..n {
            h.update(block(i));
        }
        h.finalize().to_vec()
    }

    /// Digests with room for `blocks` blocks held ahead, node-wide.
    fn digests(blocks: usize) -> UploadDigests {
        UploadDigests::new(HeldAhead::new(blocks))
    }

    fn record(d: &UploadDigests, u: &str, i: u8) {
        d.recorded(u, u32::from(i), &format!("k{i}"), &block(i), LEASE);
    }

    #[test]
    fn blocks_recorded_in_order_give_the_whole_digest() {
        let d = digests(8);
        for i in 0..5 {
            record(&d, "u", i);
        }
        let p = d.finish("u", &keys(5));
        assert_eq!(p.blocks, 5);
        assert_eq!(p.hasher.finalize().to_vec(), digest_of(5));
        assert_eq!(d.tracked(), 0, "finished uploads are forgotten");
    }

    #[test]
    fn blocks_recorded_out_of_order_are_held_until_their_gap_fills_and_give_the_whole_digest() {
        let d = digests(8);
        for i in [1u8, 3, 0, 2, 5, 4] {
            record(&d, "u", i);
        }
        assert_eq!(d.bound.held(), 0, "every held block was hashed and let go");
        let p = d.finish("u", &keys(6));
        assert_eq!(p.blocks, 6, "nothing is read back");
        assert_eq!(p.hasher.finalize().to_vec(), digest_of(6));
    }

    #[test]
    fn a_block_past_the_node_wide_bound_ends_the_prefix_and_lets_go_of_what_was_held() {
        let bound = HeldAhead::new(2);
        let (d, other) = (
            UploadDigests::new(bound.clone()),
            UploadDigests::new(bound.clone()),
        );
        record(&other, "w", 1);
        record(&d, "u", 0);
        record(&d, "u", 2);
        assert_eq!(bound.held(), 2);
        record(&d, "u", 3);
        assert_eq!(
            bound.held(),
            1,
            "u's held block is dropped; the other shard's stays"
        );
        record(&d, "u", 1);
        let p = d.finish("u", &keys(4));
        assert_eq!(p.blocks, 1, "block 0 only; the rest is read back");
        assert_eq!(p.hasher.finalize().to_vec(), digest_of(1));
        other.forget("w");
        assert_eq!(
            bound.held(),
            0,
            "a forgotten upload lets go of its held blocks"
        );
    }

    #[test]
    fn held_blocks_of_an_upload_left_idle_are_let_go_and_its_prefix_ends() {
        let d = digests(8);
        record(&d, "u", 0);
        record(&d, "u", 2);
        d.release_stale(Duration::from_secs(3600));
        assert_eq!(d.bound.held(), 1, "recently touched: kept");
        d.release_stale(Duration::ZERO);
        assert_eq!(d.bound.held(), 0);
        record(&d, "u", 1);
        assert_eq!(d.finish("u", &keys(3)).blocks, 1);
    }

    #[test]
    fn the_node_bound_counts_the_reservations_held_blocks_may_pin_in_a_quarter_of_the_budget() {
        let message = nokv_proto::MAX_MESSAGE as u64;
        assert_eq!(HeldAhead::for_budget(256 * 1024 * 1024).max, 15);
        assert_eq!(
            HeldAhead::for_budget(message).max,
            0,
            "the smallest budget holds nothing"
        );
        assert_eq!(HeldAhead::for_budget(8 * message).max, 2);
    }

    #[test]
    fn finishing_an_upload_with_a_gap_lets_go_of_its_held_blocks() {
        let d = digests(8);
        record(&d, "u", 0);
        record(&d, "u", 2);
        assert_eq!(d.finish("u", &keys(3)).blocks, 1);
        assert_eq!(d.bound.held(), 0);
    }

    #[test]
    fn a_recorded_key_it_did_not_hash_or_a_block_recorded_twice_means_read_everything_back() {
        let d = digests(8);
        for i in 0..3 {
            record(&d, "u", i);
        }
        let mut recorded = keys(3);
        recorded[1] = "k1-retry".into();
        assert_eq!(d.finish("u", &recorded).blocks, 0);

        record(&d, "v", 0);
        d.recorded("v", 0, "k0b", &block(9), LEASE);
        record(&d, "v", 1);
        assert_eq!(d.finish("v", &keys(2)).blocks, 0, "block 0 recorded twice");

        record(&d, "x", 1);
        d.recorded("x", 1, "k1b", &block(9), LEASE);
        record(&d, "x", 0);
        assert_eq!(
            d.finish("x", &keys(2)).blocks,
            0,
            "held block 1 recorded twice"
        );
        assert_eq!(d.bound.held(), 0);
        assert_eq!(d.finish("never", &keys(2)).blocks, 0, "never tracked");
    }

    #[test]
    fn a_full_table_tracks_no_new_upload_until_an_abandoned_one_ages_out() {
        let d = digests(8);
        for u in 0..MAX_UPLOADS {
            record(&d, &format!("u{u}"), 0);
        }
        record(&d, "late", 0);
        assert_eq!(d.finish("late", &keys(1)).blocks, 0, "not tracked");
        // With a lease of zero every tracked upload counts as abandoned.
        d.recorded("later", 0, "k0", &block(0), Duration::ZERO);
        assert_eq!(d.finish("later", &keys(1)).blocks, 1);
    }
}
