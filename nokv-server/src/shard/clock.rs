//! The shard clock: the one time source a shard judges leases, replay windows and grace
//! periods by.
//!
//! Invariant: a lease is judged only by a reading taken *inside* the write session that acts
//! on it (after the gate is taken), so time spent queueing for the gate can never authorise
//! an already expired writer. The provider write of a PutBlock is cut off when this clock
//! reaches the lease deadline ([`Clock::reached`]).
//!
//! Production shards use wall time. Tests use a manual clock that moves only when told to,
//! so a lease runs out at a point the test chooses instead of after a sleep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(test)]
use std::sync::Arc;

/// Cheap to clone: every clone reads the same time.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    source: Source,
}

#[derive(Clone, Debug, Default)]
enum Source {
    #[default]
    Wall,
    /// Milliseconds since the epoch, moved only by [`Clock::advance`]; the channel wakes
    /// whoever waits in [`Clock::reached`].
    #[cfg(test)]
    Manual(Arc<tokio::sync::watch::Sender<i64>>),
}

impl Clock {
    /// Wall time.
    pub fn wall() -> Clock {
        Clock {
            source: Source::Wall,
        }
    }

    /// A clock for tests that starts at the current wall time and moves only on
    /// [`Clock::advance`].
    #[cfg(test)]
    pub fn manual() -> Clock {
        Clock {
            source: Source::Manual(Arc::new(tokio::sync::watch::Sender::new(wall_ms()))),
        }
    }

    /// Moves a manual clock forward by `by`, waking every [`Clock::reached`] it passes.
    #[cfg(test)]
    pub fn advance(&self, by: Duration) {
        match &self.source {
            Source::Manual(now) => now.send_modify(|ms| *ms += by.as_millis() as i64),
            Source::Wall => panic!("only a manual clock can be advanced"),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match &self.source {
            Source::Wall => wall_ms(),
            #[cfg(test)]
            Source::Manual(now) => *now.borrow(),
        }
    }

    /// Resolves once the clock reads `deadline_ms` or later.
    pub async fn reached(&self, deadline_ms: i64) {
        match &self.source {
            Source::Wall => loop {
                let left = deadline_ms - wall_ms();
                if left <= 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(left as u64)).await;
            },
            #[cfg(test)]
            Source::Manual(now) => {
                let mut rx = now.subscribe();
                // The sender lives as long as this clock, which outlives the wait.
                let _ = rx.wait_for(|ms| *ms >= deadline_ms).await;
            }
        }
    }
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
