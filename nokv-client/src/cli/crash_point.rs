//! A test-only crash point: with `NOKV_TEST_EXIT_AFTER_BLOCKS=N` in its environment, a
//! publish exits the process at once (status 137, as if killed with SIGKILL) right after its
//! N-th block was acknowledged or skipped — no abort, no cleanup, the upload left open exactly
//! as a crashed client leaves it. Black-box tests use it to interrupt a publish at a known
//! block instead of racing a kill against the transfer. Unset (always, outside tests), it
//! changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nokv_client::publish::Progress;

/// The environment variable that arms the crash point.
const ENV: &str = "NOKV_TEST_EXIT_AFTER_BLOCKS";
/// The exit status of the simulated crash (128 + SIGKILL).
const STATUS: i32 = 137;

/// `progress`, wrapped so that the armed crash point fires after its N-th call (the SDK calls
/// progress once per block).
pub fn arm(progress: Option<Progress>) -> Option<Progress> {
    let Some(after) = std::env::var(ENV).ok().and_then(|v| v.parse::<u64>().ok()) else {
        return progress;
    };
    let done = AtomicU64::new(0);
    Some(Arc::new(move |n| {
        if let Some(p) = &progress {
            p(n);
        }
        if done.fetch_add(1, Ordering::SeqCst) + 1 >= after {
            std::process::exit(STATUS);
        }
    }))
}
