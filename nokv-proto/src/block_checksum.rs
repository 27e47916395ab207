//! The checksums of one artifact block, as both ends compute and check them.
//!
//! An artifact has two kinds of digest with two different jobs:
//! * the **whole-file sha256** is the publication's identity (the entry's `sha256`, a
//!   receipt's identity, what `sha256sum` prints): cryptographic, declared by the client at
//!   commit and proven by the server over the recorded bytes before anything is published;
//! * a **block checksum** catches a block damaged in flight or at rest — a client that sent
//!   other bytes than it checksummed, a provider object cut short or flipped — early, block by
//!   block, on the way in (PutBlock) and out (restore, grep).
//!
//! The second job is about damage, not forgery, and needs no cryptography: every block's bytes
//! are also covered by the whole-file sha256, which a restore proves at its end. So blocks carry a CRC-32C (Castagnoli, the
//! checksum of iSCSI, ext4 metadata and S3's `CRC32C`), which this CPU computes at ~27 GB/s
//! against SHA-256's ~1.6 GB/s: a publish or a restore hashes every byte with SHA-256 once,
//! not twice. Blocks put before CRC-32C existed carry a sha256 instead; a block may carry both.
//! Readers check every checksum a block has, and a block with none matches nothing.
//!
//! What a CRC does not do is resist a forger: bytes swapped on purpose for others with the same
//! CRC pass a block check. A restore still refuses them at its end (the whole-file sha256);
//! grep over artifacts, which reads blocks without that proof, would match them. The provider
//! is trusted not to forge objects (credentials scoped to the bucket, HTTPS to it in
//! production); it is not trusted not to damage them, which is what the CRC catches.

use sha2::{Digest, Sha256};

/// CRC-32C (Castagnoli) of `data`, hardware-accelerated where the CPU has it.
pub fn crc32c(data: &[u8]) -> u32 {
    // The ISCSI variant is CRC-32C; its 64-bit return carries a 32-bit value.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// The checksums recorded for (or declared with) one block. Invariant of every recorded
/// block: at least one is present.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockChecksums {
    /// SHA-256 of the block; empty when it has none.
    pub sha256: Vec<u8>,
    pub crc32c: Option<u32>,
}

