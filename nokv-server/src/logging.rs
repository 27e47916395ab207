//! The daemon's log sink: tracing to stderr, where a failed write drops the line and never
//! fails, let alone panics, the thread that logged it.
//!
//! **Why this module exists (issue 42, item 3).** With stderr redirected to a file on the same
//! filesystem as the data dir (a log file, or journald on the root disk), filling that disk
//! killed the node committer for good: every write then answered `Unavailable: shard is
//! shutting down`, health said NOT SERVING, and freeing the disk brought nothing back. The
//! exact path, reproduced on a 64 MiB tmpfs holding both the data dir and the stderr file
//! (`2>>`), caught with gdb on `rust_panic` in the committer thread:
//!
//! 1. a commit fails with ENOSPC; `gate::Outage::begin` logs its one ERROR for the incident;
//! 2. `tracing_subscriber::fmt()` — as `main` built it — writes the line to stderr, which fails
//!    with ENOSPC too. The `SubscriberBuilder` turns on `log_internal_errors` by default, so its
//!    `fmt_layer` (`on_event`) reports that failure with `eprintln!` — to the same full stderr;
//! 3. `eprintln!` panics when its write fails (`failed printing to stderr: No space left on
//!    device`; std's `print_to`); the panic message itself cannot be written either, so
//!    nothing is seen;
//! 4. the panic unwinds the committer thread (`commit_loop` has nothing to stop it): its job
//!    queue closes (later writes: "shard is shutting down"), the acknowledger ends with it, and
//!    the `serving` flag it had just set to false is never set back.
//!
//! The same run killed the node's maintenance task (a `tracing::warn!` from `server::maintain`
//! on a tokio worker panicked the same way), silently ending reconciliation. With stderr on
//! another filesystem nothing failed and the store recovered by itself two seconds after space
//! was freed.
//!
//! **The rule.** Logging is a side path: it must never decide whether a write succeeds. So the
//! sink ([`Lossy`]) swallows its own write errors (and counts the lines it lost, for metrics),
//! and the subscriber is built with `log_internal_errors(false)`, so that even a sink that did
//! return an error could not make tracing print, and panic, on stderr. Either one alone stops
//! the panic; both are kept because each guards a different layer against a future change.
//! Anything else the process prints after start-up must follow the same rule (no `eprintln!`
//! or `println!` outside start-up and the offline commands). The committer itself also
//! survives what a session does (see [`crate::shard::gate`]).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::fmt::MakeWriter;

/// Log lines lost because the sink refused them (disk full, closed pipe), since start.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines lost because the sink refused them, since the process started.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A writer that never fails: what the inner writer refuses is dropped (and counted), so a
/// full disk or a closed pipe under stderr costs log lines, never the thread that logs.
pub struct Lossy<W>(pub W);

impl<W: Write> Write for Lossy<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// Makes a [`Lossy`] writer around each writer `make` returns (one per event).
#[derive(Clone, Copy)]
pub struct LossyWriter<F>(pub F);

impl<'a, F: Fn() -> W + 'static, W: Write + 'a> MakeWriter<'a> for LossyWriter<F> {
    type Writer = Lossy<W>;

    fn make_writer(&'a self) -> Self::Writer {
        Lossy((self.0)())
    }
}

/// The daemon's subscriber: `filter` (an `EnvFilter` directive, `info` if it does not parse)
/// written to stderr through [`Lossy`], with tracing's own error reports off.
pub fn subscriber(filter: &str) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(LossyWriter(io::stderr))
        .log_internal_errors(false)
        .finish()
}

/// Installs [`subscriber`] as the process's default.
pub fn init(filter: &str) {
    let _ = tracing::subscriber::set_global_default(subscriber(filter));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::error::Error;
    use crate::meta::MetaStore;
    use crate::shard::fence::Fence;
    use crate::shard::gate::Gate;

    /// A sink whose every write fails the way a full disk does.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::StorageFull))
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::StorageFull))
        }
    }

    // Catches: a sink that passes its error on (`return Err(e)` from `Lossy::write`; verified
    // red) — tracing would then report it on stderr, which is on the same full disk.
    #[test]
    fn a_line_the_sink_refuses_is_dropped_and_counted_without_an_error() {
        let before = dropped_lines();
        let mut sink = Lossy(Full);
        assert_eq!(sink.write(b"a log line\n").unwrap(), 11);
        sink.write_all(b"another\n").unwrap();
        sink.flush().unwrap();
        assert!(dropped_lines() >= before + 2);
    }

    /// Set in the child process of the test below, whose stderr is `/dev/full`.
    const CHILD: &str = "NOKV_TEST_LOGGING_STDERR_IS_FULL";

    // The production failure, end to end in a child process whose stderr is `/dev/full` (every
    // write to it fails with ENOSPC, as a log file on a full disk does), with the daemon's
    // subscriber installed: the committer logs its ERROR for a full disk, and must still be
    // running — and recover — once the disk is free. Catches: the daemon's old subscriber,
    // `tracing_subscriber::fmt().with_writer(io::stderr)` in `subscriber` (verified red: the
    // committer panics in tracing's `eprintln!`, and its `Stopped` guard's ERROR panics again
    // while unwinding, so the child aborts; without that guard the committer simply stops and
    // the child reports it).
    #[test]
    fn the_committer_survives_logging_its_error_to_a_full_stderr() {
        if std::env::var_os(CHILD).is_some() {
            return the_committer_survives_a_full_disk_under_the_daemons_subscriber();
        }
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            // No /dev/full (not Linux): nothing to run the child against.
            return;
        };
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "logging::tests::the_committer_survives_logging_its_error_to_a_full_stderr",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stderr(full)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        assert!(
            stdout.contains("committer survived"),
            "the child ran nothing: {stdout}"
        );
    }

    /// The child's side: everything it reports goes to stdout (stderr is full).
    fn the_committer_survives_a_full_disk_under_the_daemons_subscriber() {
        init("info");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
            let disk = meta.faults().clone();
            let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
            let put = |name: &'static str| gate.write(move |w| Ok(w.put_inline("ws", name, b"x")?));
            put("before").await.unwrap();
            disk.fill_disk();
            // The failure the committer logs at ERROR (to the full stderr).
            let err = put("during").await.unwrap_err();
            if !matches!(err, Error::Unavailable(_)) {
                println!("unexpected error during the outage: {err:?}");
                std::process::exit(1);
            }
            disk.free_disk();
            tokio::select! {
                () = gate.wait_serving(true) => {}
                () = gate.stopped() => {
                    println!("the committer stopped during the outage");
                    std::process::exit(1);
                }
            }
            if let Err(e) = put("after").await {
                println!("the write after the outage failed: {e:?}");
                std::process::exit(1);
            }
            println!("committer survived");
        });
    }
}
