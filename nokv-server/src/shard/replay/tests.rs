//! Replay against a real store, one write session per call, as the shard runs it: what is
//! recorded, what a retry gets back, and what is never recorded.

use std::cell::Cell;

use nokv_proto::v1 as pb;

use super::RequestKey;
use crate::error::{Error, Result};
use crate::meta::{MetaStore, ReplayRecord, WriteView};

fn store() -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().unwrap();
    let meta = MetaStore::create(&dir.path().join("r.redb")).unwrap();
    (dir, meta)
}

fn key(request_id: &str, path: &str) -> RequestKey {
    let req = pb::DeleteRequest {
        workspace: "ws".into(),
        path: path.into(),
        ..Default::default()
    };
    RequestKey::new("ws", request_id, "Delete", &req)
}

/// Runs `key.execute` as one durable write session whose state check gives `check` and
/// whose apply answers `generation`, counting how often apply ran. The outer error aborts
/// the session, as in the gate.
fn execute(
    meta: &MetaStore,
    key: &RequestKey,
    check: impl FnOnce() -> Result<()>,
    generation: u64,
    applied: &Cell<u32>,
) -> Result<Result<pb::DeleteResponse>> {
    meta.write(|w| {
        key.execute(
            w,
            1_000,
            |_: &WriteView| check(),
            |_: &mut WriteView, (), _now| {
                applied.set(applied.get() + 1);
                Ok(pb::DeleteResponse { generation })
            },
        )
    })
}

// Catches: dropping the replay lookup at the top of `execute` (`if let Some(outcome) =
// self.recorded(w)? { return Ok(outcome); }`), or `execute` not calling `self.record`.
// (Verified red.)
#[test]
fn a_retry_of_a_recorded_success_gets_the_recorded_response_without_running_again() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    let applied = Cell::new(0);
    let first = execute(&meta, &k, || Ok(()), 7, &applied).unwrap().unwrap();
    assert_eq!(first.generation, 7);
    // The state would now refuse, and a rerun would answer 8: the retry gets neither.
    let again = execute(
        &meta,
        &k,
        || Err(Error::NotFound("gone".into())),
        8,
        &applied,
    )
    .unwrap()
    .unwrap();
    assert_eq!(again.generation, 7);
    assert_eq!(applied.get(), 1);
}

// Catches: `execute` answering a refusal without `w.put_replay` (refusals not recorded), or
// `refusal_record` returning `None` for `NotFound`. (Verified red.)
#[test]
fn a_retry_of_a_recorded_refusal_gets_the_refusal_even_when_the_state_now_allows_it() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    let applied = Cell::new(0);
    let first = execute(
        &meta,
        &k,
        || Err(Error::NotFound("ws:a does not exist".into())),
        1,
        &applied,
    )
    .unwrap();
    assert!(matches!(first, Err(Error::NotFound(_))), "{first:?}");
    let again = execute(&meta, &k, || Ok(()), 1, &applied).unwrap();
    match again {
        Err(Error::NotFound(msg)) => assert_eq!(msg, "ws:a does not exist"),
        other => panic!("expected the recorded NotFound, got {other:?}"),
    }
    assert_eq!(applied.get(), 0);
}

// Catches: `refusal_from_record` mapping `GenerationMismatch` with its numbers lost or
// swapped (e.g. `expected: rec.current`). (Verified red.)
#[test]
fn a_recorded_generation_mismatch_replays_the_generations_it_was_refused_with() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    let applied = Cell::new(0);
    let refusal = || {
        Err(Error::GenerationMismatch {
            expected: 5,
            current: 3,
        })
    };
    execute(&meta, &k, refusal, 1, &applied)
        .unwrap()
        .unwrap_err();
    let again = execute(&meta, &k, || Ok(()), 1, &applied).unwrap();
    assert!(
        matches!(
            again,
            Err(Error::GenerationMismatch {
                expected: 5,
                current: 3
            })
        ),
        "{again:?}"
    );
}

// Catches: dropping the fingerprint comparison in `recorded` (`if rec.fingerprint !=
// self.fingerprint`), or `RequestKey::new` leaving the operation name out of the
// fingerprint (`h.update(op.as_bytes())`). (Verified red.)
#[test]
fn the_same_request_id_for_another_request_is_refused_as_reused_and_changes_nothing() {
    let (_d, meta) = store();
    let applied = Cell::new(0);
    execute(&meta, &key("r1", "a"), || Ok(()), 7, &applied)
        .unwrap()
        .unwrap();

    // Another path under the same id, and the same request body as another operation.
    let same_body = pb::DeleteRequest {
        workspace: "ws".into(),
        path: "a".into(),
        ..Default::default()
    };
    let other_op = RequestKey::new("ws", "r1", "Stat", &same_body);
    for other in [key("r1", "b"), other_op] {
        let err = execute(&meta, &other, || Ok(()), 9, &applied).unwrap_err();
        assert!(matches!(err, Error::RequestIdReused(_)), "{err:?}");
    }
    assert_eq!(applied.get(), 1);
    // The first request's record is untouched: its retry still answers as before.
    let again = execute(&meta, &key("r1", "a"), || Ok(()), 8, &applied)
        .unwrap()
        .unwrap();
    assert_eq!(again.generation, 7);
}

