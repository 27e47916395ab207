use std::future::Future;
use std::pin::Pin;

use super::acknowledger::Stage;
use super::handoff::answers_here;
use super::jobs::ExclusiveJob;
use super::*;
use crate::meta::Commit;

/// A session of the gate under test, submitted but not yet answered.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

/// The committer, busy with a session that blocks until [`Held::release`].
struct Held {
    release: std::sync::mpsc::Sender<()>,
    answered: tokio::task::JoinHandle<Result<()>>,
}

impl Held {
    async fn release(self) {
        self.release.send(()).unwrap();
        self.answered.await.unwrap().unwrap();
    }
}

/// Occupies the committer with a session (writing `held`) that blocks until released;
/// returns once that session runs, so whatever is submitted next queues behind it.
async fn hold(gate: &Arc<Gate>) -> Held {
    let (running, is_running) = oneshot::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let g = gate.clone();
    let answered = tokio::spawn(async move {
        g.write(move |w| {
            running.send(()).unwrap();
            released.recv().unwrap();
            Ok(w.put_inline("ws", "held", b"h")?)
        })
        .await
    });
    is_running.await.unwrap();
    Held { release, answered }
}

/// Submits each session: polling a write once puts its session on the committer's queue
/// (the send happens before the first await), so on return all of them are queued, in
/// order, behind the held session — a signal, not a timing guess.
async fn submit(sessions: &mut [Pending<'_>]) {
    for s in sessions.iter_mut() {
        assert!(
            futures::poll!(s.as_mut()).is_pending(),
            "answered while held"
        );
    }
}

/// Resumes paused log appends when dropped — even if an assertion fails — so the gate can be
/// dropped (its committer joins the acknowledger, which would wait at the pause forever).
struct Resume(crate::meta::StoreFaults);

impl Drop for Resume {
    fn drop(&mut self) {
        self.0.resume_log();
    }
}

/// Returns once an append waits at the paused log (its batch committed, not yet durable).
async fn a_paused_append(faults: &crate::meta::StoreFaults) {
    let waiting = faults.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for_a_paused_append())
        .await
        .unwrap();
}

/// Whether the committer runs an exclusive job within 10 s (it is not stuck in an append),
/// and that job's answer.
async fn committer_is_free(gate: &Gate) -> (bool, tokio::task::JoinHandle<Result<()>>) {
    let (ran, has_run) = std::sync::mpsc::channel();
    let c = gate.committer.clone();
    let probe = tokio::spawn(async move {
        c.exclusive(move |_| {
            ran.send(()).unwrap();
            Ok(())
        })
        .await
    });
    let free = tokio::task::spawn_blocking(move || {
        has_run.recv_timeout(std::time::Duration::from_secs(10))
    })
    .await
    .unwrap();
    (free.is_ok(), probe)
}

/// A gate on a fresh standalone store, and the fault hook of that store.
fn gate_with_faults() -> (tempfile::TempDir, crate::meta::StoreFaults, Arc<Gate>) {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
    let faults = meta.faults().clone();
    let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
    (dir, faults, gate)
}

/// A session writing the small file `name`.
fn put<'a>(gate: &'a Gate, name: String) -> Pending<'a> {
    Box::pin(gate.write(move |w| Ok(w.put_inline("ws", &name, b"x")?)))
}

// Catches: `const MAX_BATCH: usize = 1;` (every session its own batch and fsync; verified
// red).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_queued_while_the_committer_is_busy_commit_together_as_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
    let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
    let before = gate.stats();

    let held = hold(&gate).await;
    let mut queued: Vec<_> = (0..10).map(|i| put(&gate, format!("f{i}"))).collect();
    submit(&mut queued).await;
    held.release().await;
    for s in queued {
        s.await.unwrap();
    }

    let after = gate.stats();
    // The held session's batch, then one batch of the ten queued behind it.
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert_eq!(after.sessions - before.sessions, 11, "{after:?}");
    assert_eq!(after.acknowledged - before.acknowledged, 11, "{after:?}");
}

