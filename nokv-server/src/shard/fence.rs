//! The fence of a shard: who may commit a write session on it, and under which epoch.
//!
//! Leases alone cannot give exclusion — a process paused past its lease still believes it owns
//! the shard. So the epoch of the ownership is stored in the shard's own metadata (raised by
//! the loader when a node takes the shard) and every write session checks, *inside the
//! session*, that the node may still acknowledge the shard at exactly that epoch. Three checks,
//! each necessary:
//!
//! 1. [`Fence::prepare`] before the session is queued: in a cluster, the first write of an
//!    ownership first tells etcd the shard may now differ from its checkpoint (guarded by the
//!    owner key, so a deposed owner cannot); later writes answer from memory.
//! 2. [`Fence::check`] inside the session, on the committer thread: the node's ownership
//!    (memory only: owned table + lease deadline) must name the epoch the store holds. A
//!    session that runs late — queued before a pause, run after it — changes nothing.
//! 3. [`Fence::still_owner`] after the batch's fsync and before the caller is answered: a
//!    lease that lapsed during the fsync means no acknowledgement (the caller retries with the
//!    same request id and reaches the owner; the replay record answers it if the session is in
//!    the checkpoint the owner took).
//!
//! None of the checks talks to etcd except the first write of an ownership: no etcd round
//! trip on the per-request path. The embedded default is epoch 0 everywhere.

use crate::control::{ControlError, Epoch, Ownership, local::LocalOwnership};
use crate::error::{Error, Result};
use crate::meta::WriteView;

/// The fence of one shard (cheap to clone).
#[derive(Clone)]
pub struct Fence {
    shard: u32,
    ownership: Ownership,
}

impl Fence {
    pub fn new(shard: u32, ownership: Ownership) -> Fence {
        Fence { shard, ownership }
    }

