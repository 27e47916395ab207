//! Artifact commands: publish and restore, and streaming an artifact for `get`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nokv_client::publish::PublishOptions;
use nokv_client::{Client, ClientError};
use serde_json::json;

use super::crash_point;
use super::output::{Output, entry_human, entry_json, human_bytes};
use super::progress::Bar;
use super::spool::spool_stdin;
use super::target::Target;

fn rate(bytes: u64, started: Instant) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / started.elapsed().as_secs_f64().max(1e-9)
}

pub async fn publish(
    client: &Client,
    out: Output,
    source: &Path,
    t: &Target,
    parallel: usize,
    quiet: bool,
    receipt: Option<String>,
) -> Result<(), ClientError> {
    // Stdin has no size up front: spool it to a temporary file first (never into memory).
    if source.as_os_str() == "-" {
        let spooled = spool_stdin(&[]).await?;
        return publish_file(client, out, spooled.path(), t, parallel, quiet, receipt).await;
    }
    publish_file(client, out, source, t, parallel, quiet, receipt).await
}

/// Publishes the regular file `file` (streamed in blocks, never held in memory as a whole),
/// under `receipt` when given. The JSON document is the entry plus `sent_blocks`,
/// `resumed_blocks` (recorded by an earlier run of the receipt, not sent again),
/// `already_committed` and `receipt`.
pub async fn publish_file(
    client: &Client,
    out: Output,
    file: &Path,
    t: &Target,
    parallel: usize,
    quiet: bool,
    receipt: Option<String>,
) -> Result<(), ClientError> {
    let size = std::fs::metadata(file)
        .map_err(|e| ClientError::local(format!("{}: {e}", file.display())))?
        .len();
    let bar = Bar::new(size, quiet, out.json, "publish");
    let started = Instant::now();
    let published = client
        .publish(
            &t.workspace,
            &t.path,
            file,
            PublishOptions {
                parallel,
                progress: crash_point::arm(bar.callback()),
                receipt: receipt.clone(),
            },
        )
        .await;
    bar.finish();
    let published = published?;
    let entry = &published.entry;
    let mib_s = rate(size, started);
    let mut doc = entry_json(entry);
    doc["mib_per_s"] = json!(mib_s);
    doc["sent_blocks"] = json!(published.sent_blocks);
    doc["resumed_blocks"] = json!(published.resumed_blocks);
    doc["already_committed"] = json!(published.already_committed);
    doc["receipt"] = json!(receipt);
    out.emit(doc, || {
        if published.already_committed {
            return format!(
                "already published under receipt {}; nothing was sent\n{}",
                receipt.as_deref().unwrap_or_default(),
                entry_human(entry)
            );
        }
        let resumed = if published.resumed_blocks > 0 {
            format!(
                ", resumed: {} sent, {} already recorded",
                published.sent_blocks, published.resumed_blocks
            )
        } else {
            String::new()
        };
        format!(
            "published {t} ({}, {} blocks{resumed}, revision {}, generation {}) at {mib_s:.1} MiB/s\n  sha256 {}",
            human_bytes(entry.size),
            entry.block_count,
            entry.revision,
            entry.generation,
            hex::encode(&entry.sha256)
        )
    });
    Ok(())
}

pub async fn restore(
    client: &Client,
    out: Output,
    t: &Target,
    dest: &Path,
    parallel: usize,
    quiet: bool,
) -> Result<(), ClientError> {
    let size = client.manifest(&t.workspace, &t.path).await?.size;
    let bar = Bar::new(size, quiet, out.json, "restore");
    let started = Instant::now();
    let r = client
        .restore(&t.workspace, &t.path, dest, parallel, bar.callback())
        .await;
    bar.finish();
    let r = r?;
    let mib_s = rate(size, started);
    let m = &r.manifest;
    out.emit(
        json!({
            "workspace": t.workspace, "path": t.path, "dest": dest.display().to_string(),
            "size": m.size, "sha256": hex::encode(&m.sha256), "revision": m.revision,
            "block_count": m.blocks.len(), "resumed_blocks": r.resumed_blocks, "mib_per_s": mib_s,
        }),
        || {
            format!(
                "restored {t} -> {} ({}, {} blocks verified{}) at {mib_s:.1} MiB/s",
                dest.display(),
                human_bytes(m.size),
                m.blocks.len(),
                if r.resumed_blocks > 0 {
                    format!(", {} resumed", r.resumed_blocks)
                } else {
                    String::new()
                }
            )
        },
    );
    Ok(())
}

/// `nokv get` of an artifact: to a file via an atomic restore, to stdout as a verified
/// stream.
pub async fn get(
    client: &Client,
    out: Output,
    t: &Target,
    dest: Option<PathBuf>,
) -> Result<(), ClientError> {
    match dest {
        Some(d) if d.as_os_str() != "-" => restore(client, out, t, &d, 4, true).await,
        _ => {
            let mut stdout = tokio::io::stdout();
            client
                .read_artifact_to(&t.workspace, &t.path, &mut stdout, 4)
                .await?;
            Ok(())
        }
    }
}
