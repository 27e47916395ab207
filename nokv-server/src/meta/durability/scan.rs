//! Reading the log at open: what it must hold, given what the node file says, and the
//! refusals when it does not.
//!
//! The node file records the log's round ([`Round`]: id, start, and the round before it). An
//! honest log — after any crash, kill -9 or power cut — then looks like this, and nothing else:
//! * it exists, is at least [`GROW`] long, a multiple of it, and at most [`LOG_MAX`];
//! * offset 0 holds the marker of the round (or, after a crash between the commit that began
//!   the round and the marker's fsync, the previous round's marker, and in that round's log
//!   its announcement of this round: then nothing of this round was written — its marker is
//!   written and fsynced on its own before any record). A 32-byte header lies within one disk
//!   sector, which is written whole or not at all;
//! * then records of the round with consecutive sequence numbers from the round's start, up to
//!   a tail: zeros, stale bytes of earlier rounds, or a torn last append — one whose fsync never
//!   returned, so none of its records was acknowledged.
//!
//! So the scan refuses (a [`Fault`], naming the offset and the sequence numbers) a missing,
//! emptied, truncated or oversized file, a first marker of another round or another moment,
//! and a bad record followed by a valid record of the round that was written by a *later*
//! append (each record carries the first sequence of its append: a later append began only
//! after the earlier one's fsync returned, so the bad record had been acknowledged) — unless
//! every record behind the damage is at or below the file's `applied` (the file holds them
//! all, e.g. after a clean stop): then nothing needed is lost.
//!
//! What cannot be told from an honest log, and is therefore not refused: damage confined to
//! the last append (it looks exactly like that append torn by a power cut: only that append is
//! lost), and a cut at a multiple of [`GROW`] bytes (it looks like the last append torn while it
//! grew the file: every append whose records lay past the cut is lost). A log of exactly the
//! round before the node file's — what a crash between a checkpoint's durable commit and the
//! new round's marker leaves — is accepted only if that round announced the node file's round
//! in its log before the commit (`ANNOUNCE`); a copy of it taken before then is refused.
//!
//! Memory stays bounded: records are read and applied one at a time, never the whole file.

use std::path::Path;

use super::super::disk::Disk;
use super::super::log_file::LogFile;
use super::super::{MetaError, MetaResult};
use super::format::{ANNOUNCE, GROW, HEADER, Header, LOG_MAX, MARKER, RECORD, legacy_checksum};
use super::round::Round;

/// What an honest log held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::meta) struct Found {
    /// The round whose marker is at offset 0: the file's round, or the one before it.
    pub(in crate::meta) at_zero: u64,
    /// The last sequence of the round in the log (the round's start if it holds none).
    pub(in crate::meta) last: u64,
    /// Records applied (those above the file's `applied`).
    pub(in crate::meta) replayed: u64,
    /// Where what the log holds of the round at offset 0 ends: the next round's announcement
    /// goes here (nothing after it is needed).
    pub(in crate::meta) end: u64,
}

/// Why a log is refused.
#[derive(Debug)]
pub(in crate::meta) enum Fault {
    Missing,
    /// Emptied, cut short, or larger than any log nokv writes.
    Size {
        len: u64,
    },
    /// Offset 0 holds no marker of the file's round or the one before.
    Foreign {
        found: String,
    },
    /// A bad record followed by records that later appends wrote.
    Damaged {
        offset: u64,
        /// The last record read in sequence before the damage.
        last_good: u64,
        /// Valid records of the round found behind the damage.
        later: Later,
    },
    Io(std::io::Error),
}

/// Valid records of the round found behind a bad one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::meta) struct Later {
    pub(in crate::meta) count: u64,
    pub(in crate::meta) min_seq: u64,
    pub(in crate::meta) max_seq: u64,
    /// The largest "first sequence of its append" among them: above the sequence after the
    /// last good record, a later append wrote it.
    pub(in crate::meta) max_first: u64,
}

