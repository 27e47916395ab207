//! Unit-test support: one shard on a real redb store in a temp dir and a FAKE provider
//! (object_store's in-memory store behind the fault-injecting layer, so tests can fail
//! creates, reads and deletes and count them). Built only for tests.

use std::sync::Arc;

use super::clock::Clock;
use super::{Shard, ShardConfig};
use crate::meta::MetaStore;
use crate::object::ObjectProvider;
use crate::object::fault::{Faults, MemoryFake};
use crate::token::Signer;

pub(crate) struct Fixture {
    pub _dir: tempfile::TempDir,
    pub shard: Arc<Shard>,
    pub faults: Faults,
    pub provider: ObjectProvider,
    /// The shard clock the fixture was made with.
    pub clock: Clock,
    /// Block memory for reads of artifact blocks (a node's budget, here the fixture's own).
    pub memory: crate::memory::BlockMemory,
}

/// Shard `id` with `cfg`, judging leases and grace periods by `clock`.
pub(crate) fn shard_on(id: u32, cfg: ShardConfig, clock: Clock) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
    let faults = Faults::default();
    // Reads and deletes go through the fault layer too, so tests can fail them.
    let provider = MemoryFake::new(faults.clone()).faulty();
    let bulk = Arc::new(crate::bulk::Bulk::new(2, None).unwrap());
    let shard = Shard::open_with_clock(
        id,
        meta,
        provider.clone(),
        bulk,
        Signer::new(b"k"),
        cfg,
        clock.clone(),
    );
    Fixture {
        _dir: dir,
        shard,
        faults,
        provider,
        clock,
        memory: crate::memory::BlockMemory::new(64 << 20, std::time::Duration::from_secs(10)),
    }
}
