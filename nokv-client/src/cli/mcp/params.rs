//! The input of every MCP tool: these types are the JSON schemas a model sees, so their doc
//! comments are written for a model (what a field means and when to set it), not for Rust
//! readers. Unknown fields are refused, so a misspelt argument fails loudly instead of being
//! ignored.
//!
//! Every tool names its workspace in an optional `workspace` field. When `nokv mcp` runs with
//! `--workspace`, the field is removed from the published schemas (see `pin_workspace` in the
//! parent module) and a call naming another workspace is refused.

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the file or artifact inside the workspace, e.g. `src/main.rs`.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the small file to read. Artifacts (large files) cannot be read here: use
    /// nokv_restore to copy one to a local file.
    pub path: String,
    /// Lines to skip from the start of the file (0-based line index of the first line
    /// returned). Default 0.
    pub offset: Option<u64>,
    /// Most lines to return. Default: every line from `offset` on.
    pub limit: Option<u64>,
}

/// How `nokv_write` treats an existing file.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// Create the file or replace whatever is there.
    Upsert,
    /// Create the file; fail with AlreadyExists if the path exists.
    CreateOnly,
    /// Replace the file only if its current generation equals `if_generation` (0: only if it
    /// does not exist); otherwise fail with GenerationMismatch.
    IfGeneration,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the small file to write; parent directories need not exist.
    pub path: String,
    /// The whole new content of the file (UTF-8 text, at most 256 KiB; larger files go through
    /// nokv_publish).
    pub content: String,
    /// `upsert` (default), `create_only`, or `if_generation` (optimistic concurrency: pass the
    /// generation nokv_stat or nokv_read returned). Omitted with `if_generation` given: mode
    /// `if_generation`.
    pub mode: Option<WriteMode>,
    /// The generation the file must have for mode `if_generation` (0: it must not exist).
    pub if_generation: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the small file to edit.
    pub path: String,
    /// Exact text to replace. It must occur exactly once in the file: include enough
    /// surrounding lines to make it unique. Zero or several occurrences fail with MatchCount.
    pub old: String,
    /// Replacement text (may be empty, to delete `old`).
    pub new: String,
    /// Apply the edit only if the file still has this generation (from nokv_read/nokv_stat);
    /// otherwise fail with GenerationMismatch. Omit to edit whatever version is current.
    pub expected_generation: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the small file to append to; created if missing.
    pub path: String,
    /// Text to append as is (add the trailing newline yourself for line-oriented files).
    /// Concurrent appends never interleave within one call's text.
    pub content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Only paths starting with this prefix, e.g. `src/`. Default: every path.
    pub prefix: Option<String>,
    /// Entries per page, 1-1000. Default 100.
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page, to continue a listing.
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Glob over whole paths: `*` and `?` stay within one path segment, `**` spans segments,
    /// e.g. `**/*.rs` or `docs/*.md`.
    pub glob: String,
    /// Paths per page, 1-1000. Default 100.
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page, to continue.
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Regular expression (Rust `regex` syntax: no backreferences or lookaround), matched
    /// against each line of each small file (and of each artifact with include_artifacts).
    pub regex: String,
    /// Only files whose path matches this glob, e.g. `**/*.py`. Default: every file.
    pub path_glob: Option<String>,
    /// Stop after this many matching lines, 1-10000. Default 100.
    pub max_matches: Option<u32>,
    /// Lines of context to return before and after each match, 0-10. Default 0.
    pub context_lines: Option<u32>,
    /// Match case-insensitively. Default false.
    pub ignore_case: Option<bool>,
    /// Also search artifacts (large files), after the small files; slower, since their bytes
    /// come from object storage. Default false: they are skipped.
    pub include_artifacts: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the file or artifact to delete.
    pub path: String,
    /// Delete only if the entry still has this generation (>= 1); otherwise fail with
    /// GenerationMismatch. Omit to delete unconditionally.
    pub if_generation: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Destination path of the artifact inside the workspace.
    pub path: String,
    /// The local file to upload, on the machine running `nokv mcp`: relative to the server's
    /// local root directory (by default the one it started in), or absolute inside it.
    /// Paths leading out of the root (`..` above it, a symbolic link out) are refused.
    pub local_path: String,
    /// Names this publication (1-128 printable ASCII characters). Default: derived from the
    /// workspace, path, local file and its size and modification time — so calling again with
    /// the same arguments after a failure resumes the interrupted upload (only missing blocks
    /// are sent), and after success sends nothing. Set it only to control resumption yourself.
    pub receipt: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
    /// Path of the artifact inside the workspace.
    pub path: String,
    /// Local destination file on the machine running `nokv mcp`, relative to the server's
    /// local root directory (by default the one it started in) or absolute inside it;
    /// written atomically once every block verified. Its directory must exist.
    pub local_path: String,
    /// Replace `local_path` if a file is already there (default false: an existing file is
    /// refused with LocalRefused and left untouched).
    pub overwrite: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthArgs {
    /// The workspace (a top-level namespace of files). Omit it when the server was started
    /// with --workspace: it is fixed then, and another one is refused.
    pub workspace: Option<String>,
}
