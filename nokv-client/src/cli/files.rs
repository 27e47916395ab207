//! Small-file commands: put, get, stat, ls, rm, and admin health.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use nokv_client::sdk::{INLINE_MAX, new_request_id};
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::json;
use tokio::io::AsyncReadExt;

use super::output::{
    Output, TextCheck, binary_to_terminal, entry_human, entry_json, format_ms, human_bytes,
    kind_name,
};
use super::spool::{Spool, spool};
use super::target::Target;

fn is_stdio(p: &Option<PathBuf>) -> bool {
    p.as_ref().is_none_or(|p| p.as_os_str() == "-")
}

/// Where `put` takes its body from, decided by size: a body within the inline limit is sent
/// in one `Write`; a larger one is published as an artifact, streamed from a file (a stdin
/// body is spooled to a private temporary file first), so no size is ever held in memory as
/// a whole and agents need not care about the limit.
enum Source {
    Inline(Vec<u8>),
    Large(PathBuf, Option<Spool>),
}

async fn read_source(file: &Option<PathBuf>) -> Result<Source, ClientError> {
    let limit = INLINE_MAX as u64;
    match file {
        Some(p) if !is_stdio(file) => {
            let err = |e: std::io::Error| ClientError::local(format!("{}: {e}", p.display()));
            let size = std::fs::metadata(p).map_err(err)?.len();
            if size > limit {
                return Ok(Source::Large(p.clone(), None));
            }
            Ok(Source::Inline(std::fs::read(p).map_err(err)?))
        }
        _ => {
            let mut head = Vec::new();
            let mut stdin = tokio::io::stdin();
            (&mut stdin)
                .take(limit + 1)
                .read_to_end(&mut head)
                .await
                .map_err(|e| ClientError::local(format!("stdin: {e}")))?;
            if head.len() as u64 <= limit {
                return Ok(Source::Inline(head));
            }
            // The same reader goes on: it may hold stdin bytes read ahead of `head`.
            let spool = spool(&head, &mut stdin).await?;
            Ok(Source::Large(spool.path().to_path_buf(), Some(spool)))
        }
    }
}

pub async fn put(
    client: &Client,
    out: Output,
    t: &Target,
    file: Option<PathBuf>,
    create_only: bool,
    if_generation: Option<u64>,
    request_id: Option<String>,
) -> Result<(), ClientError> {
    let data = match read_source(&file).await? {
        Source::Inline(data) => data,
        Source::Large(path, _spool) => {
            if create_only || if_generation.is_some() {
                return Err(ClientError::usage(format!(
                    "the body is larger than the {} inline limit, so it is published as an \
                     artifact, which replaces unconditionally: --create-only and \
                     --if-generation apply to small files only",
                    human_bytes(INLINE_MAX as u64)
                )));
            }
            if request_id.is_some() {
                return Err(ClientError::usage(
                    "--request-id applies to small files only: a body over the inline limit is \
                     published as an artifact, one request id per block",
                ));
            }
            return super::artifacts::publish_file(client, out, &path, t, 4, true, None).await;
        }
    };
    let (mode, if_generation) = match (create_only, if_generation) {
        (true, _) => (pb::WriteMode::CreateOnly, 0),
        (false, Some(g)) => (pb::WriteMode::IfGeneration, g),
        (false, None) => (pb::WriteMode::Upsert, 0),
    };
    let request_id = request_id.unwrap_or_else(new_request_id);
    let e = client
        .write(pb::WriteRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            data: data.into(),
            mode: mode as i32,
            if_generation,
            request_id: request_id.clone(),
        })
        .await
        .map_err(|e| e.with_retry_hint(&request_id))?;
    out.emit(entry_json(&e), || {
        format!(
            "wrote {t} ({}, generation {})",
            human_bytes(e.size),
            e.generation
        )
    });
    Ok(())
}

pub async fn get(
    client: &Client,
    out: Output,
    t: &Target,
    file: Option<PathBuf>,
    force: bool,
) -> Result<(), ClientError> {
    let r = client.read(&t.workspace, &t.path).await?;
    let entry = r.entry.unwrap_or_default();
    if entry.kind == pb::EntryKind::Artifact as i32 {
        return super::artifacts::get(client, out, t, file, force).await;
    }
    if is_stdio(&file) {
        if refuse_on_terminal(std::io::stdout().is_terminal(), force, &r.data) {
            return Err(binary_to_terminal(&t.to_string()));
        }
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&r.data)
            .and_then(|_| stdout.flush())
            .map_err(|e| ClientError::local(format!("stdout: {e}")))?;
        return Ok(());
    }
    let path = file.expect("not stdio");
    std::fs::write(&path, &r.data)
        .map_err(|e| ClientError::local(format!("{}: {e}", path.display())))?;
    out.emit(
        json!({"entry": entry_json(&entry), "dest": path.display().to_string()}),
        || {
            format!(
                "read {t} -> {} ({})",
                path.display(),
                human_bytes(entry.size)
            )
        },
    );
    Ok(())
}

