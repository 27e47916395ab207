//! The glob matcher's rules, and the prefix invariant the scans rely on.

use super::Glob;
use crate::error::Error;

fn g(source: &str) -> Glob {
    Glob::new(source).unwrap_or_else(|e| panic!("{source:?}: {e}"))
}

#[track_caller]
fn check(source: &str, yes: &[&str], no: &[&str]) {
    let glob = g(source);
    for p in yes {
        assert!(glob.matches(p), "{source:?} should match {p:?}");
    }
    for p in no {
        assert!(!glob.matches(p), "{source:?} should not match {p:?}");
    }
}

// Catches: `*` or `?` crossing a `/` (e.g. matching `*` against the whole path instead of
// per segment). (Verified red.)
#[test]
fn star_and_question_mark_stay_inside_one_segment() {
    check("*.rs", &["main.rs", ".rs"], &["src/main.rs", "main.rsx"]);
    check(
        "src/?.rs",
        &["src/a.rs"],
        &["src/ab.rs", "src/.rs", "src/a/b.rs"],
    );
    check(
        "a*b*c",
        &["abc", "aXbYc", "abbc", "aXXbXXbXc"],
        &["ab", "acb", "a/b/c"],
    );
}

// Catches: a `**` segment matching only one segment, or a trailing `**` also matching the
// directory itself (`a/**` matching `a`). (Verified red.)
#[test]
fn double_star_spans_zero_or_more_segments_and_a_trailing_one_means_everything_inside() {
    check(
        "src/**/*.rs",
        &["src/a.rs", "src/x/a.rs", "src/x/y/z/a.rs"],
        &["a.rs", "src/x/a.txt", "lib/src/a.rs"],
    );
    check(
        "**/notes.md",
        &["notes.md", "a/notes.md", "a/b/notes.md"],
        &["a/notes.mdx"],
    );
    check("a/**", &["a/b", "a/b/c"], &["a", "ab/c", "b/a/c"]);
    check("**", &["a", "a/b/c"], &[]);
    check("a/**/**/b", &["a/b", "a/x/y/b"], &["a/x/y/c"]);
    // Inside a segment `**` is a plain star.
    check("a**b", &["ab", "axxb"], &["a/b"]);
}

// Catches: classes that ignore negation or ranges. (Verified red.)
#[test]
fn classes_match_members_ranges_and_negations() {
    check("f[0-9][0-9]", &["f00", "f49"], &["f0", "fa0", "f000"]);
    check("[abc].txt", &["a.txt", "c.txt"], &["d.txt", "ab.txt"]);
    check("[!abc].txt", &["d.txt"], &["a.txt"]);
    check("[^a-c]x", &["dx"], &["bx"]);
    check("[]]", &["]"], &["a"]);
    check("[a-]", &["a", "-"], &["b"]);
    check(r"lit\*\?", &["lit*?"], &["litXY", "lit"]);
    check("é*", &["été"], &["ete"]);
}

#[test]
fn malformed_globs_are_invalid_arguments() {
    for bad in ["[abc", "a/[", "x\\", "a//b", "/a", "a/", "[z-a]"] {
        match Glob::new(bad) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("{bad:?}: expected InvalidArgument, got {other:?}"),
        }
    }
}

// Catches: a literal prefix that runs past the first special character (e.g. ignoring
// `[`), or a trailing `**` that matches zero segments: either lets a matching path fall
// outside the prefix a scan starts from, so Find would miss it. (Verified red.)
#[test]
fn every_path_a_glob_matches_starts_with_its_literal_prefix() {
    let globs = [
        "a/**",
        "a/**/b",
        "a/b",
        "a/b*",
        "a/[bc]d",
        "a/?",
        "**",
        "a\\*b",
        "src/**/*.rs",
        "ab**",
        "a/b/**",
        "*",
    ];
    let paths = [
        "a",
        "a/b",
        "a/bd",
        "a/cd",
        "a/b/c",
        "a/x/b",
        "a*b",
        "ab",
        "abc",
        "src/m.rs",
        "src/x/m.rs",
        "a/b/b",
        "b",
    ];
    for source in globs {
        let glob = g(source);
        for p in paths {
            if glob.matches(p) {
                assert!(
                    p.starts_with(glob.literal_prefix()),
                    "{source:?} matches {p:?} outside its prefix {:?}",
                    glob.literal_prefix()
                );
            }
        }
    }
    assert_eq!(g("src/ma*.rs").literal_prefix(), "src/ma");
    assert_eq!(g("src/main.rs").literal_prefix(), "src/main.rs");
    assert_eq!(g("**/x").literal_prefix(), "");
}

// Catches: a matcher that backtracks over every star (exponential); this pattern against
// this path would not finish. No timing: it either completes or the test hangs.
#[test]
fn a_glob_with_many_stars_against_a_long_near_miss_still_answers() {
    let glob = g(&"*a".repeat(50));
    let path = "a".repeat(49) + &"b".repeat(200);
    assert!(!glob.matches(&path));
    let deep = g("**/a/".repeat(30).trim_end_matches('/'));
    let long: Vec<&str> = std::iter::repeat_n("a", 29)
        .chain(std::iter::repeat_n("b", 200))
        .collect();
    assert!(!deep.matches(&long.join("/")));
}
