//! The command gate of one shard: write sessions are exclusive, reads never wait for them.
//!
//! **Write sessions** run one at a time on the shard's committer thread — the single writer is
//! the gate, so exclusivity holds by construction. A session is a synchronous closure over a
//! [`WriteView`]; it cannot await anything, so no provider I/O can ever happen while the gate
//! is held. Callers that need provider I/O (the upload sequencer) split their work into two
//! sessions with the I/O between them.
//!
//! **Group commit.** The committer takes every session queued at that moment as one batch: each
//! session is its own redb transaction (a failing one aborts alone and changes nothing), all
//! but the last commit deferred, the last durably (or an empty durable commit flushes the
//! batch). Nobody is answered before that fsync, so every acknowledged mutation is durable, and
//! one fsync serves the whole batch. A mutation that depends on another one's outcome is
//! submitted after it was answered, hence lands in a later batch: a crash can never keep a
//! dependent mutation and lose what it depended on.
//!
//! **Reads** take an MVCC snapshot of the last committed state and run concurrently with write
//! sessions, so a stat or list never queues behind an fsync. Every acknowledged mutation was
//! committed before it was acknowledged, so reads observe all of them; a read may also observe a
//! session of the batch in progress, which becomes durable moments later or, after a crash, was
//! never acknowledged to anyone.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::meta::{Commit, MetaStore, ReadView, WriteView};

/// Sessions taken into one batch at most (bounds the latency of the batch's first session).
const MAX_BATCH: usize = 64;

/// A queued session: runs on the committer thread with the commit mode the batch assigns,
/// and returns whether it committed and how to answer its caller once the batch's
/// durability is known.
type Job = Box<dyn FnOnce(&MetaStore, Commit) -> (bool, Answer) + Send>;
/// Delivers a session's outcome given the batch's flush result.
type Answer = Box<dyn FnOnce(&std::result::Result<(), String>) + Send>;

pub struct Gate {
    meta: Arc<MetaStore>,
    /// `None` only while dropping: closing the queue ends the committer.
    queue: Option<mpsc::UnboundedSender<Job>>,
    committer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Gate {
    /// Closes the queue and waits for the committer to finish the sessions already queued,
    /// so the database is closed cleanly once the gate is gone.
    fn drop(&mut self) {
        self.queue.take();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

impl Gate {
    /// Starts the shard's committer thread; it ends when the gate is dropped.
    pub fn new(meta: MetaStore, name: String) -> Gate {
        let meta = Arc::new(meta);
        let (queue, jobs) = mpsc::unbounded_channel();
        let store = meta.clone();
        let committer = std::thread::Builder::new()
            .name(name)
            .spawn(move || commit_loop(&store, jobs))
            .expect("spawn the shard committer");
        Gate {
            meta,
            queue: Some(queue),
            committer: Some(committer),
        }
    }

    /// Runs `f` on a snapshot of the last committed state; never waits for write sessions.
    pub async fn read<T>(&self, f: impl FnOnce(&ReadView) -> Result<T>) -> Result<T> {
        self.meta.read(f)
    }

    /// Runs `f` as one exclusive write session and answers once it is durable (or, when `f`
    /// fails, once it was rolled back — a failed session changes nothing). The session runs
    /// to completion even if the caller stops waiting.
    pub async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriteView) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |meta, commit| {
            let outcome = meta.write_with(commit, f);
            let committed = outcome.is_ok();
            let answer: Answer = Box::new(move |flushed| {
                let _ = tx.send(match (outcome, flushed) {
                    (Err(e), _) => Err(e),
                    (Ok(v), Ok(())) => Ok(v),
                    (Ok(_), Err(e)) => Err(Error::Internal(format!("commit failed: {e}"))),
                });
            });
            (committed, answer)
        });
        self.queue
            .as_ref()
            .expect("queue is open until drop")
            .send(job)
            .map_err(|_| Error::Unavailable("shard is shutting down".into()))?;
        rx.await
            .map_err(|_| Error::Internal("write session was dropped".into()))?
    }
}

fn commit_loop(meta: &MetaStore, mut jobs: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = jobs.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let last = batch.len() - 1;
        let mut answers = Vec::with_capacity(batch.len());
        let mut deferred_pending = false;
        for (i, job) in batch.into_iter().enumerate() {
            let commit = if i == last {
                Commit::Durable
            } else {
                Commit::Deferred
            };
            let (committed, answer) = job(meta, commit);
            // A durable commit also makes every earlier deferred commit durable.
            deferred_pending = match commit {
                Commit::Deferred => deferred_pending || committed,
                Commit::Durable => deferred_pending && !committed,
            };
            answers.push(answer);
        }
        // The last session failed (so did not commit) after deferred ones did: flush them.
        let flushed = if deferred_pending {
            meta.flush().map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        for answer in answers {
            answer(&flushed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_keeps_every_committed_session_and_nothing_of_a_failed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.redb");
        let gate = Arc::new(Gate::new(MetaStore::open(&path).unwrap(), "t".into()));
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let g = gate.clone();
                tokio::spawn(async move {
                    g.write(move |w| {
                        w.put_inline("ws", &format!("f{i}"), b"x")?;
                        if i % 3 == 0 {
                            return Err(Error::Internal("this session fails".into()));
                        }
                        Ok(i)
                    })
                    .await
                })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap().is_ok(), i % 3 != 0);
        }
        drop(Arc::try_unwrap(gate).ok().expect("sole owner"));
        // Reopen: what was acknowledged is there, what failed left nothing.
        let meta = MetaStore::open(&path).unwrap();
        for i in 0..40 {
            let have = meta.read(|r| r.inline("ws", &format!("f{i}"))).unwrap();
            assert_eq!(have.is_some(), i % 3 != 0, "f{i}");
        }
    }
}
