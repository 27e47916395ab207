//! Grep over artifacts: their revision's blocks, read from the provider in order and matched
//! line by line as they arrive, so a line (or its context) may span a block boundary.
//!
//! The same bounds hold as for small files: the byte budget is checked before each block is
//! fetched, the time budget before each block, `max_matches` and the reply budget per match.
//! Each block is checked against its recorded checksums before a byte of it is matched: damaged
//! bytes answer `DataCorrupted`, never lines. An artifact is text only while every line is
//! UTF-8 and shorter than [`MAX_ARTIFACT_LINE`]; at the first line that is not, it is counted
//! in `files_skipped` and the matches it gave are withdrawn (as a small file that is not UTF-8
//! gives none) — unless a bound stopped the search before that line was reached.

use std::collections::VecDeque;
use std::time::Instant;

use nokv_proto::v1 as pb;

use super::{BY_BYTE_BUDGET, BY_TIME_BUDGET, Found, GrepSearch, clip};
use crate::error::{Error, Result};
use crate::memory::BlockMemory;
use crate::meta::RevisionBlock;
use crate::shard::Shard;

/// Longest artifact line searched: an artifact with a longer one is treated as binary.
pub const MAX_ARTIFACT_LINE: usize = 1024 * 1024;

/// An artifact to search, as the Grep's snapshot names it.
pub(super) struct Artifact {
    pub path: String,
    pub generation: u64,
    pub revision: u64,
    pub blocks: Vec<RevisionBlock>,
}

/// Searches `artifacts` in order, adding to `found`; returns why the search stopped early
/// (`""`: it did not).
pub(super) async fn scan(
    shard: &Shard,
    search: &GrepSearch,
    started: Instant,
    artifacts: Vec<Artifact>,
    found: &mut Found,
    memory: &BlockMemory,
) -> Result<&'static str> {
    for artifact in artifacts {
        let mark = (found.matches.len(), found.reply_bytes);
        let mut lines = Lines::new(search, &artifact);
        let mut fed = Fed::More;
        for (i, block) in artifact.blocks.iter().enumerate() {
            if started.elapsed() >= search.limits.grep_time {
                return Ok(BY_TIME_BUDGET);
            }
            if found.summary.bytes_scanned + block.length > search.limits.grep_bytes {
                return Ok(BY_BYTE_BUDGET);
            }
            let data = fetch(shard, &artifact, block, memory).await?;
            // A file counts as read once its first bytes are.
            found.summary.files_scanned += u64::from(i == 0);
            found.summary.bytes_scanned += data.len() as u64;
            fed = lines.feed(&data, found);
            if !matches!(fed, Fed::More) {
                break;
            }
        }
        if artifact.blocks.is_empty() {
            found.summary.files_scanned += 1;
        }
        if matches!(fed, Fed::More) {
            fed = lines.finish(found);
        }
        match fed {
            Fed::More => {}
            Fed::Stop(why) => return Ok(why),
            Fed::Binary => {
                found.matches.truncate(mark.0);
                found.reply_bytes = mark.1;
                found.summary.files_skipped += 1;
            }
        }
    }
    Ok("")
}

/// One block's bytes (read like a restore's, see [`Shard::fetch_block`]), verified against the
/// checksums its revision recorded.
async fn fetch(
    shard: &Shard,
    artifact: &Artifact,
    block: &RevisionBlock,
    memory: &BlockMemory,
) -> Result<bytes::Bytes> {
    let data = shard
        .fetch_block(artifact.revision, &block.key, block.length, memory)
        .await?;
    if data.len() as u64 != block.length || !block.checksums().matches(&data) {
        tracing::error!(
            shard = shard.id,
            path = artifact.path,
            key = block.key,
            "an artifact block does not match its recorded checksum"
        );
        return Err(Error::DataCorrupted(format!(
            "{}: a block of the artifact does not match its recorded checksum; publish it again \
             from a good copy",
            artifact.path
        )));
    }
    Ok(data)
}

/// What feeding an artifact's bytes led to.
enum Fed {
    /// Go on with the next bytes.
    More,
    /// The search is over, for this reason.
    Stop(&'static str),
    /// The artifact is not text: skip it.
    Binary,
}

/// The lines of one artifact, assembled from its blocks, with the context lines a match
/// needs: the `context` lines before it are kept as they pass, the ones after it are added
/// to the match (already in `found`) as they arrive.
struct Lines<'a> {
    search: &'a GrepSearch,
    artifact: &'a Artifact,
    /// The bytes of the line not yet ended by `\n`.
    carry: Vec<u8>,
    /// Lines ended so far.
    line_number: u64,
    before: VecDeque<String>,
    /// Indexes in `found.matches` of matches still owed `after` lines.
    open: Vec<usize>,
    /// Set once a match reached `max_matches`: no more matches, only the open ones' context.
    stopping: Option<&'static str>,
}

impl<'a> Lines<'a> {
    fn new(search: &'a GrepSearch, artifact: &'a Artifact) -> Self {
        Lines {
            search,
            artifact,
            carry: Vec::new(),
            line_number: 0,
            before: VecDeque::new(),
            open: Vec::new(),
            stopping: None,
        }
    }

    fn feed(&mut self, data: &[u8], found: &mut Found) -> Fed {
        let mut rest = data;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            let fed = if self.carry.is_empty() {
                self.line(&rest[..end], found)
            } else {
                let mut line = std::mem::take(&mut self.carry);
                line.extend_from_slice(&rest[..end]);
                self.line(&line, found)
            };
            if !matches!(fed, Fed::More) {
                return fed;
            }
            rest = &rest[end + 1..];
        }
        self.carry.extend_from_slice(rest);
        if self.carry.len() > MAX_ARTIFACT_LINE {
            return Fed::Binary;
        }
        Fed::More
    }

    /// The end of the artifact: its last line, if it has no `\n`, then whatever a match at
    /// `max_matches` was waiting for.
    fn finish(&mut self, found: &mut Found) -> Fed {
        if !self.carry.is_empty() {
            let line = std::mem::take(&mut self.carry);
            let fed = self.line(&line, found);
            if !matches!(fed, Fed::More) {
                return fed;
            }
        }
        match self.stopping {
            Some(why) => Fed::Stop(why),
            None => Fed::More,
        }
    }

    fn line(&mut self, bytes: &[u8], found: &mut Found) -> Fed {
        let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Fed::Binary;
        };
        self.line_number += 1;
        let context = self.search.context;
        let clipped = clip(text);
        for &i in &self.open {
            let m = &mut found.matches[i];
            found.reply_bytes += clipped.len();
            m.after.push(clipped.clone());
        }
        self.open
            .retain(|&i| found.matches[i].after.len() < context);
        if let Some(why) = self.stopping
            && self.open.is_empty()
        {
            return Fed::Stop(why);
        }
        if self.stopping.is_none() && self.search.regex.is_match(text) {
            let m = pb::GrepMatch {
                path: self.artifact.path.clone(),
                line_number: self.line_number,
                line: clipped.clone(),
                before: self.before.iter().cloned().collect(),
                after: Vec::new(),
                generation: self.artifact.generation,
            };
            match found.push(m) {
                None if context > 0 => self.open.push(found.matches.len() - 1),
                None => {}
                Some(why) if context > 0 && why == super::BY_MAX_MATCHES => {
                    self.open.push(found.matches.len() - 1);
                    self.stopping = Some(why);
                }
                Some(why) => return Fed::Stop(why),
            }
        }
        if context > 0 {
            if self.before.len() == context {
                self.before.pop_front();
            }
            self.before.push_back(clipped);
        }
        Fed::More
    }
}
