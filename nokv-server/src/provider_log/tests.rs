//! The stream's rules against the local provider, whose create-if-absent is atomic (a staged
//! file hard-linked into place). Races are written as ordered interleavings: who creates a key
//! first is decided by the order of the calls, as on any provider that honours the condition.

use super::*;
use crate::object::{ObjectProvider, ProviderConfig};

fn provider(dir: &tempfile::TempDir) -> ObjectProvider {
    ObjectProvider::open(
        &ProviderConfig::Local {
            root: dir.path().to_path_buf(),
        },
        "pfx",
    )
    .unwrap()
}

fn stream() -> StreamId {
    StreamId {
        node: "n1".into(),
        incarnation: 42,
    }
}

fn records(first: u64, last: u64) -> Segment {
    Segment {
        kind: Kind::Records,
        node: "n1".into(),
        incarnation: 42,
        first,
        last,
        shards: vec![(3, 5)],
        body: format!("records {first}..={last}").into_bytes(),
    }
}

fn ranges(tail: &Tail) -> Vec<(u64, u64)> {
    tail.segments.iter().map(|s| (s.first, s.last)).collect()
}

#[tokio::test]
async fn appended_segments_read_back_contiguous_from_any_sequence_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    for (a, b) in [(1, 3), (4, 4), (5, 9)] {
        stream::append(&p, &stream(), &records(a, b)).await.unwrap();
    }
    let all = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!(ranges(&all), vec![(1, 3), (4, 4), (5, 9)]);
    assert_eq!((all.next, all.fenced), (10, None));
    let mid = stream::read(&p, &stream(), 6).await.unwrap();
    assert_eq!(ranges(&mid), vec![(5, 9)]);
    let past = stream::read(&p, &stream(), 10).await.unwrap();
    assert_eq!((ranges(&past), past.next), (vec![], 10));
}

#[tokio::test]
async fn after_a_fence_the_writers_next_segment_is_refused_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 3)).await.unwrap();
    let at = stream::fence(&p, &stream(), 1, "n2", 3, 6).await.unwrap();
    assert_eq!(at, 4);
    match stream::append(&p, &stream(), &records(4, 6)).await {
        Err(LogError::Fenced { at, by, .. }) => assert_eq!((at, by.as_str()), (4, "n2")),
        other => panic!("the deposed writer's segment was not refused: {other:?}"),
    }
    // A segment the writer had in flight past the fence lands anyway: it is never replayed.
    stream::append(&p, &stream(), &records(7, 8)).await.unwrap();
    let tail = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!(ranges(&tail), vec![(1, 3)]);
    assert_eq!(tail.fenced, Some((4, "n2".to_string())));
}

#[tokio::test]
async fn a_writers_segment_that_wins_the_key_first_moves_the_fence_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 3)).await.unwrap();
    // The fencer read the stream (next = 4) ...
    let seen = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!(seen.next, 4);
    // ... then the writer's segment 4..=6 landed (it may have been acknowledged) ...
    stream::append(&p, &stream(), &records(4, 6)).await.unwrap();
    // ... so the fence goes after it, and the reader returns it.
    let at = stream::fence(&p, &stream(), 1, "n2", 3, 6).await.unwrap();
    assert_eq!(at, 7);
    let tail = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!(ranges(&tail), vec![(1, 3), (4, 6)]);
    assert_eq!(tail.fenced, Some((7, "n2".to_string())));
}

#[tokio::test]
async fn a_second_taker_finds_the_first_fence_and_the_stream_ends_there() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 2)).await.unwrap();
    assert_eq!(
        stream::fence(&p, &stream(), 1, "n2", 3, 6).await.unwrap(),
        3
    );
    assert_eq!(
        stream::fence(&p, &stream(), 1, "n3", 9, 2).await.unwrap(),
        3
    );
    let tail = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!(tail.fenced, Some((3, "n2".to_string())));
}

#[tokio::test]
async fn a_retried_append_whose_first_answer_was_lost_counts_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 2)).await.unwrap();
    // Same bytes again: the earlier attempt landed.
    stream::append(&p, &stream(), &records(1, 2)).await.unwrap();
    // Other bytes under the same key: two writers on one stream id, refused.
    let mut other = records(1, 2);
    other.body = b"someone else".to_vec();
    assert!(matches!(
        stream::append(&p, &stream(), &other).await,
        Err(LogError::Conflict { .. })
    ));
}