// Catches: a committer per shard (each shard then pays its own fsync) — e.g. `Gate::on`
// starting a committer of its own, or a batch cut at a change of namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_of_different_shards_queued_together_commit_as_one_batch_with_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let node = MetaStore::create_node(&dir.path().join("node.redb")).unwrap();
    let (one, two) = (Tables::shard(1), Tables::shard(2));
    node.prepare(one).unwrap();
    node.prepare(two).unwrap();
    let committer = Committer::start(node, "t".into());
    let a = Arc::new(Gate::on(committer.clone(), one, Fence::local(1)));
    let b = Gate::on(committer.clone(), two, Fence::local(2));
    let (before, fsyncs) = (committer.stats(), committer.log_syncs());

    let held = hold(&a).await;
    let mut queued: Vec<_> = (0..5)
        .flat_map(|i| [put(&a, format!("a{i}")), put(&b, format!("b{i}"))])
        .collect();
    submit(&mut queued).await;
    held.release().await;
    for s in queued {
        s.await.unwrap();
    }

    let after = committer.stats();
    // The held session's batch, then one batch of the ten sessions of both shards.
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert_eq!(after.acknowledged - before.acknowledged, 11, "{after:?}");
    // The acknowledger may cover both batches with one fsync, never more than one each.
    let synced = committer.log_syncs() - fsyncs;
    assert!((1..=2).contains(&synced), "{synced} fsyncs for two batches");
    // Each shard sees its own files only.
    let has = |g: &Gate, name: &str| {
        let name = name.to_string();
        g.read_now(move |r| Ok(r.inline("ws", &name)?))
            .unwrap()
            .is_some()
    };
    for i in 0..5 {
        let (fa, fb) = (format!("a{i}"), format!("b{i}"));
        assert!(has(&a, &fa) && !has(&b, &fa), "{fa}");
        assert!(has(&b, &fb) && !has(&a, &fb), "{fb}");
    }
}

// Catches: the committer never making a batch durable — e.g. `acknowledger::append`
// writing none of the round's records (`s.log(&pending)` → `s.log(&[])`; verified red):
// the batches are then only in the held transaction or in redb's non-durable commits,
// which a crash does not keep. A clean close would make the file durable and hide that; a
// copy of the open file and its log does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_answered_caller_saw_is_in_a_copy_of_the_file_taken_while_the_gate_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.redb");
    let gate = Arc::new(Gate::new(
        MetaStore::create(&path).unwrap(),
        "t".into(),
        Fence::local(0),
    ));

    let held = hold(&gate).await;
    let mut queued: Vec<_> = (0..10).map(|i| put(&gate, format!("f{i}"))).collect();
    submit(&mut queued).await;
    held.release().await;
    for s in queued {
        s.await.unwrap();
    }

    // The gate (and its committer) stays open: these are the bytes a crash would leave —
    // the file and its redo log.
    let copy = dir.path().join("copy.redb");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(path.with_extension("redo"), copy.with_extension("redo")).unwrap();
    let copied = MetaStore::open(&copy).unwrap();
    for name in ["held".to_string()]
        .into_iter()
        .chain((0..10).map(|i| format!("f{i}")))
    {
        let have = copied.read(|r| r.inline("ws", &name)).unwrap();
        assert!(have.is_some(), "{name} was acknowledged but is not durable");
    }
    drop(gate);
}

// Catches: a copy taken before the sessions queued ahead of it are committed. The
// exclusive job must run after their batch and after `run_batches` commits the held
// transaction (`release(&mut held)`); dropping that release makes the copy's own write
// transaction wait for the held one, so the test hangs rather than fails (tried). Dropping
// `self.flush()` from `MetaStore::export` no longer turns it red: the copy reads a snapshot
// of the last commit, durable or not (that flush is what makes a failed store refuse to be
// copied, see `meta::snapshot`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_holds_every_session_queued_before_it_in_its_own_batch() {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
    let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
    let copy = dir.path().join("copy.redb");

    let held = hold(&gate).await;
    let mut before: Vec<_> = (0..5).map(|i| put(&gate, format!("before{i}"))).collect();
    submit(&mut before).await;
    let mut snapshot = Box::pin(gate.snapshot_to(copy.clone()));
    assert!(futures::poll!(snapshot.as_mut()).is_pending());
    let mut after: Vec<_> = (0..5).map(|i| put(&gate, format!("after{i}"))).collect();
    submit(&mut after).await;
    held.release().await;
    let size = snapshot.await.unwrap();
    for s in before.into_iter().chain(after) {
        s.await.unwrap();
    }

    assert_eq!(size, std::fs::metadata(&copy).unwrap().len());
    let copied = MetaStore::open(&copy).unwrap();
    for i in 0..5 {
        let name = format!("before{i}");
        let have = copied.read(|r| r.inline("ws", &name)).unwrap();
        assert!(have.is_some(), "{name} was queued before the snapshot");
    }
}

