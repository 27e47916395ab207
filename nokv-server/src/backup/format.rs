//! The backup file format: a header, one section per shard, a trailer.
//!
//! ```text
//! FILE    = HEADER SECTION* TRAILER
//! HEADER  = "NOKVBKP\0" | version u32 (1) | shard_count u32 | sections u32 | created_unix_ms u64
//! SECTION = "SECT" | shard u32 | length u64 | body (length bytes) | sha256(body) (32 bytes)
//! TRAILER = "NOKVEND\0" | sha256 of every byte of the file before this digest (32 bytes)
//! ```
//! Integers are little-endian. A body is a standalone single-shard store (the export a
//! checkpoint uses, canonical table names), so restoring a section is the import a cluster
//! load does. Sections are in ascending shard order, each shard at most once, every shard
//! below `shard_count`, exactly `sections` of them.
//!
//! Why two levels of digest: the per-section sha256 names the shard whose bytes are damaged;
//! the trailer's digest covers the header and the framing too, so *any* changed byte is
//! refused — a flipped bit in a length or a shard number is caught as surely as one in a body.
//! Everything is checked by reading the file once, front to back, in bounded memory, so
//! restore proves a file whole before it creates anything. A file that ends early, carries
//! bytes after its trailer, or starts with anything but the magic is refused likewise.

use std::io::Read;

use sha2::{Digest, Sha256};

use super::Damage;

const MAGIC: &[u8; 8] = b"NOKVBKP\0";
const VERSION: u32 = 1;
const SECTION_MAGIC: &[u8; 4] = b"SECT";
const TRAILER_MAGIC: &[u8; 8] = b"NOKVEND\0";
/// Bytes read from the file at a time while checking it.
const READ_CHUNK: usize = 1024 * 1024;

/// What a verified file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub shard_count: u32,
    pub created_unix_ms: u64,
    pub sections: Vec<Section>,
    /// Length of the whole file.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub shard: u32,
    pub length: u64,
}

/// Writes a backup front to back: every byte handed out or passed through [`Encoder::body`]
/// is hashed, so the digests are those of exactly the bytes the caller sends on.
pub struct Encoder {
    file: Sha256,
    section: Option<(Sha256, u64)>,
}

impl Encoder {
    /// Starts a file for `sections` sections of a node with `shard_count` shards.
    pub fn new(shard_count: u32, sections: u32, created_unix_ms: u64) -> (Encoder, Vec<u8>) {
        let mut head = Vec::with_capacity(28);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&shard_count.to_le_bytes());
        head.extend_from_slice(&sections.to_le_bytes());
        head.extend_from_slice(&created_unix_ms.to_le_bytes());
        let mut e = Encoder {
            file: Sha256::new(),
            section: None,
        };
        e.file.update(&head);
        (e, head)
    }

    /// The framing before shard `shard`'s body of `length` bytes.
    pub fn begin_section(&mut self, shard: u32, length: u64) -> Vec<u8> {
        let mut head = Vec::with_capacity(16);
        head.extend_from_slice(SECTION_MAGIC);
        head.extend_from_slice(&shard.to_le_bytes());
        head.extend_from_slice(&length.to_le_bytes());
        self.file.update(&head);
        self.section = Some((Sha256::new(), length));
        head
    }

    /// Accounts for body bytes the caller sends on.
    pub fn body(&mut self, bytes: &[u8]) {
        let (hash, left) = self.section.as_mut().expect("inside a section");
        hash.update(bytes);
        *left = left.saturating_sub(bytes.len() as u64);
        self.file.update(bytes);
    }

    /// The section's digest, or `None` when its body was shorter than announced (the caller
    /// must not send a file whose framing lies).
    pub fn end_section(&mut self) -> Option<Vec<u8>> {
        let (hash, left) = self.section.take().expect("inside a section");
        if left != 0 {
            return None;
        }
        let digest = hash.finalize().to_vec();
        self.file.update(&digest);
        Some(digest)
    }

    /// The trailer, which ends the file.
    pub fn finish(mut self) -> Vec<u8> {
        self.file.update(TRAILER_MAGIC);
        let mut tail = TRAILER_MAGIC.to_vec();
        tail.extend_from_slice(&self.file.finalize());
        tail
    }
}

