use super::*;

fn store() -> (tempfile::TempDir, MetaStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = MetaStore::create(&dir.path().join("m.redb")).unwrap();
    (dir, s)
}

#[test]
fn a_failed_session_changes_nothing() {
    let (_d, s) = store();
    let r: Result<(), crate::error::Error> = s.write(|w| {
        w.put_inline("ws", "a", b"x")?;
        Err(crate::error::Error::Internal("the session fails".into()))
    });
    assert!(r.is_err());
    assert_eq!(s.read(|r| r.inline("ws", "a")).unwrap(), None);
}

#[test]
fn generations_survive_removal_and_never_repeat() {
    let (_d, s) = store();
    let g: Vec<u64> = s
        .write(|w| {
            let mut gens = Vec::new();
            for _ in 0..2 {
                let generation = w.next_generation("ws", "p")?;
                w.put_entry(
                    "ws",
                    "p",
                    &EntryRecord {
                        generation,
                        ..Default::default()
                    },
                )?;
                gens.push(generation);
            }
            w.remove_entry("ws", "p")?;
            gens.push(w.next_generation("ws", "p")?);
            Ok::<_, MetaError>(gens)
        })
        .unwrap();
    assert_eq!(g, vec![1, 2, 3]);
}

#[test]
fn list_stays_inside_workspace_and_prefix_and_pages_after_cursor() {
    let (_d, s) = store();
    s.write(|w| {
        for (ws, p) in [
            ("a", "x/1"),
            ("a", "x/2"),
            ("a", "x/3"),
            ("a", "y"),
            ("b", "x/0"),
        ] {
            w.put_entry(ws, p, &EntryRecord::default())?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    let names = |v: Vec<(String, EntryRecord)>| v.into_iter().map(|x| x.0).collect::<Vec<_>>();
    let page = s.read(|r| r.list("a", "x/", None, 2)).unwrap();
    assert_eq!(names(page), ["x/1", "x/2"]);
    let page = s.read(|r| r.list("a", "x/", Some("x/2"), 2)).unwrap();
    assert_eq!(names(page), ["x/3"]);
}

#[test]
fn pruning_removes_only_old_replays_in_bounded_pages() {
    let (_d, s) = store();
    s.write(|w| {
        for (i, ms) in [10i64, 20, 30, 40].iter().enumerate() {
            let rec = ReplayRecord {
                created_ms: *ms,
                ..Default::default()
            };
            w.put_replay("ws", &format!("r{i}"), &rec)?;
        }
        Ok::<_, MetaError>(())
    })
    .unwrap();
    assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 2);
    assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 1);
    assert_eq!(s.write(|w| w.prune_replays(35, 2)).unwrap(), 0);
    assert!(s.read(|r| r.replay("ws", "r3")).unwrap().is_some());
    assert!(s.read(|r| r.replay("ws", "r0")).unwrap().is_none());
}

/// An SDK-style request id: `ms` as 12 hex digits, then 20 more.
fn sdk_id(ms: i64, tail: u8) -> String {
    format!("{ms:012x}{}", format!("{tail:02x}").repeat(10))
}

fn age_rows(s: &MetaStore) -> usize {
    s.read(|r| Ok::<_, MetaError>(r.txn.open_table(r.t.request_age)?.len()? as usize))
        .unwrap()
}

#[test]
fn self_dated_request_ids_skip_the_age_row_and_are_pruned_by_their_recorded_time() {
    let (_d, s) = store();
    let t = 1_700_000_000_000i64;
    let min = 60 * 1000;
    let (on_time, claims_later, claims_earlier, custom, far_off) = (
        sdk_id(t, 1),
        sdk_id(t + 9 * min, 2),
        sdk_id(t + 5 * min, 3),
        "my-retry-1".to_string(),
        sdk_id(t - 60 * min, 4),
    );
    s.write(|w| {
        let at = |created_ms| ReplayRecord {
            created_ms,
            ..Default::default()
        };
        w.put_replay("ws", &on_time, &at(t))?;
        w.put_replay("ws", &claims_later, &at(t))?;
        // Recorded 12 minutes after the others, its id 7 minutes earlier than that.
        w.put_replay("ws", &claims_earlier, &at(t + 12 * min))?;
        w.put_replay("other", &custom, &at(t))?;
        // Not self-dated (its id's time is an hour from the record's), and it sorts
        // below every bound used here: the scans meet it.
        w.put_replay("ws", &far_off, &at(t))?;
        Ok::<_, MetaError>(())
    })
    .unwrap();
    assert_eq!(
        age_rows(&s),
        2,
        "only the custom id and the far-off one get an age row"
    );
    let kept = |ws: &str, id: &str| s.read(|r| r.replay(ws, id)).unwrap().is_some();

    // Nothing was recorded before t: nothing goes, although the scan meets the far-off id.
    assert!(!s.read(|r| r.has_replays_before(t)).unwrap());
    assert_eq!(s.write(|w| w.prune_replays(t, 10)).unwrap(), 0);

    // Past t: the two with age rows go at once; the self-dated ones wait for their ids to
    // be a skew (10 min) behind the cutoff.
    assert!(s.read(|r| r.has_replays_before(t + 1)).unwrap());
    assert_eq!(s.write(|w| w.prune_replays(t + 1, 10)).unwrap(), 2);
    assert!(!kept("other", &custom) && !kept("ws", &far_off));
    assert_eq!(age_rows(&s), 0);
    assert!(kept("ws", &on_time));
    assert_eq!(
        s.write(|w| w.prune_replays(t + 10 * min + 1, 10)).unwrap(),
        1
    );
    assert!(!kept("ws", &on_time));

    // Past t + 19 min: both remaining ids are a skew behind, and both were recorded
    // before the cutoff.
    assert!(kept("ws", &claims_later) && kept("ws", &claims_earlier));
    assert_eq!(
        s.write(|w| w.prune_replays(t + 19 * min + 1, 10)).unwrap(),
        2
    );
    assert!(!s.read(|r| r.has_replays_before(i64::MAX / 2)).unwrap());
}

#[test]
fn uploads_recorded_before_the_upload_indexes_existed_are_indexed_once() {
    let (_d, s) = store();
    let rec = |state: UploadState, lease| UploadRecord {
        state: state as i32,
        lease_expires_ms: lease,
        created_ms: 5,
        ..Default::default()
    };
    // Written the way a data dir from before the indexes holds them: records only.
    s.write(|w| {
        let mut t = w.table(w.t.uploads)?;
        t.insert(
            "open",
            rec(UploadState::Open, 10).encode_to_vec().as_slice(),
        )?;
        t.insert(
            "done",
            rec(UploadState::Aborted, 10).encode_to_vec().as_slice(),
        )?;
        Ok::<_, MetaError>(())
    })
    .unwrap();
    assert_eq!(s.read(|r| r.counts()).unwrap().uploads, 0);
    assert_eq!(s.write(|w| w.index_uploads()).unwrap(), 2);
    assert_eq!(s.write(|w| w.index_uploads()).unwrap(), 0, "only once");
    assert_eq!(s.read(|r| r.counts()).unwrap().uploads, 1);
    assert_eq!(s.read(|r| r.expired_uploads(10, 10)).unwrap(), ["open"]);
    assert_eq!(s.read(|r| r.ended_uploads(5, 10)).unwrap(), ["done"]);
}

/// Existing data dirs open: upload records and collectable keys written before the
/// ledger existed get their ledger rows once, with per-state counters to match.
/// Mutation: skip the COLLECTABLE loop of `backfill_operations` (the old key would have
/// no operation and the reconciler would read its revision number as an operation id).
#[test]
fn uploads_and_collectable_keys_from_before_the_ledger_are_backfilled_once() {
    let (_d, s) = store();
    s.write(|w| {
        // The layout of a data dir from before the ledger: no marker, raw rows.
        w.table(w.t.sequences)?.remove(OPERATIONS_MARKER)?;
        let u = UploadRecord::open("ws", "p", 4, 1, 5, 10, "");
        w.table(w.t.uploads)?
            .insert("u1", u.encode_to_vec().as_slice())?;
        w.table(w.t.collectable)?.insert("old-key", 7u64)?;
        Ok::<_, MetaError>(())
    })
    .unwrap();
    assert_eq!(s.write(|w| w.backfill_operations(100)).unwrap(), 2);
    assert_eq!(s.write(|w| w.backfill_operations(100)).unwrap(), 0, "once");
    let c = s.read(|r| r.counts()).unwrap();
    assert_eq!(
        (c.operations[0], c.operations[4]),
        (1, 1),
        "open and deleting"
    );
    let queued = s.read(|r| r.collectable_ops(10)).unwrap();
    assert_eq!(queued.len(), 1);
    let op = s.read(|r| r.operation(queued[0].1)).unwrap().unwrap();
    assert_eq!(
        (op.key.as_str(), op.op_state()),
        ("old-key", OpState::Deleting)
    );
    assert_ne!(s.read(|r| r.upload("u1")).unwrap().unwrap().operation, 0);
}
