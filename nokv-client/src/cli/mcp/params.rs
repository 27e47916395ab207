//! The input of every MCP tool: these types are the JSON schemas a model sees, so their doc
//! comments are written for a model (what a field means and when to set it), not for Rust
//! readers. Unknown fields are refused, so a misspelt argument fails loudly instead of being
//! ignored.
//!
//! Every tool names its workspace in a `workspace` field, `Option` here because the published
//! schema depends on how `nokv mcp` was started (see the parent module): without
//! `--workspace` the field is *required* in every schema; with it, the field is removed and a
//! call naming another workspace is refused.
//!
//! Every numeric argument is a [`Bounded`]: the range a model reads in the schema is the range
//! the arguments are checked against, and both are the daemon's own where the daemon bounds
//! the value (see the [`Bounds`] implementations below).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer};

use nokv_client::sdk::INLINE_MAX;
use nokv_proto::{MAX_GLOB_BYTES, MAX_PATH_BYTES, MAX_REGEX_BYTES};

/// The range of one numeric argument, and the argument's name for the refusal of a value
/// outside it.
pub trait Bounds {
    /// The argument's name in the schema.
    const NAME: &'static str;
    const MIN: u64;
    /// `None`: no maximum but the integer's (2^64 - 1).
    const MAX: Option<u64>;
}

/// A whole number within `B`'s range. Its schema publishes the range (`minimum`, `maximum`)
/// and deserializing refuses a value outside it, a negative or fractional number included, so
/// a model that ignores the schema gets an `InvalidArgument` tool error naming the argument
/// and its range before anything is sent — never a transport failure, never the daemon's
/// default silently standing in for an out-of-range value.
pub struct Bounded<B>(u64, PhantomData<B>);

impl<B> Bounded<B> {
    pub fn get(&self) -> u64 {
        self.0
    }
}

impl<B> fmt::Debug for Bounded<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<B: Bounds> Bounded<B> {
    /// `v` if it is a whole number within `B`'s range; otherwise the refusal, naming the
    /// argument and the range (a string or a fraction included: serde's own message for those
    /// names neither).
    pub fn new(v: &serde_json::Value) -> Result<Self, String> {
        match v.as_u64() {
            Some(n) if n >= B::MIN && B::MAX.is_none_or(|max| n <= max) => {
                Ok(Bounded(n, PhantomData))
            }
            _ => Err(format!("{} must be {}, not {v}", B::NAME, Self::range())),
        }
    }

    /// The range in words, as the refusal states it.
    fn range() -> String {
        match B::MAX {
            Some(max) => format!("an integer from {} to {max}", B::MIN),
            None => format!("an integer of at least {}", B::MIN),
        }
    }
}

impl<'de, B: Bounds> Deserialize<'de> for Bounded<B> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Bounded::new(&v).map_err(serde::de::Error::custom)
    }
}

impl<B: Bounds> JsonSchema for Bounded<B> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        format!("Bounded_{}", B::NAME).into()
    }

    fn schema_id() -> Cow<'static, str> {
        format!("Bounded<{}>", std::any::type_name::<B>()).into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut s = json_schema!({"type": "integer", "minimum": B::MIN});
        if let Some(max) = B::MAX {
            s.insert("maximum".into(), max.into());
        }
        s
    }
}

/// `limit` of nokv_list and nokv_find: the daemon's page size, `LIST_MAX` in
/// nokv-server/src/shard/files.rs (its 0 means "default", which the schema leaves to omission).
pub struct PageLimit;
impl Bounds for PageLimit {
    const NAME: &'static str = "limit";
    const MIN: u64 = 1;
    const MAX: Option<u64> = Some(1000);
}

/// `max_matches` of nokv_grep: `GREP_MAX_MATCHES` in nokv-server/src/shard/search.rs.
pub struct MaxMatches;
impl Bounds for MaxMatches {
    const NAME: &'static str = "max_matches";
    const MIN: u64 = 1;
    const MAX: Option<u64> = Some(10_000);
}

/// `context_lines` of nokv_grep: `GREP_MAX_CONTEXT` in nokv-server/src/shard/search.rs.
pub struct ContextLines;
impl Bounds for ContextLines {
    const NAME: &'static str = "context_lines";
    const MIN: u64 = 0;
    const MAX: Option<u64> = Some(10);
}

/// `offset` of nokv_read: lines to skip (the window is cut here, not by the daemon).
pub struct LineOffset;
impl Bounds for LineOffset {
    const NAME: &'static str = "offset";
    const MIN: u64 = 0;
    const MAX: Option<u64> = None;
}

/// `limit` of nokv_read: lines to return; 0 would return nothing, so it is refused.
pub struct LineLimit;
impl Bounds for LineLimit {
    const NAME: &'static str = "limit";
    const MIN: u64 = 1;
    const MAX: Option<u64> = None;
}

/// `if_generation` of nokv_write: 0 means "only if the file does not exist".
pub struct WriteGeneration;
impl Bounds for WriteGeneration {
    const NAME: &'static str = "if_generation";
    const MIN: u64 = 0;
    const MAX: Option<u64> = None;
}