impl BlockChecksums {
    /// What a client declares for a block it sends: its CRC-32C.
    pub fn of(data: &[u8]) -> BlockChecksums {
        BlockChecksums {
            sha256: Vec::new(),
            crc32c: Some(crc32c(data)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.sha256.is_empty() && self.crc32c.is_none()
    }

    /// Whether `data` matches every checksum present. With none present nothing matches: a
    /// block without a checksum proves nothing about its bytes.
    pub fn matches(&self, data: &[u8]) -> bool {
        !self.is_empty()
            && self.crc32c.is_none_or(|c| crc32c(data) == c)
            && (self.sha256.is_empty() || Sha256::digest(data).as_slice() == self.sha256)
    }

    /// Whether two declarations of one block name the same bytes as far as their checksums
    /// tell: they share at least one kind, and every kind both carry agrees. (A retried block
    /// is answered from the first attempt's record, so this only decides between "the same
    /// block again" and a conflict; the recorded bytes are what the commit proves.)
    pub fn agrees_with(&self, other: &BlockChecksums) -> bool {
        let sha = !self.sha256.is_empty() && !other.sha256.is_empty();
        let crc = self.crc32c.is_some() && other.crc32c.is_some();
        (sha || crc)
            && (!sha || self.sha256 == other.sha256)
            && (!crc || self.crc32c == other.crc32c)
    }

    /// Feeds the block's part of a manifest digest: its sha256, or the 4 big-endian bytes of
    /// its CRC-32C when it has no sha256 (a block of a revision published before CRC-32C has a
    /// sha256 only, so such revisions keep the manifest digest they were published with).
    pub fn feed_manifest(&self, manifest: &mut Sha256) {
        match (self.sha256.is_empty(), self.crc32c) {
            (false, _) => manifest.update(&self.sha256),
            (true, Some(c)) => manifest.update(c.to_be_bytes()),
            (true, None) => {}
        }
    }
}

/// What a PutBlock declares for its body.
impl From<&crate::v1::PutBlockRequest> for BlockChecksums {
    fn from(req: &crate::v1::PutBlockRequest) -> BlockChecksums {
        BlockChecksums {
            sha256: req.block_sha256.clone(),
            crc32c: req.block_crc32c,
        }
    }
}

/// What a manifest recorded for a block.
impl From<&crate::v1::BlockInfo> for BlockChecksums {
    fn from(b: &crate::v1::BlockInfo) -> BlockChecksums {
        BlockChecksums {
            sha256: b.sha256.clone(),
            crc32c: b.crc32c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_the_castagnoli_crc() {
        // The standard check value of CRC-32C (and CRC-32/ISCSI) over "123456789".
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn a_block_matches_only_bytes_that_agree_with_every_checksum_it_has() {
        let data = b"four mebibytes, give or take".to_vec();
        let crc = BlockChecksums::of(&data);
        assert!(crc.matches(&data));
        assert!(!crc.matches(b"four mebibytes, give or tak3"));

        let sha = BlockChecksums {
            sha256: Sha256::digest(&data).to_vec(),
            crc32c: None,
        };
        assert!(sha.matches(&data));
        assert!(!sha.matches(b"other"));

        let both_right = BlockChecksums {
            sha256: sha.sha256.clone(),
            crc32c: crc.crc32c,
        };
        assert!(both_right.matches(&data));
        let crc_wrong = BlockChecksums {
            crc32c: Some(crc.crc32c.unwrap() ^ 1),
            ..both_right.clone()
        };
        assert!(
            !crc_wrong.matches(&data),
            "a wrong CRC fails even beside a right sha256"
        );
        let sha_wrong = BlockChecksums {
            sha256: vec![0; 32],
            ..both_right
        };
        assert!(
            !sha_wrong.matches(&data),
            "a wrong sha256 fails even beside a right CRC"
        );
    }

    #[test]
    fn two_declarations_agree_only_on_a_shared_checksum_that_is_equal_everywhere() {
        let crc = |c| BlockChecksums {
            sha256: Vec::new(),
            crc32c: Some(c),
        };
        let sha = |b: u8| BlockChecksums {
            sha256: vec![b; 32],
            crc32c: None,
        };
        let both = |b: u8, c| BlockChecksums {
            sha256: vec![b; 32],
            crc32c: Some(c),
        };
        assert!(crc(7).agrees_with(&crc(7)));
        assert!(!crc(7).agrees_with(&crc(8)));
        assert!(sha(1).agrees_with(&sha(1)));
        assert!(!sha(1).agrees_with(&sha(2)));
        assert!(both(1, 7).agrees_with(&crc(7)) && crc(7).agrees_with(&both(1, 7)));
        assert!(both(1, 7).agrees_with(&sha(1)));
        assert!(!both(1, 7).agrees_with(&both(1, 8)));
        assert!(!both(1, 7).agrees_with(&both(2, 7)));
        assert!(
            !crc(7).agrees_with(&sha(1)),
            "nothing shared: cannot tell, so no"
        );
        assert!(!BlockChecksums::default().agrees_with(&BlockChecksums::default()));
    }

    #[test]
    fn a_block_without_checksums_matches_nothing() {
        assert!(BlockChecksums::default().is_empty());
        assert!(!BlockChecksums::default().matches(b""));
        assert!(!BlockChecksums::default().matches(b"anything"));
    }

    #[test]
    fn the_manifest_takes_the_sha256_when_present_and_the_crc_otherwise() {
        let data = b"block";
        let digest = |b: &BlockChecksums| {
            let mut m = Sha256::new();
            b.feed_manifest(&mut m);
            m.finalize().to_vec()
        };
        let sha = Sha256::digest(data).to_vec();
        let both = BlockChecksums {
            sha256: sha.clone(),
            crc32c: Some(crc32c(data)),
        };
        assert_eq!(digest(&both), Sha256::digest(&sha).to_vec());
        assert_eq!(
            digest(&BlockChecksums::of(data)),
            Sha256::digest(crc32c(data).to_be_bytes()).to_vec()
        );
    }
}
