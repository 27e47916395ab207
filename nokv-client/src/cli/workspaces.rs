//! `nokv workspace ...`: commands on a whole workspace.

use clap::Subcommand;
use nokv_client::sdk::new_request_id;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::json;

use super::output::{Output, plural};

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// Delete a workspace: every entry and artifact in it, and its open uploads. Mutations
    /// of it are refused from the moment the deletion starts; once it completes, the name
    /// can be used again as a fresh, empty workspace. Needs --yes.
    #[command(after_help = "Examples:\n  nokv workspace delete scratch --yes")]
    Delete {
        /// The workspace to delete (its name alone, no `:`).
        workspace: String,
        /// Confirm the deletion (without it nothing is sent and the command exits 2).
        #[arg(long)]
        yes: bool,
        /// Request id: resending with the id the deletion was first sent with never deletes
        /// again (default: random; printed when the outcome is unknown).
        #[arg(long)]
        request_id: Option<String>,
    },
}

impl WorkspaceCommand {
    /// Refuses, before anything is sent, a destructive command that was not confirmed.
    pub fn confirmed(&self) -> Result<(), ClientError> {
        match self {
            WorkspaceCommand::Delete {
                workspace,
                yes: false,
                ..
            } => Err(ClientError::usage(format!(
                "deleting workspace {workspace:?} removes every entry in it; add --yes to confirm"
            ))),
            WorkspaceCommand::Delete { .. } => Ok(()),
        }
    }
}

pub async fn run(client: &Client, out: Output, cmd: WorkspaceCommand) -> Result<(), ClientError> {
    cmd.confirmed()?;
    match cmd {
        WorkspaceCommand::Delete {
            workspace,
            request_id,
            ..
        } => {
            let request_id = request_id.unwrap_or_else(new_request_id);
            let r = client
                .delete_workspace(pb::DeleteWorkspaceRequest {
                    workspace: workspace.clone(),
                    request_id: request_id.clone(),
                })
                .await
                .map_err(|e| e.with_retry_hint(&request_id))?;
            out.emit(
                json!({"workspace": workspace, "deleted": true,
                       "entries_removed": r.entries_removed,
                       "uploads_ended": r.uploads_ended,
                       "retired_revisions_released": r.retired_revisions_released}),
                || {
                    format!(
                        "deleted workspace {workspace} ({}, {} ended)",
                        plural(r.entries_removed, "entry"),
                        plural(r.uploads_ended, "open upload")
                    )
                },
            );
            Ok(())
        }
    }
}