impl Later {
    fn add(&mut self, h: &Header) {
        if self.count == 0 {
            *self = Later {
                count: 1,
                min_seq: h.seq,
                max_seq: h.seq,
                max_first: h.first,
            };
        } else {
            self.count += 1;
            self.min_seq = self.min_seq.min(h.seq);
            self.max_seq = self.max_seq.max(h.seq);
            self.max_first = self.max_first.max(h.first);
        }
    }
}

impl Fault {
    /// What is wrong, in words that name the sequence numbers at stake.
    pub(in crate::meta) fn describe(&self, round: &Round, applied: u64) -> String {
        let holds = format!(
            "the node file holds batches up to {applied} and expects the log to go on from \
             sequence {}",
            round.start + 1
        );
        match self {
            Fault::Missing => format!("the redo log is missing; {holds}"),
            Fault::Size { len } if *len == 0 => format!("the redo log is empty; {holds}"),
            Fault::Size { len } if *len > LOG_MAX => format!(
                "the redo log is {len} bytes, more than any log nokv writes ({LOG_MAX}); it was \
                 not written by nokv or is damaged; {holds}"
            ),
            Fault::Size { len } => format!(
                "the redo log is {len} bytes, not a multiple of {GROW}: it was cut; {holds}"
            ),
            Fault::Foreign { found } => format!(
                "the redo log does not belong with this node file ({found}); the two files are \
                 from different moments or different data dirs; {holds}"
            ),
            Fault::Damaged {
                offset,
                last_good,
                later,
            } => format!(
                "the redo log is damaged at offset {offset}: records up to sequence {last_good} \
                 are intact, the record after them is not, and {} later records (sequences \
                 {}..={}) were written after it was acknowledged; {holds}",
                later.count, later.min_seq, later.max_seq
            ),
            Fault::Io(e) => format!("the redo log cannot be read ({e}); {holds}"),
        }
    }
}

/// Reads the log at `path` against `round` (the node file's), calling `visit` with every
/// record above `applied` in order. Returns what it held, or why it is refused — in which case
/// the caller must not keep what `visit` applied.
pub(in crate::meta) fn scan(
    disk: &Disk,
    path: &Path,
    round: &Round,
    applied: u64,
    mut visit: impl FnMut(u64, &[u8]) -> MetaResult<()>,
) -> MetaResult<Result<Found, Fault>> {
    let len = match disk.file_len(path) {
        Ok(Some(len)) => len,
        Ok(None) => return Ok(Err(Fault::Missing)),
        Err(e) => return Ok(Err(Fault::Io(e))),
    };
    if len < GROW || len % GROW != 0 || len > LOG_MAX {
        return Ok(Err(Fault::Size { len }));
    }
    let file = match disk.open_log(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(Err(Fault::Missing)),
        Err(e) => return Ok(Err(Fault::Io(e))),
    };
    let mut reader = Reader {
        file: file.as_ref(),
        len,
        payload: Vec::new(),
    };
    let io = |e| Ok(Err(Fault::Io(e)));
    let first = match reader.header(0) {
        Ok(h) => h,
        Err(e) => return io(e),
    };
    let marker_of = |id: u64| first.magic == MARKER && first.len == 0 && first.valid(id, &[]);
    let at_zero = if marker_of(round.id) && first.seq == round.start {
        round.id
    } else if marker_of(round.prev) {
        round.prev
    } else {
        return Ok(Err(Fault::Foreign {
            found: describe_first(&first),
        }));
    };
    let mut last = round.start;
    let mut replayed = 0;
    let mut pos = HEADER as u64;
    if at_zero != round.id {
        // The crash fell between the commit that began the round and its marker: the round
        // before announced this one in its log before that commit. A log of the round before
        // without that announcement was copied before the round began: from another moment.
        match reader.find(HEADER as u64, ANNOUNCE, round.prev, |h, p| {
            h.seq == round.start && p == round.id.to_le_bytes()
        }) {
            Ok(Some(at)) => pos = at + (HEADER + 8) as u64,
            Ok(None) => {
                return Ok(Err(Fault::Foreign {
                    found: format!(
                        "it is a log of the round before the node file's, taken before the \
                         node file's round began after sequence {}",
                        round.start
                    ),
                }));
            }
            Err(e) => return io(e),
        }
    } else {
        loop {
            match reader.announcement(pos, round.id) {
                Ok(Some(len)) => {
                    pos += len;
                    continue;
                }
                Ok(None) => {}
                Err(e) => return io(e),
            }
            let record = match reader.record(pos, round.id) {
                Ok(r) => r,
                Err(e) => return io(e),
            };
            let Some(h) = record.filter(|h| h.seq == last + 1 && h.first <= h.seq) else {
                break;
            };
            if h.seq > applied {
                visit(h.seq, &reader.payload)?;
                replayed += 1;
            }
            last = h.seq;
            pos += (HEADER + h.len as usize) as u64;
        }
    }
    let later = match reader.valid_after(pos, round.id) {
        Ok(l) => l,
        Err(e) => return io(e),
    };
    // Records behind the tail from the append that the tail tore are unacknowledged; any from a
    // later append prove the bad record was acknowledged.
    // Damage among records the node file already holds (a clean stop makes the file durable
    // after every record) costs nothing: only records above `applied` are needed.
    if later.count > 0 && later.max_first > last + 1 && later.max_seq > applied {
        return Ok(Err(Fault::Damaged {
            offset: pos,
            last_good: last,
            later,
        }));
    }
    Ok(Ok(Found {
        at_zero,
        last,
        replayed,
        end: pos,
    }))
}

