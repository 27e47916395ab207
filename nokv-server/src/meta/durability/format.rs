//! The redo log's bytes on disk: how a record, a round's marker and a round's announcement of
//! the next one are framed, and the checksum that tells them from anything else.
//!
//! A record is `magic, payload length, sequence, first sequence of its append, checksum`, then
//! the payload; a marker is the same header with its own magic, no payload, and the round's
//! start as both sequences; an announcement carries the next round's id as its payload and its
//! start as both sequences.
//!
//! Invariants:
//! * every checksum mixes in the round's random id, so bytes of another round (or a user's file
//!   body) never pass for a record of this one;
//! * a header is [`HEADER`] bytes, within one disk sector: written whole or not at all;
//! * the file only grows, by [`GROW`]-sized steps, and never beyond [`LOG_MAX`].

/// A batch record.
pub(super) const RECORD: u32 = 0x6e6b_7632;
/// The first bytes of a round of the log.
pub(super) const MARKER: u32 = 0x6e6b_726d;
/// A round's note, written in its log before the durable commit that begins the next round,
/// of that next round's id (payload) and start (sequence): lets a crash between that commit
/// and the next round's marker be told from a log of an earlier moment.
pub(super) const ANNOUNCE: u32 = 0x6e6b_7261;
/// magic, payload length, sequence, first sequence of the append, checksum.
pub(super) const HEADER: usize = 4 + 4 + 8 + 8 + 8;

/// The least a log file is ever long (it is created with this many bytes, holding its first
/// marker) and the unit it grows by: records are written into blocks the file already has, so
/// an fsync flushes data only — not the file size and block map, which would cost a journal
/// commit on every append. A log whose length is not a multiple of it was cut by someone else.
pub(super) const GROW: u64 = 1 << 20;
/// The most bytes a log file may take: rounds end at [`BUDGET_MAX`] and an append that would
/// grow the file beyond this is refused (the store then starts a new round). A bigger file is
/// not a log nokv wrote, and is refused at open without being read.
pub(in crate::meta) const LOG_MAX: u64 = 256 << 20;

/// One record's header as framed on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) magic: u32,
    pub(super) len: u32,
    pub(super) seq: u64,
    /// The sequence of the first record of the append this one was written in (a marker: the
    /// round's start). Tells damage from a torn last append (see [`scan`]).
    pub(super) first: u64,
    pub(super) sum: u64,
}

impl Header {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.sum.to_le_bytes());
    }

    pub(super) fn decode(b: &[u8; HEADER]) -> Header {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        Header {
            magic: u32_at(0),
            len: u32_at(4),
            seq: u64_at(8),
            first: u64_at(16),
            sum: u64_at(24),
        }
    }

    /// True if the header and `payload` were framed in round `round` exactly like this.
    pub(super) fn valid(&self, round: u64, payload: &[u8]) -> bool {
        self.sum == checksum(round, self.magic, self.seq, self.first, payload)
    }
}

/// Frames a record of `round` (or, with `MARKER`, the round's marker) into `out`.
pub(super) fn frame(
    round: u64,
    magic: u32,
    seq: u64,
    first: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    Header {
        magic,
        len: payload.len() as u32,
        seq,
        first,
        sum: checksum(round, magic, seq, first, payload),
    }
    .encode(out);
    out.extend_from_slice(payload);
}

/// Detects a torn record, a stale one of another round, or bytes that were never a record
/// (not an adversary): a multiply-xor hash over 8-byte words, keyed by the round's random id —
/// bytes left from another round (or a user's file body) do not check out in this one.
pub(super) fn checksum(round: u64, magic: u32, seq: u64, first: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = round.wrapping_mul(K) ^ u64::from(magic);
    for w in [seq, first, payload.len() as u64] {
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    mix(h, payload)
}

/// The checksum of records written before rounds existed (read once, at the first open).
pub(super) fn legacy_checksum(seq: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    mix(seq ^ (payload.len() as u64).wrapping_mul(K), payload)
}

fn mix(mut h: u64, payload: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut words = payload.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K).rotate_left(29);
    }
    h ^ (h >> 32)
}
