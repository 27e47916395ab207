//! The appending end of a store's redo log.
//!
//! Invariants:
//! * records of a round are written only after the durable commit that began the round, and
//!   after the round's marker at offset 0 is durable (written on its own) — so a crash never
//!   finds a record of a round the file does not know, the log is never overwritten while it
//!   holds the only copy of anything, and the previous round's announcement of this one
//!   survives until this round's marker does;
//! * one [`Log::append`] is one write and one fsync; every record it writes carries the
//!   sequence of the append's first record, which lets a reader tell a torn last append from
//!   damage in the middle (see [`super::scan`]);
//! * the file only grows, by [`GROW`]-sized steps of zeros, and never beyond [`LOG_MAX`].

use std::path::{Path, PathBuf};

use super::super::StoreFaults;
use super::super::disk::{Disk, Synced};
use super::super::log_file::LogFile;
use super::format::{ANNOUNCE, GROW, LOG_MAX, MARKER, RECORD, frame};
use super::record::Redo;
use super::round::Round;

/// Why an append failed. A write can fail before anything reached the disk (a full disk):
/// the store recovers in-process. A failed fsync is another matter (see `meta::fatal`).
#[derive(Debug)]
pub(in crate::meta) enum AppendError {
    Write(std::io::Error),
    Sync(std::io::Error),
}

pub(in crate::meta) struct Log {
    file: Box<dyn LogFile>,
    path: PathBuf,
    faults: StoreFaults,
    /// Where the next record goes.
    pos: u64,
    /// Bytes of the file already allocated.
    len: u64,
    round: Round,
    /// True until the round's marker is durable at offset 0.
    needs_marker: bool,
    /// Reused for framing.
    buf: Vec<u8>,
}

impl Log {
    /// Creates (or takes over) the log at `path` for a store whose file names no round yet, or
    /// whose log is being replaced: writes `round`'s marker at offset 0 and makes it, the
    /// file's size and its directory entry durable. Only then may the store record `round`.
    pub(in crate::meta) fn create(
        disk: &Disk,
        path: &Path,
        round: Round,
        faults: &StoreFaults,
    ) -> Result<Log, AppendError> {
        let file = disk.create_log(path).map_err(AppendError::Write)?;
        let mut log = Log::on(file, path, round, faults)?;
        if log.len < GROW || log.len % GROW != 0 {
            let grown = log.len.max(GROW).div_ceil(GROW) * GROW;
            log.file.set_len(grown).map_err(AppendError::Write)?;
            log.len = grown;
        }
        log.append(&[])?;
        Ok(log)
    }

    /// Opens the existing log at `path` whose offset 0 holds the marker of round `at_zero` and
    /// whose content of that round ends at `end` (see `scan`): the next round is announced
    /// there ([`Log::announce`]) and begun after the durable commit that records it
    /// ([`Log::begin`]).
    pub(in crate::meta) fn resume(
        disk: &Disk,
        path: &Path,
        at_zero: u64,
        end: u64,
        faults: &StoreFaults,
    ) -> Result<Log, AppendError> {
        let file = match disk.open_log(path).map_err(AppendError::Write)? {
            Some(f) => f,
            None => {
                return Err(AppendError::Write(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{} disappeared", path.display()),
                )));
            }
        };
        let mut log = Log::on(
            file,
            path,
            Round {
                id: at_zero,
                start: 0,
                prev: 0,
            },
            faults,
        )?;
        log.pos = end;
        log.needs_marker = false;
        Ok(log)
    }

    /// Writes, durably, the note in the current round's log that `next` is about to begin —
    /// before the durable commit that records `next` (see `scan`: it tells a crash between
    /// that commit and `next`'s marker from a log of an earlier moment).
    pub(in crate::meta) fn announce(&mut self, next: &Round) -> Result<(), AppendError> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        frame(
            self.round.id,
            ANNOUNCE,
            next.start,
            next.start,
            &next.id.to_le_bytes(),
            &mut buf,
        );
        let at = self.pos;
        let written = self.write(&buf, at);
        self.pos = at + buf.len() as u64;
        self.buf = buf;
        written
    }

    /// The log in `file`, about to write `round`'s marker at offset 0.
    fn on(
        file: Box<dyn LogFile>,
        path: &Path,
        round: Round,
        faults: &StoreFaults,
    ) -> Result<Log, AppendError> {
        Ok(Log {
            len: file.len().map_err(AppendError::Write)?,
            file,
            path: path.to_path_buf(),
            faults: faults.clone(),
            pos: 0,
            round,
            needs_marker: true,
            buf: Vec::new(),
        })
    }

    /// The file this log writes.
    pub(in crate::meta) fn path(&self) -> &Path {
        &self.path
    }

    /// The round records are appended to.
    pub(in crate::meta) fn round(&self) -> Round {
        self.round
    }

    /// Starts `round`, which a durable commit of the store has just recorded (every record so
    /// far is in the file itself): the next append writes its marker over the old round.
    pub(in crate::meta) fn begin(&mut self, round: Round) {
        self.round = round;
        self.pos = 0;
        self.needs_marker = true;
    }

    /// Appends the records of `redos` (consecutive batches, in order) — preceded by the round's
    /// marker if it is not written yet — with one write and one fsync. With no records, writes
    /// only a missing marker (or nothing).
    pub(in crate::meta) fn append(&mut self, redos: &[&Redo]) -> Result<(), AppendError> {
        if redos.is_empty() && !self.needs_marker {
            return Ok(());
        }
        if self.needs_marker && !redos.is_empty() {
            // The marker first, on its own: until it is durable the old round's log — its
            // announcement of this round among it — must not be overwritten by this round's
            // records (a power cut could keep them and lose the marker).
            self.append(&[])?;
        }
        let id = self.round.id;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let at = if self.needs_marker { 0 } else { self.pos };
        if self.needs_marker {
            let start = self.round.start;
            frame(id, MARKER, start, start, &[], &mut buf);
        }
        let first = redos.first().map_or(0, |r| r.seq());
        for r in redos {
            frame(id, RECORD, r.seq(), first, r.payload(), &mut buf);
        }
        let written = self.write(&buf, at);
        self.buf = buf;
        written?;
        self.needs_marker = false;
        self.pos = at + self.buf.len() as u64;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8], at: u64) -> Result<(), AppendError> {
        let end = at + bytes.len() as u64;
        self.faults.check_log().map_err(AppendError::Write)?;
        if end > self.len {
            let grown = end.div_ceil(GROW) * GROW;
            if grown > LOG_MAX {
                return Err(AppendError::Write(std::io::Error::other(format!(
                    "{}: a round may not grow the log beyond {LOG_MAX} bytes",
                    self.path.display()
                ))));
            }
            self.file.set_len(grown).map_err(AppendError::Write)?;
            let zeros = vec![0u8; (grown - self.len) as usize];
            self.file
                .write_all_at(&zeros, self.len)
                .map_err(AppendError::Write)?;
            self.len = grown;
        }
        self.file
            .write_all_at(bytes, at)
            .map_err(AppendError::Write)?;
        self.faults
            .check_sync(Synced::Log)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| {
                // Latched before the failure can reach anyone (see `crate::fsync_latch`).
                self.faults.sync_failed(Synced::Log, e.to_string());
                AppendError::Sync(e)
            })
    }
}
