//! Searching a workspace on the server: Find (paths matching a glob, paged) and Grep (lines
//! of small files matching a regex).
//!
//! Both scan entries in key order from the glob's literal prefix (see [`crate::glob`]), so a
//! glob like `src/**/*.rs` only visits `src/...` keys. Every call does bounded work, whatever
//! the workspace holds:
//! * a Find page visits at most [`SearchLimits::find_scan`] entries and then answers with a
//!   cursor, even with fewer matches than asked for (possibly none);
//! * a Grep stops at `max_matches`, at a budget of body bytes read, of time, and of reply
//!   text (whichever comes first) and says which in its summary. Regexes are the `regex`
//!   crate's (finite automata, linear in the text: no pattern can backtrack
//!   catastrophically); a pattern source past [`MAX_REGEX_BYTES`] or one compiling past
//!   [`REGEX_SIZE_LIMIT`] is refused.
//!
//! A Grep reads every file from ONE snapshot (one MVCC read transaction), so it never sees a
//! half-old, half-new workspace, and runs on a blocking thread because the scan is CPU work
//! that must not hold up the async workers. Artifacts are skipped unless the request asks for
//! them; then they are searched after the small files, from the revisions that same snapshot
//! names, block by block from the provider ([`artifacts`]) — a revision's blocks never change,
//! and a replaced one stays readable for the retired grace, so the view is still that one
//! snapshot's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nokv_proto::v1 as pb;
use regex::{Regex, RegexBuilder};

use super::files::{page_after, page_cursor, page_limit, verify_body};
use super::{Shard, to_entry};
use crate::error::{Error, Result};
use crate::glob::Glob;
use crate::memory::BlockMemory;
use crate::meta::{EntryRecord, KIND_ARTIFACT, KIND_FILE, ReadView};

mod artifacts;
use artifacts::Artifact;

pub use nokv_proto::MAX_REGEX_BYTES;
/// Compiled-program size limit handed to the regex builder: a short source can still expand
/// hugely (`a{1000}{1000}`); past this it is refused instead of built.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
pub const GREP_DEFAULT_MATCHES: u32 = 100;
pub const GREP_MAX_MATCHES: u32 = 10_000;
pub const GREP_MAX_CONTEXT: u32 = 10;
/// Lines longer than this (match and context alike) are cut at a character boundary at or
/// before it: a minified file's one line must not fill a reply.
pub const MAX_LINE_BYTES: usize = 1024;

/// Why a Grep stopped early (`GrepSummary.truncated_by`).
pub const BY_MAX_MATCHES: &str = "max_matches";
pub const BY_BYTE_BUDGET: &str = "byte_budget";
pub const BY_TIME_BUDGET: &str = "time_budget";
pub const BY_REPLY_BUDGET: &str = "reply_budget";

/// The work bounds of one Find page and one Grep.
#[derive(Debug, Clone)]
pub struct SearchLimits {
    /// Entries one Find page visits at most.
    pub find_scan: usize,
    /// Body bytes one Grep reads at most: it stops before a file that would pass it.
    pub grep_bytes: u64,
    /// Time one Grep runs at most, checked before each entry it visits (a file is at most
    /// the inline limit, so one file's scan is short).
    pub grep_time: Duration,
    /// Bytes of lines (matches and context) one Grep returns at most.
    pub grep_reply_bytes: usize,
}