/// Reads a whole backup from `src`, checking every length and digest, and hands each body
/// to `body` as it streams by, as `(shard, bytes)` pieces in file order. A section's bytes
/// reach `body` before its digest is checked: a caller that keeps them must drop them when
/// this returns an error.
pub fn read<R: Read, E: From<Damage> + From<std::io::Error>>(
    src: R,
    mut body: impl FnMut(u32, &[u8]) -> Result<(), E>,
) -> Result<Manifest, E> {
    let mut r = Reader {
        src,
        offset: 0,
        file: Sha256::new(),
    };
    if r.array::<8, E>()? != *MAGIC {
        return Err(Damage::NotABackup.into());
    }
    let version = u32::from_le_bytes(r.array::<4, E>()?);
    if version != VERSION {
        return Err(Damage::Version(version).into());
    }
    let shard_count = u32::from_le_bytes(r.array::<4, E>()?);
    let count = u32::from_le_bytes(r.array::<4, E>()?);
    let created_unix_ms = u64::from_le_bytes(r.array::<8, E>()?);
    let mut sections: Vec<Section> = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK];
    for _ in 0..count {
        let at = r.offset;
        if r.array::<4, E>()? != *SECTION_MAGIC {
            return Err(Damage::Framing { offset: at }.into());
        }
        let shard = u32::from_le_bytes(r.array::<4, E>()?);
        let length = u64::from_le_bytes(r.array::<8, E>()?);
        if shard >= shard_count || sections.last().is_some_and(|s| s.shard >= shard) {
            return Err(Damage::Framing { offset: at }.into());
        }
        let mut hash = Sha256::new();
        let mut left = length;
        while left > 0 {
            let n = left.min(READ_CHUNK as u64) as usize;
            r.exact::<E>(&mut buf[..n])?;
            hash.update(&buf[..n]);
            body(shard, &buf[..n])?;
            left -= n as u64;
        }
        let expected = r.array::<32, E>()?;
        if hash.finalize().as_slice() != expected {
            return Err(Damage::Section { shard }.into());
        }
        sections.push(Section { shard, length });
    }
    let at = r.offset;
    if r.array::<8, E>()? != *TRAILER_MAGIC {
        return Err(Damage::Framing { offset: at }.into());
    }
    let whole = r.file.clone().finalize();
    let expected = r.array::<32, E>()?;
    if whole.as_slice() != expected {
        return Err(Damage::File.into());
    }
    let mut probe = [0u8; 1];
    loop {
        match r.src.read(&mut probe) {
            Ok(0) => break,
            Ok(_) => return Err(Damage::TrailingBytes { offset: r.offset }.into()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Manifest {
        shard_count,
        created_unix_ms,
        sections,
        bytes: r.offset,
    })
}

/// The file being read, with its offset and the running digest of what was read.
struct Reader<R> {
    src: R,
    offset: u64,
    file: Sha256,
}

impl<R: Read> Reader<R> {
    fn exact<E: From<Damage> + From<std::io::Error>>(&mut self, buf: &mut [u8]) -> Result<(), E> {
        match self.src.read_exact(buf) {
            Ok(()) => {
                self.file.update(&*buf);
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Damage::Truncated {
                offset: self.offset,
            }
            .into()),
            Err(e) => Err(e.into()),
        }
    }

    fn array<const N: usize, E: From<Damage> + From<std::io::Error>>(
        &mut self,
    ) -> Result<[u8; N], E> {
        let mut a = [0u8; N];
        self.exact::<E>(&mut a)?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    enum E {
        Damage(Damage),
        Io,
    }
    impl From<Damage> for E {
        fn from(d: Damage) -> E {
            E::Damage(d)
        }
    }
    impl From<std::io::Error> for E {
        fn from(_: std::io::Error) -> E {
            E::Io
        }
    }

    fn encode(sections: &[(u32, &[u8])]) -> Vec<u8> {
        let (mut e, mut out) = Encoder::new(16, sections.len() as u32, 42);
        for (shard, body) in sections {
            out.extend(e.begin_section(*shard, body.len() as u64));
            e.body(body);
            out.extend_from_slice(body);
            out.extend(e.end_section().unwrap());
        }
        out.extend(e.finish());
        out
    }

    /// The bodies read, per shard in file order.
    type Bodies = Vec<(u32, Vec<u8>)>;

    fn bodies(file: &[u8]) -> Result<(Manifest, Bodies), E> {
        let mut got = Bodies::new();
        let m = read(file, |shard, bytes| {
            match got.last_mut() {
                Some((s, b)) if *s == shard => b.extend_from_slice(bytes),
                _ => got.push((shard, bytes.to_vec())),
            }
            Ok::<(), E>(())
        })?;
        Ok((m, got))
    }

    #[test]
    fn a_file_reads_back_as_the_sections_it_was_written_with() {
        let file = encode(&[(0, b"zero"), (3, b"three"), (15, b"")]);
        let (m, got) = bodies(&file).unwrap();
        assert_eq!(m.shard_count, 16);
        assert_eq!(m.created_unix_ms, 42);
        assert_eq!(m.bytes, file.len() as u64);
        let shards: Vec<_> = m.sections.iter().map(|s| s.shard).collect();
        assert_eq!(shards, [0, 3, 15]);
        assert_eq!(
            got,
            [(0, b"zero".to_vec()), (3, b"three".to_vec())],
            "an empty body hands out nothing"
        );
    }

    // Catches: any byte of the file (header, framing, body, digests) that no check covers —
    // e.g. a trailer digest computed over the bodies only.
    #[test]
    fn every_single_flipped_byte_anywhere_in_the_file_is_refused() {
        let file = encode(&[(1, b"first body"), (7, b"second")]);
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x01;
            assert!(bodies(&bad).is_err(), "byte {i} flipped was accepted");
        }
    }

    #[test]
    fn a_file_cut_short_or_with_bytes_after_its_trailer_is_refused() {
        let file = encode(&[(2, b"body")]);
        for len in 0..file.len() {
            match bodies(&file[..len]) {
                // Named at the start of the field the cut went through.
                Err(E::Damage(Damage::Truncated { offset })) => assert!(offset <= len as u64),
                other => panic!("cut at {len}: {other:?}"),
            }
        }
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(
            bodies(&longer),
            Err(E::Damage(Damage::TrailingBytes { .. }))
        ));
    }

    #[test]
    fn a_damaged_body_is_named_by_its_shard() {
        let mut file = encode(&[(1, b"aaaa"), (9, b"bbbb")]);
        let at = file.windows(4).position(|w| w == b"bbbb").unwrap();
        file[at] = b'c';
        assert!(matches!(
            bodies(&file),
            Err(E::Damage(Damage::Section { shard: 9 }))
        ));
    }
}
