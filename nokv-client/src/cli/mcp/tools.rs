//! The tools of `nokv mcp`, one SDK call each (two for `nokv_health`'s fallback). Their names
//! are a contract with agent hosts and their descriptions are what a model reads to choose a
//! tool, so both say when to use the tool and what its errors mean.
//!
//! Every tool answers through [`reply`]: failures become tool errors carrying the typed reason,
//! whatever their source (the daemon, the transport, a bad argument caught here).

use std::path::{Path, PathBuf};

use nokv_client::publish::PublishOptions;
use nokv_client::restore::Destination;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use serde_json::json;

use super::super::agent_ops::{self, grep_json, grep_lines};
use super::super::crash_point;
use super::super::output::{entry_json, human_bytes, kind_name};
use super::local_root::LocalError;
use super::params::*;
use super::receipt;
use super::reply;
use super::{HOST_WRITING_TOOL, NokvMcp};

/// Blocks in flight for a publish or a restore (the CLI's default).
const PARALLEL: usize = 4;

type Answer = Result<CallToolResult, ClientError>;

/// The tool result of `r`: its success, or its error as a tool error.
fn answer(r: Answer) -> CallToolResult {
    r.unwrap_or_else(|e| {
        tracing::debug!(reason = e.reason_name(), error = %e, "tool call failed");
        reply::failed(&e)
    })
}

/// One line naming an entry and the facts a model acts on (size, generation).
fn entry_line(e: &pb::Entry) -> String {
    format!(
        "{} {}:{} ({}, generation {})",
        kind_name(e.kind),
        e.workspace,
        e.path,
        human_bytes(e.size),
        e.generation
    )
}

/// A page of entries as lines, with the continuation cursor when there is one.
fn entries_text(what: &str, entries: &[pb::Entry], next_cursor: &str) -> String {
    let mut s = format!("{} {what}", entries.len());
    for e in entries {
        s.push_str(&format!(
            "\n{:<8} {:>10} gen {:<4} {}",
            kind_name(e.kind),
            e.size,
            e.generation,
            e.path
        ));
    }
    if !next_cursor.is_empty() {
        s.push_str(&format!("\n(more: call again with cursor {next_cursor:?})"));
    }
    s
}

/// The lines `offset..offset+limit` of `text` (line endings kept), and the total line count.
fn line_window(text: &str, offset: u64, limit: Option<u64>) -> (String, u64) {
    let total = text.split_inclusive('\n').count() as u64;
    let take = limit.unwrap_or(u64::MAX);
    let window = text
        .split_inclusive('\n')
        .skip(offset.min(total) as usize)
        .take(take.min(total) as usize)
        .collect();
    (window, total)
}

/// Grep matches as the CLI prints them (`path:N:line`, context `path-N-line`, `--` between
/// groups), then one summary line saying what was scanned and whether the search stopped early.
fn grep_text(matches: &[pb::GrepMatch], summary: &pb::GrepSummary, context: bool) -> String {
    let mut s = grep_lines(matches, context).join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s.push_str(&format!(
        "{} matching line(s); {} file(s), {} scanned",
        matches.len(),
        summary.files_scanned,
        human_bytes(summary.bytes_scanned)
    ));
    if !summary.truncated_by.is_empty() {
        s.push_str(&format!(
            "; stopped early by {} (narrow the regex or path_glob, or raise max_matches)",
            summary.truncated_by
        ));
    }
    s
}

/// When a glob without wildcards came back empty (`nothing` says how), the line that names
/// the glob meaning the directory's contents (see [`agent_ops::directory_glob`]); empty
/// otherwise.
fn directory_hint(nothing: &str, glob: &str) -> String {
    agent_ops::directory_glob(glob).map_or_else(String::new, |dir| {
        format!(
            "\n({nothing} {glob:?}; if it is a directory, everything under it is the glob {dir:?})"
        )
    })
}