#[tokio::test]
async fn a_gap_ends_the_stream_and_the_fence_fills_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 2)).await.unwrap();
    // 3..=4 was in flight and never landed; 5..=6 did. Nothing after the gap was acknowledged.
    stream::append(&p, &stream(), &records(5, 6)).await.unwrap();
    let tail = stream::read(&p, &stream(), 1).await.unwrap();
    assert_eq!((ranges(&tail), tail.next), (vec![(1, 2)], 3));
    assert_eq!(
        stream::fence(&p, &stream(), 1, "n2", 3, 6).await.unwrap(),
        3
    );
    assert!(matches!(
        stream::append(&p, &stream(), &records(3, 4)).await,
        Err(LogError::Fenced { at: 3, .. })
    ));
}

#[tokio::test]
async fn a_damaged_segment_is_refused_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    stream::append(&p, &stream(), &records(1, 2)).await.unwrap();
    let key = stream().key(&p, 1);
    let file = dir.path().join(&key);
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 40;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    match stream::read(&p, &stream(), 1).await {
        Err(LogError::Damaged { key: k, error }) => {
            assert_eq!((k, error), (key, SegmentError::Checksum))
        }
        other => panic!("a damaged segment was read: {other:?}"),
    }
}

/// Segments are fetched several at a time, but the chain is what counts: past a gap nothing
/// was acknowledged, so a damaged segment there is not an error, and a long chain reads back
/// whole and in order.
#[tokio::test]
async fn a_read_follows_the_chain_and_never_looks_past_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    for n in 0..20 {
        stream::append(&p, &stream(), &records(2 * n + 1, 2 * n + 2))
            .await
            .unwrap();
    }
    // 41..=42 never landed; 43..=44 did, and is damaged.
    stream::append(&p, &stream(), &records(43, 44))
        .await
        .unwrap();
    let file = dir.path().join(stream().key(&p, 43));
    std::fs::write(&file, b"not a segment").unwrap();
    let tail = stream::read(&p, &stream(), 5).await.unwrap();
    let want: Vec<(u64, u64)> = (2..20).map(|n| (2 * n + 1, 2 * n + 2)).collect();
    assert_eq!((ranges(&tail), tail.next), (want, 41));
}

#[tokio::test]
async fn compaction_keeps_the_last_segment_and_reading_below_it_names_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    for (a, b) in [(1, 3), (4, 6), (7, 9)] {
        stream::append(&p, &stream(), &records(a, b)).await.unwrap();
    }
    assert_eq!(stream::delete_below(&p, &stream(), 100).await.unwrap(), 2);
    let tail = stream::read(&p, &stream(), 7).await.unwrap();
    assert_eq!((ranges(&tail), tail.next), (vec![(7, 9)], 10));
    assert!(matches!(
        stream::read(&p, &stream(), 2).await,
        Err(LogError::Missing {
            from: 2,
            first: 7,
            ..
        })
    ));
    // The fence still lands at the stream's end.
    assert_eq!(
        stream::fence(&p, &stream(), 2, "n2", 3, 6).await.unwrap(),
        10
    );
}

#[tokio::test]
async fn a_record_sent_after_its_shard_was_released_still_names_the_epoch_it_was_held_at() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir);
    let writer = LogWriter::new(
        p.clone(),
        tokio::runtime::Handle::current(),
        std::time::Duration::ZERO,
    );
    writer.begin(stream());
    writer.hold(3, 5);
    // Committed while held, handed to the writer after the release (a handoff whose
    // checkpoint failed leaves the record naming this log at epoch 5).
    writer.release(3);
    let late = Outgoing {
        seq: 0,
        payload: b"late",
        shards: vec![3],
    };
    let prepared = writer.prepare(&[late]).unwrap().expect("a segment");
    writer.send(prepared).await.unwrap();
    let tail = stream::read(&p, &stream(), 0).await.unwrap();
    assert_eq!(tail.segments[0].shards, vec![(3, 5)]);
}
