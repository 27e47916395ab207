//! The open boundary of a metadata file: everything that can go wrong while a redb file is
//! opened becomes one [`MetaError`] naming the file, never a panic.
//!
//! redb treats some impossible-by-construction states as bugs and panics on them (debug
//! builds do so for corrupt pages on purpose). A corrupt file is an operator's problem, not
//! a bug: the panic is caught here, at the boundary, and reported like any other damage. The
//! panic message is kept off stderr for the duration of the call only, and only on the calling
//! thread, so panics elsewhere in the process are reported as usual.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Once;

use super::MetaError;

thread_local! {
    /// True while this thread runs a [`catch_quietly`] closure.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}
static HOOK: Once = Once::new();

/// Refuses a metadata file that is missing or empty: both mean the shard's entries are gone,
/// and opening would silently serve an empty shard.
/// `len` is the file's length as its disk reports it (`None`: no such file).
pub(super) fn require_existing(
    path: &Path,
    len: std::io::Result<Option<u64>>,
) -> Result<(), MetaError> {
    match len {
        Ok(Some(0)) => Err(MetaError::Empty(path.to_path_buf())),
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(MetaError::Missing(path.to_path_buf())),
        Err(e) => Err(MetaError::Damaged {
            path: path.to_path_buf(),
            detail: e.to_string(),
        }),
    }
}

/// Runs `f` (which opens `path`), turning a panic into [`MetaError::Damaged`] for that file.
pub(super) fn guarded<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, MetaError>,
) -> Result<T, MetaError> {
    catch_quietly(f).unwrap_or_else(|panic| {
        Err(MetaError::Damaged {
            path: path.to_path_buf(),
            detail: format!("the store reported an internal inconsistency: {panic}"),
        })
    })
}

/// Runs `f`, catching a panic and returning its message; the panic hook stays silent for
/// this thread meanwhile (it is wrapped once, and delegates to the previous hook otherwise).
fn catch_quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info)
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let out = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    out.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into())
    })
}