// The rule as the handoff relies on it, under load: the copy opens as a store and holds
// every session acknowledged before it was requested, while other sessions keep
// committing around it (a copy torn by a concurrent commit would fail to open or miss
// some).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_during_concurrent_writes_opens_and_holds_every_acknowledged_session() {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
    let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
    let acked = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let (count_tx, mut count_rx) = watch::channel(0usize);
    let count_tx = Arc::new(count_tx);
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let (g, acked, count_tx) = (gate.clone(), acked.clone(), count_tx.clone());
            tokio::spawn(async move {
                for i in 0..60 {
                    let name = format!("t{t}-{i}");
                    let n = name.clone();
                    g.write(move |w| Ok(w.put_inline("ws", &n, b"x")?))
                        .await
                        .unwrap();
                    let len = {
                        let mut a = acked.lock();
                        a.push(name);
                        a.len()
                    };
                    count_tx.send_replace(len);
                }
            })
        })
        .collect();

    // Writers are mid-flight: some sessions acknowledged, more queued and committing.
    count_rx.wait_for(|n| *n >= 40).await.unwrap();
    let acknowledged_before = acked.lock().clone();
    let copy = dir.path().join("copy.redb");
    gate.snapshot_to(copy.clone()).await.unwrap();
    for w in writers {
        w.await.unwrap();
    }

    let copied = MetaStore::open(&copy).unwrap();
    for name in &acknowledged_before {
        let have = copied.read(|r| r.inline("ws", name)).unwrap();
        assert!(
            have.is_some(),
            "{name} was acknowledged before the snapshot"
        );
    }
}

/// Queues `n` sessions writing `f0..`, the last of which fills the disk before it ends
/// (so the batch's earlier, deferred commits succeed and its durable end fails), and
/// returns every answer. The last session returns `last` after filling the disk.
async fn batch_failing_at_its_end(
    gate: &Arc<Gate>,
    n: usize,
    last: fn() -> Result<()>,
) -> Vec<Result<()>> {
    let disk = gate
        .committer
        .slot
        .store
        .read()
        .clone()
        .unwrap()
        .faults()
        .clone();
    let held = hold(gate).await;
    let mut queued: Vec<_> = (0..n - 1).map(|i| put(gate, format!("f{i}"))).collect();
    // The disk fills only once the held session's batch is durable (its log append runs
    // while the committer already runs this batch).
    let (held_durable, wait_held) = std::sync::mpsc::channel::<()>();
    queued.push(Box::pin(gate.write(move |w| {
        w.put_inline("ws", "last", b"x")?;
        wait_held.recv().unwrap();
        disk.fill_disk();
        last()
    })));
    submit(&mut queued).await;
    held.release().await;
    held_durable.send(()).unwrap();
    let mut answers = Vec::new();
    for s in queued {
        answers.push(s.await);
    }
    answers
}

// Catches: answering a batch before its record is known to be durable — `a(&appended)`
// → `a(&Ok(()))` for a logged stage's answers in `acknowledger::handle` (verified red):
// the disk fills while the batch runs, so its log append fails and every session must
// hear of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_durable_commit_fails_answers_every_session_with_an_error() {
    let (_dir, disk, gate) = gate_with_faults();
    let before = gate.stats();

    let answers = batch_failing_at_its_end(&gate, 8, || Ok(())).await;
    for (i, a) in answers.iter().enumerate() {
        assert!(
            matches!(a, Err(Error::Unavailable(_))),
            "session {i}: {a:?}"
        );
    }
    let after = gate.stats();
    assert_eq!(
        after.acknowledged - before.acknowledged,
        1,
        "only the held one"
    );
    disk.free_disk();
    gate.wait_serving(true).await;
}