impl Default for SearchLimits {
    fn default() -> Self {
        SearchLimits {
            find_scan: 10_000,
            grep_bytes: 64 * 1024 * 1024,
            grep_time: Duration::from_secs(2),
            grep_reply_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Entries read from the store per step of a scan (all within the caller's one snapshot).
const SCAN_STEP: usize = 256;

impl Shard {
    /// One page of the entries of `ws` whose path matches `glob`.
    pub async fn find(
        &self,
        ws: &str,
        glob: &str,
        limit: u32,
        cursor: &str,
    ) -> Result<pb::FindResponse> {
        let limit = page_limit(limit)?;
        let after = page_after(cursor)?;
        let glob = Glob::new(glob)?;
        let budget = self.cfg.search.find_scan.max(1);
        self.gate
            .read_fenced(|r| {
                let mut entries = Vec::new();
                let mut scan = Scan::new(r, ws, glob.literal_prefix(), after);
                let mut visited = 0;
                while entries.len() < limit && visited < budget {
                    let Some((path, e)) = scan.next(budget - visited)? else {
                        return Ok(pb::FindResponse {
                            entries,
                            next_cursor: String::new(),
                        });
                    };
                    visited += 1;
                    if glob.matches(&path) {
                        entries.push(to_entry(ws, &path, &e));
                    }
                }
                // Stopped by the page size or the scan budget: a cursor only if more remain.
                let next_cursor = match scan.last() {
                    Some(last) if scan.more()? => page_cursor(last),
                    _ => String::new(),
                };
                Ok(pb::FindResponse {
                    entries,
                    next_cursor,
                })
            })
            .await
    }

    /// Runs one Grep to completion (or to its first bound) and answers every match and the
    /// summary; the service streams them. Artifact blocks, when asked for, are read like a
    /// restore's: bulk work that yields to interactive requests, within `memory`.
    pub async fn grep(
        self: &Arc<Self>,
        req: pb::GrepRequest,
        memory: &BlockMemory,
    ) -> Result<(Vec<pb::GrepMatch>, pb::GrepSummary)> {
        let search = Arc::new(GrepSearch::new(&req, self.cfg.search.clone())?);
        let started = Instant::now();
        let (shard, small) = (self.clone(), search.clone());
        let (mut found, artifacts) = tokio::task::spawn_blocking(move || {
            shard
                .gate
                .read_fenced_now(|r| small.run(r, shard.id, &req.workspace, started))
        })
        .await
        .map_err(|e| Error::Internal(format!("grep task failed: {e}")))??;
        if found.summary.truncated_by.is_empty() {
            let stop =
                artifacts::scan(self, &search, started, artifacts, &mut found, memory).await?;
            found.summary.truncated_by = stop.to_string();
        }
        found.summary.matches = found.matches.len() as u64;
        Ok((found.matches, found.summary))
    }
}

/// The matches of one Grep so far, with what they cost, and the bounds they must keep.
struct Found {
    matches: Vec<pb::GrepMatch>,
    summary: pb::GrepSummary,
    /// Bytes of lines (matches and context) in `matches`.
    reply_bytes: usize,
    max_matches: usize,
    reply_budget: usize,
}

impl Found {
    fn new(search: &GrepSearch) -> Found {
        Found {
            matches: Vec::new(),
            summary: pb::GrepSummary::default(),
            reply_bytes: 0,
            max_matches: search.max_matches,
            reply_budget: search.limits.grep_reply_bytes,
        }
    }

    /// Adds `m` unless its lines would pass the reply budget; returns why the search must stop
    /// now, if it must.
    fn push(&mut self, m: pb::GrepMatch) -> Option<&'static str> {
        let size = m.line.len()
            + m.before.iter().map(String::len).sum::<usize>()
            + m.after.iter().map(String::len).sum::<usize>();
        if self.reply_bytes + size > self.reply_budget {
            return Some(BY_REPLY_BUDGET);
        }
        self.reply_bytes += size;
        self.matches.push(m);
        (self.matches.len() == self.max_matches).then_some(BY_MAX_MATCHES)
    }
}

/// A validated Grep request, ready to run against a snapshot.
struct GrepSearch {
    regex: Regex,
    glob: Option<Glob>,
    max_matches: usize,
    context: usize,
    include_artifacts: bool,
    limits: SearchLimits,
}

impl GrepSearch {
    fn new(req: &pb::GrepRequest, limits: SearchLimits) -> Result<GrepSearch> {
        if req.regex.len() > MAX_REGEX_BYTES {
            return Err(Error::InvalidArgument(format!(
                "regex is {} bytes; the limit is {MAX_REGEX_BYTES}",
                req.regex.len()
            )));
        }
        let max_matches = match req.max_matches {
            0 => GREP_DEFAULT_MATCHES,
            1..=GREP_MAX_MATCHES => req.max_matches,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "max_matches must be 1..={GREP_MAX_MATCHES}"
                )));
            }
        } as usize;
        if req.context_lines > GREP_MAX_CONTEXT {
            return Err(Error::InvalidArgument(format!(
                "context_lines must be at most {GREP_MAX_CONTEXT}"
            )));
        }
        let regex = RegexBuilder::new(&req.regex)
            .case_insensitive(req.ignore_case)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(regex_refusal)?;
        let glob = match req.path_glob.as_str() {
            "" => None,
            g => Some(Glob::new(g)?),
        };
        Ok(GrepSearch {
            regex,
            glob,
            max_matches,
            context: req.context_lines as usize,
            include_artifacts: req.include_artifacts,
            limits,
        })
    }

    /// Scans the small files of `ws` in `r` (one snapshot), and names the artifacts to search
    /// after them (when asked for) as that snapshot has them. A stored body that fails its
    /// digest fails the whole search (`DataCorrupted`), as Read does: damaged bytes are never
    /// returned.
    fn run(
        &self,
        r: &ReadView,
        shard: u32,
        ws: &str,
        started: Instant,
    ) -> Result<(Found, Vec<Artifact>)> {
        let mut found = Found::new(self);
        let mut artifacts = Vec::new();
        let prefix = self.glob.as_ref().map_or("", |g| g.literal_prefix());
        let mut scan = Scan::new(r, ws, prefix, None);
        let stop = 'files: loop {
            let Some((path, e)) = scan.next(SCAN_STEP)? else {
                break "";
            };
            // Checked per entry visited, not per file searched: a scan over many entries the
            // glob rejects costs time too.
            if started.elapsed() >= self.limits.grep_time {
                break BY_TIME_BUDGET;
            }
            if self.glob.as_ref().is_some_and(|g| !g.matches(&path)) {
                continue;
            }
            if e.kind == KIND_ARTIFACT && self.include_artifacts {
                let rev = r.revision(e.revision)?.ok_or_else(|| {
                    Error::Internal(format!("{ws}:{path}: revision {} is missing", e.revision))
                })?;
                artifacts.push(Artifact {
                    path,
                    generation: e.generation,
                    revision: e.revision,
                    blocks: rev.blocks,
                });
                continue;
            }
            if e.kind != KIND_FILE {
                continue;
            }
            if found.summary.bytes_scanned + e.size > self.limits.grep_bytes {
                break BY_BYTE_BUDGET;
            }
            let body = r.inline(ws, &path)?.unwrap_or_default();
            verify_body(shard, ws, &path, &e, &body)?;
            found.summary.files_scanned += 1;
            found.summary.bytes_scanned += body.len() as u64;
            let Ok(text) = std::str::from_utf8(&body) else {
                found.summary.files_skipped += 1;
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if !self.regex.is_match(line) {
                    continue;
                }
                if let Some(stop) = found.push(self.matched(&path, &e, &lines, i)) {
                    break 'files stop;
                }
            }
        };
        found.summary.truncated_by = stop.to_string();
        Ok((found, artifacts))
    }

    fn matched(&self, path: &str, e: &EntryRecord, lines: &[&str], i: usize) -> pb::GrepMatch {
        let after_end = (i + 1 + self.context).min(lines.len());
        pb::GrepMatch {
            path: path.to_string(),
            line_number: i as u64 + 1,
            line: clip(lines[i]),
            before: lines[i.saturating_sub(self.context)..i]
                .iter()
                .map(|l| clip(l))
                .collect(),
            after: lines[i + 1..after_end].iter().map(|l| clip(l)).collect(),
            generation: e.generation,
        }
    }
}

