//! FAKE ownership for unit tests of the fence: an owned epoch the test sets and clears at
//! will, counting the etcd marks it would have sent. Never built outside tests.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{ControlError, Epoch};

#[derive(Default)]
pub struct FakeOwnership {
    /// `(epoch, changed)` while owned.
    held: Mutex<Option<(Epoch, bool)>>,
    marks: AtomicUsize,
}

impl FakeOwnership {
    /// Owned at `epoch`, not yet marked changed.
    pub fn own(&self, epoch: Epoch) {
        *self.held.lock() = Some((epoch, false));
    }

    /// Lost (deposed, or the lease lapsed).
    pub fn lose(&self) {
        *self.held.lock() = None;
    }

    /// How many times the shard was marked changed in "etcd".
    pub fn marks(&self) -> usize {
        self.marks.load(Ordering::SeqCst)
    }

    pub fn holding(&self, shard: u32) -> Result<(Epoch, bool), ControlError> {
        self.held.lock().ok_or(ControlError::NotOwner { shard })
    }

    pub fn mark_changed(&self, shard: u32) -> Result<(), ControlError> {
        let mut held = self.held.lock();
        match held.as_mut() {
            Some((_, true)) => Ok(()),
            Some((_, changed)) => {
                *changed = true;
                self.marks.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            None => Err(ControlError::NotOwner { shard }),
        }
    }
}