// Catches: the same `a(&Ok(()))` in `acknowledger::handle` when the batch's last session
// failed by itself (verified red): that one keeps its own refusal, every session before it
// hears that the batch's log append failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_flush_fails_answers_every_session_with_an_error() {
    let (_dir, disk, gate) = gate_with_faults();
    let before = gate.stats();

    // The last session refuses by itself, so the batch ends with an explicit flush of
    // the deferred commits before it — and that flush fails.
    let answers = batch_failing_at_its_end(&gate, 8, || {
        Err(Error::FailedPrecondition("the last session refuses".into()))
    })
    .await;
    let (last, deferred) = answers.split_last().unwrap();
    assert!(
        matches!(last, Err(Error::FailedPrecondition(_))),
        "{last:?}"
    );
    for (i, a) in deferred.iter().enumerate() {
        assert!(
            matches!(a, Err(Error::Unavailable(_))),
            "session {i}: {a:?}"
        );
    }
    let after = gate.stats();
    assert_eq!(
        after.acknowledged - before.acknowledged,
        1,
        "only the held one"
    );
    disk.free_disk();
    gate.wait_serving(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_keeps_every_committed_session_and_nothing_of_a_failed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.redb");
    let gate = Arc::new(Gate::new(
        MetaStore::create(&path).unwrap(),
        "t".into(),
        Fence::local(0),
    ));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_reports_not_serving_while_its_disk_is_full_and_recovers_by_itself() {
    let (_dir, disk, gate) = gate_with_faults();
    let put = |name: &'static str| gate.write(move |w| Ok(w.put_inline("ws", name, b"x")?));
    put("before").await.unwrap();

    disk.fill_disk();
    let err = put("during").await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    // While the disk stays full the store cannot be reopened: the shard is out of
    // service, and says so instead of answering Internal.
    assert!(!gate.serving());
    let err = put("during-2").await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    let err = gate.read(|r| Ok(r.inline("ws", "before")?)).await;
    assert!(matches!(err, Err(Error::Unavailable(_))), "{err:?}");

    disk.free_disk();
    gate.wait_serving(true).await;
    put("after").await.unwrap();
    for (name, present) in [
        ("before", true),
        ("during", false),
        ("during-2", false),
        ("after", true),
    ] {
        let have = gate.read(move |r| Ok(r.inline("ws", name)?)).await.unwrap();
        assert_eq!(have.is_some(), present, "{name}");
    }
}

// Catches: answering a batch before its record is durable (`a(&Ok(()))` for logged
// answers in the acknowledger), appending after a failed append, or a store left in
// service after one (the next put would be answered from a log that lost a batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_log_append_fails_is_not_acknowledged_and_the_store_recovers() {
    let (dir, faults, gate) = gate_with_faults();
    let path = dir.path().join("g.redb");
    let put = |name: &'static str| gate.write(move |w| Ok(w.put_inline("ws", name, b"x")?));
    put("before").await.unwrap();

    faults.fail_log();
    let err = put("lost").await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    // The store is out of service until the committer reopened it (from the file and
    // the records the log holds), so no reader saw "lost" in between.
    let err = gate.read(|r| Ok(r.inline("ws", "lost")?)).await;
    assert!(
        matches!(err, Err(Error::Unavailable(_)) | Ok(None)),
        "{err:?}"
    );
    faults.heal_log();
    gate.wait_serving(true).await;
    put("after").await.unwrap();
    // "lost" was answered Unavailable: it may or may not have been kept (closing the
    // failed handle can still make its commit durable, as a crash after an fsync can keep
    // a batch nobody heard of) — a retry with its request id finds out. What readers see
    // is what the file holds.
    let seen = |name: &'static str| gate.read(move |r| Ok(r.inline("ws", name)?));
    assert!(seen("before").await.unwrap().is_some());
    assert!(seen("after").await.unwrap().is_some());
    let lost = seen("lost").await.unwrap().is_some();
    drop(gate);
    let reopened = MetaStore::open(&path).unwrap();
    let kept = |name: &str| reopened.read(|r| r.inline("ws", name)).unwrap().is_some();
    assert!(kept("before") && kept("after"));
    assert_eq!(kept("lost"), lost);
}

fn known() -> Stage {
    Stage::Known {
        answers: Vec::new(),
        outcome: Ok(()),
        visible: None,
    }
}