#[tool_router(router = tool_router, vis = "pub(super)")]
impl NokvMcp {
    #[tool(
        name = "nokv_stat",
        description = "Show one entry's metadata without its content: kind (file = small text \
            file, artifact = large file), size, sha256, and generation (a counter that grows on \
            every change; pass it to nokv_write/nokv_edit/nokv_delete to act only if nobody \
            changed the entry since). Errors: NotFound if the path does not exist.",
        annotations(read_only_hint = true)
    )]
    async fn stat(&self, Parameters(a): Parameters<StatArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let e = self.client()?.stat(&ws, &a.path).await?;
                Ok(reply::ok(entry_line(&e), entry_json(&e)))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_read",
        description = "Read a small file's text, whole or a window of lines (offset = lines to \
            skip, limit = lines to return): use a window for long files. The first line of the \
            answer names the file's generation and the line range; the file's lines follow. \
            Errors: NotFound; IsArtifact for a large file (use nokv_restore to copy it to a \
            local file instead).",
        annotations(read_only_hint = true)
    )]
    async fn read(&self, Parameters(a): Parameters<ReadArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let r = self.client()?.read(&ws, &a.path).await?;
                let entry = r.entry.unwrap_or_default();
                if entry.kind == pb::EntryKind::Artifact as i32 {
                    return Ok(reply::refused(
                        "IsArtifact",
                        format!(
                            "{ws}:{} is an artifact of {}: its content is not returned inline",
                            a.path,
                            human_bytes(entry.size)
                        ),
                    ));
                }
                let text = String::from_utf8_lossy(&r.data);
                let lossy = matches!(text, std::borrow::Cow::Owned(_));
                let offset = a.offset.map_or(0, |o| o.get());
                let (content, total) = line_window(&text, offset, a.limit.map(|l| l.get()));
                let shown = content.split_inclusive('\n').count() as u64;
                let range = if shown == 0 {
                    format!("no lines shown of {total}")
                } else {
                    format!("lines {}-{} of {total}", offset + 1, offset + shown)
                };
                let header = format!(
                    "{ws}:{} (generation {}, {range}{}):",
                    a.path,
                    entry.generation,
                    if lossy {
                        ", not valid UTF-8: shown lossily"
                    } else {
                        ""
                    }
                );
                Ok(reply::ok(
                    format!("{header}\n{content}"),
                    json!({
                        "entry": entry_json(&entry),
                        "offset": offset,
                        "lines_returned": shown,
                        "total_lines": total,
                        "truncated": offset + shown < total,
                        "lossy": lossy,
                        "content": content,
                    }),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_write",
        description = "Create or replace a small text file with the given content (at most \
            256 KiB; for larger data use nokv_publish). Modes: upsert (default) replaces \
            anything; create_only fails with AlreadyExists if the path exists; if_generation \
            (or just passing if_generation) writes only if the file still has that generation \
            and fails with GenerationMismatch otherwise — use it after reading a file so a \
            concurrent change is not overwritten. To change part of a file prefer nokv_edit.",
        annotations(destructive_hint = true)
    )]
    async fn write(&self, Parameters(a): Parameters<WriteArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let (mode, if_generation) = match (a.mode, a.if_generation.map(|g| g.get())) {
                    (None, None) | (Some(WriteMode::Upsert), None) => (pb::WriteMode::Upsert, 0),
                    (Some(WriteMode::CreateOnly), None) => (pb::WriteMode::CreateOnly, 0),
                    (None | Some(WriteMode::IfGeneration), Some(g)) => {
                        (pb::WriteMode::IfGeneration, g)
                    }
                    (Some(WriteMode::IfGeneration), None) => {
                        return Err(ClientError::usage(
                            "mode if_generation needs if_generation (the generation the file \
                             must have; 0 if it must not exist)",
                        ));
                    }
                    (Some(m), Some(_)) => {
                        return Err(ClientError::usage(format!(
                            "if_generation applies to mode if_generation only, not {m:?}"
                        )));
                    }
                };
                let e = self
                    .client()?
                    .write(pb::WriteRequest {
                        workspace: ws,
                        path: a.path,
                        data: a.content.into_bytes().into(),
                        mode: mode as i32,
                        if_generation,
                        request_id: String::new(),
                    })
                    .await?;
                Ok(reply::ok(
                    format!("wrote {}", entry_line(&e)),
                    entry_json(&e),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_edit",
        description = "Replace exactly one occurrence of `old` with `new` in a small file, \
            atomically on the server (no read-modify-write race). Cheaper and safer than \
            rewriting the file with nokv_write. Errors: MatchCount if `old` occurs 0 times (the \
            text differs from the file: read it again) or more than once (include more \
            surrounding lines to make it unique); GenerationMismatch if if_generation is given \
            and the file changed since; NotFound. Returns the new generation.",
        annotations(destructive_hint = true)
    )]
    async fn edit(&self, Parameters(a): Parameters<EditArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let e = self
                    .client()?
                    .edit(pb::EditRequest {
                        workspace: ws,
                        path: a.path,
                        old: a.old,
                        new: a.new,
                        expected_generation: a.if_generation.map_or(0, |g| g.get()),
                        request_id: String::new(),
                    })
                    .await?;
                Ok(reply::ok(
                    format!("edited {}", entry_line(&e)),
                    entry_json(&e),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_append",
        description = "Append text to a small file atomically, creating it if missing — for \
            logs, journals and notes several agents add to at once (appends never interleave \
            or get lost). Errors: InvalidArgument when the file would grow past the small-file \
            limit (256 KiB).",
        annotations(destructive_hint = false)
    )]
    async fn append(&self, Parameters(a): Parameters<AppendArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let e = self
                    .client()?
                    .append(pb::AppendRequest {
                        workspace: ws,
                        path: a.path,
                        data: a.content.into_bytes(),
                        request_id: String::new(),
                    })
                    .await?;
                Ok(reply::ok(
                    format!("appended to {}", entry_line(&e)),
                    entry_json(&e),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_list",
        description = "List entries (path, kind, size, generation) whose path starts with a \
            prefix, in path order, one page at a time; pass next_cursor back as cursor for the \
            next page. To match patterns like **/*.rs use nokv_find.",
        annotations(read_only_hint = true)
    )]
    async fn list(&self, Parameters(a): Parameters<ListArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let page = self
                    .client()?
                    .list(
                        &ws,
                        a.prefix.as_deref().unwrap_or(""),
                        a.limit.map_or(100, |l| l.get() as u32),
                        a.cursor.as_deref().unwrap_or(""),
                    )
                    .await?;
                Ok(reply::ok(
                    entries_text("entries", &page.entries, &page.next_cursor),
                    json!({
                        "entries": page.entries.iter().map(entry_json).collect::<Vec<_>>(),
                        "next_cursor": page.next_cursor,
                    }),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_find",
        description = "Find entries whose path matches a glob (`*`, `?`, `**` across \
            directories, e.g. `**/*.py`), one page at a time; pass next_cursor back as cursor \
            for the next page. Use it to locate files before reading them. Errors: \
            InvalidArgument for a malformed glob.",
        annotations(read_only_hint = true)
    )]
    async fn find(&self, Parameters(a): Parameters<FindArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let page = self
                    .client()?
                    .find(
                        &ws,
                        &a.glob,
                        a.limit.map_or(0, |l| l.get() as u32),
                        a.cursor.as_deref().unwrap_or(""),
                    )
                    .await?;
                let mut text = entries_text("matching paths", &page.entries, &page.next_cursor);
                if page.entries.is_empty() {
                    text.push_str(&directory_hint("no path is", &a.glob));
                }
                Ok(reply::ok(
                    text,
                    json!({
                        "entries": page.entries.iter().map(entry_json).collect::<Vec<_>>(),
                        "next_cursor": page.next_cursor,
                    }),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_grep",
        description = "Search the workspace's small files for lines matching a regular \
            expression, on the server in one round trip (one consistent snapshot), optionally \
            only in paths matching path_glob and with context lines. Answers grep -n style \
            lines (path:line:text) and says when it stopped early (max_matches, or the \
            server's time/byte budget): narrow the search then. Errors: InvalidArgument for a \
            malformed or too long regex.",
        annotations(read_only_hint = true)
    )]
    async fn grep(&self, Parameters(a): Parameters<GrepArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let context = a.context_lines.map_or(0, |c| c.get() as u32);
                let path_glob = a.path_glob.unwrap_or_default();
                let (matches, summary) = self
                    .client()?
                    .grep(pb::GrepRequest {
                        workspace: ws,
                        regex: a.regex,
                        path_glob: path_glob.clone(),
                        max_matches: a.max_matches.map_or(0, |m| m.get() as u32),
                        context_lines: context,
                        ignore_case: a.ignore_case.unwrap_or(false),
                        include_artifacts: a.include_artifacts.unwrap_or(false),
                    })
                    .await?;
                let mut text = grep_text(&matches, &summary, context > 0);
                if summary.files_scanned == 0 {
                    text.push_str(&directory_hint("no file was searched at", &path_glob));
                }
                Ok(reply::ok(text, grep_json(&matches, &summary)))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_delete",
        description = "Delete a file or artifact. With if_generation it deletes only if the \
            entry still has that generation (GenerationMismatch otherwise). Errors: NotFound.",
        annotations(destructive_hint = true)
    )]
    async fn delete(&self, Parameters(a): Parameters<DeleteArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let generation = self
                    .client()?
                    .delete(pb::DeleteRequest {
                        workspace: ws.clone(),
                        path: a.path.clone(),
                        if_generation: a.if_generation.map_or(0, |g| g.get()),
                        request_id: String::new(),
                    })
                    .await?;
                Ok(reply::ok(
                    format!("deleted {ws}:{} (generation {generation})", a.path),
                    json!({"workspace": ws, "path": a.path, "deleted_generation": generation}),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_publish",
        description = "Upload a local file (any size, e.g. a build output, dataset or \
            checkpoint) as an artifact at `path`, in 4 MiB blocks, verified end to end. Safe to \
            retry: calling again with the same arguments after a failure or interruption \
            resumes the upload and sends only the missing blocks (blocks_sent / blocks_skipped \
            say so); after a success it sends nothing. local_path is confined to the server's \
            local root directory. Errors: OutsideLocalRoot if local_path leads out of it; \
            LocalRefused if it is not a regular file; Local if it cannot be read; \
            QuotaExceeded; RequestIdReused if an explicit receipt was used for another \
            file.",
        annotations(destructive_hint = true)
    )]
    async fn publish(&self, Parameters(a): Parameters<PublishArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let root = match self.local_root("nokv_publish") {
                    Ok(r) => r,
                    Err(refused) => return Ok(refused),
                };
                let file = match root.open_source(&a.local_path) {
                    Ok(f) => f,
                    Err(e) => return local_refusal(e),
                };
                let meta = file
                    .metadata()
                    .map_err(|e| ClientError::local(format!("{}: {e}", a.local_path)))?;
                // Before a byte is read: a device never ends (/dev/zero), a FIFO blocks, a
                // directory is not an artifact.
                if !meta.is_file() {
                    return Ok(reply::refused(
                        reply::LOCAL_REFUSED,
                        format!(
                            "nokv_publish reads regular files only: {} is {}",
                            a.local_path,
                            file_kind(&meta)
                        ),
                    ));
                }
                let shown = Path::new(&a.local_path);
                let receipt = match a.receipt {
                    Some(r) => r,
                    None => {
                        let rel = shown.strip_prefix(root.path()).unwrap_or(shown);
                        receipt::derive(&ws, &a.path, &root.path().join(rel), &meta)
                    }
                };
                let p = self
                    .client()?
                    .publish_open(
                        &ws,
                        &a.path,
                        file,
                        shown,
                        PublishOptions {
                            parallel: PARALLEL,
                            progress: crash_point::arm(None),
                            receipt: Some(receipt.clone()),
                        },
                    )
                    .await?;
                let e = &p.entry;
                let how = if p.already_committed {
                    "already published by an earlier call: nothing sent".to_string()
                } else {
                    format!(
                        "{} block(s) sent, {} already uploaded by an earlier attempt",
                        p.sent_blocks, p.resumed_blocks
                    )
                };
                let mut doc = entry_json(e);
                doc["blocks_sent"] = json!(p.sent_blocks);
                doc["blocks_skipped"] = json!(p.resumed_blocks);
                doc["already_committed"] = json!(p.already_committed);
                doc["receipt"] = json!(receipt);
                Ok(reply::ok(
                    format!(
                        "published {} from {} ({how}); revision {}, sha256 {}",
                        entry_line(e),
                        a.local_path,
                        e.revision,
                        hex::encode(&e.sha256)
                    ),
                    doc,
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_restore",
        description = "Download an artifact into a local file, every block verified against \
            its recorded checksum and the whole file against its sha256; the destination \
            appears only once complete (an interrupted \
            restore resumes when called again). Does not change the workspace; writes a file on \
            this machine, inside the server's local root directory, and refuses to replace an \
            existing one unless overwrite is true. Errors: NotFound; OutsideLocalRoot if \
            local_path leads out of the local root; LocalRefused if the destination exists; \
            Local if it cannot be written.",
        annotations(read_only_hint = true)
    )]
    async fn restore(&self, Parameters(a): Parameters<RestoreArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace(a.workspace)?;
                let root = match self.local_root(HOST_WRITING_TOOL) {
                    Ok(r) => r,
                    Err(refused) => return Ok(refused),
                };
                let target = match root.target(&a.local_path) {
                    Ok(t) => t,
                    Err(e) => return local_refusal(e),
                };
                if !a.overwrite.unwrap_or(false) && target.existing.is_some() {
                    return Ok(reply::refused(
                        reply::LOCAL_REFUSED,
                        format!(
                            "nokv_restore never replaces an existing file unless the call says \
                             overwrite: true: {} exists and was left untouched",
                            a.local_path
                        ),
                    ));
                }
                let dest =
                    Destination::in_dir(target.dir, target.name, PathBuf::from(&a.local_path))?;
                let r = self
                    .client()?
                    .restore_to(&ws, &a.path, &dest, PARALLEL, None)
                    .await?;
                let m = &r.manifest;
                Ok(reply::ok(
                    format!(
                        "restored {ws}:{} -> {} ({}, {} verified, revision {})",
                        a.path,
                        a.local_path,
                        human_bytes(m.size),
                        crate::cli::output::plural(m.blocks.len() as u64, "block"),
                        m.revision
                    ),
                    json!({
                        "workspace": ws, "path": a.path, "local_path": a.local_path,
                        "size": m.size, "sha256": hex::encode(&m.sha256),
                        "revision": m.revision, "block_count": m.blocks.len(),
                        "resumed_blocks": r.resumed_blocks,
                    }),
                ))
            }
            .await,
        )
    }

    #[tool(
        name = "nokv_health",
        description = "Check that the nokv server is reachable and serving. With an admin \
            token: the node's health (status, shards, uptime). Otherwise: a connectivity and \
            access check of the workspace (its route: shard and owner endpoint). `check` in the \
            answer says which was done. Use it when other tools fail with Transport or \
            Unavailable.",
        annotations(read_only_hint = true)
    )]
    async fn health(&self, Parameters(a): Parameters<HealthArgs>) -> CallToolResult {
        answer(
            async {
                let ws = self.workspace_if_any(a.workspace)?;
                match self.client()?.health().await {
                    Ok(h) => Ok(admin_health(&h)),
                    Err(e) if e.is("PermissionDenied") => match ws {
                        Some(ws) => route_check(self.client()?, &ws).await,
                        None => Err(ClientError {
                            message: format!(
                                "{}; the token is not an admin token: name a workspace to \
                                 check connectivity and access to it instead",
                                e.message
                            ),
                            ..e
                        }),
                    },
                    Err(e) => Err(e),
                }
            }
            .await,
        )
    }
}

fn admin_health(h: &pb::HealthResponse) -> CallToolResult {
    reply::ok(
        format!(
            "{} (admin health): node {}, version {}, {} shards, provider {}, up {} s",
            h.status,
            h.node,
            h.version,
            h.shard_count,
            h.provider,
            h.uptime_ms / 1000
        ),
        json!({
            "check": "admin_health", "status": h.status, "node": h.node,
            "version": h.version, "shard_count": h.shard_count, "provider": h.provider,
            "uptime_ms": h.uptime_ms, "dead_letters": h.dead_letters,
        }),
    )
}

/// The check a non-admin token can make: the server answers and the token reads `ws`.
async fn route_check(client: &Client, ws: &str) -> Answer {
    let r = client.route(ws).await?;
    Ok(reply::ok(
        format!(
            "reachable (route check; the token is not an admin token): workspace {ws} is \
             readable, served by shard {} at {}",
            r.shard, r.endpoint
        ),
        json!({
            "check": "route", "workspace": ws, "shard": r.shard,
            "endpoint": r.endpoint, "epoch": r.epoch,
        }),
    ))
}

/// The tool answer for a local path that was not opened: an escape from the root is refused
/// with its rule (`OutsideLocalRoot`); any other failure is the call's error.
fn local_refusal(e: LocalError) -> Answer {
    match e {
        LocalError::Escapes(message) => Ok(reply::refused(reply::OUTSIDE_LOCAL_ROOT, message)),
        LocalError::Failed(e) => Err(e),
    }
}

/// What a file that is not a regular file is, in words.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}
