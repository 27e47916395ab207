//! Edit and Append on a real shard (redb store, in-memory provider): what they change, what
//! they refuse without changing anything, and what a retry answers.

use nokv_proto::v1 as pb;

use crate::error::Error;
use crate::meta::{EntryRecord, KIND_ARTIFACT};
use crate::shard::ShardConfig;
use crate::shard::clock::Clock;
use crate::shard::fixture::{Fixture, shard_on};

fn fixture() -> Fixture {
    fixture_with(ShardConfig::default())
}

fn fixture_with(cfg: ShardConfig) -> Fixture {
    shard_on(0, cfg, Clock::wall())
}

async fn put(f: &Fixture, path: &str, body: &[u8]) -> pb::Entry {
    f.shard
        .write(pb::WriteRequest {
            workspace: "ws".into(),
            path: path.into(),
            data: body.to_vec().into(),
            mode: pb::WriteMode::Upsert as i32,
            request_id: crate::ids::random_hex(8),
            ..Default::default()
        })
        .await
        .unwrap()
        .entry
        .unwrap()
}

fn edit(path: &str, old: &str, new: &str, expected: u64, id: &str) -> pb::EditRequest {
    pb::EditRequest {
        workspace: "ws".into(),
        path: path.into(),
        old: old.into(),
        new: new.into(),
        expected_generation: expected,
        request_id: id.into(),
    }
}

fn append(path: &str, data: &[u8], id: &str) -> pb::AppendRequest {
    pb::AppendRequest {
        workspace: "ws".into(),
        path: path.into(),
        data: data.to_vec(),
        request_id: id.into(),
    }
}

async fn body(f: &Fixture, path: &str) -> Vec<u8> {
    f.shard.read("ws", path).await.unwrap().data.to_vec()
}

async fn entry(f: &Fixture, path: &str) -> pb::Entry {
    f.shard.stat("ws", path).await.unwrap()
}

