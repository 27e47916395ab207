//! A simulated disk for tests, named as such: it keeps what was written since the last fsync
//! apart from what was fsynced, so a test can cut power and find only what a real disk would
//! still hold. A kill -9 keeps the page cache and cannot catch a missing fsync; this can.
//!
//! Model: a write lands in the file's page cache; `sync_data` makes the whole file durable.
//! A power cut keeps the durable bytes and, of each write since the last fsync, every
//! 4 KiB sector independently with probability one half (sectors are written whole or
//! not at all; their order is not kept) — so the last writes may be torn. Files exist from
//! creation (directory entries are fsynced by the callers anyway); renames are durable.
//!
//! The power can also go off at an exact point — after the n-th fsync of any file
//! ([`SimDisk::power_off_after`]) — while the process runs on unaware: its later writes reach
//! only the page cache and its fsyncs do nothing. So a cut can fall inside any sequence of
//! operations (between a checkpoint's commit and the log's next marker, say).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// The unit a power cut keeps or loses whole: a 4 KiB physical sector (what current disks
/// write atomically, and redb's page size).
const SECTOR: usize = 4096;

/// The disk: files by path.
#[derive(Debug, Default)]
pub struct SimDisk {
    files: Mutex<HashMap<PathBuf, Arc<SimFile>>>,
    power: Arc<Power>,
}

/// When the power goes off: after `off_after` fsyncs of any file (0: never).
#[derive(Debug, Default)]
struct Power {
    syncs: std::sync::atomic::AtomicU64,
    off_after: std::sync::atomic::AtomicU64,
}

impl Power {
    fn on(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let off = self.off_after.load(SeqCst);
        off == 0 || self.syncs.load(SeqCst) < off
    }
}

/// One file: its durable bytes, its page cache, and the writes not yet fsynced.
#[derive(Debug, Default)]
pub struct SimFile {
    state: Mutex<FileState>,
    power: Arc<Power>,
}

#[derive(Debug, Default, Clone)]
struct FileState {
    durable: Vec<u8>,
    cached: Vec<u8>,
    /// Writes since the last fsync (while the power was on): offset and the bytes written.
    unsynced: Vec<(u64, Vec<u8>)>,
}

/// A handle on a [`SimFile`] (what the log and redb hold).
#[derive(Debug, Clone)]
pub struct SimHandle(Arc<SimFile>);

impl SimDisk {
    pub fn len_of(&self, path: &Path) -> Option<u64> {
        let files = self.files.lock();
        files.get(path).map(|f| f.state.lock().cached.len() as u64)
    }

    pub fn open(&self, path: &Path) -> Option<SimHandle> {
        self.files.lock().get(path).cloned().map(SimHandle)
    }

    pub fn create(&self, path: &Path) -> SimHandle {
        let power = self.power.clone();
        SimHandle(
            self.files
                .lock()
                .entry(path.to_path_buf())
                .or_insert_with(|| {
                    Arc::new(SimFile {
                        state: Mutex::default(),
                        power,
                    })
                })
                .clone(),
        )
    }

    /// The power goes off after `n` more fsyncs (of any file) succeed.
    pub fn power_off_after(&self, n: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        let done = self.power.syncs.load(SeqCst);
        self.power.off_after.store(done + n + 1, SeqCst);
    }

    /// True while the power is on: every fsync so far reached the disk.
    pub fn powered(&self) -> bool {
        self.power.on()
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut files = self.files.lock();
        let f = files
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        files.insert(to.to_path_buf(), f);
        Ok(())
    }

    /// Cuts power: every file keeps its durable bytes and a random part of what was written
    /// since its last fsync (decided by `seed`); returns the disk as it comes back.
    pub fn power_cut(&self, seed: u64) -> SimDisk {
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let files = self.files.lock();
        let mut after = HashMap::new();
        let power = Arc::new(Power::default());
        for (path, file) in files.iter() {
            let s = file.state.lock();
            let mut bytes = s.durable.clone();
            // The size is file system metadata (journaled): the old one or the new one.
            if !s.unsynced.is_empty() && next() % 2 == 0 {
                bytes.resize(s.cached.len(), 0);
            }
            for (at, data) in &s.unsynced {
                let at = *at as usize;
                let end = (at + data.len()).min(bytes.len());
                let mut sector = at;
                while sector < end {
                    let stop = ((sector / SECTOR + 1) * SECTOR).min(end);
                    if next() % 2 == 0 {
                        bytes[sector..stop].copy_from_slice(&data[sector - at..stop - at]);
                    }
                    sector = stop;
                }
            }
            let state = FileState {
                durable: bytes.clone(),
                cached: bytes,
                unsynced: Vec::new(),
            };
            after.insert(
                path.clone(),
                Arc::new(SimFile {
                    state: Mutex::new(state),
                    power: power.clone(),
                }),
            );
        }
        SimDisk {
            files: Mutex::new(after),
            power,
        }
    }
}

impl SimHandle {
    fn write(&self, data: &[u8], at: u64) {
        let mut s = self.0.state.lock();
        let end = at as usize + data.len();
        if s.cached.len() < end {
            s.cached.resize(end, 0);
        }
        s.cached[at as usize..end].copy_from_slice(data);
        if self.0.power.on() {
            s.unsynced.push((at, data.to_vec()));
        }
    }

    fn resize(&self, len: u64) {
        let mut s = self.0.state.lock();
        let old = s.cached.len();
        s.cached.resize(len as usize, 0);
        if len as usize > old && self.0.power.on() {
            s.unsynced.push((old as u64, vec![0; len as usize - old]));
        }
    }

    fn sync(&self) {
        if !self.0.power.on() {
            return;
        }
        let mut s = self.0.state.lock();
        // This fsync completes only if the power is still on once it is counted.
        let n = self
            .0
            .power
            .syncs
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let off = self
            .0
            .power
            .off_after
            .load(std::sync::atomic::Ordering::SeqCst);
        if off != 0 && n + 1 >= off {
            return;
        }
        s.durable = s.cached.clone();
        s.unsynced.clear();
    }

    fn read(&self, out: &mut [u8], at: u64) -> io::Result<()> {
        let s = self.0.state.lock();
        let end = at as usize + out.len();
        if end > s.cached.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        out.copy_from_slice(&s.cached[at as usize..end]);
        Ok(())
    }
}

impl super::log_file::LogFile for SimHandle {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state.lock().cached.len() as u64)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.resize(len);
        Ok(())
    }
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.read(buf, at)
    }
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        self.write(buf, at);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync();
        Ok(())
    }
}

impl redb::StorageBackend for SimHandle {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.state.lock().cached.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        SimHandle::read(self, out, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.resize(len);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync();
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        SimHandle::write(self, data, offset);
        Ok(())
    }
}
