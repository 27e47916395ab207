//! Accounting of provider keys: the one place that says what the shard's metadata makes of
//! a key the provider holds. The store's invariant is that every such key is **referenced**
//! (named by a block record of an open upload or by a revision, live or retired),
//! **guarded** (a cleanup guard of a write attempt) or **collectable** (queued for deletion,
//! or a dead-lettered delete waiting for an operator's retry);
//! anything else leaked. A key that is both referenced and collectable is worse: the
//! reconciler would delete live bytes.
//!
//! Tests check the invariant after every sequencer and reconciler test; an operator audit
//! (listing the provider prefix and classifying each key) uses the same classification.
//! The ledger is read from one snapshot, so it is consistent in itself; keys that a write in
//! flight lands after the snapshot may classify as unaccounted, which an audit must read as
//! "not yet known", never as "delete".

use std::collections::HashSet;

use super::Shard;
use crate::error::Result;
use crate::meta::ReadView;

/// What the shard's metadata makes of one provider key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyClass {
    /// Named by a block record or a revision: live bytes, never deleted.
    Referenced,
    /// Guarded by a write attempt's cleanup record: the reconciler deletes it when the
    /// attempt may no longer publish.
    Guarded,
    /// Queued for deletion by the reconciler.
    Collectable,
    /// Referenced *and* collectable: a violation (live bytes queued for deletion).
    CollectableButReferenced,
    /// Known to no record of this shard: leaked (or written after the ledger's snapshot).
    Unaccounted,
}

/// The key sets of one metadata snapshot.
#[derive(Debug, Default)]
pub struct Ledger {
    referenced: HashSet<String>,
    guarded: HashSet<String>,
    collectable: HashSet<String>,
}

impl Ledger {
    /// Reads every referencing, guarding and collectable record of one snapshot.
    pub fn read(r: &ReadView) -> Result<Ledger> {
        let mut referenced: HashSet<String> = r.block_keys()?.into_iter().collect();
        referenced.extend(r.revision_keys()?);
        // Dead-lettered deletes left the automatic queue but are still delete intents.
        let mut collectable: HashSet<String> = r.collectable_keys()?.into_iter().collect();
        collectable.extend(r.dead_letter_keys()?);
        Ok(Ledger {
            referenced,
            guarded: r.guards()?.into_iter().map(|(k, _)| k).collect(),
            collectable,
        })
    }

    /// Classifies one provider key. Referenced wins over guarded (a recorded block's key may
    /// keep its guard until the reconciler sees the key referenced); a referenced key that is
    /// also collectable is reported as the violation it is.
    pub fn classify(&self, key: &str) -> KeyClass {
        let referenced = self.referenced.contains(key);
        let collectable = self.collectable.contains(key);
        match (referenced, collectable) {
            (true, true) => KeyClass::CollectableButReferenced,
            (true, false) => KeyClass::Referenced,
            (false, true) => KeyClass::Collectable,
            (false, false) if self.guarded.contains(key) => KeyClass::Guarded,
            (false, false) => KeyClass::Unaccounted,
        }
    }
}

impl Shard {
    /// The ledger of the last committed state (a snapshot read; never waits for writes).
    pub async fn ledger(&self) -> Result<Ledger> {
        self.gate.read(Ledger::read).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mutation: `(true, true) => KeyClass::CollectableButReferenced` →
    /// `(true, true) => KeyClass::Referenced` (live bytes queued for deletion would pass).
    #[test]
    fn a_key_is_referenced_guarded_collectable_or_unaccounted_and_live_collectable_is_a_violation()
    {
        let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect();
        let ledger = Ledger {
            referenced: set(&["live", "live-and-queued", "live-and-guarded"]),
            guarded: set(&["guarded", "live-and-guarded", "guarded-and-queued"]),
            collectable: set(&["queued", "live-and-queued", "guarded-and-queued"]),
        };
        assert_eq!(ledger.classify("live"), KeyClass::Referenced);
        assert_eq!(ledger.classify("live-and-guarded"), KeyClass::Referenced);
        assert_eq!(ledger.classify("guarded"), KeyClass::Guarded);
        assert_eq!(ledger.classify("queued"), KeyClass::Collectable);
        assert_eq!(ledger.classify("guarded-and-queued"), KeyClass::Collectable);
        assert_eq!(
            ledger.classify("live-and-queued"),
            KeyClass::CollectableButReferenced
        );
        assert_eq!(ledger.classify("stray"), KeyClass::Unaccounted);
    }
}