// Catches: the edited body not stored (`w.put_inline` dropped from `put_file`), or an answer
// whose entry is not the stored one. (Verified red.)
#[tokio::test]
async fn an_edit_with_exactly_one_match_replaces_it_and_answers_the_new_entry() {
    let f = fixture();
    let before = put(&f, "a.txt", b"one two three\nfour\n").await;
    let e = f
        .shard
        .edit(edit("a.txt", "two", "2", 0, "e1"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(body(&f, "a.txt").await, b"one 2 three\nfour\n");
    assert!(e.generation > before.generation);
    assert_eq!(e, entry(&f, "a.txt").await);
}

// Catches: a count that allows 0 or >1 matches through (e.g. `count == 0` as the only
// refusal), a count of overlapping occurrences (`aaa` holds `aa` once when counted without
// overlap, as the replacement sees it), or a refusal that still writes. (Verified red.)
#[tokio::test]
async fn an_edit_whose_text_occurs_zero_or_two_times_is_refused_with_the_count_and_changes_nothing()
{
    let f = fixture();
    let before = put(&f, "a.txt", b"x = 1; x = 1;").await;
    for (old, want) in [("y", 0), ("x = 1", 2)] {
        let err = f
            .shard
            .edit(edit("a.txt", old, "z", 0, &format!("e-{old}")))
            .await
            .unwrap_err();
        match err {
            Error::MatchCount { count, what } => {
                assert_eq!(count, want, "{old:?}");
                assert_eq!(what, "ws:a.txt");
            }
            other => panic!("{old:?}: expected MatchCount, got {other:?}"),
        }
    }
    assert_eq!(entry(&f, "a.txt").await, before);
    assert_eq!(body(&f, "a.txt").await, b"x = 1; x = 1;");

    put(&f, "b.txt", b"aaa").await;
    f.shard
        .edit(edit("b.txt", "aa", "X", 0, "e-overlap"))
        .await
        .unwrap();
    assert_eq!(body(&f, "b.txt").await, b"Xa");
}

// Catches: ignoring `expected_generation` (the check dropped or compared with `==`).
// (Verified red.)
#[tokio::test]
async fn an_edit_with_a_stale_expected_generation_is_refused_and_changes_nothing() {
    let f = fixture();
    let first = put(&f, "a.txt", b"v1").await;
    let second = put(&f, "a.txt", b"v2").await;
    let err = f
        .shard
        .edit(edit("a.txt", "v", "w", first.generation, "e1"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::GenerationMismatch { expected, current }
            if expected == first.generation && current == second.generation),
        "{err:?}"
    );
    assert_eq!(body(&f, "a.txt").await, b"v2");
    let ok = f
        .shard
        .edit(edit("a.txt", "v", "w", second.generation, "e2"))
        .await
        .unwrap();
    assert!(ok.entry.unwrap().generation > second.generation);
}

// Catches: a MatchCount refusal not recorded for replay (`refusal_record` without its
// MatchCount arm): the retry would apply to the file that now holds the text once.
// (Verified red.)
#[tokio::test]
async fn a_retried_edit_refused_for_its_match_count_answers_the_refusal_after_the_file_changed() {
    let f = fixture();
    put(&f, "a.txt", b"no match here").await;
    let err = f
        .shard
        .edit(edit("a.txt", "needle", "pin", 0, "e1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MatchCount { count: 0, .. }), "{err:?}");
    let now = put(&f, "a.txt", b"a needle").await;
    let again = f
        .shard
        .edit(edit("a.txt", "needle", "pin", 0, "e1"))
        .await
        .unwrap_err();
    assert!(
        matches!(again, Error::MatchCount { count: 0, .. }),
        "{again:?}"
    );
    assert_eq!(entry(&f, "a.txt").await, now);
    assert_eq!(body(&f, "a.txt").await, b"a needle");
}

// Catches: a retried successful edit applied again (it would answer a newer generation and
// replace the `1` of `11`).
#[tokio::test]
async fn a_retried_edit_answers_its_recorded_entry_without_editing_again() {
    let f = fixture();
    put(&f, "a.txt", b"count: 1").await;
    let first = f
        .shard
        .edit(edit("a.txt", "1", "11", 0, "e1"))
        .await
        .unwrap();
    let again = f
        .shard
        .edit(edit("a.txt", "1", "11", 0, "e1"))
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(body(&f, "a.txt").await, b"count: 11");
}

// Catches: any of the four refusals missing (an artifact entry edited as text, a lossy
// decode of a non-UTF-8 body, an empty `old` replacing at offset 0, a result past the inline
// limit stored). (Verified red for the artifact, UTF-8 and limit checks.)
#[tokio::test]
async fn edits_of_artifacts_binary_bodies_with_an_empty_old_or_past_the_limit_are_invalid() {
    let f = fixture_with(ShardConfig {
        inline_max: 16,
        ..ShardConfig::default()
    });
    put(&f, "bin", &[0xff, 0xfe, b'a']).await;
    put(&f, "t.txt", b"abc").await;
    f.shard
        .gate
        .write(|w| {
            let rec = EntryRecord {
                kind: KIND_ARTIFACT,
                generation: 1,
                ..Default::default()
            };
            Ok(w.put_entry("ws", "art", &rec)?)
        })
        .await
        .unwrap();
    for (req, what) in [
        (edit("art", "a", "b", 0, "e1"), "artifact"),
        (edit("bin", "a", "b", 0, "e2"), "not UTF-8"),
        (edit("t.txt", "", "b", 0, "e3"), "empty old"),
        (
            edit("t.txt", "b", &"x".repeat(20), 0, "e4"),
            "past the limit",
        ),
    ] {
        let err = f.shard.edit(req).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{what}: {err:?}");
    }
    assert_eq!(body(&f, "t.txt").await, b"abc");
    assert_eq!(body(&f, "bin").await, [0xff, 0xfe, b'a']);
}

#[tokio::test]
async fn an_edit_of_a_missing_file_is_not_found() {
    let f = fixture();
    let err = f
        .shard
        .edit(edit("nope", "a", "b", 0, "e1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

// Catches: an edit that skips `charge_write` (usage would not follow the body's size) or
// ignores a quota it passes. (Verified red.)
#[tokio::test]
async fn edits_and_appends_are_charged_against_the_quota_like_writes() {
    let f = fixture();
    put(&f, "a.txt", b"0123456789").await;
    assert_eq!(f.shard.usage("ws").await.unwrap().used_bytes, 10);
    f.shard
        .edit(edit("a.txt", "0123", "", 0, "e1"))
        .await
        .unwrap();
    f.shard.append(append("a.txt", b"ab", "a1")).await.unwrap();
    assert_eq!(f.shard.usage("ws").await.unwrap().used_bytes, 8);

    f.shard.set_quota("ws", Some(12)).await.unwrap();
    let err = f
        .shard
        .edit(edit("a.txt", "ab", "abcdefg", 0, "e2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    let err = f
        .shard
        .append(append("a.txt", b"12345", "a2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    assert_eq!(body(&f, "a.txt").await, b"456789ab");
}

// Catches: an append that replaces instead of extending, or one that does not create.
#[tokio::test]
async fn appends_create_the_file_then_extend_it_in_order() {
    let f = fixture();
    let e1 = f
        .shard
        .append(append("log", b"one\n", "a1"))
        .await
        .unwrap()
        .entry
        .unwrap();
    let e2 = f
        .shard
        .append(append("log", b"two\n", "a2"))
        .await
        .unwrap()
        .entry
        .unwrap();
    assert_eq!(body(&f, "log").await, b"one\ntwo\n");
    assert!(e2.generation > e1.generation);
    assert_eq!(e2, entry(&f, "log").await);
}

// Catches: the limit checked against the appended data alone (not the resulting file), or an
// append refused after it wrote. (Verified red.)
#[tokio::test]
async fn an_append_past_the_inline_limit_is_refused_naming_the_limit_and_changes_nothing() {
    let f = fixture_with(ShardConfig {
        inline_max: 10,
        ..ShardConfig::default()
    });
    let before = put(&f, "log", b"12345678").await;
    let err = f
        .shard
        .append(append("log", b"abc", "a1"))
        .await
        .unwrap_err();
    match err {
        Error::InvalidArgument(msg) => assert!(msg.contains("10 bytes"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(entry(&f, "log").await, before);
    assert_eq!(body(&f, "log").await, b"12345678");
}

// Catches: a retried append that appends again (replay not consulted).
#[tokio::test]
async fn a_retried_append_answers_its_recorded_entry_and_appends_once() {
    let f = fixture();
    let first = f.shard.append(append("log", b"x\n", "a1")).await.unwrap();
    let again = f.shard.append(append("log", b"x\n", "a1")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(body(&f, "log").await, b"x\n");
}

// Catches: an append to an artifact path that turns it into a small file.
#[tokio::test]
async fn an_append_to_an_artifact_is_invalid_and_changes_nothing() {
    let f = fixture();
    f.shard
        .gate
        .write(|w| {
            let rec = EntryRecord {
                kind: KIND_ARTIFACT,
                generation: 1,
                ..Default::default()
            };
            Ok(w.put_entry("ws", "art", &rec)?)
        })
        .await
        .unwrap();
    let err = f.shard.append(append("art", b"x", "a1")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(entry(&f, "art").await.kind, KIND_ARTIFACT);
}
