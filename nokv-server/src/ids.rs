//! Fresh random identifiers and secrets from the operating system's CSPRNG: upload ids,
//! block-attempt keys, the cluster secret. Uniqueness of attempt keys is what lets a late
//! writer never collide with a newer attempt, so they are random, never counters or times.

use ring::rand::{SecureRandom, SystemRandom};

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    SystemRandom::new()
        .fill(&mut b)
        .expect("the system random source works");
    b
}

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    hex::encode(random_bytes(n))
}