/// `get` to stdout: bytes that are not UTF-8 text are refused when stdout is a terminal,
/// unless `--force`.
fn refuse_on_terminal(terminal: bool, force: bool, data: &[u8]) -> bool {
    if !terminal || force {
        return false;
    }
    let mut check = TextCheck::default();
    !(check.feed(data) && check.complete())
}

pub async fn stat(client: &Client, out: Output, t: &Target) -> Result<(), ClientError> {
    let e = client.stat(&t.workspace, &t.path).await?;
    out.emit(entry_json(&e), || entry_human(&e));
    Ok(())
}

pub async fn ls(
    client: &Client,
    out: Output,
    t: &Target,
    limit: u32,
    cursor: Option<String>,
) -> Result<(), ClientError> {
    let one_page = cursor.is_some();
    let mut cursor = cursor.unwrap_or_default();
    let mut entries = Vec::new();
    loop {
        let page = client.list(&t.workspace, &t.path, limit, &cursor).await?;
        entries.extend(page.entries);
        cursor = page.next_cursor;
        if one_page || cursor.is_empty() {
            break;
        }
    }
    out.emit(
        json!({
            "entries": entries.iter().map(entry_json).collect::<Vec<_>>(),
            "next_cursor": cursor,
        }),
        || ls_text(&entries, &cursor),
    );
    Ok(())
}

/// `ls`'s human text: a header, then one row per entry (size in bytes, modification time in
/// UTC), and the cursor of the next page when one page was asked for.
fn ls_text(entries: &[pb::Entry], cursor: &str) -> String {
    let mut s = format!(
        "{:<8} {:>12} {:>10}  {:<23}  PATH",
        "KIND", "SIZE", "GENERATION", "MODIFIED"
    );
    for e in entries {
        s.push_str(&format!(
            "\n{:<8} {:>12} {:>10}  {:<23}  {}",
            kind_name(e.kind),
            e.size,
            e.generation,
            format_ms(e.modified_ms),
            e.path
        ));
    }
    if entries.is_empty() {
        s.push_str("\n(no entries)");
    }
    if !cursor.is_empty() {
        s.push_str(&format!("\n(more: --cursor {cursor})"));
    }
    s
}

pub async fn rm(
    client: &Client,
    out: Output,
    t: &Target,
    if_generation: Option<u64>,
    request_id: Option<String>,
) -> Result<(), ClientError> {
    let request_id = request_id.unwrap_or_else(new_request_id);
    let generation = client
        .delete(pb::DeleteRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            if_generation: if_generation.unwrap_or(0),
            request_id: request_id.clone(),
        })
        .await
        .map_err(|e| e.with_retry_hint(&request_id))?;
    out.emit(
        json!({"workspace": t.workspace, "path": t.path, "deleted_generation": generation}),
        || format!("deleted {t} (generation {generation})"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_refuses_binary_bytes_only_on_a_terminal_and_only_without_force() {
        let binary = [0x89, b'P', b'N', b'G', 0xff, 0];
        assert!(refuse_on_terminal(true, false, &binary));
        assert!(!refuse_on_terminal(true, true, &binary), "--force");
        assert!(
            !refuse_on_terminal(false, false, &binary),
            "a pipe or a file"
        );
        assert!(
            !refuse_on_terminal(true, false, "héllo\n".as_bytes()),
            "text"
        );
        assert!(!refuse_on_terminal(true, false, b""), "nothing");
    }

    #[test]
    fn ls_text_starts_with_a_header_naming_each_column() {
        let e = pb::Entry {
            path: "notes/a.md".into(),
            kind: pb::EntryKind::File as i32,
            size: 12,
            generation: 3,
            ..Default::default()
        };
        let text = ls_text(&[e], "");
        let mut lines = text.lines();
        let header = lines.next().unwrap();
        for column in ["KIND", "SIZE", "GENERATION", "MODIFIED", "PATH"] {
            assert!(header.contains(column), "{header}");
        }
        let row = lines.next().unwrap();
        assert!(
            row.starts_with("file") && row.ends_with("notes/a.md"),
            "{row}"
        );
        // The columns line up: the path starts where the header's PATH does.
        assert_eq!(row.find("notes/a.md"), header.find("PATH"), "{text}");
        assert!(ls_text(&[], "").contains("(no entries)"));
    }
}
