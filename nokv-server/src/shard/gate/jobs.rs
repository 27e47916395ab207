//! What the committer runs, and how a caller hears back: a queued [`Job`] (a write session or
//! an exclusive job on the whole store) and its [`Answer`].
//!
//! Invariants:
//! * a job is answered exactly once: with the batch's outcome once that is known (after the
//!   fsync that covers it, see [`super::acknowledger`]), or refused without running while the
//!   store is out of service ([`Job::refuse`], answered `Unavailable`, see [`out_of_service`]);
//! * a panic in a session's or a job's code is that caller's alone ([`caught`]).
//!
//! **Panics: caught per session, not `panic = "abort"` (issue 42, item 3).** Every shard of
//! the node writes through this one thread, so it must outlive whatever one session does. A
//! session runs under `catch_unwind`: a panic in it becomes `Internal` for that caller alone,
//! and the batch undoes the session's writes exactly as for a session that returned an error
//! (the same undo steps, the same rewind of its redo effects) — the other sessions of the
//! batch are committed, logged and acknowledged as usual, and later batches run. (An
//! exclusive job's panic is caught the same way; it runs outside any transaction.) Why not
//! `panic = "abort"` and a supervisor restart:
//! * the blast radius. One session's bug would take every shard of the node down, fail the
//!   sessions of other tenants batched with it, and cost a full restart (redb's repair walk
//!   of the whole node file, then the log replay) — for one request;
//! * crash loops. A panic that a request's data triggers comes back with the client's retry
//!   (same request id, same data): under abort the node would restart for as long as that
//!   client retries; caught, that client gets `Internal` each time and nobody else notices;
//! * what is given up is small: the panicking session's writes are undone from the undo
//!   steps recorded at each write, so nothing of it reaches the transaction's commit or the
//!   log; if an undo step itself fails the batch is poisoned — nothing of it is acknowledged
//!   and the store is reopened from what is durable (see [`crate::meta`]'s `Batch`). The
//!   residual risk, named: a panic *inside* redb mid-operation could leave the transaction
//!   inconsistent in ways no undo step knows; redb panics only on broken internal invariants
//!   (a redb bug, treated as damage at open, see `meta`'s `open`).
//!
//! A panic anywhere else on the committer thread (outside sessions and jobs: a bug in the
//! committer itself) still ends it. Then no write can succeed, so its
//! [`Stopped`](super::Stopped) guard makes every shard on it report not serving — admin
//! health, the metrics gauge and the standard gRPC health service all follow
//! [`Gate::serving`](super::Gate::serving) — and writes answer `Unavailable` naming the stopped
//! committer. A logging failure can no longer be such a panic: that was the
//! full-disk death of item 3 (the exact path is in [`crate::logging`]'s doc).

use crate::error::{Error, Result};
use crate::meta::{Batch, MetaStore};

/// A queued session: runs on the committer thread with the commit mode the batch assigns
/// (or, given `None`, is refused without running because the store is out of service), and
/// returns whether it committed and how to answer its caller once the batch's durability is
/// known.
/// A write session: runs inside the batch's transaction (or, given `None`, is refused without
/// running) and returns whether it committed and how to answer its caller.
pub(super) type SessionJob = Box<dyn FnOnce(Option<&mut Batch>) -> (bool, Answer) + Send>;
/// Work on the whole store between batches (no transaction open).
pub(super) type ExclusiveJob = Box<dyn FnOnce(Option<&MetaStore>) -> Answer + Send>;

pub(super) enum Job {
    Session(SessionJob),
    Exclusive(ExclusiveJob),
}

impl Job {
    /// Refuses the job without running it (the store is out of service).
    pub(super) fn refuse(self) -> Answer {
        match self {
            Job::Session(j) => j(None).1,
            Job::Exclusive(j) => j(None),
        }
    }
}
/// Delivers a session's outcome given the batch's flush result.
pub(super) type Answer = Box<dyn FnOnce(&std::result::Result<(), String>) + Send>;

pub(super) fn out_of_service() -> Error {
    Error::Unavailable("shard metadata store is reopening after a storage failure; retry".into())
}

/// Runs `f` (a session's or a job's code, on the committer thread), turning a panic into
/// `Internal` for that caller alone: the committer, and every other session of the batch,
/// must outlive it (see the module doc). The panic hook has already printed where it
/// happened; this logs it as the ERROR an operator looks for.
pub(super) fn caught<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        tracing::error!(
            panic = %message,
            "{what} panicked: answered Internal, its writes undone, the batch goes on"
        );
        Err(Error::Internal(format!(
            "{what} panicked ({message}); nothing of it was kept"
        )))
    })
}