// Catches: `refusal_record` treating every error as a state refusal (e.g. its catch-all arm
// `_ => (0, 0)` instead of `_ => return None`), which would pin a transient failure on the
// request id for the replay TTL. (Verified red.)
#[test]
fn an_error_that_is_not_a_state_refusal_is_not_recorded_and_a_retry_runs_again() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    let applied = Cell::new(0);
    for transient in [
        Error::Unavailable("store reopening".into()),
        Error::Internal("bug".into()),
        Error::InvalidArgument("bad".into()),
    ] {
        let reason = transient.reason();
        let err = execute(&meta, &k, || Err(transient), 1, &applied).unwrap_err();
        assert_eq!(err.reason(), reason, "{err:?}");
        let rec = meta.read(|r| r.replay("ws", "r1")).unwrap();
        assert!(rec.is_none(), "{rec:?}");
    }
    let ok = execute(&meta, &k, || Ok(()), 4, &applied).unwrap().unwrap();
    assert_eq!(ok.generation, 4);
    assert_eq!(applied.get(), 1);
}

// Catches: `refusal_from_record` mapping an unknown reason to some known refusal (e.g.
// `other => Error::NotFound(msg)`), which would answer a client with a refusal nobody gave.
// (Verified red.)
#[test]
fn an_unknown_recorded_refusal_is_an_internal_error_not_a_guessed_answer() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    meta.write(|w| {
        w.put_replay(
            "ws",
            "r1",
            &ReplayRecord {
                fingerprint: k.fingerprint.clone(),
                refusal: "FromTheFuture".into(),
                refusal_message: "what a newer version recorded".into(),
                ..Default::default()
            },
        )
    })
    .unwrap();
    let applied = Cell::new(0);
    let again = execute(&meta, &k, || Ok(()), 1, &applied).unwrap();
    match again {
        Err(Error::Internal(msg)) => assert!(msg.contains("FromTheFuture"), "{msg}"),
        other => panic!("expected Internal, got {other:?}"),
    }
    assert_eq!(applied.get(), 0);
}

// Catches: `refusal_record` returning `None` for `MatchCount` (the refusal not recorded, so a
// retried Edit could apply after the file changed), or `refusal_from_record` losing the count
// or the file. (Verified red.)
#[test]
fn a_recorded_match_count_replays_the_count_and_the_file_it_was_refused_with() {
    let (_d, meta) = store();
    let k = key("r1", "a");
    let applied = Cell::new(0);
    let refusal = || {
        Err(Error::MatchCount {
            count: 2,
            what: "ws:a".into(),
        })
    };
    execute(&meta, &k, refusal, 1, &applied)
        .unwrap()
        .unwrap_err();
    let again = execute(&meta, &k, || Ok(()), 1, &applied).unwrap();
    match again {
        Err(Error::MatchCount { count, what }) => {
            assert_eq!((count, what.as_str()), (2, "ws:a"));
        }
        other => panic!("expected the recorded MatchCount, got {other:?}"),
    }
    assert_eq!(applied.get(), 0);
}

#[test]
fn a_fingerprint_is_the_same_from_a_reused_buffer_and_a_large_request_leaves_no_large_buffer_behind()
 {
    let write = |data: Vec<u8>| pb::WriteRequest {
        workspace: "ws".into(),
        path: "p".into(),
        data: data.into(),
        ..Default::default()
    };
    let small = RequestKey::new("ws", "id", "Write", &write(vec![1; 4096]));
    let large = RequestKey::new("ws", "id", "Write", &write(vec![2; 1 << 20]));
    assert_ne!(small.fingerprint, large.fingerprint);
    let kept = super::ENCODED.with_borrow(|b| b.capacity());
    assert!(
        kept <= super::ENCODED_KEPT,
        "the thread keeps {kept} bytes after a 1 MiB request"
    );
    // The buffer held the large request a moment ago: the small one hashes the same as before.
    let again = RequestKey::new("ws", "id", "Write", &write(vec![1; 4096]));
    assert_eq!(again.fingerprint, small.fingerprint);
}
