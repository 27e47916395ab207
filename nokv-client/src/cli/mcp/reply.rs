//! How a tool answers. Success: a concise text for the model plus the same facts as structured
//! content (the entry or match JSON the CLI's `--json` prints). Failure: a *tool* error
//! (`isError: true`) whose text starts with the typed reason (`GenerationMismatch`,
//! `NotFound`, `MatchCount`, `PermissionDenied`, ...) and whose structured content is
//! `{"error": {"reason", "message", "hint"}}` — never a JSON-RPC error, which hosts show to
//! the user opaquely instead of to the model that could act on it.

use nokv_client::{ClientError, Reason};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

/// The reason of a refused write tool in `--read-only` mode.
pub const READ_ONLY: &str = "ReadOnly";
/// The reason of a call refused to protect the files of the machine `nokv mcp` runs on (a
/// restore over an existing file, a publish of something that is not a regular file, either
/// tool under `--local-root none`).
pub const LOCAL_REFUSED: &str = "LocalRefused";
/// The reason of a call whose `local_path` leads out of `nokv mcp --local-root` (an absolute
/// path outside it, `..` above it, a symbolic link leading out); the message names the rule.
pub const OUTSIDE_LOCAL_ROOT: &str = "OutsideLocalRoot";
/// The reason of every tool call of a server started without a usable configuration (no CA,
/// a missing config file, ...); the message names the problem and how to fix it.
pub const NOT_CONFIGURED: &str = "NotConfigured";
/// The reason of a call whose arguments do not fit the tool's schema (a missing `path`, a
/// string where a number goes), like the daemon's for bad input.
pub const INVALID_ARGUMENT: &str = "InvalidArgument";

pub fn ok(text: impl Into<String>, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text.into())]);
    r.structured_content = Some(structured);
    r
}

/// A tool error for a refusal that is this server's own (not the daemon's).
pub fn refused(reason: &str, message: impl Into<String>) -> CallToolResult {
    error(reason, &message.into())
}

pub fn failed(e: &ClientError) -> CallToolResult {
    // The daemon's message starts with the reason already; say it once.
    let reason = e.reason_name();
    let msg = e
        .message
        .strip_prefix(&format!("{reason}: "))
        .unwrap_or(&e.message);
    let hint = hint(reason, e.reason == Reason::Refused);
    error_with(reason, msg, hint)
}

fn error(reason: &str, message: &str) -> CallToolResult {
    error_with(reason, message, hint(reason, false))
}

fn error_with(reason: &str, message: &str, hint: Option<&str>) -> CallToolResult {
    let mut text = format!("{reason}: {message}");
    if let Some(h) = hint {
        text.push_str("\nHint: ");
        text.push_str(h);
    }
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(json!({
        "error": {"reason": reason, "message": message, "hint": hint}
    }));
    r
}

tokio::task_local! {
    /// The tool whose call is running: a hint depends on it (a read can always be repeated).
    static TOOL: String;
}

/// Runs a tool call, making its name known to the hints of its errors.
pub async fn for_tool<F: std::future::Future>(name: &str, call: F) -> F::Output {
    TOOL.scope(name.to_string(), call).await
}

/// What a failed call of a tool did to the workspace, for the hint of a transport failure.
enum Effect {
    /// Reads, or writes only this machine's files (nokv_restore resumes): repeating is safe.
    None,
    /// Publishes under a receipt: repeating resumes and never publishes twice.
    Resumable,
    /// write, edit, append, delete, or an unknown tool: repeating may apply it twice.
    Mutation,
}

fn effect_of_current_tool() -> Effect {
    match TOOL.try_with(|t| t.clone()).ok().as_deref() {
        Some("nokv_stat" | "nokv_read" | "nokv_list" | "nokv_find" | "nokv_grep")
        | Some("nokv_health" | "nokv_restore") => Effect::None,
        Some("nokv_publish") => Effect::Resumable,
        _ => Effect::Mutation,
    }
}

