//! The whole-artifact SHA-256 of an upload's in-order prefix, computed as its blocks are
//! recorded, so that CommitUpload reads back from the provider only the blocks after it —
//! none, when the blocks were recorded in order (see [`super::sequencer`]).
//!
//! SHA-256 is not composable: the whole-file digest needs the bytes in index order. A block
//! recorded in its turn is hashed at once (on a bulk thread, from the request's own bytes); a
//! block recorded ahead of its turn ends the prefix, and so does everything after it — its
//! bytes are **not** kept: they belong to the request's block-memory reservation, and holding
//! them for a block that may only arrive later (refused for that very budget) could wedge
//! every upload. The commit hashes the rest from the provider.
//!
//! It is an optimisation with an exact fallback, never a source of truth:
//! * it lives in memory only — after a restart or a handoff, for an upload it gave up on (a
//!   block recorded twice) or one it never tracked (the table full), commit reads every block
//!   back as before;
//! * it remembers the attempt key of every block it hashed, and commit continues from it only
//!   if those are exactly the recorded keys of the first blocks, in order. Attempt keys are
//!   random and written once, so equal keys mean the hashed bytes are the bytes the provider
//!   holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// Uploads tracked at once per shard; past it a new upload is not tracked.
pub const MAX_UPLOADS: usize = 64;

/// One upload's running digest.
#[derive(Default)]
struct Running {
    hasher: Sha256,
    /// The attempt keys of blocks `0..keys.len()`, all hashed.
    keys: Vec<String>,
    /// A block was recorded ahead of its turn: the prefix ends here.
    ended: bool,
    /// Given up: commit reads every block back.
    abandoned: bool,
    touched: Option<Instant>,
}

/// Where a commit's digest stands before it reads anything back.
pub struct Prefix {
    /// The digest state after the first `blocks` blocks.
    pub hasher: Sha256,
    pub blocks: usize,
}

/// The running digests of a shard's open uploads.
#[derive(Default)]
pub struct UploadDigests {
    uploads: Mutex<HashMap<String, Arc<Mutex<Running>>>>,
}

impl UploadDigests {
    /// Block `index` of `upload_id` was recorded under `key` with `data`: hashes it if it is
    /// the prefix's next block (call it on a bulk thread).
    pub fn recorded(&self, upload_id: &str, index: u32, key: &str, data: &Bytes, lease: Duration) {
        let Some(running) = self.running(upload_id, lease) else {
            return;
        };
        let mut r = running.lock();
        r.touched = Some(Instant::now());
        let next = r.keys.len() as u32;
        if index < next {
            // Recorded again (a superseded attempt): the bytes hashed may not be the bytes
            // kept. Give up rather than reason about it.
            r.abandoned = true;
        }
        if r.abandoned || r.ended {
            return;
        }
        if index > next {
            r.ended = true;
            return;
        }
        r.hasher.update(data);
        r.keys.push(key.to_string());
    }

    /// The hashed prefix of the upload if its keys are the first of `keys` (the recorded
    /// attempt key of every block, in index order); otherwise the empty prefix (read every
    /// block back). Forgets the upload.
    pub fn finish(&self, upload_id: &str, keys: &[String]) -> Prefix {
        let taken = self
            .uploads
            .lock()
            .remove(upload_id)
            .map(|running| std::mem::take(&mut *running.lock()));
        match taken {
            Some(r) if !r.abandoned && keys.starts_with(&r.keys) => Prefix {
                blocks: r.keys.len(),
                hasher: r.hasher,
            },
            _ => Prefix {
                hasher: Sha256::new(),
                blocks: 0,
            },
        }
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

    fn record(d: &UploadDigests, u: &str, i: u8) {
        d.recorded(u, u32::from(i), &format!("k{i}"), &block(i), LEASE);
    }

    #[test]
    fn blocks_recorded_in_order_give_the_whole_digest() {
        let d = UploadDigests::default();
        for i in 0..5 {
            record(&d, "u", i);
        }
        let p = d.finish("u", &keys(5));
        assert_eq!(p.blocks, 5);
        assert_eq!(p.hasher.finalize().to_vec(), digest_of(5));
        assert_eq!(d.tracked(), 0, "finished uploads are forgotten");
    }

    #[test]
    fn a_block_recorded_ahead_ends_the_prefix_and_keeps_no_bytes() {
        let d = UploadDigests::default();
        for i in [0u8, 1, 3, 2, 4] {
            record(&d, "u", i);
        }
        let p = d.finish("u", &keys(5));
        assert_eq!(p.blocks, 2, "blocks 0 and 1; the rest is read back");
        assert_eq!(p.hasher.finalize().to_vec(), digest_of(2));
    }

    #[test]
    fn a_recorded_key_it_did_not_hash_or_a_block_recorded_twice_means_read_everything_back() {
        let d = UploadDigests::default();
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
        assert_eq!(d.finish("never", &keys(2)).blocks, 0, "never tracked");
    }

    #[test]
    fn a_full_table_tracks_no_new_upload_until_an_abandoned_one_ages_out() {
        let d = UploadDigests::default();
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