fn logged() -> Stage {
    let dir = tempfile::tempdir().unwrap();
    let meta = Arc::new(MetaStore::create(&dir.path().join("g.redb")).unwrap());
    let mut batch = meta.batch().unwrap();
    batch
        .session(Tables::canonical(), |w| w.put_inline("ws", "a", b"x"))
        .unwrap();
    let logged = batch.commit_logged().unwrap();
    Stage::Logged {
        store: meta,
        redo: logged.redo,
        snapshot: logged.snapshot,
        answers: Vec::new(),
        committed: 1,
    }
}

// Catches: the committer answering a batch itself while a stage is still with the
// acknowledger (drop `handed_over == 0`; verified red) — its record could then reach the log
// before an earlier batch's, and a crash keep the later batch and lose the earlier one it was
// acknowledged after — or while sessions are queued behind it (drop `lone`).
#[test]
fn only_a_lone_batch_with_nothing_left_at_the_acknowledger_is_answered_by_the_committer() {
    assert!(answers_here(&logged(), true, 0));
    assert!(
        !answers_here(&logged(), true, 1),
        "a record still unwritten"
    );
    assert!(
        !answers_here(&logged(), false, 0),
        "sessions queued behind it"
    );
    assert!(!answers_here(&known(), true, 0), "not a committed batch");
}

// Catches: a batch shown to readers without its rows while the committer holds the
// transaction (a snapshot taken from the last commit, not read through the memtable), and
// a committer that commits every batch after all (the count of commits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_write_is_read_back_while_the_committer_holds_its_transaction() {
    let (dir, _faults, gate) = gate_with_faults();
    let (commits, batches) = (gate.committer.commits(), gate.stats().batches);
    for i in 0..10 {
        let name = format!("f{i}");
        let body = name.clone().into_bytes();
        gate.write(move |w| {
            w.put_entry("ws", &name, &Default::default())?;
            Ok(w.put_inline("ws", &name, &body)?)
        })
        .await
        .unwrap();
        let listed = gate
            .read(|r| Ok(r.list("ws", "", None, 100)?.len()))
            .await
            .unwrap();
        let read = gate
            .read(move |r| Ok(r.inline("ws", &format!("f{i}"))?))
            .await
            .unwrap();
        assert_eq!(read, Some(format!("f{i}").into_bytes()), "f{i} not shown");
        assert_eq!(listed, i + 1, "the list misses a shown entry");
    }
    assert_eq!(gate.stats().batches - batches, 10);
    assert!(
        gate.committer.commits() - commits < 10,
        "a commit per batch: no transaction was held"
    );
    // A job between batches (a checkpoint's copy) sees the held batches too.
    let copy = dir.path().join("copy.redb");
    gate.snapshot_to(copy.clone()).await.unwrap();
    let copied = MetaStore::open(&copy).unwrap();
    for i in 0..10 {
        assert!(
            copied
                .read(|r| r.inline("ws", &format!("f{i}")))
                .unwrap()
                .is_some()
        );
    }
}

// The path both ways in one run: a batch with sessions queued behind it goes to the
// acknowledger (its append held at the pause here), and the lone batch after it must queue
// behind it — the committer stays free (an exclusive job still runs), and neither is
// answered before the log moves again. Then a lone batch with nothing at the acknowledger
// is answered (by the committer), and all three writes survive a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_batch_queues_behind_a_record_still_with_the_acknowledger() {
    let (dir, faults, gate) = gate_with_faults();
    faults.pause_log();
    let _resume = Resume(faults.clone());

    // H (held) runs; an exclusive job X and a session B queue behind it, so H's batch ends
    // at X with B queued: H goes to the acknowledger and its append waits at the pause.
    let before = gate.stats();
    let held = hold(&gate).await;
    let c = gate.committer.clone();
    let mut queued: [Pending<'_>; 2] = [
        Box::pin(async move { c.exclusive(|_| Ok(())).await }),
        put(&gate, "b".into()),
    ];
    submit(&mut queued).await;
    held.release.send(()).unwrap();
    a_paused_append(&faults).await;
    // H, X and B have run (B as a batch of its own, nothing queued behind it).
    while gate.stats().sessions < before.sessions + 3 {
        tokio::task::yield_now().await;
    }

    // B ran as a lone batch (nothing queued behind it) while H is still at the pause: the
    // committer must have queued it, so it is free for the next job.
    let (free, probe) = committer_is_free(&gate).await;
    assert!(free, "the committer sits in a lone batch's append");
    assert!(!held.answered.is_finished(), "answered before durable");

    faults.resume_log();
    held.answered.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap();
    }
    probe.await.unwrap().unwrap();

    // Nothing left at the acknowledger: a lone batch is answered, durable, and kept.
    gate.write(|w| Ok(w.put_inline("ws", "lone", b"x")?))
        .await
        .unwrap();
    drop(gate);
    let reopened = MetaStore::open(&dir.path().join("g.redb")).unwrap();
    for name in ["held", "b", "lone"] {
        assert!(
            reopened.read(|r| r.inline("ws", name)).unwrap().is_some(),
            "{name} lost"
        );
    }
}

