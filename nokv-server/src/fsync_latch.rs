//! Once an fsync has failed, the process answers nobody.
//!
//! A failed fsync of the redo log or of the node file ends the process (`meta::fatal`): the
//! page cache may no longer say what the disk holds, and the restart replays from the disk.
//! Between the failure and the exit, though, other threads run on, and any of them may meet
//! the failure through some other call and turn it into an error answer — "Internal: I/O
//! error", "the shard is reopening it, retry". Such an answer would be wrong: the write it
//! refuses may already be in the redo log and come back at the restart, so the client must be
//! left with an unknown outcome (no answer), never a refusal. So the latch is set by the
//! thread that sees the failure first, before the failure can reach any caller, and every
//! error answer passes [`hold_if_failed`] on its way out ([`crate::error::Error`]'s
//! conversion to a gRPC status): after the latch, the answering thread waits for the exit
//! instead.
//!
//! Tests that catch fatal failures in-process (`StoreFaults::catch_fatal`) never set it.

use std::sync::atomic::{AtomicBool, Ordering};

static FAILED: AtomicBool = AtomicBool::new(false);

/// Records that an fsync failed in this process; the process is about to exit.
pub fn set() {
    FAILED.store(true, Ordering::SeqCst);
}

/// Returns at once unless an fsync failed in this process; then never returns (the thread
/// parks until the exit ends it), so nothing derived from the failure is answered.
pub fn hold_if_failed() {
    if FAILED.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::Duration;

    const CHILD: &str = "NOKV_TEST_FSYNC_LATCH_CHILD";

    /// Runs in a child process of the test binary, since the latch is process-wide: once set,
    /// every error answer of this process would wait forever.
    #[test]
    fn after_a_failed_fsync_no_error_is_answered() {
        if std::env::var_os(CHILD).is_some() {
            let answer = || tonic::Status::from(crate::error::Error::Internal("I/O error".into()));
            assert_eq!(
                answer().code(),
                tonic::Code::Internal,
                "answered before the latch"
            );
            super::set();
            let _ = answer();
            println!("answered after the latch");
            return;
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fsync_latch::tests::after_a_failed_fsync_no_error_is_answered",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The child's stdout closes when it finishes; it must still be open, the child
        // waiting, when the deadline passes (an answer would have let it finish in
        // milliseconds).
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
            let _ = tx.send(out);
        });
        if let Ok(out) = rx.recv_timeout(Duration::from_secs(3)) {
            panic!("the child finished: {out}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
