//! Small-file commands: put, get, stat, ls, rm, and admin health.

use std::io::{Read, Write};
use std::path::PathBuf;

use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::json;

use super::output::{Output, entry_human, entry_json, human_bytes, kind_name};
use super::target::Target;

fn is_stdio(p: &Option<PathBuf>) -> bool {
    p.as_ref().is_none_or(|p| p.as_os_str() == "-")
}

fn read_source(file: &Option<PathBuf>) -> Result<Vec<u8>, ClientError> {
    let mut data = Vec::new();
    match file {
        Some(p) if !is_stdio(file) => {
            data =
                std::fs::read(p).map_err(|e| ClientError::local(format!("{}: {e}", p.display())))?
        }
        _ => {
            std::io::stdin()
                .read_to_end(&mut data)
                .map_err(|e| ClientError::local(format!("stdin: {e}")))?;
        }
    }
    Ok(data)
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
    let data = read_source(&file)?;
    let (mode, if_generation) = match (create_only, if_generation) {
        (true, _) => (pb::WriteMode::CreateOnly, 0),
        (false, Some(g)) => (pb::WriteMode::IfGeneration, g),
        (false, None) => (pb::WriteMode::Upsert, 0),
    };
    let e = client
        .write(pb::WriteRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            data: data.into(),
            mode: mode as i32,
            if_generation,
            request_id: request_id.unwrap_or_default(),
        })
        .await?;
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
) -> Result<(), ClientError> {
    let r = client.read(&t.workspace, &t.path).await?;
    let entry = r.entry.unwrap_or_default();
    if entry.kind == pb::EntryKind::Artifact as i32 {
        return super::artifacts::get(client, out, t, file).await;
    }
    if is_stdio(&file) {
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
        || {
            let mut s = entries
                .iter()
                .map(|e| {
                    format!(
                        "{:<8} {:>10} {:>5}  {}",
                        kind_name(e.kind),
                        e.size,
                        e.generation,
                        e.path
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            if !cursor.is_empty() {
                s.push_str(&format!("\n(more: --cursor {cursor})"));
            }
            s
        },
    );
    Ok(())
}

pub async fn rm(
    client: &Client,
    out: Output,
    t: &Target,
    if_generation: Option<u64>,
    request_id: Option<String>,
) -> Result<(), ClientError> {
    let generation = client
        .delete(pb::DeleteRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            if_generation: if_generation.unwrap_or(0),
            request_id: request_id.unwrap_or_default(),
        })
        .await?;
    out.emit(
        json!({"workspace": t.workspace, "path": t.path, "deleted_generation": generation}),
        || format!("deleted {t} (generation {generation})"),
    );
    Ok(())
}

pub async fn health(client: &Client, out: Output) -> Result<(), ClientError> {
    let h = client.health().await?;
    let shards: Vec<_> = h
        .shards
        .iter()
        .map(|s| {
            json!({"shard": s.shard, "owned": s.owned, "entries": s.entries,
                   "open_uploads": s.open_uploads, "guards": s.guards,
                   "serving": s.serving})
        })
        .collect();
    out.emit(
        json!({"status": h.status, "version": h.version, "node": h.node,
               "provider": h.provider, "shard_count": h.shard_count,
               "uptime_ms": h.uptime_ms, "shards": shards}),
        || {
            let entries: u64 = h.shards.iter().map(|s| s.entries).sum();
            format!(
                "{} · nokv-server {} · node {} · provider {} · {} shards · {} entries · up {}s",
                h.status,
                h.version,
                h.node,
                h.provider,
                h.shard_count,
                entries,
                h.uptime_ms / 1000
            )
        },
    );
    Ok(())
}