/// `if_generation` of nokv_edit and nokv_delete: an entry that exists has a generation of at
/// least 1, so 0 could never match (the daemon would read it as "unconditionally").
pub struct EntryGeneration;
impl Bounds for EntryGeneration {
    const NAME: &'static str = "if_generation";
    const MIN: u64 = 1;
    const MAX: Option<u64> = None;
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the file or artifact inside the workspace, e.g. `src/main.rs`.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the small file to read. Artifacts (large files) cannot be read here: use
    /// nokv_restore to copy one to a local file.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
    /// Lines to skip from the start of the file (0-based line index of the first line
    /// returned). Default 0.
    pub offset: Option<Bounded<LineOffset>>,
    /// Most lines to return (at least 1). Default: every line from `offset` on.
    pub limit: Option<Bounded<LineLimit>>,
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
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the small file to write; parent directories need not exist.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
    /// The whole new content of the file (UTF-8 text, at most 256 KiB; larger files go through
    /// nokv_publish).
    // The schema's bound counts characters and the daemon's bytes: a character is at least
    // one byte, so no content the daemon takes is refused by the schema.
    #[schemars(length(max = INLINE_MAX))]
    pub content: String,
    /// `upsert` (default), `create_only`, or `if_generation` (optimistic concurrency: pass the
    /// generation nokv_stat or nokv_read returned). Omitted with `if_generation` given: mode
    /// `if_generation`.
    pub mode: Option<WriteMode>,
    /// Write only if the file still has this generation (from nokv_read/nokv_stat; 0: only
    /// if it does not exist); otherwise fail with GenerationMismatch. Implies mode
    /// `if_generation`.
    pub if_generation: Option<Bounded<WriteGeneration>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the small file to edit.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
    /// Exact text to replace. It must occur exactly once in the file: include enough
    /// surrounding lines to make it unique. Zero or several occurrences fail with MatchCount.
    pub old: String,
    /// Replacement text (may be empty, to delete `old`).
    pub new: String,
    /// Apply the edit only if the file still has this generation (from nokv_read/nokv_stat);
    /// otherwise fail with GenerationMismatch. Omit to edit whatever version is current.
    // `expected_generation` was this field's name before the tools agreed on one name; hosts
    // and prompts written then still send it, so it stays accepted (not advertised: schemars
    // publishes the field's name only). Both at once are refused as a duplicate field.
    #[serde(alias = "expected_generation")]
    pub if_generation: Option<Bounded<EntryGeneration>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the small file to append to; created if missing.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
    /// Text to append as is (add the trailing newline yourself for line-oriented files).
    /// Concurrent appends never interleave within one call's text.
    // Characters, as for nokv_write: the file after the append is what the daemon bounds.
    #[schemars(length(max = INLINE_MAX))]
    pub content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Only paths starting with this prefix, e.g. `src/`. Default: every path.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub prefix: Option<String>,
    /// Entries per page, 1-1000. Default 100.
    pub limit: Option<Bounded<PageLimit>>,
    /// `next_cursor` of the previous page, to continue a listing.
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Glob over whole paths: `*` and `?` stay within one path segment, `**` spans segments,
    /// e.g. `**/*.rs` or `docs/*.md`; a trailing `/` means everything under that directory
    /// (`docs/` is `docs/**`).
    #[schemars(length(max = MAX_GLOB_BYTES))]
    pub glob: String,
    /// Paths per page, 1-1000. Default 100.
    pub limit: Option<Bounded<PageLimit>>,
    /// `next_cursor` of the previous page, to continue.
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Regular expression (Rust `regex` syntax: no backreferences or lookaround), matched
    /// against each line of each small file (and of each artifact with include_artifacts).
    #[schemars(length(max = MAX_REGEX_BYTES))]
    pub regex: String,
    /// Only files whose path matches this glob, e.g. `**/*.py` or `src/` (a trailing `/`:
    /// everything under that directory). Default: every file.
    #[schemars(length(max = MAX_GLOB_BYTES))]
    pub path_glob: Option<String>,
    /// Stop after this many matching lines, 1-10000. Default 100.
    pub max_matches: Option<Bounded<MaxMatches>>,
    /// Lines of context to return before and after each match, 0-10. Default 0.
    pub context_lines: Option<Bounded<ContextLines>>,
    /// Match case-insensitively. Default false.
    pub ignore_case: Option<bool>,
    /// Also search artifacts (large files), after the small files; slower, since their bytes
    /// come from object storage. Default false: they are skipped.
    pub include_artifacts: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the file or artifact to delete.
    #[schemars(length(max = MAX_PATH_BYTES))]
    pub path: String,
    /// Delete only if the entry still has this generation (from nokv_read/nokv_stat; at
    /// least 1); otherwise fail with GenerationMismatch. Omit to delete unconditionally.
    pub if_generation: Option<Bounded<EntryGeneration>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishArgs {
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Destination path of the artifact inside the workspace.
    #[schemars(length(max = MAX_PATH_BYTES))]
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
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
    /// Path of the artifact inside the workspace.
    #[schemars(length(max = MAX_PATH_BYTES))]
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
    /// The workspace (a top-level namespace of files) the call acts on.
    pub workspace: Option<String>,
}