/// Reads a log written before rounds existed (magic, length, sequence, checksum): every record
/// up to the first torn or out-of-sequence one, calling `visit` with those above `applied`.
/// Returns the last sequence read and how many were applied. A missing log holds nothing.
pub(in crate::meta) fn scan_legacy(
    disk: &Disk,
    path: &Path,
    applied: u64,
    mut visit: impl FnMut(u64, &[u8]) -> MetaResult<()>,
) -> MetaResult<(u64, u64)> {
    const LEGACY: u32 = 0x6e6b_7631;
    const LEGACY_HEADER: u64 = 24;
    let damaged = |e: std::io::Error| MetaError::Damaged {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let Some(file) = disk.open_log(path).map_err(damaged)? else {
        return Ok((applied, 0));
    };
    let len = file.len().map_err(damaged)?;
    if len > LOG_MAX {
        return Err(MetaError::Damaged {
            path: path.to_path_buf(),
            detail: format!("{len} bytes, more than any log nokv writes ({LOG_MAX})"),
        });
    }
    let (mut pos, mut last, mut replayed) = (0u64, applied, 0);
    let mut prev: Option<u64> = None;
    let mut payload = Vec::new();
    while pos + LEGACY_HEADER <= len {
        let mut h = [0u8; 24];
        file.read_exact_at(&mut h, pos).map_err(damaged)?;
        let magic = u32::from_le_bytes(h[0..4].try_into().expect("4"));
        let plen = u64::from(u32::from_le_bytes(h[4..8].try_into().expect("4")));
        let seq = u64::from_le_bytes(h[8..16].try_into().expect("8"));
        let sum = u64::from_le_bytes(h[16..24].try_into().expect("8"));
        if magic != LEGACY || pos + LEGACY_HEADER + plen > len {
            break;
        }
        payload.resize(plen as usize, 0);
        file.read_exact_at(&mut payload, pos + LEGACY_HEADER)
            .map_err(damaged)?;
        if legacy_checksum(seq, &payload) != sum || prev.is_some_and(|p| seq != p + 1) {
            break;
        }
        if seq > last {
            visit(seq, &payload)?;
            last = seq;
            replayed += 1;
        }
        prev = Some(seq);
        pos += LEGACY_HEADER + plen;
    }
    Ok((last, replayed))
}

/// What the first header of a refused log looks like, in words.
fn describe_first(h: &Header) -> String {
    if *h == Header::decode(&[0; HEADER]) {
        "its first bytes are zeros".into()
    } else if h.magic == MARKER {
        format!(
            "it starts a round after sequence {} that this node file does not know",
            h.seq
        )
    } else if h.magic == RECORD {
        format!(
            "it starts with a record (sequence {}), not a round marker",
            h.seq
        )
    } else {
        "its first bytes are not a round marker (damaged, or not a nokv log)".into()
    }
}

/// Reads headers and payloads by offset, one at a time.
struct Reader<'a> {
    file: &'a dyn LogFile,
    len: u64,
    /// The payload of the last record read.
    payload: Vec<u8>,
}

