//! A small deterministic sequence for the seeded tests of this module (no dependency for a
//! test's dice): the same seed rolls the same numbers on every machine.

pub(super) struct Dice(pub(super) u64);

impl Dice {
    /// The next number in `0..n`.
    pub(super) fn roll(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize % n
    }
}
