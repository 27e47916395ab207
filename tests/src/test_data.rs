//! Reproducible test data and plans without a dependency: splitmix64.

/// splitmix64: a small deterministic generator for test plans and data (no dependency).
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// `len` pseudo-random bytes, the same for the same `seed` (splitmix64): incompressible,
/// reproducible test data with no dependency.
pub fn pseudo_random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_random_bytes_are_reproducible_and_seeded() {
        let a = pseudo_random_bytes(7, 1001);
        assert_eq!(a.len(), 1001);
        assert_eq!(a, pseudo_random_bytes(7, 1001));
        assert_eq!(&a[..100], &pseudo_random_bytes(7, 100)[..]);
        assert_ne!(a, pseudo_random_bytes(8, 1001));
        assert!(pseudo_random_bytes(7, 0).is_empty());
    }
}