// Catches: the committer answering lone batches itself while writes arrive during its
// fsyncs (drop `handing_over == 0` from the lone rule; verified red): each such write waits
// for an fsync it is not in, instead of running its own batch meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_waited_behind_a_lone_batch_sends_the_next_batches_to_the_acknowledger() {
    let (_dir, faults, gate) = gate_with_faults();
    faults.pause_log();
    let _resume = Resume(faults.clone());

    // A is lone: the committer appends it itself and waits at the pause; B arrives then.
    let mut a = put(&gate, "a".into());
    assert!(futures::poll!(a.as_mut()).is_pending());
    a_paused_append(&faults).await;
    let mut b = [put(&gate, "b".into())];
    submit(&mut b).await;
    faults.resume_log();
    a.await.unwrap();
    let [b] = b;
    b.await.unwrap();

    // C is lone too (nothing queued, nothing at the acknowledger), yet handed over: the
    // committer is free while C's append waits.
    faults.pause_log();
    let g = gate.clone();
    let c = tokio::spawn(async move { g.write(|w| Ok(w.put_inline("ws", "c", b"x")?)).await });
    a_paused_append(&faults).await;
    let (free, probe) = committer_is_free(&gate).await;
    assert!(free, "the committer sits in a lone batch's append again");
    assert!(!c.is_finished(), "answered before durable");
    faults.resume_log();
    c.await.unwrap().unwrap();
    probe.await.unwrap().unwrap();
}

// Catches: showing readers a batch before its record is durable — e.g. the acknowledger
// showing the newest snapshot before its append, or reads going to the store's latest
// commit instead of the shown snapshot. A reader that saw such a batch could act on
// a write that a crash then loses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_batch_before_its_record_is_durable() {
    let (_dir, faults, gate) = gate_with_faults();
    let seen = |name: &'static str| {
        let g = gate.clone();
        async move { g.read(move |r| Ok(r.inline("ws", name)?)).await.unwrap() }
    };
    gate.write(|w| Ok(w.put_inline("ws", "before", b"x")?))
        .await
        .unwrap();

    faults.pause_log();
    let _resume = Resume(faults.clone());
    let g = gate.clone();
    let pending =
        tokio::spawn(async move { g.write(|w| Ok(w.put_inline("ws", "pending", b"x")?)).await });
    // The batch is committed and its append waits: the window before durability.
    a_paused_append(&faults).await;
    assert!(seen("before").await.is_some());
    assert!(seen("pending").await.is_none(), "visible before durable");
    assert!(!pending.is_finished(), "answered before durable");

    faults.resume_log();
    pending.await.unwrap().unwrap();
    assert!(
        seen("pending").await.is_some(),
        "durable and answered, so visible"
    );
}

/// Resumes paused shows when dropped (see [`Resume`]).
struct ResumeShow(crate::meta::StoreFaults);

impl Drop for ResumeShow {
    fn drop(&mut self) {
        self.0.resume_show();
    }
}

/// A test-only session: writes `name`, then panics.
fn panicking<'a>(gate: &'a Gate, name: &'static str) -> Pending<'a> {
    Box::pin(gate.write(move |w| -> Result<()> {
        w.put_inline("ws", name, b"x")?;
        panic!("test-only: a write session that panics after writing {name}");
    }))
}

