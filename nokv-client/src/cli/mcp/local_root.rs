//! `nokv mcp --local-root DIR`: the one place where a model's `local_path` becomes a file on
//! this machine. Every local file a tool reads (nokv_publish) or writes (nokv_restore) is
//! opened beneath the root's directory handle, so a model cannot reach outside the root:
//!
//! * a relative `local_path` is resolved beneath the root; an absolute one must lie inside
//!   the root as canonicalized once at start-up (the prefix is stripped, the rest resolved
//!   like a relative path) and is refused otherwise;
//! * the kernel does the resolution, not string checks: `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)` refuses any step out of the root — a `..` above it, a symbolic
//!   link whose target is absolute or climbs out, a `/proc` magic link — at the moment the
//!   file is opened, so a link swapped in between a check and the open cannot win a race;
//! * on kernels without openat2 (before Linux 5.6, `ENOSYS`) the path is walked one component
//!   at a time with `openat(O_NOFOLLOW)`, refusing `..` and every symbolic link, even one
//!   that stays inside: stricter, never looser.
//!
//! A refusal names the rule it applies (absolute path outside, `..`, symbolic link), so a
//! model can correct its call. Symbolic links that stay inside the root are followed (with
//! openat2), since they cannot lead anywhere the root does not already expose.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nokv_client::ClientError;
use nokv_client::dir::{Dir, EntryKind};

/// The directory that confines every local file of the MCP tools.
#[derive(Debug)]
pub struct LocalRoot {
    /// The root, canonical (absolute, no symbolic links), as it was at start-up: absolute
    /// `local_path`s are compared against it.
    path: PathBuf,
    /// The root's directory, opened at start-up: every resolution starts here, whatever
    /// happens to `path` afterwards.
    dir: OwnedFd,
    how: Resolution,
}

/// How paths are resolved beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolution {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`.
    Openat2,
    /// One `openat(O_NOFOLLOW)` per component: `..` and symbolic links refused.
    Walk,
}

/// Why a local path was not opened.
#[derive(Debug)]
pub enum LocalError {
    /// The path leads out of the root; the message names the rule.
    Escapes(String),
    /// Anything else (no such file, permission denied, not a file name).
    Failed(ClientError),
}

/// A file a restore may create or replace: a name in a directory opened beneath the root.
#[derive(Debug)]
pub struct Target {
    pub dir: Dir,
    pub name: OsString,
    /// What is at the name now (not following a symbolic link), if anything.
    pub existing: Option<EntryKind>,
}

