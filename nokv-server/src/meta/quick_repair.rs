//! redb's quick repair, set on every write transaction of the store ([`MetaStore`]'s
//! `begin_write`): a durable commit then also records the allocator state (and commits in two
//! phases, one fsync more), and the next open after a kill -9 or power cut loads that state
//! instead of walking every page of the node file to rebuild it — a walk that grows with the
//! file, which holds every shard of the node.
//!
//! What it saves and costs (`nokv-server restart-bench`, docs/benchmarks.md; min / median /
//! max of 3 runs per mode, 2-core VM): the open after a kill -9 of a 1.06 GiB node file takes
//! 40 / 67 / 102 ms with it against 1,118 / 1,220 / 2,198 ms without (the file cached), and
//! 83 / 106 / 116 ms against 5,897 / 6,549 / 7,260 ms after a reboot (cold), where redb's own
//! part is 0.5-9 ms and the rest the redo log's replay; without it the walk grows with the
//! file (12 s cold at 2.1 GiB). The durable commit pays one fsync more (two-phase commit) and
//! the allocator state: 0.19 -> 0.56 ms median on a quiet disk, 3.95 -> 7.94 ms while fsyncs
//! were slow; once a second, and store-bench's small-write throughput showed no change above
//! its noise in 5 alternating pairs.
//!
//! Invariant: the daemon never turns it off. Only the measuring instruments do
//! ([`set_for_measurement`]), to show both sides in one process.
//!
//! The open-time replay commit (`durability`'s `replay`) begins its transaction on the database
//! directly and does not set it; every open path makes a shard's `prepare` commit right after,
//! which does, so only a crash between those two commits leaves a file that is walked.
//!
//! [`MetaStore`]: super::MetaStore

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::MetaResult;

static ON: AtomicBool = AtomicBool::new(true);

/// True unless a measuring instrument turned quick repair off in this process.
pub(super) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns quick repair on or off for every store of this process from its next write
/// transaction on. For `restart-bench` and `store-bench --no-quick-repair` only: the
/// daemon keeps it on.
pub fn set_for_measurement(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// What [`open_alone`] saw.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    /// redb walked the file to repair it (its repair callback runs only then).
    pub walked: bool,
    /// How long redb's open took (the walk included), without the close after it.
    pub took: std::time::Duration,
}

/// Opens the redb file at `path` by itself — the first step of every open of a store, before
/// the redo log is replayed — and closes it again (cleanly: the next open neither walks nor
/// repairs). For `restart-bench`, which times this step apart from the replay, and the tests.
pub fn open_alone(path: &Path) -> MetaResult<Opened> {
    let walked = Arc::new(AtomicBool::new(false));
    let seen = walked.clone();
    let started = std::time::Instant::now();
    let db = redb::Database::builder()
        .set_repair_callback(move |_| seen.store(true, Ordering::Relaxed))
        .open(path)?;
    let took = started.elapsed();
    drop(db);
    Ok(Opened {
        walked: walked.load(Ordering::Relaxed),
        took,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Commit, MetaStore, Tables};

    fn walked_on_open(path: &Path) -> bool {
        super::open_alone(path)
            .expect("the crashed copy opens")
            .walked
    }

    /// What the next open finds after a kill -9: the file as the page cache holds it, taken
    /// while the store is open (redb marks an open file as needing recovery).
    fn crash_copy(store: &MetaStore, to: &Path) -> std::path::PathBuf {
        std::fs::copy(store.path(), to).unwrap();
        std::fs::copy(
            store.path().with_extension("redo"),
            to.with_extension("redo"),
        )
        .unwrap();
        to.to_path_buf()
    }

    /// Small files in the shard's namespace, committed without fsync as the committer does.
    fn deferred_writes(store: &MetaStore, from: usize, n: usize) {
        for i in from..from + n {
            store
                .write_in(Tables::shard(0), Commit::Deferred, |w| {
                    w.put_inline("ws", &format!("f-{i}"), &[b'x'; 4096])
                })
                .unwrap();
        }
    }

    // Catches: the periodic durable commit (`flush`) made without quick repair — removing
    // `set_quick_repair` from `MetaStore::begin_write` turns the last assertion red. The first
    // one shows the probe does see a walk when the last durable commit has no allocator state.
    #[test]
    fn a_crash_after_the_periodic_durable_commit_reopens_without_walking_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::create_node(&dir.path().join("node.redb")).unwrap();
        store.prepare(Tables::shard(0)).unwrap();
        deferred_writes(&store, 0, 64);

        let plain = store.db.begin_write().unwrap();
        plain.commit().unwrap();
        let without = crash_copy(&store, &dir.path().join("plain-commit.redb"));
        assert!(
            walked_on_open(&without),
            "a durable commit without quick repair leaves a file that must be walked"
        );

        store.flush().unwrap();
        // The committer goes on after its periodic commit until the kill.
        deferred_writes(&store, 64, 16);
        let crashed = crash_copy(&store, &dir.path().join("after-flush.redb"));
        assert!(
            !walked_on_open(&crashed),
            "the periodic durable commit recorded the allocator state"
        );
    }

    // Catches: quick repair set on the periodic commit alone — a node killed after its open's
    // `prepare` commits but before its first periodic commit (a restart that only served reads,
    // or crashed at once) would be walked again at the next start.
    #[test]
    fn a_node_crashed_before_its_first_periodic_commit_reopens_without_walking_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::create_node(&dir.path().join("node.redb")).unwrap();
        for id in 0..4 {
            store.prepare(Tables::shard(id)).unwrap();
        }
        deferred_writes(&store, 0, 16);
        let crashed = crash_copy(&store, &dir.path().join("crashed.redb"));
        assert!(!walked_on_open(&crashed));

        // And the store reopened from that copy, prepared as a node's open does, again.
        let reopened = MetaStore::open_node(&crashed).unwrap();
        reopened.prepare(Tables::shard(0)).unwrap();
        let again = crash_copy(&reopened, &dir.path().join("again.redb"));
        assert!(!walked_on_open(&again));
    }
}
