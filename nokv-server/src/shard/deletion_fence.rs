//! The check of a workspace's deletion fence, which every mutation of a workspace makes in
//! its own write session. [`super::workspaces`] sets the fence; the mutation modules (quota,
//! files, edit, sequencer, receipts) check it. It sits in its own module, below all of them,
//! because deletion releases bytes through the quota's accounting while the quota's own
//! mutation checks the fence: kept in `workspaces.rs`, the two imported each other.

use crate::error::{Error, Result};
use crate::meta::{WorkspaceState, WriteView};

/// The deletion fence: refuses a mutation of a workspace being deleted. Called inside the
/// mutation's own write session, after authorization and replay, so a mutation either
/// committed before the fence (and is released by the deletion) or is refused.
pub(crate) fn require_not_deleting(w: &WriteView, ws: &str) -> Result<()> {
    match w.workspace(ws)? {
        Some(rec) if rec.state == WorkspaceState::Deleting as i32 => {
            Err(Error::FailedPrecondition(format!(
                "workspace {ws:?} is being deleted; its name can be used again once the deletion completes"
            )))
        }
        _ => Ok(()),
    }
}