/// What a model should do about a reason, for the reasons a tool loop meets and can act on.
/// The hint matches the failure and the call: a refused connection sent nothing, and only a
/// mutation's transport failure leaves an outcome to check before repeating it.
fn hint(reason: &str, refused: bool) -> Option<&'static str> {
    if refused {
        return Some(
            "no nokv server accepts connections at the endpoint named in the message, so \
             nothing was sent or changed: ask the user to start nokv-server or fix the \
             endpoint in the configuration, then call again",
        );
    }
    Some(match reason {
        "GenerationMismatch" => {
            "the file changed since you read it: read it again (nokv_read or nokv_stat) and \
             retry with its current generation"
        }
        "MatchCount" => {
            "`old` must occur exactly once: read the file, then pass a longer `old` that \
             includes surrounding lines (several matches) or the exact current text (none)"
        }
        "NotFound" => "check the path with nokv_find or nokv_list",
        "AlreadyExists" => "the path exists: use mode upsert or if_generation to replace it",
        "IsArtifact" => {
            "the path is an artifact (a large file), whose content nokv_read does not return: \
             copy it to a local file with nokv_restore, or use nokv_stat for its size and \
             sha256"
        }
        "PermissionDenied" => {
            "the token does not allow this on this workspace (the message says what it \
             covers): use a workspace the token covers, or ask the operator for a token with \
             the needed role"
        }
        "Unauthenticated" => "the token is missing, expired or invalid: ask the operator",
        "Local" => {
            "the failure is on the machine running nokv mcp, not in the workspace: fix the \
             local file named in the message (local_path) and call again; a configuration \
             problem (CA file, config file) is for the user to fix"
        }
        "Usage" => "the call cannot be done as stated: change it as the message says",
        READ_ONLY => "this server was started with --read-only: only reading tools are allowed",
        LOCAL_REFUSED => {
            "the rule in the message protects this machine's files: pass overwrite: true to \
             replace a file you mean to replace, or name a regular file to publish; a server \
             started with --local-root none reads and writes no local file at all"
        }
        OUTSIDE_LOCAL_ROOT => {
            "this server reads and writes local files only inside its --local-root directory \
             (named in the message): pass a path inside it, relative to it or absolute, with \
             no `..` above it and no symbolic link that leads out"
        }
        "QuotaExceeded" => "the workspace is over its byte quota: delete something first",
        "InvalidArgument" => "fix the argument named in the message and call again",
        "Unimplemented" => "the nokv server is older than this tool: it lacks this operation",
        "Transport" | "Unavailable" => match effect_of_current_tool() {
            Effect::None => {
                "the server could not be reached: this call changes nothing in the workspace, \
                 so call it again (nokv_health shows whether the server is back)"
            }
            Effect::Resumable => {
                "the server could not be reached: call nokv_publish again with the same \
                 arguments; it resumes the same upload and never publishes twice"
            }
            Effect::Mutation => {
                "the server could not be reached and the outcome is unknown: check with \
                 nokv_stat or nokv_read before repeating a write, edit, append or delete \
                 (nokv_publish can always be repeated: it resumes)"
            }
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint_in(tool: &str, reason: &str, refused: bool) -> Option<&'static str> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(for_tool(tool, async { hint(reason, refused) }))
    }

    #[test]
    fn only_a_mutation_that_lost_its_answer_is_told_its_outcome_is_unknown() {
        let unknown = "outcome is unknown";
        for tool in ["nokv_write", "nokv_edit", "nokv_append", "nokv_delete"] {
            assert!(hint_in(tool, "Transport", false).unwrap().contains(unknown));
            assert!(!hint_in(tool, "Transport", true).unwrap().contains(unknown));
        }
        for tool in [
            "nokv_read",
            "nokv_stat",
            "nokv_grep",
            "nokv_publish",
            "nokv_restore",
        ] {
            for refused in [false, true] {
                let h = hint_in(tool, "Transport", refused).unwrap();
                assert!(!h.contains(unknown), "{tool}: {h}");
            }
        }
        assert!(
            hint_in("nokv_read", "Transport", true)
                .unwrap()
                .contains("nothing was sent")
        );
    }

    #[test]
    fn is_artifact_local_and_usage_errors_get_hints() {
        for reason in ["IsArtifact", "Local", "Usage"] {
            assert!(hint_in("nokv_read", reason, false).is_some(), "{reason}");
        }
    }
}
