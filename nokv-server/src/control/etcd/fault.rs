//! A test fault of the control plane, named as such: `NOKV_TEST_FAIL_MARK_SERVING=S:N` makes
//! the first `N` [`EtcdControl::mark_serving`](super::EtcdControl::mark_serving) calls for
//! shard `S` of each membership fail as an etcd outage does (`Unavailable`, nothing sent).
//!
//! It exists for one black-box test: a given-up handoff whose `serving` mark etcd did not take
//! must be marked again by a later balance step, or the other nodes route that shard as
//! moving for good. That window (an etcd error between the drain mark and the give-up, a few
//! milliseconds) cannot be hit from outside the daemon any other way. Like
//! `NOKV_TEST_FAULTS`, it is not a flag and not documented for operators; the daemon logs a
//! warning when it is set. Production pays one atomic load per given-up handoff.

use std::sync::atomic::{AtomicU64, Ordering};

use super::ControlError;

/// The environment variable read at each join.
pub const FAIL_MARK_SERVING_ENV: &str = "NOKV_TEST_FAIL_MARK_SERVING";

/// `(shard, marks left to fail)`, or none.
#[derive(Debug, Default)]
pub(super) struct ControlFaults {
    mark_serving: Option<(u32, AtomicU64)>,
}

impl ControlFaults {
    /// No fault, or the one named by [`FAIL_MARK_SERVING_ENV`]; a value that does not parse
    /// is warned about and ignored (the test then fails on the missing fault, loudly).
    pub(super) fn from_env() -> ControlFaults {
        match std::env::var(FAIL_MARK_SERVING_ENV) {
            Ok(spec) => match ControlFaults::parse(&spec) {
                Some(faults) => {
                    tracing::warn!(
                        spec,
                        "{FAIL_MARK_SERVING_ENV} is set: test faults in etcd marks"
                    );
                    faults
                }
                None => {
                    tracing::warn!(spec, "{FAIL_MARK_SERVING_ENV}: expected SHARD:COUNT");
                    ControlFaults::default()
                }
            },
            Err(_) => ControlFaults::default(),
        }
    }

    fn parse(spec: &str) -> Option<ControlFaults> {
        let (shard, count) = spec.split_once(':')?;
        Some(ControlFaults {
            mark_serving: Some((
                shard.trim().parse().ok()?,
                AtomicU64::new(count.trim().parse().ok()?),
            )),
        })
    }

    /// Fails (as etcd unreachable) while marks of `shard` are left to fail, counting one down.
    pub(super) fn mark_serving(&self, shard: u32) -> Result<(), ControlError> {
        let Some((faulty, left)) = &self.mark_serving else {
            return Ok(());
        };
        let failed = *faulty == shard
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if failed {
            return Err(ControlError::Etcd(etcd_client::Error::GRpcStatus(
                tonic::Status::unavailable(format!("{FAIL_MARK_SERVING_ENV}: injected")),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_shards_marks_fail_as_many_times_as_asked_and_no_other_shards_do() {
        let faults = ControlFaults::parse("3:2").expect("parses");
        assert!(faults.mark_serving(4).is_ok());
        assert!(matches!(faults.mark_serving(3), Err(ControlError::Etcd(_))));
        assert!(matches!(faults.mark_serving(3), Err(ControlError::Etcd(_))));
        assert!(faults.mark_serving(3).is_ok());
        assert!(ControlFaults::default().mark_serving(3).is_ok());
    }

    #[test]
    fn a_spec_that_does_not_parse_names_no_fault() {
        for spec in ["3", "x:1", "3:y", ""] {
            assert!(ControlFaults::parse(spec).is_none(), "{spec}");
        }
    }
}
