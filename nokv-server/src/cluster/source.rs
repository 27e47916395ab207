//! Where a newly acquired shard's data comes from, decided from the record its acquisition
//! replaced alone (so the decision is a pure function, tested case by case below).

use crate::control::Epoch;
use crate::control::etcd::{CheckpointRef, LogRef, ShardRecord, ShardState};

/// Where a newly acquired shard's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// No record: a new shard (an existing local file from an earlier life is kept if its
    /// epoch is 0).
    New,
    /// The checkpoint the record points at: it holds everything acknowledged.
    Checkpoint(CheckpointRef),
    /// This node's own file, which must hold epoch `epoch` (`exact`) or at most `epoch`.
    Local { epoch: Epoch, exact: bool },
    /// The provider: the checkpoint (none: empty) plus the previous owner's log for the shard,
    /// read up to the fence the taker puts on it (see [`crate::takeover`]). The log's
    /// segments must name the shard at an epoch from `log.epoch` (the one it was recorded
    /// at) to the one being taken.
    Provider {
        checkpoint: Option<CheckpointRef>,
        log: LogRef,
    },
}

impl Source {
    /// Decides from the record the acquisition replaced (see the module doc and
    /// `control::etcd::balance::takeable`, which admits exactly these cases).
    pub fn of(previous: Option<&ShardRecord>) -> Source {
        let Some(r) = previous else {
            return Source::New;
        };
        // A record that names a log is checkpoint + log whatever its state: a release with a
        // new checkpoint clears the log, so a handoff that still names one is a release whose
        // checkpoint failed, and its checkpoint is an older base the log goes on from.
        if let Some(log) = &r.log {
            let mut log = log.clone();
            if log.epoch == 0 {
                // Recorded before logs kept their epoch.
                log.epoch = r.epoch;
            }
            return Source::Provider {
                checkpoint: r.checkpoint.clone(),
                log,
            };
        }
        match (&r.state, &r.checkpoint) {
            (ShardState::Handoff, Some(c)) => Source::Checkpoint(c.clone()),
            (ShardState::Serving | ShardState::Draining, Some(c))
                if !r.changed && (c.epoch + 1 == r.epoch || c.epoch == r.epoch) =>
            {
                Source::Checkpoint(c.clone())
            }
            _ => Source::Local {
                epoch: r.epoch,
                exact: r.changed,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: ShardState, epoch: Epoch, changed: bool, ckpt: Option<Epoch>) -> ShardRecord {
        ShardRecord {
            epoch,
            state,
            owner: Some("a".into()),
            endpoint: Some("https://a:1".into()),
            checkpoint: ckpt.map(|epoch| CheckpointRef {
                key: format!("p/meta/1/ckpt/{epoch}-x"),
                sha256: "00".into(),
                size: 1,
                epoch,
                created_unix_ms: 0,
            }),
            changed,
            target: None,
            log: None,
        }
    }

    #[test]
    fn a_lapsed_owner_whose_log_is_in_the_provider_is_loaded_from_checkpoint_and_log() {
        let mut r = record(ShardState::Serving, 5, true, Some(4));
        r.log = Some(LogRef {
            stream: "a.0000000000000007".into(),
            from_seq: 90,
            epoch: 5,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { checkpoint: Some(c), log } if c.epoch == 4 && log.from_seq == 90 && log.epoch == 5
        ));
        // Also when it released without a checkpoint: the log still holds what it wrote.
        r.state = ShardState::Handoff;
        r.checkpoint = None;
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider {
                checkpoint: None,
                ..
            }
        ));
    }

    /// Found by the provider chaos schedule (seed 2004): an owner that had loaded the shard
    /// from a log (so its record held a base checkpoint of its own epoch) released it while
    /// the provider refused the handoff checkpoint; the next owner loaded the base alone and
    /// every write in the log after it was gone.
    #[test]
    fn a_handoff_whose_checkpoint_failed_is_loaded_from_the_older_base_and_the_log() {
        let mut r = record(ShardState::Handoff, 2, true, Some(2));
        r.log = Some(LogRef {
            stream: "b.0000000000000009".into(),
            from_seq: 40,
            epoch: 2,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { checkpoint: Some(c), log } if c.epoch == 2 && log.from_seq == 40
        ));
    }

    /// Found by the provider chaos schedule (seed 9108): an acquisition carries the record's
    /// log over, so a record can be of a later epoch than its log — the owner took back a
    /// shard it had released without a checkpoint and died before its load recorded a log
    /// of its own. The log's segments are of the epoch it was recorded at, which the taker
    /// must read from the log, not from the record.
    #[test]
    fn a_log_carried_over_by_an_acquisition_keeps_the_epoch_it_was_recorded_at() {
        let mut r = record(ShardState::Serving, 4, false, None);
        r.log = Some(LogRef {
            stream: "b.0000000000000009".into(),
            from_seq: 9,
            epoch: 3,
        });
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { log, .. } if log.epoch == 3
        ));
        // A record written before logs kept their epoch: the record's is all there is.
        r.log.as_mut().unwrap().epoch = 0;
        assert!(matches!(
            Source::of(Some(&r)),
            Source::Provider { log, .. } if log.epoch == 4
        ));
    }

    #[test]
    fn a_lapsed_owner_that_recorded_a_checkpoint_of_its_own_epoch_and_changed_nothing_is_loaded_from_it()
     {
        let clean = record(ShardState::Serving, 5, false, Some(5));
        assert!(matches!(Source::of(Some(&clean)), Source::Checkpoint(c) if c.epoch == 5));
    }

    #[test]
    fn a_shard_handed_off_gracefully_is_loaded_from_its_checkpoint() {
        let r = record(ShardState::Handoff, 4, true, Some(4));
        assert!(matches!(Source::of(Some(&r)), Source::Checkpoint(c) if c.epoch == 4));
    }

    #[test]
    fn a_lapsed_owner_that_changed_nothing_since_its_checkpoint_is_loaded_from_it() {
        let clean = record(ShardState::Serving, 5, false, Some(4));
        assert!(matches!(Source::of(Some(&clean)), Source::Checkpoint(c) if c.epoch == 4));
    }

    #[test]
    fn a_lapsed_owner_that_changed_the_shard_is_loaded_only_from_its_own_file_at_its_epoch() {
        let changed = record(ShardState::Serving, 5, true, Some(4));
        assert_eq!(
            Source::of(Some(&changed)),
            Source::Local {
                epoch: 5,
                exact: true
            }
        );
        assert_eq!(Source::of(None), Source::New);
    }
}