    /// The embedded default's fence: epoch 0, always owner.
    pub fn local(shard: u32) -> Fence {
        Fence::new(shard, Ownership::Local(LocalOwnership))
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Check 1 (see the module doc): makes the shard writable under its current ownership.
    pub async fn prepare(&self) -> Result<()> {
        self.ownership
            .prepare_write(self.shard)
            .await
            .map_err(|e| self.lost(e))
    }

    /// Check 2: inside a write session, the stored epoch must be the one the node may
    /// acknowledge under right now.
    pub fn check(&self, w: &WriteView) -> Result<Epoch> {
        let epoch = self
            .ownership
            .acknowledge_epoch(self.shard)
            .map_err(|e| self.lost(e))?;
        self.same_epoch(w.epoch()?, epoch)
    }

    /// The read fence ([`crate::shard::gate::Gate::read_fenced`]), after the read: the node
    /// still holds the shard, its lease confirmed recently enough, at exactly the epoch the
    /// read's snapshot holds. A shard not yet marked changed may be read (its state is its
    /// checkpoint's); only a write needs the mark.
    pub fn check_read(&self, stored: Epoch) -> Result<Epoch> {
        let epoch = self.holding_epoch()?;
        self.same_epoch(stored, epoch)
    }

    fn same_epoch(&self, stored: Epoch, epoch: Epoch) -> Result<Epoch> {
        if stored != epoch {
            return Err(Error::Unavailable(format!(
                "shard {} holds epoch {stored} but this node owns it at epoch {epoch}; \
                 nothing was changed, retry",
                self.shard
            )));
        }
        Ok(epoch)
    }

    /// Check 3: the node may still acknowledge the shard (after the fsync, before answering).
    pub fn still_owner(&self) -> Result<()> {
        self.ownership
            .acknowledge_epoch(self.shard)
            .map(drop)
            .map_err(|e| self.lost(e))
    }

    /// The epoch the loader records in the store when the node takes the shard (owned and
    /// acknowledged, not necessarily marked changed yet).
    pub fn holding_epoch(&self) -> Result<Epoch> {
        self.ownership
            .holding_epoch(self.shard)
            .map_err(|e| self.lost(e))
    }

    fn lost(&self, e: ControlError) -> Error {
        match e {
            ControlError::NotOwner { .. } | ControlError::LeaseLost => Error::Unavailable(format!(
                "shard {} is not acknowledged by this node any more (moving, or its lease \
                 lapsed); nothing was acknowledged, retry",
                self.shard
            )),
            other => other.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::control::fake::FakeOwnership;
    use crate::meta::MetaStore;
    use crate::shard::gate::Gate;

    /// A gate on a fresh store, fenced by a fake ownership of shard 7 at `epoch` whose epoch
    /// the store has adopted.
    async fn owned_gate(epoch: Epoch) -> (tempfile::TempDir, Arc<FakeOwnership>, Arc<Gate>) {
        let dir = tempfile::tempdir().unwrap();
        let meta = MetaStore::create(&dir.path().join("s.redb")).unwrap();
        let fake = Arc::new(FakeOwnership::default());
        fake.own(epoch);
        let fence = Fence::new(7, Ownership::Fake(fake.clone()));
        let gate = Arc::new(Gate::new(meta, "t".into(), fence));
        assert_eq!(gate.adopt_epoch().await.unwrap(), epoch);
        (dir, fake, gate)
    }

    /// One session raising the counter "n" (its value is the number of committed sessions).
    async fn put(gate: &Gate) -> Result<u64> {
        gate.write(move |w| Ok(w.next_sequence("n")?)).await
    }

    async fn value(gate: &Gate) -> u64 {
        gate.read(|r| Ok(r.last_sequence("n")?)).await.unwrap()
    }

    /// A client's read that took its snapshot while the node owned the shard, and is answered
    /// after it lost it (here `f` itself is the pause point between the two), is refused: the
    /// new owner may have acknowledged a newer write meanwhile. Internal reads are not fenced.
    #[tokio::test]
    async fn a_read_whose_snapshot_was_taken_before_the_shard_was_lost_is_not_answered() {
        let (_dir, fake, gate) = owned_gate(3).await;
        put(&gate).await.unwrap();
        let answered = gate
            .read_fenced(|r| {
                let seen = r.last_sequence("n")?;
                fake.lose();
                Ok(seen)
            })
            .await;
        assert!(
            matches!(&answered, Err(Error::Unavailable(m)) if m.contains("not acknowledged")),
            "a stale read was answered: {answered:?}"
        );
        // A NotFound from the stale snapshot is just as stale.
        fake.own(3);
        let answered: Result<u64> = gate
            .read_fenced(|_| {
                fake.own(4);
                Err(Error::NotFound("x".into()))
            })
            .await;
        assert!(
            matches!(answered, Err(Error::Unavailable(_))),
            "{answered:?}"
        );
        // While the node owns the shard at the snapshot's epoch, the read is answered.
        fake.own(3);
        assert_eq!(
            gate.read_fenced(|r| Ok(r.last_sequence("n")?))
                .await
                .unwrap(),
            1
        );
        fake.lose();
        assert_eq!(value(&gate).await, 1, "internal reads are not fenced");
    }

    #[tokio::test]
    async fn a_node_that_lost_the_shard_commits_no_write_session() {
        let (_dir, fake, gate) = owned_gate(3).await;
        put(&gate).await.unwrap();
        fake.lose();
        let err = put(&gate).await.unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert_eq!(
            value(&gate).await,
            1,
            "the refused session changed the store"
        );
    }

    #[tokio::test]
    async fn a_session_queued_before_the_shard_was_lost_changes_nothing_when_it_runs_late() {
        let (_dir, fake, gate) = owned_gate(3).await;
        put(&gate).await.unwrap();
        // Hold the committer in a session so the next one is queued (it passed `prepare`),
        // then lose the shard before the queued one runs: the in-session check refuses it.
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let blocker = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.write(move |_| {
                    entered_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    Ok(())
                })
                .await
            })
        };
        tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
            .await
            .unwrap();
        let late = {
            let gate = gate.clone();
            tokio::spawn(async move { put(&gate).await })
        };
        // Let the late session reach the queue (it only needs `prepare`, which is memory).
        tokio::task::yield_now().await;
        while !late.is_finished() && gate.stats().sessions == 0 && fake.marks() == 0 {
            tokio::task::yield_now().await;
        }
        fake.lose();
        go_tx.send(()).unwrap();
        let _ = blocker.await.unwrap();
        let err = late.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert_eq!(value(&gate).await, 1, "the late session changed the store");
    }

    #[tokio::test]
    async fn a_store_holding_another_epoch_refuses_write_sessions() {
        let (_dir, fake, gate) = owned_gate(3).await;
        // The node now believes it owns epoch 4, but the store was never moved to it.
        fake.own(4);
        let err = put(&gate).await.unwrap_err();
        assert!(
            matches!(&err, Error::Unavailable(m) if m.contains("holds epoch 3")),
            "{err:?}"
        );
        assert_eq!(value(&gate).await, 0);
    }

    #[tokio::test]
    async fn a_session_whose_ownership_lapsed_before_the_answer_is_not_acknowledged() {
        let (_dir, fake, gate) = owned_gate(3).await;
        let lapse = fake.clone();
        let err = gate
            .write(move |w| {
                w.next_sequence("n")?;
                // The lease lapses while the batch commits and fsyncs.
                lapse.lose();
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn the_first_write_of_an_ownership_marks_the_shard_changed_once() {
        let (_dir, fake, gate) = owned_gate(5).await;
        assert_eq!(fake.marks(), 0, "adopting the epoch is not a change");
        put(&gate).await.unwrap();
        put(&gate).await.unwrap();
        assert_eq!(fake.marks(), 1);
    }

    #[tokio::test]
    async fn the_stored_epoch_never_goes_back() {
        let (_dir, fake, gate) = owned_gate(5).await;
        fake.own(4);
        let err = gate.adopt_epoch().await.unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
        assert_eq!(gate.read(|r| Ok(r.epoch()?)).await.unwrap(), 5);
    }
}
