//! How a tool answers. Success: a concise text for the model plus the same facts as structured
//! content (the entry or match JSON the CLI's `--json` prints). Failure: a *tool* error
//! (`isError: true`) whose text starts with the typed reason (`GenerationMismatch`,
//! `NotFound`, `MatchCount`, `PermissionDenied`, ...) and whose structured content is
//! `{"error": {"reason", "message", "hint"}}` — never a JSON-RPC error, which hosts show to
//! the user opaquely instead of to the model that could act on it.

use nokv_client::ClientError;
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
    error(reason, msg)
}

fn error(reason: &str, message: &str) -> CallToolResult {
    let hint = hint(reason);
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

/// What a model should do about a reason, for the reasons a tool loop meets and can act on.
fn hint(reason: &str) -> Option<&'static str> {
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
        "PermissionDenied" => {
            "the token does not allow this on this workspace: use a workspace the token \
             covers, or ask the operator for a token with the needed role"
        }
        "Unauthenticated" => "the token is missing, expired or invalid: ask the operator",
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
        "Transport" | "Unavailable" => {
            "the server could not be reached and the outcome is unknown: check with nokv_stat \
             or nokv_read before repeating a write, edit, append or delete (nokv_publish can \
             always be repeated: it resumes)"
        }
        _ => return None,
    })
}
