//! The file interface of the redo log, implemented by a real file and by the simulated disk
//! of tests ([`super::powercut`]). It has its own module, below both [`super::disk`] (which
//! hands out log files) and the simulated disk (which implements it), so neither imports the
//! other's side of the interface.

use std::io;

/// The operations the redo log needs from its file.
pub(super) trait LogFile: Send + Sync {
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()>;
    fn sync_data(&self) -> io::Result<()>;
}

impl LogFile for std::fs::File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, at)
    }
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, buf, at)
    }
    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }
}