// Catches: a session run without `caught` in `Gate::submit` (`batch.session(ns, f)`;
// verified red: the panic ends the committer, "a" and "c" answer "write session was
// dropped" and nothing after is written) — and a caught panic whose writes are not undone
// (`caught` around `batch.session` instead of inside it, so the undo never runs; verified
// red: "panicked" is shown and kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_session_answers_internal_leaves_nothing_and_the_rest_of_its_batch_is_kept() {
    let (dir, _faults, gate) = gate_with_faults();
    let before = gate.stats();

    let held = hold(&gate).await;
    let (a, p, c) = {
        let mut queued = [
            put(&gate, "a".into()),
            panicking(&gate, "panicked"),
            put(&gate, "c".into()),
        ];
        submit(&mut queued).await;
        held.release().await;
        let [a, p, c] = queued;
        (a.await, p.await, c.await)
    };
    a.unwrap();
    let err = p.unwrap_err();
    assert!(matches!(err, Error::Internal(_)), "{err:?}");
    c.unwrap();

    let after = gate.stats();
    // The held session's batch, then one batch of all three.
    assert_eq!(after.batches - before.batches, 2, "{after:?}");
    assert_eq!(after.acknowledged - before.acknowledged, 3, "{after:?}");
    assert!(gate.serving());
    gate.write(|w| Ok(w.put_inline("ws", "later", b"x")?))
        .await
        .unwrap();
    let seen = |name: &'static str| gate.read_now(move |r| Ok(r.inline("ws", name)?));
    assert!(
        seen("panicked").unwrap().is_none(),
        "the panicked session's write is shown"
    );
    drop(gate);
    let reopened = MetaStore::open(&dir.path().join("g.redb")).unwrap();
    let kept = |name: &str| reopened.read(|r| r.inline("ws", name)).unwrap().is_some();
    for name in ["held", "a", "c", "later"] {
        assert!(kept(name), "{name} was acknowledged but is not durable");
    }
    assert!(!kept("panicked"), "the panicked session left its write");
}

// Catches: a committer that ends without taking its shards out of service (drop
// `send_replace(false)` from `Stopped::drop`; verified red): health would say serving
// while every write fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committer_that_stopped_reports_not_serving_and_refuses_writes() {
    let (_dir, _faults, gate) = gate_with_faults();
    gate.write(|w| Ok(w.put_inline("ws", "before", b"x")?))
        .await
        .unwrap();
    assert!(gate.serving());

    // Test-only: a job that panics outside any session and any `caught` — the committer's
    // own code failing, the one panic it does not survive.
    let job: ExclusiveJob = Box::new(|_| panic!("test-only: the committer itself panics"));
    gate.committer.send(Job::Exclusive(job)).unwrap();
    gate.stopped().await;

    assert!(!gate.serving(), "a stopped committer reported serving");
    let err = gate
        .write(|w| Ok(w.put_inline("ws", "after", b"x")?))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
}