/// A regex the builder refused, in one line (the crate's syntax errors span several lines,
/// drawing a caret under the pattern; the last line names the problem).
fn regex_refusal(e: regex::Error) -> Error {
    let msg = match e {
        regex::Error::CompiledTooBig(limit) => format!(
            "regex compiles to more than {limit} bytes of program; simplify it (e.g. smaller \
             repetition counts)"
        ),
        e => {
            let text = e.to_string();
            let problem = text
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .trim_start_matches("error: ")
                .to_string();
            format!("regex is not valid: {problem}")
        }
    };
    Error::InvalidArgument(msg)
}

/// `line` cut to at most [`MAX_LINE_BYTES`], at a character boundary.
fn clip(line: &str) -> String {
    if line.len() <= MAX_LINE_BYTES {
        return line.to_string();
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

/// Entries of one workspace under a prefix, in key order, read in steps from one snapshot.
struct Scan<'r> {
    r: &'r ReadView,
    ws: &'r str,
    prefix: &'r str,
    after: Option<String>,
    step: std::vec::IntoIter<(String, EntryRecord)>,
    done: bool,
}

impl<'r> Scan<'r> {
    fn new(r: &'r ReadView, ws: &'r str, prefix: &'r str, after: Option<String>) -> Self {
        Scan {
            r,
            ws,
            prefix,
            after,
            step: Vec::new().into_iter(),
            done: false,
        }
    }

    /// The next entry; reads at most `want` (and at most [`SCAN_STEP`]) entries ahead.
    fn next(&mut self, want: usize) -> Result<Option<(String, EntryRecord)>> {
        if let Some((path, e)) = self.step.next() {
            self.after = Some(path.clone());
            return Ok(Some((path, e)));
        }
        if self.done {
            return Ok(None);
        }
        let n = want.clamp(1, SCAN_STEP);
        let page = self
            .r
            .list(self.ws, self.prefix, self.after.as_deref(), n)?;
        self.done = page.len() < n;
        self.step = page.into_iter();
        match self.step.next() {
            Some((path, e)) => {
                self.after = Some(path.clone());
                Ok(Some((path, e)))
            }
            None => Ok(None),
        }
    }

    /// The path of the last entry returned (or the starting cursor).
    fn last(&self) -> Option<&str> {
        self.after.as_deref()
    }

    /// Whether any entry follows the last one returned.
    fn more(&self) -> Result<bool> {
        if self.step.len() > 0 {
            return Ok(true);
        }
        Ok(!self.done
            && !self
                .r
                .list(self.ws, self.prefix, self.last(), 1)?
                .is_empty())
    }
}

#[cfg(test)]
mod tests;
