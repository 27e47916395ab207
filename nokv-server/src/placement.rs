//! Workspace -> shard placement. For now a stable hash of the workspace name; a cluster adds
//! placement records in etcd, and this function stays the default for unplaced workspaces.

/// FNV-1a 64 of the workspace name, modulo the shard count. Stable across processes,
/// versions and platforms (unlike `std`'s randomly seeded hasher), which is the whole point.
pub fn shard_of(workspace: &str, shard_count: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in workspace.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(shard_count.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_stable_and_spreads_workspaces() {
        assert_eq!(shard_of("alpha", 16), shard_of("alpha", 16));
        assert_eq!(shard_of("", 16), (0xcbf2_9ce4_8422_2325u64 % 16) as u32);
        let used: std::collections::HashSet<u32> =
            (0..200).map(|i| shard_of(&format!("ws{i}"), 16)).collect();
        assert_eq!(used.len(), 16);
    }
}
