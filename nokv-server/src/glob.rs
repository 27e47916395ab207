//! Path globs for Find and Grep: `*` and `?` stay inside one path segment, `**` as a whole
//! segment spans segments, `[abc]` / `[a-z]` / `[!abc]` are character classes, and `\x`
//! matches `x` literally.
//!
//! Matching is the two-pointer wildcard algorithm at two levels (segments of the path, then
//! characters of a segment), each with a single backtrack point, so a match costs at most
//! O(pattern × path) steps: no glob can make the server backtrack exponentially.
//!
//! Invariant: every path a glob matches starts with its [`Glob::literal_prefix`], so a scan
//! may start at the prefix and stop when keys leave it. That is why a trailing `**` matches
//! *one or more* segments (`a/**` is everything inside `a`, not `a` itself): with "zero or
//! more", `a` would match yet not start with the prefix `a/`. Elsewhere `**` matches zero or
//! more segments (`a/**/b` matches `a/b`). `**` inside a segment (`a**b`) acts as `*`.

use crate::error::{Error, Result};

pub use nokv_proto::MAX_GLOB_BYTES;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Literal(char),
    /// `?`: any one character.
    One,
    /// `*`: any run of characters (within the segment).
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    /// `**`: any run of whole segments.
    Any,
    /// One path segment.
    Pattern(Vec<Token>),
}

/// A compiled glob.
#[derive(Debug, Clone)]
pub struct Glob {
    segments: Vec<Segment>,
    prefix: String,
}

impl Glob {
    /// Compiles `source` (already normalised by [`crate::names::glob`]); malformed classes,
    /// a trailing `\` and empty segments are `InvalidArgument`.
    pub fn new(source: &str) -> Result<Glob> {
        if source.len() > MAX_GLOB_BYTES {
            return Err(invalid(format!(
                "glob is longer than {MAX_GLOB_BYTES} bytes"
            )));
        }
        let mut segments = Vec::new();
        for part in split_segments(source)? {
            if part == "**" {
                // `**/**` is the same as `**`; keeping one keeps the match linear.
                if segments.last() != Some(&Segment::Any) {
                    segments.push(Segment::Any);
                }
            } else if part.is_empty() {
                return Err(invalid(format!("glob {source:?} has an empty segment")));
            } else {
                segments.push(Segment::Pattern(tokens(&part, source)?));
            }
        }
        // A trailing `**` is "everything inside": one segment, then any more (see the module
        // doc for why the prefix invariant needs this).
        if segments.last() == Some(&Segment::Any) {
            let at = segments.len() - 1;
            segments.insert(at, Segment::Pattern(vec![Token::Star]));
        }
        Ok(Glob {
            segments,
            prefix: literal_prefix(source),
        })
    }

    /// The longest literal leading text of the glob: every matching path starts with it.
    pub fn literal_prefix(&self) -> &str {
        &self.prefix
    }

    pub fn matches(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        wildcard(
            &self.segments,
            &parts,
            |s| matches!(s, Segment::Any),
            |s, part| match s {
                Segment::Pattern(tokens) => segment_matches(tokens, part),
                Segment::Any => unreachable!("Any is the star"),
            },
        )
    }
}

/// The classic linear-time wildcard match over any items: `is_star` items match any run of
/// items, every other pattern item matches exactly one item when `one` says so. On a
/// mismatch only the most recent star is widened; earlier stars never need to be, because a
/// later star can absorb anything they could.
fn wildcard<P, T: Copy>(
    pattern: &[P],
    items: &[T],
    is_star: impl Fn(&P) -> bool,
    one: impl Fn(&P, T) -> bool,
) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < items.len() {
        if p < pattern.len() && is_star(&pattern[p]) {
            star = Some((p, i));
            p += 1;
        } else if p < pattern.len() && one(&pattern[p], items[i]) {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(is_star)
}

fn segment_matches(tokens: &[Token], part: &str) -> bool {
    let chars: Vec<char> = part.chars().collect();
    wildcard(
        tokens,
        &chars,
        |t| matches!(t, Token::Star),
        |t, c| match t {
            Token::Literal(l) => *l == c,
            Token::One => true,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
            }
            Token::Star => unreachable!("Star is the star"),
        },
    )
}

/// Splits on unescaped `/`, keeping escapes for [`tokens`].
fn split_segments(source: &str) -> Result<Vec<String>> {
    let mut parts = vec![String::new()];
    let mut chars = source.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let next = chars
                    .next()
                    .ok_or_else(|| invalid(format!("glob {source:?} ends with a lone '\\'")))?;
                let part = parts.last_mut().expect("never empty");
                part.push('\\');
                part.push(next);
            }
            '/' => parts.push(String::new()),
            c => parts.last_mut().expect("never empty").push(c),
        }
    }
    Ok(parts)
}

fn tokens(part: &str, source: &str) -> Result<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = part.chars().peekable();
    while let Some(c) = chars.next() {
        let token = match c {
            '\\' => Token::Literal(chars.next().expect("split_segments keeps pairs")),
            '?' => Token::One,
            '*' => {
                // Consecutive stars are one star (`a**b` acts as `a*b`).
                if out.last() == Some(&Token::Star) {
                    continue;
                }
                Token::Star
            }
            '[' => class(&mut chars, source)?,
            c => Token::Literal(c),
        };
        out.push(token);
    }
    Ok(out)
}

/// Parses a class after its `[`: an optional `!` or `^`, then characters and `a-z` ranges up
/// to the closing `]` (a `]` right after the opening is a member, as in shells).
fn class(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, source: &str) -> Result<Token> {
    let unclosed = || invalid(format!("glob {source:?} has an unclosed '['"));
    let negated = matches!(chars.peek(), Some('!' | '^'));
    if negated {
        chars.next();
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = chars.next().ok_or_else(unclosed)?;
        let lo = match c {
            ']' if !first => break,
            '\\' => chars.next().ok_or_else(unclosed)?,
            c => c,
        };
        first = false;
        let hi = if chars.peek() == Some(&'-') {
            chars.next();
            match chars.next().ok_or_else(unclosed)? {
                // `[a-]`: the dash is a member.
                ']' => {
                    ranges.push((lo, lo));
                    ranges.push(('-', '-'));
                    break;
                }
                '\\' => chars.next().ok_or_else(unclosed)?,
                hi => hi,
            }
        } else {
            lo
        };
        if hi < lo {
            return Err(invalid(format!(
                "glob {source:?} has a reversed range {lo}-{hi}"
            )));
        }
        ranges.push((lo, hi));
    }
    Ok(Token::Class { negated, ranges })
}

/// The source up to its first special character. Escapes end it too: keys are compared
/// byte-wise, so the prefix must be the source's own text, never a decoded form.
fn literal_prefix(source: &str) -> String {
    let end = source.find(['*', '?', '[', '\\']).unwrap_or(source.len());
    source[..end].to_string()
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

#[cfg(test)]
mod tests;
