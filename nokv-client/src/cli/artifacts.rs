//! Artifact commands: publish and restore, and streaming an artifact for `get`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use nokv_client::publish::PublishOptions;
use nokv_client::{Client, ClientError};
use serde_json::json;

use super::crash_point;
use super::output::{
    Output, TextCheck, binary_to_terminal, entry_human, entry_json, human_bytes, plural,
};
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

/// A publish that failed in transit (no answer, the server unavailable) can be run again; say
/// what a rerun does, which depends on whether it names a receipt. Other failures (a refusal,
/// a bad file) would fail the same way again, so they get no hint.
fn with_rerun_hint(mut e: ClientError, receipt: Option<&str>) -> ClientError {
    if e.is_transport() || e.is_retryable() {
        let rerun = match receipt {
            Some(r) => format!(
                "run the same command again: it resumes under receipt {r} (blocks the server \
                 recorded are not sent again) or, if the commit was applied, reports it"
            ),
            // Also `nokv put` of a large body, which has no --receipt of its own.
            None => "a publish commits all or nothing: run it again (published with `nokv \
                     publish FILE WS:PATH --receipt ID`, a rerun resumes instead of starting \
                     over)"
                .to_string(),
        };
        e.message = format!("{}; {rerun}", e.message);
    }
    e
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
    let published = published.map_err(|e| with_rerun_hint(e, receipt.as_deref()))?;
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
            "published {t} ({}, {}{resumed}, revision {}, generation {}) at {mib_s:.1} MiB/s\n  sha256 {}",
            human_bytes(entry.size),
            plural(entry.block_count, "block"),
            entry.revision,
            entry.generation,
            hex::encode(&entry.sha256)
        )
    });
    Ok(())
}

/// What `restore` does when DEST exists already (an interrupted restore's `DEST.partial` is
/// not DEST: it is resumed whatever the choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clobber {
    /// The default: refused (exit 2) before anything is downloaded, naming --force.
    Refuse,
    /// `--no-clobber`: nothing is done and the command succeeds (exit 0), saying so.
    Skip,
    /// `--force`: DEST is replaced by the verified restore (atomically, by a rename).
    Replace,
}

/// Whether `dest` is an existing DEST in the sense of [`Clobber`]: anything but a directory
/// (a directory is refused by the restore itself, whatever the choice).
fn dest_exists(dest: &Path) -> bool {
    dest.symlink_metadata().is_ok_and(|m| !m.is_dir())
}

pub async fn restore(
    client: &Client,
    out: Output,
    t: &Target,
    dest: &Path,
    parallel: usize,
    quiet: bool,
    clobber: Clobber,
) -> Result<(), ClientError> {
    // A restore is verified before its file appears (DEST.partial, then a rename); bytes
    // written to stdout cannot be taken back, so `-` is not a file name here but a mistake.
    if dest.as_os_str() == "-" {
        return Err(ClientError::usage(format!(
            "restore writes a file and renames it into place once verified, so it cannot \
             write stdout; `nokv get {t} -` streams the artifact to stdout"
        )));
    }
    if clobber != Clobber::Replace && dest_exists(dest) {
        if clobber == Clobber::Refuse {
            return Err(ClientError::usage(format!(
                "{} exists; pass --force to replace it, or --no-clobber to leave it and \
                 succeed",
                dest.display()
            )));
        }
        out.emit(
            json!({"workspace": t.workspace, "path": t.path, "dest": dest.display().to_string(),
                   "skipped": true}),
            || format!("{} exists; left as it is (--no-clobber)", dest.display()),
        );
        return Ok(());
    }
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
            "skipped": false,
        }),
        || {
            format!(
                "restored {t} -> {} ({}, {} verified{}) at {mib_s:.1} MiB/s",
                dest.display(),
                human_bytes(m.size),
                plural(m.blocks.len() as u64, "block"),
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

/// Stdout as a terminal sees it: the bytes pass through only while they are UTF-8 text (see
/// [`TextCheck`]); the first chunk that is not fails the write, before it is written.
struct TerminalText<W> {
    inner: W,
    check: TextCheck,
    /// Bytes of the caller's current buffer already checked but not yet accepted by `inner`
    /// (a retried write passes the rest of the same buffer: it is not checked twice).
    ahead: usize,
    refused: bool,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for TerminalText<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.ahead == 0 {
            if !this.check.feed(buf) {
                this.refused = true;
                return Poll::Ready(Err(std::io::Error::other("not UTF-8 text")));
            }
            this.ahead = buf.len();
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.ahead = this.ahead.saturating_sub(n);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `nokv get` of an artifact: to a file via an atomic restore, to stdout as a verified
/// stream.
pub async fn get(
    client: &Client,
    out: Output,
    t: &Target,
    dest: Option<PathBuf>,
    force: bool,
) -> Result<(), ClientError> {
    match dest {
        // A file named on the command line is replaced, as for a small file.
        Some(d) if d.as_os_str() != "-" => {
            restore(client, out, t, &d, 4, true, Clobber::Replace).await
        }
        _ if force || !std::io::stdout().is_terminal() => {
            let mut stdout = tokio::io::stdout();
            client
                .read_artifact_to(&t.workspace, &t.path, &mut stdout, 4)
                .await?;
            Ok(())
        }
        _ => {
            let mut stdout = TerminalText {
                inner: tokio::io::stdout(),
                check: TextCheck::default(),
                ahead: 0,
                refused: false,
            };
            match client
                .read_artifact_to(&t.workspace, &t.path, &mut stdout, 4)
                .await
            {
                Err(_) if stdout.refused => Err(binary_to_terminal(&t.to_string())),
                r => r.map(drop),
            }
        }
    }
}