impl LocalRoot {
    /// Opens `dir` as the root. A missing root, or one that is not a directory, fails
    /// `nokv mcp` at start-up rather than at the first tool call.
    pub fn open(dir: &Path) -> Result<LocalRoot, ClientError> {
        let fail =
            |e: io::Error| ClientError::usage(format!("--local-root {}: {e}", dir.display()));
        let path = dir.canonicalize().map_err(fail)?;
        let mut root = LocalRoot {
            dir: Dir::open(&path).map_err(fail)?.into(),
            path,
            how: Resolution::Openat2,
        };
        match root.open_beneath(Path::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(_) => {}
            // Not built into this kernel (or this OS), or filtered out by a seccomp policy.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                tracing::info!(
                    root = %root.path.display(),
                    "openat2 unavailable ({e}): --local-root resolves component by component \
                     and follows no symbolic link"
                );
                root.how = Resolution::Walk;
            }
            Err(e) => return Err(fail(e)),
        }
        Ok(root)
    }

    /// The canonical root, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `local_path` for reading, beneath the root. Opening never blocks (`O_NONBLOCK`:
    /// a FIFO with no writer) and never takes a controlling terminal; the caller checks with
    /// `fstat` that it got a regular file before reading.
    pub fn open_source(&self, local_path: &str) -> Result<File, LocalError> {
        let rel = self.relative(local_path)?;
        self.open_beneath(&rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0)
            .map(File::from)
            .map_err(|e| self.refusal(local_path, &rel, e))
    }

    /// The file `local_path` names for writing: its directory opened beneath the root, and
    /// its name in it. A symbolic link at that name is refused unless it stays inside the
    /// root (a rename replaces the link itself, but a model naming a link means its target).
    pub fn target(&self, local_path: &str) -> Result<Target, LocalError> {
        let rel = self.relative(local_path)?;
        let name = match rel.components().next_back() {
            Some(Component::Normal(n)) => n.to_owned(),
            _ if climbs_out(&rel) => return Err(self.refusal(local_path, &rel, exdev())),
            _ => {
                return Err(LocalError::Failed(ClientError::usage(format!(
                    "local_path {local_path:?} does not name a file: restore needs a file \
                     path to create or replace"
                ))));
            }
        };
        let parent = match rel.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = self
            .open_beneath(parent, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .and_then(Dir::from_fd)
            .map_err(|e| self.refusal(local_path, &rel, e))?;
        let existing = dir
            .entry_kind(&name)
            .map_err(|e| LocalError::Failed(local(local_path, e)))?;
        if existing == Some(EntryKind::Symlink) {
            self.follow_beneath(&rel)
                .map_err(|e| self.refusal(local_path, &rel, e))?;
        }
        Ok(Target {
            dir,
            name,
            existing,
        })
    }

    /// `local_path` relative to the root: as given if relative, the part after the root if
    /// absolute and inside it. Lexical only; the kernel decides the rest when opening.
    fn relative(&self, local_path: &str) -> Result<PathBuf, LocalError> {
        let p = Path::new(local_path);
        if local_path.is_empty() {
            return Err(LocalError::Failed(ClientError::usage(
                "local_path is empty",
            )));
        }
        if !p.is_absolute() {
            return Ok(p.to_owned());
        }
        match p.strip_prefix(&self.path) {
            Ok(rel) => Ok(rel.to_owned()),
            Err(_) => Err(LocalError::Escapes(format!(
                "local_path escapes --local-root {}: {local_path} is an absolute path outside \
                 it (name a file inside it; a relative path is resolved against it)",
                self.path.display()
            ))),
        }
    }

    /// Opens `rel` beneath the root with `flags` (`mode` for `O_CREAT`).
    fn open_beneath(&self, rel: &Path, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        match self.how {
            Resolution::Openat2 => openat2_beneath(self.dir.as_fd(), rel, flags, mode),
            Resolution::Walk => walk_beneath(self.dir.as_fd(), rel, flags, mode),
        }
    }

    /// Checks that `rel`, following symbolic links, stays beneath the root. A link that
    /// dangles inside the root is fine (`ENOENT`): it leads nowhere outside.
    fn follow_beneath(&self, rel: &Path) -> io::Result<()> {
        match self.how {
            Resolution::Openat2 => match openat2_beneath(self.dir.as_fd(), rel, RESOLVE_ONLY, 0) {
                Ok(_) => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                Err(e) => Err(e),
            },
            Resolution::Walk => Err(io::Error::from_raw_os_error(libc::ELOOP)),
        }
    }

    /// The tool error for a failed open of `local_path` (`rel` beneath the root): the rule
    /// it broke when the kernel refused a step out, the I/O error otherwise.
    fn refusal(&self, local_path: &str, rel: &Path, e: io::Error) -> LocalError {
        let root = self.path.display();
        let rule = match (e.raw_os_error(), self.how) {
            (Some(libc::EXDEV), _) if climbs_out(rel) => "climbs out of it through `..`",
            (Some(libc::EXDEV), _) => {
                "goes through a symbolic link that leads out of it (absolute, or climbing \
                 above it)"
            }
            (Some(libc::ELOOP), Resolution::Openat2) => {
                "goes through a symbolic link that cannot be followed beneath it (a loop, or \
                 a /proc magic link)"
            }
            (Some(libc::ELOOP), Resolution::Walk) => {
                "goes through a symbolic link, and this kernel lacks openat2, so no symbolic \
                 link is followed beneath it"
            }
            _ => return LocalError::Failed(local(local_path, e)),
        };
        LocalError::Escapes(format!(
            "local_path escapes --local-root {root}: {local_path} {rule}"
        ))
    }
}

