//! The delay-based governor of bulk bandwidth (TCP-LEDBAT's idea applied to a storage node):
//! bulk work may use whatever does not make interactive requests slower than they are on
//! their own, and the only reliable witness of "slower" is the interactive requests' own
//! service time.
//!
//! Every [`INTERVAL`] the governor reads the median service time of the interactive requests
//! that ended in it ([`crate::pressure::Pressure::take_latency`]) and compares it with the
//! **base**: the least such median over the last [`BASE_SECONDS`] (kept as one minimum per
//! second). The base is what an interval costs without interference: because every rise cuts
//! the rate, intervals close to the base keep occurring even under a steady upload, so the base
//! does not drift up with the load it measures.
//! * **Within target** (median <= base x (1 + [`TARGET`]) + [`SLACK`]): the rate grows
//!   additively, by [`GAIN_MIB_PER_S`] per second.
//! * **Above target**: the rate is cut to half of what bulk actually moved in the interval
//!   (never below the floor), so one cut takes effect whatever the rate had grown to.
//! * **No interactive request** in flight or ended: no limit at all — an upload alone runs as
//!   fast as the machine allows.
//!
//! Why additive increase and multiplicative decrease: several uploads share one governor, and
//! AIMD is the rule that converges to a fair, stable share without knowing the capacity; the
//! cut to half of the *observed* rate (not the allowance) is what keeps a rate that grew
//! while bulk was idle from being spent at once.
//!
//! Pure: the caller passes the time and the samples, so tests drive it without a clock.

use std::collections::VecDeque;
use std::time::Duration;

/// How often the governor decides.
pub const INTERVAL: Duration = Duration::from_millis(50);
/// The rise of the interactive service time over the base that bulk may cause.
pub const TARGET: f64 = 0.10;
/// Added to the target: below a tenth of a millisecond a rise is scheduling noise.
pub const SLACK: Duration = Duration::from_micros(100);
/// How long the base remembers a minimum.
pub const BASE_SECONDS: u64 = 20;
/// Additive increase, MiB/s gained per second within target.
pub const GAIN_MIB_PER_S: f64 = 256.0;

const MIB: f64 = 1024.0 * 1024.0;

/// The governor's state (see the module doc).
#[derive(Debug)]
pub struct Governor {
    /// Bytes per second bulk may move; `None`: no limit.
    rate: Option<f64>,
    /// The floor of `rate` (bytes/s): bulk always progresses.
    floor: f64,
    /// One minimum interval median per second, oldest first: (second, minimum).
    minima: VecDeque<(u64, Duration)>,
}

/// One interval as the governor sees it.
#[derive(Debug, Clone, Copy)]
pub struct Interval {
    /// Seconds since an arbitrary fixed start (buckets the base).
    pub at_secs: f64,
    pub length: Duration,
    /// Median service time of the interactive requests that ended in it, if any did.
    pub interactive: Option<Duration>,
    /// Interactive requests in flight at its end.
    pub in_flight: usize,
    /// Bulk bytes admitted during it.
    pub bulk_bytes: u64,
}

impl Governor {
    pub fn new(floor_bytes_per_s: f64) -> Governor {
        Governor {
            rate: None,
            floor: floor_bytes_per_s,
            minima: VecDeque::new(),
        }
    }

    /// Bytes per second bulk may move now (`None`: no limit).
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// The base service time now, if any interval was measured.
    pub fn base(&self) -> Option<Duration> {
        self.minima.iter().map(|(_, m)| *m).min()
    }

    /// Decides the rate after `interval`.
    pub fn observe(&mut self, interval: Interval) {
        let Some(median) = interval.interactive else {
            if interval.in_flight == 0 {
                self.rate = None;
            }
            return;
        };
        let second = interval.at_secs.max(0.0) as u64;
        match self.minima.back_mut() {
            Some((s, m)) if *s == second => *m = (*m).min(median),
            _ => self.minima.push_back((second, median)),
        }
        while self
            .minima
            .front()
            .is_some_and(|(s, _)| *s + BASE_SECONDS <= second)
        {
            self.minima.pop_front();
        }
        let base = self.base().expect("just recorded");
        let limit = base.mul_f64(1.0 + TARGET) + SLACK;
        let secs = interval.length.as_secs_f64().max(1e-3);
        if median <= limit {
            if let Some(r) = &mut self.rate {
                *r += GAIN_MIB_PER_S * MIB * secs;
            }
        } else {
            let moved = interval.bulk_bytes as f64 / secs;
            let from = self.rate.map_or(moved, |r| r.min(moved));
            self.rate = Some((from / 2.0).max(self.floor));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn interval(at: f64, median_ms: Option<f64>, bulk_mib: f64) -> Interval {
        Interval {
            at_secs: at,
            length: INTERVAL,
            interactive: median_ms.map(|m| Duration::from_secs_f64(m / 1000.0)),
            in_flight: 0,
            bulk_bytes: (bulk_mib * MIB) as u64,
        }
    }

    #[test]
    fn a_quiet_node_puts_no_limit_on_bulk() {
        let mut g = Governor::new(8.0 * MIB);
        g.observe(interval(0.0, None, 10.0));
        assert_eq!(g.rate(), None);
    }

    #[test]
    fn latency_above_the_base_cuts_bulk_to_half_of_what_it_moved_and_within_target_it_grows_back() {
        let mut g = Governor::new(8.0 * MIB);
        g.observe(interval(0.00, Some(1.0), 0.0)); // base 1 ms
        assert_eq!(g.rate(), None, "within target with no limit yet: none");
        // 10 MiB in 50 ms = 200 MiB/s moved, and the interactive median rose to 2 ms.
        g.observe(interval(0.05, Some(2.0), 10.0));
        let cut = g.rate().unwrap() / MIB;
        assert!((cut - 100.0).abs() < 1e-6, "{cut}");
        // Back within target: additive increase, GAIN per second.
        g.observe(interval(0.10, Some(1.05), 5.0));
        let grown = g.rate().unwrap() / MIB;
        assert!(
            (grown - (100.0 + GAIN_MIB_PER_S * 0.05)).abs() < 1e-6,
            "{grown}"
        );
    }

    #[test]
    fn the_rate_never_drops_below_the_floor() {
        let mut g = Governor::new(8.0 * MIB);
        g.observe(interval(0.0, Some(1.0), 0.0));
        for k in 1..50 {
            g.observe(interval(k as f64 * 0.05, Some(5.0), 0.0));
        }
        assert_eq!(g.rate(), Some(8.0 * MIB));
    }

    #[test]
    fn the_base_forgets_minima_older_than_its_window() {
        let mut g = Governor::new(8.0 * MIB);
        g.observe(interval(0.0, Some(1.0), 0.0));
        g.observe(interval(1.0, Some(3.0), 0.0));
        assert_eq!(g.base(), Some(MS));
        g.observe(interval(BASE_SECONDS as f64 + 0.5, Some(3.0), 0.0));
        assert_eq!(g.base(), Some(3 * MS), "the 1 ms minimum aged out");
    }

    #[test]
    fn a_request_still_in_flight_keeps_the_limit_although_none_ended() {
        let mut g = Governor::new(8.0 * MIB);
        g.observe(interval(0.0, Some(1.0), 0.0));
        g.observe(interval(0.05, Some(4.0), 4.0));
        let limited = g.rate();
        assert!(limited.is_some());
        let mut busy = interval(0.10, None, 0.0);
        busy.in_flight = 3;
        g.observe(busy);
        assert_eq!(g.rate(), limited);
    }
}