// The window of issue 42, item 6: a batch is durable (appended) but not yet shown when
// the store fails (here an exclusive job's durable commit on a full disk); the committer
// has not yet taken the store out of service. The batch's caller is answered OK, and then
// must never read a state without its own write. Catches: `Slot::show` leaving the older
// snapshot up when the store failed (the code before this test; verified red: "held" read
// back as absent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_answered_while_the_store_fails_never_reads_a_state_without_its_write() {
    let (_dir, faults, gate) = gate_with_faults();
    gate.write(|w| Ok(w.put_inline("ws", "before", b"x")?))
        .await
        .unwrap();
    faults.pause_show();
    let _resume = ResumeShow(faults.clone());

    // H runs; X (an exclusive job) queues behind it, so H's batch goes to the acknowledger,
    // which appends it and waits before showing it. X runs meanwhile and, once the disk is
    // full, fails the store with a durable commit — then waits inside the committer.
    let held = hold(&gate).await;
    let (x_running, is_x_running) = oneshot::channel();
    let (disk_full, wait_disk_full) = std::sync::mpsc::channel::<()>();
    let (failed, has_failed) = oneshot::channel();
    let (done, wait_done) = std::sync::mpsc::channel::<()>();
    let c = gate.committer.clone();
    let mut queued: [Pending<'_>; 1] = [Box::pin(async move {
        c.exclusive(move |meta| {
            x_running.send(()).unwrap();
            wait_disk_full.recv().unwrap();
            let commit = meta.write_in(Tables::canonical(), Commit::Durable, |w| {
                w.next_sequence("x").map(drop)
            });
            failed.send(commit.is_err()).unwrap();
            wait_done.recv().unwrap();
            Ok(())
        })
        .await
    })];
    submit(&mut queued).await;
    held.release.send(()).unwrap();
    let waiting = faults.clone();
    tokio::task::spawn_blocking(move || waiting.wait_for_a_paused_show())
        .await
        .unwrap();
    is_x_running.await.unwrap();
    faults.fill_disk();
    disk_full.send(()).unwrap();
    assert!(has_failed.await.unwrap(), "the store did not fail");

    // H was durable before the failure: its caller is answered OK ...
    faults.resume_show();
    held.answered.await.unwrap().unwrap();
    // ... and reads it back, or is refused retryably — never a state without it.
    let read = gate.read(|r| Ok(r.inline("ws", "held")?)).await;
    assert!(
        matches!(read, Ok(Some(_)) | Err(Error::Unavailable(_))),
        "an acknowledged write read back as {read:?}"
    );

    done.send(()).unwrap();
    let [x] = queued;
    x.await.unwrap();
    faults.free_disk();
    gate.wait_serving(true).await;
    let read = gate.read(|r| Ok(r.inline("ws", "held")?)).await;
    assert!(read.unwrap().is_some(), "an acknowledged write lost");
    gate.write(|w| Ok(w.put_inline("ws", "after", b"x")?))
        .await
        .unwrap();
}

// A poisoned undo: a session fails and undoing it fails too, so its write stays in the
// transaction. Nothing of that batch may be acknowledged or kept: the batch is refused,
// the store reopened from what is durable, and writes work again. Catches: `Batch::end`
// ignoring `poisoned` (verified red: "a" acknowledged and the failed session's "b" kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_undo_fails_acknowledges_nothing_and_the_store_is_reopened() {
    let (dir, faults, gate) = gate_with_faults();
    gate.write(|w| Ok(w.put_inline("ws", "before", b"x")?))
        .await
        .unwrap();
    let before = gate.stats();

    let held = hold(&gate).await;
    let (a, b, c) = {
        let failing: Pending<'_> = Box::pin(gate.write(|w| {
            w.put_inline("ws", "b", b"x")?;
            Err(Error::FailedPrecondition("this session fails".into()))
        }));
        let mut queued = [put(&gate, "a".into()), failing, put(&gate, "c".into())];
        submit(&mut queued).await;
        faults.fail_undo();
        held.release.send(()).unwrap();
        let [a, b, c] = queued;
        (a.await, b.await, c.await)
    };
    faults.heal_undo();
    assert!(matches!(a, Err(Error::Unavailable(_))), "{a:?}");
    assert!(matches!(b, Err(Error::FailedPrecondition(_))), "{b:?}");
    assert!(matches!(c, Err(Error::Unavailable(_))), "{c:?}");
    // H's batch went to the acknowledger while this one ran: it is acknowledged only if its
    // append came before the store failed.
    let held_ok = held.answered.await.unwrap().is_ok();
    let after = gate.stats();
    assert_eq!(
        after.acknowledged - before.acknowledged,
        u64::from(held_ok),
        "{after:?}"
    );

    gate.wait_serving(true).await;
    gate.write(|w| Ok(w.put_inline("ws", "later", b"x")?))
        .await
        .unwrap();
    let seen = |name: &'static str| {
        gate.read_now(move |r| Ok(r.inline("ws", name)?))
            .unwrap()
            .is_some()
    };
    for (name, present) in [("before", true), ("a", false), ("b", false), ("c", false)] {
        assert_eq!(seen(name), present, "{name}");
    }
    assert!(!held_ok || seen("held"), "held was acknowledged");
    drop(gate);
    let reopened = MetaStore::open(&dir.path().join("g.redb")).unwrap();
    let kept = |name: &str| reopened.read(|r| r.inline("ws", name)).unwrap().is_some();
    for (name, present) in [
        ("before", true),
        ("a", false),
        ("b", false),
        ("c", false),
        ("later", true),
    ] {
        assert_eq!(kept(name), present, "{name}");
    }
}