/// Whether `rel`'s `..` components, taken lexically, climb above its start.
fn climbs_out(rel: &Path) -> bool {
    let mut depth: i64 = 0;
    for c in rel.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

fn exdev() -> io::Error {
    io::Error::from_raw_os_error(libc::EXDEV)
}

fn local(local_path: &str, e: io::Error) -> ClientError {
    ClientError::local(format!("{local_path}: {e}"))
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The fd a libc call returned, or its error.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of open/openat/openat2 is a new fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Open flags that only resolve a path (`O_PATH`), for checking where a link leads.
#[cfg(target_os = "linux")]
const RESOLVE_ONLY: libc::c_int = libc::O_PATH;
#[cfg(not(target_os = "linux"))]
const RESOLVE_ONLY: libc::c_int = libc::O_RDONLY;

/// `struct open_how` of `linux/openat2.h` (libc's is `non_exhaustive`).
#[cfg(target_os = "linux")]
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(root, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: the kernel refuses
/// (`EXDEV`) any step of the resolution that would leave `root`, `ELOOP` for a magic link.
#[cfg(target_os = "linux")]
fn openat2_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let c = c_path(rel)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: a valid directory fd, a NUL-terminated path and an `open_how` of the size
        // passed, all outliving the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        match owned(r) {
            // EAGAIN: a concurrent rename or mount made the kernel give up to stay safe.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => continue,
            other => return other,
        }
    }
}

/// openat2 is Linux's: elsewhere the component walk is used.
#[cfg(not(target_os = "linux"))]
fn openat2_beneath(_: BorrowedFd<'_>, _: &Path, _: libc::c_int, _: u32) -> io::Result<OwnedFd> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// Opens `rel` beneath `root` one component at a time, without openat2: every directory with
/// `O_NOFOLLOW | O_DIRECTORY`, the last component with `O_NOFOLLOW`; `..` is refused
/// (`EXDEV`) and a symbolic link anywhere fails (`ELOOP`).
fn walk_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(exdev());
            }
        }
    }
    let last = names.pop();
    let mut at: Option<OwnedFd> = None;
    for n in names {
        let dir = openat(
            at.as_ref().map_or(root, |f| f.as_fd()),
            n.as_ref(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        at = Some(dir);
    }
    let parent = at.as_ref().map_or(root, |f| f.as_fd());
    match last {
        Some(n) => openat(parent, n.as_ref(), flags | libc::O_NOFOLLOW, mode),
        None => openat(parent, Path::new("."), flags, mode),
    }
}

/// `openat(at, name, flags | O_CLOEXEC, mode)`, reporting a symbolic link met with
/// `O_NOFOLLOW` as `ELOOP` (with `O_DIRECTORY` some kernels say `ENOTDIR`).
fn openat(at: BorrowedFd<'_>, name: &Path, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let c = c_path(name)?;
    // SAFETY: a valid directory fd and a NUL-terminated string that outlive the call.
    let r = unsafe {
        libc::openat(
            at.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    match owned(libc::c_long::from(r)) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink(at, &c) => {
            Err(io::Error::from_raw_os_error(libc::ELOOP))
        }
        other => other,
    }
}

fn is_symlink(at: BorrowedFd<'_>, name: &CString) -> bool {
    // SAFETY: `stat` is plain data; all-zero is a valid value that fstatat overwrites.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid directory fd, a NUL-terminated string and a live `stat` buffer.
    let r = unsafe {
        libc::fstatat(
            at.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

#[cfg(test)]
mod tests;
