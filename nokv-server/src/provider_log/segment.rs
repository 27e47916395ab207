//! One object of a node's log stream: a *records* segment (a run of redo records with
//! consecutive sequence numbers) or a *fence* (written by a node that took over the stream's
//! shards: nothing at or after its sequence belongs to the stream).
//!
//! Layout (little-endian), then a SHA-256 of everything before it:
//!
//! ```text
//! magic "NKVLOGS1" | kind u8 (1 records, 2 fence) | node: u16 len + utf-8 | incarnation u64
//! | first u64 | last u64 | shards: u32 n + n x (shard u32, epoch u64) | body: u64 len + bytes
//! ```
//!
//! For a records segment `node`/`incarnation` name the writing stream, `shards` the epochs at
//! which the writer owned every shard its records touch, and `body` the records, opaque here.
//! For a fence, `node` is the fencing node, `shards` the shard and epoch it took, and
//! `first == last` is the fenced sequence. A segment whose digest does not match is refused
//! whole: a record is never replayed from a damaged object.

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"NKVLOGS1";
const DIGEST: usize = 32;

/// What a segment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Records,
    Fence,
}

/// A decoded segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub kind: Kind,
    pub node: String,
    pub incarnation: u64,
    pub first: u64,
    pub last: u64,
    pub shards: Vec<(u32, u64)>,
    pub body: Vec<u8>,
}

/// Why bytes are not a segment.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SegmentError {
    #[error("not a log segment (bad magic or kind)")]
    NotSegment,
    #[error("log segment is cut short")]
    Truncated,
    #[error("log segment checksum mismatch")]
    Checksum,
    #[error("log segment names sequence {first}..={last}, which is not a range")]
    Range { first: u64, last: u64 },
}

impl Segment {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.node.len() + self.body.len());
        out.extend_from_slice(MAGIC);
        out.push(match self.kind {
            Kind::Records => 1,
            Kind::Fence => 2,
        });
        out.extend_from_slice(&(self.node.len() as u16).to_le_bytes());
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(&self.incarnation.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.last.to_le_bytes());
        out.extend_from_slice(&(self.shards.len() as u32).to_le_bytes());
        for (shard, epoch) in &self.shards {
            out.extend_from_slice(&shard.to_le_bytes());
            out.extend_from_slice(&epoch.to_le_bytes());
        }
        out.extend_from_slice(&(self.body.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.body);
        let digest = Sha256::digest(&out);
        out.extend_from_slice(&digest);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Segment, SegmentError> {
        if bytes.len() < MAGIC.len() + DIGEST || &bytes[..MAGIC.len()] != MAGIC {
            return Err(SegmentError::NotSegment);
        }
        let (content, digest) = bytes.split_at(bytes.len() - DIGEST);
        if Sha256::digest(content).as_slice() != digest {
            return Err(SegmentError::Checksum);
        }
        let mut r = Reader(&content[MAGIC.len()..]);
        let kind = match r.take(1)?[0] {
            1 => Kind::Records,
            2 => Kind::Fence,
            _ => return Err(SegmentError::NotSegment),
        };
        let node_len = r.u16()? as usize;
        let node =
            String::from_utf8(r.take(node_len)?.to_vec()).map_err(|_| SegmentError::NotSegment)?;
        let incarnation = r.u64()?;
        let first = r.u64()?;
        let last = r.u64()?;
        if last < first {
            return Err(SegmentError::Range { first, last });
        }
        let n = r.u32()? as usize;
        let mut shards = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            shards.push((r.u32()?, r.u64()?));
        }
        let body_len = r.u64()? as usize;
        let body = r.take(body_len)?.to_vec();
        if !r.0.is_empty() {
            return Err(SegmentError::NotSegment);
        }
        Ok(Segment {
            kind,
            node,
            incarnation,
            first,
            last,
            shards,
            body,
        })
    }
}

/// The body of a records segment: each redo record as `seq u64 | len u32 | payload`, in
/// sequence order (the payloads are opaque here: `meta` reads them back).
pub fn encode_records<'a>(records: impl IntoIterator<Item = (u64, &'a [u8])>) -> Vec<u8> {
    let mut body = Vec::new();
    for (seq, payload) in records {
        body.extend_from_slice(&seq.to_le_bytes());
        body.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        body.extend_from_slice(payload);
    }
    body
}

impl Segment {
    /// The records of a records segment's body, `(sequence, payload)`, in order. A body that
    /// does not parse, or a record outside `first..=last` or out of order, is refused: the
    /// digest matched, so such a segment was written wrong and nothing in it is replayed.
    pub fn records(&self) -> Result<Vec<(u64, &[u8])>, SegmentError> {
        let mut r = Reader(&self.body);
        let mut out = Vec::new();
        let mut floor = self.first;
        while !r.0.is_empty() {
            let seq = r.u64()?;
            let len = r.u32()? as usize;
            let payload = r.take(len)?;
            if seq < floor || seq > self.last {
                return Err(SegmentError::Range {
                    first: self.first,
                    last: self.last,
                });
            }
            floor = seq + 1;
            out.push((seq, payload));
        }
        Ok(out)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SegmentError> {
        if self.0.len() < n {
            return Err(SegmentError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, SegmentError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, SegmentError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, SegmentError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Segment {
        Segment {
            kind: Kind::Records,
            node: "n1".into(),
            incarnation: 7,
            first: 10,
            last: 12,
            shards: vec![(3, 4), (9, 2)],
            body: b"three records".to_vec(),
        }
    }

    #[test]
    fn a_segment_decodes_to_what_was_encoded() {
        let s = sample();
        assert_eq!(Segment::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn records_read_back_in_order_and_a_record_outside_the_range_is_refused() {
        let mut s = sample();
        s.body = encode_records([(10, &b"a"[..]), (12, &b"bc"[..])]);
        assert_eq!(s.records(), Ok(vec![(10, &b"a"[..]), (12, &b"bc"[..])]));
        s.body = encode_records([(13, &b"late"[..])]);
        assert!(s.records().is_err());
        s.body = encode_records([(11, &b"x"[..]), (11, &b"again"[..])]);
        assert!(s.records().is_err());
    }

    #[test]
    fn any_flipped_byte_or_cut_is_refused_whole() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Segment::decode(&bad).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(Segment::decode(&bytes[..n]).is_err(), "cut at {n} accepted");
        }
    }
}
