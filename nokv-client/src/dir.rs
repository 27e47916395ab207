//! A directory handle and the file calls made relative to it (`openat`, `fstatat`,
//! `renameat`, `unlinkat`, `fsync`).
//!
//! Naming a file as (directory handle, one name) instead of by path resolves the directory
//! once: a directory renamed, or a symbolic link swapped into a parent, after that cannot
//! redirect where a file is created, renamed or removed. [`crate::restore`] writes through
//! one, and `nokv mcp --local-root` hands restore a directory it resolved beneath its root.
//!
//! Every name given to these calls is one path component: it must not contain `/` (nor NUL),
//! so no call here walks further than the directory itself.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// What a name in a directory is, without following a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    Symlink,
    /// A regular file, device, FIFO or socket.
    Other,
}

impl Dir {
    /// Opens the directory at `path` (following symbolic links, as any path does).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        owned(fd).map(|fd| Dir { fd })
    }

    /// Takes an open file descriptor that must be a directory (`ENOTDIR` otherwise).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Dir> {
        if !File::from(fd.try_clone()?).metadata()?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Dir { fd })
    }

    /// `openat(self, name, flags, mode)`; `O_CLOEXEC` is always added.
    pub fn open_file(&self, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
        let c = component(name)?;
        // SAFETY: a valid directory fd and a NUL-terminated string that outlive the call.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        owned(fd).map(File::from)
    }

    /// What `name` is (`None`: nothing by that name), not following a symbolic link.
    pub fn entry_kind(&self, name: &OsStr) -> io::Result<Option<EntryKind>> {
        let c = component(name)?;
        // SAFETY: `stat` is plain data; all-zero is a valid value that fstatat overwrites.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory fd, a NUL-terminated string and a live `stat` buffer.
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => EntryKind::Directory,
            libc::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Other,
        }))
    }

    /// Renames `from` to `to`, both in this directory, replacing `to` atomically.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (component(from)?, component(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: a valid directory fd and NUL-terminated strings that outlive the call.
        check(unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) })
    }

    /// Removes the file `name` (not a directory).
    pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
        let c = component(name)?;
        // SAFETY: a valid directory fd and a NUL-terminated string that outlive the call.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })
    }

    /// Makes the directory's entries durable (a rename or create in it).
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: a valid fd.
        check(unsafe { libc::fsync(self.fd.as_raw_fd()) })
    }
}

impl From<Dir> for OwnedFd {
    fn from(d: Dir) -> OwnedFd {
        d.fd
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `name` as a C string, refused unless it is exactly one path component.
fn component(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The fd a libc call returned, or its error.
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of open/openat is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