/// Bytes searched at a time for records behind the tail.
const CHUNK: usize = 1 << 20;

impl Reader<'_> {
    fn header(&self, at: u64) -> std::io::Result<Header> {
        let mut b = [0u8; HEADER];
        if at + HEADER as u64 > self.len {
            return Ok(Header::decode(&b));
        }
        self.file.read_exact_at(&mut b, at)?;
        Ok(Header::decode(&b))
    }

    /// The record of round `id` at `at`, if one is there and whole (its payload then in
    /// `self.payload`).
    fn record(&mut self, at: u64, id: u64) -> std::io::Result<Option<Header>> {
        self.element(at, RECORD, id)
    }

    /// The element framed with `magic` in round `id` at `at`, if one is there and whole (its
    /// payload then in `self.payload`).
    fn element(&mut self, at: u64, magic: u32, id: u64) -> std::io::Result<Option<Header>> {
        let h = self.header(at)?;
        let end = at + HEADER as u64 + u64::from(h.len);
        if h.magic != magic || end > self.len {
            return Ok(None);
        }
        self.payload.resize(h.len as usize, 0);
        self.file
            .read_exact_at(&mut self.payload, at + HEADER as u64)?;
        Ok(h.valid(id, &self.payload).then_some(h))
    }

    /// The size of the announcement of round `id` at `at`, if one is there and whole.
    fn announcement(&mut self, at: u64, id: u64) -> std::io::Result<Option<u64>> {
        let h = self.header(at)?;
        if h.magic != ANNOUNCE || h.len != 8 || at + (HEADER + 8) as u64 > self.len {
            return Ok(None);
        }
        let mut p = [0u8; 8];
        self.file.read_exact_at(&mut p, at + HEADER as u64)?;
        Ok(h.valid(id, &p).then_some((HEADER + 8) as u64))
    }

    /// The offset of the first element framed with `magic` in round `id`, from `from` on, that
    /// `wanted` accepts (given its header and payload).
    fn find(
        &mut self,
        from: u64,
        magic: u32,
        id: u64,
        wanted: impl Fn(&Header, &[u8]) -> bool,
    ) -> std::io::Result<Option<u64>> {
        let mut found = None;
        self.each(from, magic, id, |at, h, p| {
            if found.is_none() && wanted(h, p) {
                found = Some(at);
            }
        })?;
        Ok(found)
    }

    /// The valid records of round `id` anywhere from `from` to the end of the file.
    fn valid_after(&mut self, from: u64, id: u64) -> std::io::Result<Later> {
        let mut later = Later::default();
        self.each(from, RECORD, id, |_, h, _| later.add(h))?;
        Ok(later)
    }

    /// Calls `found` with every whole element framed with `magic` in round `id` from `from` to
    /// the end of the file (offset, header, payload), searching byte by byte: elements are not
    /// aligned, and bytes that are not one of this round's never check out.
    fn each(
        &mut self,
        from: u64,
        magic: u32,
        id: u64,
        mut found: impl FnMut(u64, &Header, &[u8]),
    ) -> std::io::Result<()> {
        let bytes = magic.to_le_bytes();
        let mut chunk = vec![0u8; CHUNK];
        let mut at = from;
        while at + HEADER as u64 <= self.len {
            let n = (self.len - at).min(CHUNK as u64) as usize;
            self.file.read_exact_at(&mut chunk[..n], at)?;
            let hits: Vec<u64> = chunk[..n]
                .windows(4)
                .enumerate()
                .filter(|(_, w)| *w == bytes)
                .map(|(i, _)| at + i as u64)
                .collect();
            for o in hits {
                if let Some(h) = self.element(o, magic, id)? {
                    found(o, &h, &self.payload);
                }
            }
            // Overlap by the magic's length less one, so no header is missed at the seam.
            at += (n as u64).saturating_sub(3).max(1);
        }
        Ok(())
    }
}
