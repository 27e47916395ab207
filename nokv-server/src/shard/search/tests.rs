//! Find and Grep on a real shard: paging, glob narrowing, every bound a Grep has, and the
//! refusals that protect the server.

use std::time::Duration;

use nokv_proto::v1 as pb;

use super::SearchLimits;
use crate::error::Error;
use crate::meta::{EntryRecord, KIND_ARTIFACT};
use crate::shard::ShardConfig;
use crate::shard::clock::Clock;
use crate::shard::fixture::{Fixture, shard_on};

fn fixture_with(search: SearchLimits) -> Fixture {
    shard_on(
        0,
        ShardConfig {
            search,
            ..ShardConfig::default()
        },
        Clock::wall(),
    )
}

fn fixture() -> Fixture {
    fixture_with(SearchLimits::default())
}

/// Writes every `(path, body)`, one Write each.
async fn files(f: &Fixture, files: Vec<(String, Vec<u8>)>) {
    for (path, body) in files {
        f.shard
            .write(pb::WriteRequest {
                workspace: "ws".into(),
                path,
                data: body.into(),
                mode: pb::WriteMode::Upsert as i32,
                request_id: crate::ids::random_hex(8),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

fn named(paths: &[&str]) -> Vec<(String, Vec<u8>)> {
    paths
        .iter()
        .map(|p| (p.to_string(), format!("body of {p}\n").into_bytes()))
        .collect()
}

/// Every path `glob` finds, walking all pages of `limit`; also the number of pages.
async fn find_all(f: &Fixture, glob: &str, limit: u32) -> (Vec<String>, usize) {
    let (mut paths, mut pages, mut cursor) = (Vec::new(), 0, String::new());
    loop {
        let page = f.shard.find("ws", glob, limit, &cursor).await.unwrap();
        pages += 1;
        assert!(page.entries.len() <= limit as usize);
        paths.extend(page.entries.into_iter().map(|e| e.path));
        cursor = page.next_cursor;
        if cursor.is_empty() {
            return (paths, pages);
        }
        assert!(pages < 1000, "find never ends");
    }
}

fn grep(regex: &str) -> pb::GrepRequest {
    pb::GrepRequest {
        workspace: "ws".into(),
        regex: regex.into(),
        ..Default::default()
    }
}

// Catches: `**` not spanning segments, the glob not applied (every path under the prefix
// returned), or a cursor that skips or repeats entries across pages. (Verified red.)
#[tokio::test]
async fn find_walks_every_page_and_returns_exactly_the_matching_paths_in_order() {
    let f = fixture();
    files(
        &f,
        named(&[
            "README.md",
            "src/a.rs",
            "src/b.txt",
            "src/x/c.rs",
            "src/x/y/d.rs",
            "srcs/e.rs",
            "tests/f.rs",
        ]),
    )
    .await;
    let (paths, pages) = find_all(&f, "src/**/*.rs", 1).await;
    assert_eq!(paths, ["src/a.rs", "src/x/c.rs", "src/x/y/d.rs"]);
    assert!(pages >= 3);
    let (paths, _) = find_all(&f, "**/*.rs", 2).await;
    assert_eq!(
        paths,
        [
            "src/a.rs",
            "src/x/c.rs",
            "src/x/y/d.rs",
            "srcs/e.rs",
            "tests/f.rs"
        ]
    );
    let (paths, _) = find_all(&f, "*.md", 100).await;
    assert_eq!(paths, ["README.md"]);
}

// Catches: a page that keeps scanning past `find_scan` entries looking for matches (the
// bound removed), or one that stops at the bound without a cursor (matches after it lost).
// (Verified red.)
#[tokio::test]
async fn a_find_page_visits_at_most_its_scan_budget_and_answers_a_cursor_to_continue() {
    let f = fixture_with(SearchLimits {
        find_scan: 10,
        ..SearchLimits::default()
    });
    let mut all: Vec<String> = (0..25).map(|i| format!("d/n{i:02}.txt")).collect();
    all.push("d/z.rs".into());
    files(&f, all.iter().map(|p| (p.clone(), b"x".to_vec())).collect()).await;

    let first = f.shard.find("ws", "d/*.rs", 100, "").await.unwrap();
    assert!(first.entries.is_empty(), "only 10 of 26 entries visited");
    assert!(!first.next_cursor.is_empty());
    let (paths, pages) = find_all(&f, "d/*.rs", 100).await;
    assert_eq!(paths, ["d/z.rs"]);
    assert_eq!(pages, 3, "26 entries at 10 per page");
}

#[tokio::test]
async fn find_refuses_bad_limits_cursors_and_globs() {
    let f = fixture();
    for (glob, limit, cursor) in [("**", 1001, ""), ("**", 10, "zz"), ("[a", 10, "")] {
        let err = f.shard.find("ws", glob, limit, cursor).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument(_)),
            "{glob} {limit} {cursor}: {err:?}"
        );
    }
}

// Catches: grep reporting the wrong line number, context off by one, or ignoring
// `ignore_case`. (Verified red for context and case.)
#[tokio::test]
async fn grep_answers_path_line_number_line_context_and_generation() {
    let f = fixture();
    files(
        &f,
        vec![
            ("a.txt".into(), b"zero\none\nTWO\nthree\r\nfour\n".to_vec()),
            ("b.txt".into(), b"nothing\n".to_vec()),
        ],
    )
    .await;
    let gen_a = f.shard.stat("ws", "a.txt").await.unwrap().generation;
    let (matches, summary) = f
        .shard
        .grep(
            pb::GrepRequest {
                context_lines: 1,
                ignore_case: true,
                ..grep("^two$")
            },
            &f.memory,
        )
        .await
        .unwrap();
    assert_eq!(matches.len(), 1);
    let m = &matches[0];
    assert_eq!(
        (m.path.as_str(), m.line_number, m.line.as_str()),
        ("a.txt", 3, "TWO")
    );
    assert_eq!(m.before, ["one"]);
    assert_eq!(
        m.after,
        ["three"],
        "the \\r of a CRLF line ending is not part of the line"
    );
    assert_eq!(m.generation, gen_a);
    assert_eq!(summary.files_scanned, 2);
    assert_eq!(summary.matches, 1);
    assert_eq!(summary.truncated_by, "");
}

// Catches: `max_matches` not enforced, or enforced without saying so. (Verified red.)
#[tokio::test]
async fn grep_stops_at_max_matches_and_says_so() {
    let f = fixture();
    let body = "hit\n".repeat(50).into_bytes();
    files(&f, vec![("a".into(), body.clone()), ("b".into(), body)]).await;
    let (matches, summary) = f
        .shard
        .grep(
            pb::GrepRequest {
                max_matches: 70,
                ..grep("hit")
            },
            &f.memory,
        )
        .await
        .unwrap();
    assert_eq!(matches.len(), 70);
    assert_eq!(summary.matches, 70);
    assert_eq!(summary.truncated_by, "max_matches");
    let (all, summary) = f.shard.grep(grep("hit"), &f.memory).await.unwrap();
    assert_eq!(all.len(), 100, "the default is 100");
    assert_eq!(summary.truncated_by, "max_matches");
}

// Catches: the byte budget not checked (every file read), or checked after reading the file
// that passes it. (Verified red.)
#[tokio::test]
async fn grep_stops_before_the_file_that_would_pass_the_byte_budget() {
    let f = fixture_with(SearchLimits {
        grep_bytes: 25,
        ..SearchLimits::default()
    });
    files(
        &f,
        (0..5)
            .map(|i| (format!("f{i}"), b"match me\n".to_vec()))
            .collect(),
    )
    .await;
    let (matches, summary) = f.shard.grep(grep("match"), &f.memory).await.unwrap();
    assert_eq!(summary.files_scanned, 2, "9 + 9 <= 25 < 9 + 9 + 9");
    assert_eq!(summary.bytes_scanned, 18);
    assert_eq!(matches.len(), 2);
    assert_eq!(summary.truncated_by, "byte_budget");
}

// Catches: the time budget never checked. A zero budget is spent before the first entry, so
// this needs no clock control and no timing threshold. (Verified red.)
#[tokio::test]
async fn grep_with_its_time_budget_spent_stops_and_says_so() {
    let f = fixture_with(SearchLimits {
        grep_time: Duration::ZERO,
        ..SearchLimits::default()
    });
    files(&f, named(&["a", "b"])).await;
    let (matches, summary) = f.shard.grep(grep("body"), &f.memory).await.unwrap();
    assert!(matches.is_empty());
    assert_eq!(summary.files_scanned, 0);
    assert_eq!(summary.truncated_by, "time_budget");
}

// Catches: the reply budget not checked (the lines gathered unbounded), or long lines not
// cut. (Verified red.)
#[tokio::test]
async fn grep_cuts_long_lines_and_stops_at_its_reply_budget() {
    let f = fixture_with(SearchLimits {
        grep_reply_bytes: 3 * super::MAX_LINE_BYTES,
        ..SearchLimits::default()
    });
    let long = format!(
        "{}é{}\n",
        "x".repeat(super::MAX_LINE_BYTES - 1),
        "y".repeat(5000)
    );
    files(&f, vec![("a".into(), long.repeat(10).into_bytes())]).await;
    let (matches, summary) = f.shard.grep(grep("x"), &f.memory).await.unwrap();
    assert_eq!(matches.len(), 3);
    assert!(
        matches
            .iter()
            .all(|m| m.line.len() == super::MAX_LINE_BYTES - 1)
    );
    assert_eq!(summary.truncated_by, "reply_budget");
}

// Catches: artifacts searched, binary bodies decoded lossily, or the glob not narrowing.
#[tokio::test]
async fn grep_skips_artifacts_and_non_utf8_files_and_searches_only_paths_the_glob_matches() {
    let f = fixture();
    files(
        &f,
        vec![
            ("src/a.rs".into(), b"needle\n".to_vec()),
            ("src/b.txt".into(), b"needle\n".to_vec()),
            ("src/bin.rs".into(), b"needle\xff\n".to_vec()),
            ("docs/c.rs".into(), b"needle\n".to_vec()),
        ],
    )
    .await;
    f.shard
        .gate
        .write(|w| {
            let rec = EntryRecord {
                kind: KIND_ARTIFACT,
                generation: 1,
                ..Default::default()
            };
            Ok(w.put_entry("ws", "src/art.rs", &rec)?)
        })
        .await
        .unwrap();
    let (matches, summary) = f
        .shard
        .grep(
            pb::GrepRequest {
                path_glob: "src/**/*.rs".into(),
                ..grep("needle")
            },
            &f.memory,
        )
        .await
        .unwrap();
    let paths: Vec<_> = matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["src/a.rs"]);
    assert_eq!(summary.files_scanned, 2);
    assert_eq!(summary.files_skipped, 1);
}

// Catches: a regex engine that backtracks (`(a*)*b` would not finish: no timing, it answers
// or hangs), or the size limit not set (`a{50000}` builds within the regex crate's default
// 10 MiB limit but not within our 1 MiB). (Verified red for the size limit.)
#[tokio::test]
async fn pathological_and_huge_regexes_are_answered_or_refused() {
    let f = fixture();
    let line = "a".repeat(100_000);
    files(&f, vec![("a".into(), line.into_bytes())]).await;
    let (matches, summary) = f.shard.grep(grep("(a*)*b"), &f.memory).await.unwrap();
    assert!(matches.is_empty());
    assert_eq!(summary.files_scanned, 1);

    for bad in [
        "a{1000}{1000}".to_string(),
        // Within the regex crate's default limit (10 MiB), past ours (1 MiB).
        "a{50000}".to_string(),
        "x".repeat(super::MAX_REGEX_BYTES + 1),
        "(unclosed".to_string(),
    ] {
        let err = f.shard.grep(grep(&bad), &f.memory).await.unwrap_err();
        match err {
            // One line: the CLI prints a reason and its message on one stderr line.
            Error::InvalidArgument(msg) => assert!(!msg.contains('\n'), "{msg}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn grep_refuses_out_of_range_limits_and_a_bad_glob() {
    let f = fixture();
    for req in [
        pb::GrepRequest {
            max_matches: 10_001,
            ..grep("x")
        },
        pb::GrepRequest {
            context_lines: 11,
            ..grep("x")
        },
        pb::GrepRequest {
            path_glob: "[".into(),
            ..grep("x")
        },
    ] {
        let err = f.shard.grep(req.clone(), &f.memory).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{req:?}: {err:?}");
    }
}

// Catches: grep returning bytes that fail their recorded digest.
#[tokio::test]
async fn grep_refuses_a_body_that_fails_its_recorded_digest() {
    let f = fixture();
    files(&f, named(&["a"])).await;
    f.shard
        .gate
        .write(|w| Ok(w.put_inline("ws", "a", b"tampered body\n")?))
        .await
        .unwrap();
    let err = f.shard.grep(grep("body"), &f.memory).await.unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
}

/// Publishes an artifact at `ws:path` straight into the store and the provider, one object
/// per block (the upload protocol is the sequencer's tests' business). `bad_digest` records
/// a wrong checksum (CRC-32C) for block 0.
async fn artifact(f: &Fixture, path: &str, blocks: &[&[u8]], bad_digest: bool) {
    use nokv_proto::block_checksum::crc32c;
    let mut recorded = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let key = format!("t/art/{path}/{i}");
        f.provider
            .create(&key, bytes::Bytes::copy_from_slice(block))
            .await;
        let crc = if bad_digest && i == 0 {
            crc32c(b"other bytes")
        } else {
            crc32c(block)
        };
        recorded.push(crate::meta::RevisionBlock {
            length: block.len() as u64,
            sha256: Vec::new(),
            crc32c: Some(crc),
            key,
        });
    }
    let path = path.to_string();
    f.shard
        .gate
        .write(move |w| {
            let rev = w.next_sequence("revision")?;
            let size = recorded.iter().map(|b| b.length).sum();
            w.put_revision(
                rev,
                &crate::meta::RevisionRecord {
                    workspace: "ws".into(),
                    path: path.clone(),
                    size,
                    blocks: recorded,
                    ..Default::default()
                },
            )?;
            let rec = EntryRecord {
                kind: KIND_ARTIFACT,
                size,
                revision: rev,
                generation: 7,
                ..Default::default()
            };
            Ok(w.put_entry("ws", &path, &rec)?)
        })
        .await
        .unwrap();
}

/// `(path, line number, line, before, after)` of each match.
type Seen = Vec<(String, u64, String, Vec<String>, Vec<String>)>;

fn seen(matches: &[pb::GrepMatch]) -> Seen {
    matches
        .iter()
        .map(|m| {
            (
                m.path.clone(),
                m.line_number,
                m.line.clone(),
                m.before.clone(),
                m.after.clone(),
            )
        })
        .collect()
}

fn strings(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| l.to_string()).collect()
}

// Catches: artifacts searched without being asked, or not at all when asked; lines or
// context cut at a block boundary; a last line without `\n` dropped; `\r\n` kept in a line.
#[tokio::test]
async fn grep_searches_artifacts_only_when_asked_with_lines_and_context_across_blocks() {
    let f = fixture();
    files(&f, vec![("notes.txt".into(), b"a needle here\n".to_vec())]).await;
    let blocks: [&[u8]; 3] = [b"alpha\r\nbe", b"ta needle\ngam", b"ma\ndelta needle"];
    artifact(&f, "big.log", &blocks, false).await;

    let (matches, summary) = f.shard.grep(grep("needle"), &f.memory).await.unwrap();
    assert_eq!(
        matches.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(),
        ["notes.txt"],
        "artifacts are skipped unless asked"
    );
    assert_eq!(summary.files_scanned, 1);

    let asked = pb::GrepRequest {
        include_artifacts: true,
        context_lines: 1,
        ..grep("needle")
    };
    let (matches, summary) = f.shard.grep(asked, &f.memory).await.unwrap();
    let art = |n, line: &str, before: &[&str], after: &[&str]| {
        (
            "big.log".to_string(),
            n,
            line.to_string(),
            strings(before),
            strings(after),
        )
    };
    assert_eq!(
        seen(&matches),
        vec![
            (
                "notes.txt".to_string(),
                1,
                "a needle here".to_string(),
                vec![],
                vec![]
            ),
            art(2, "beta needle", &["alpha"], &["gamma"]),
            art(4, "delta needle", &["gamma"], &[]),
        ]
    );
    assert_eq!(matches[1].generation, 7);
    assert_eq!(
        (
            summary.files_scanned,
            summary.matches,
            summary.truncated_by.as_str()
        ),
        (2, 3, "")
    );
    let artifact_bytes: usize = blocks.iter().map(|b| b.len()).sum();
    assert_eq!(summary.bytes_scanned, (14 + artifact_bytes) as u64);
}

// Catches: matches kept from an artifact that turns out not to be text, or the search
// stopped by it.
#[tokio::test]
async fn grep_skips_an_artifact_that_is_not_text_and_withdraws_its_matches() {
    let f = fixture();
    artifact(&f, "a.bin", &[b"needle\n", b"\xff\xfe needle\n"], false).await;
    artifact(&f, "b.txt", &[b"needle\n"], false).await;
    let asked = pb::GrepRequest {
        include_artifacts: true,
        ..grep("needle")
    };
    let (matches, summary) = f.shard.grep(asked, &f.memory).await.unwrap();
    assert_eq!(
        matches.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(),
        ["b.txt"]
    );
    assert_eq!((summary.files_scanned, summary.files_skipped), (2, 1));
}

// Catches: artifact bytes matched before (or without) checking their recorded digest.
#[tokio::test]
async fn grep_refuses_an_artifact_block_that_fails_its_recorded_digest() {
    let f = fixture();
    artifact(&f, "a.log", &[b"needle\n"], true).await;
    let asked = pb::GrepRequest {
        include_artifacts: true,
        ..grep("needle")
    };
    let err = f.shard.grep(asked, &f.memory).await.unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
}

// Catches: the last match allowed answered without its context lines, or matches past
// `max_matches`; a byte budget that fetches the block that passes it.
#[tokio::test]
async fn grep_keeps_max_matches_and_the_byte_budget_in_artifacts() {
    let f = fixture();
    artifact(
        &f,
        "a.log",
        &[b"needle 1\nnext", b" line\nneedle 2\n"],
        false,
    )
    .await;
    let asked = pb::GrepRequest {
        include_artifacts: true,
        max_matches: 1,
        context_lines: 1,
        ..grep("needle")
    };
    let (matches, summary) = f.shard.grep(asked.clone(), &f.memory).await.unwrap();
    assert_eq!(
        seen(&matches),
        vec![(
            "a.log".to_string(),
            1,
            "needle 1".to_string(),
            vec![],
            strings(&["next line"])
        )]
    );
    assert_eq!(summary.truncated_by, super::BY_MAX_MATCHES);

    let small = fixture_with(SearchLimits {
        grep_bytes: 20,
        ..SearchLimits::default()
    });
    artifact(
        &small,
        "a.log",
        &[b"needle 1\nnext", b" line\nneedle 2\n"],
        false,
    )
    .await;
    let (matches, summary) = small
        .shard
        .grep(
            pb::GrepRequest {
                max_matches: 0,
                ..asked
            },
            &small.memory,
        )
        .await
        .unwrap();
    assert_eq!(matches.len(), 1, "only the first block was read");
    assert_eq!((summary.files_scanned, summary.bytes_scanned), (1, 13));
    artifact(&small, "b.log", &[&[b'x'; 30]], false).await;
    let (_, summary) = small
        .shard
        .grep(
            pb::GrepRequest {
                path_glob: "b.log".into(),
                include_artifacts: true,
                ..grep("needle")
            },
            &small.memory,
        )
        .await
        .unwrap();
    assert_eq!(
        (summary.files_scanned, summary.truncated_by.as_str()),
        (0, super::BY_BYTE_BUDGET),
        "an artifact none of whose bytes were read is not counted"
    );
    assert_eq!(summary.truncated_by, super::BY_BYTE_BUDGET);
}
