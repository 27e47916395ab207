//! Publishing an artifact: the file is streamed once, in blocks, with several blocks in
//! flight; the whole-body sha256 is computed during that same pass and declared at commit
//! (the only SHA-256 pass: each block carries a CRC-32C).
//! Memory is bounded by `parallel` blocks. Every call carries its own request id and is
//! retried with that id, so a lost response never publishes twice or loses a block.
//!
//! While blocks are in flight the upload's lease is renewed every third of its length; a
//! renewal failure stops the publish with that failure's reason and nothing is committed.

use std::collections::HashSet;
use std::io::SeekFrom;
use std::sync::Arc;
use std::time::Duration;

use nokv_proto::block_checksum;
use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::error::ClientError;
use crate::receipt;
use crate::sdk::{Client, Result, new_request_id, unary};

/// Called with the number of bytes just accounted for (read and sent).
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

#[derive(Clone)]
pub struct PublishOptions {
    /// Blocks in flight at once (default 4).
    pub parallel: usize,
    pub progress: Option<Progress>,
    /// A stable receipt naming this logical publication: rerunning the publish after a
    /// failure resumes the receipt's open upload (only missing blocks are sent), and after
    /// a commit answers the committed entry without writing anything (the SDK's `receipt`
    /// module says how).
    /// `None` (the default): every publish is a new upload.
    pub receipt: Option<String>,
}

impl Default for PublishOptions {
    fn default() -> Self {
        PublishOptions {
            parallel: 4,
            progress: None,
            receipt: None,
        }
    }
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub entry: pb::Entry,
    /// Blocks sent by this run.
    pub sent_blocks: u32,
    /// Blocks the resumed receipt upload had recorded already: not sent again.
    pub resumed_blocks: u32,
    /// The receipt's publication was committed by an earlier run: nothing was sent.
    pub already_committed: bool,
}

impl Client {
    /// Publishes a local file as `ws:path`.
    pub async fn publish_file(
        &self,
        ws: &str,
        path: &str,
        file: &std::path::Path,
        opts: PublishOptions,
    ) -> Result<pb::Entry> {
        Ok(self.publish(ws, path, file, opts).await?.entry)
    }

    /// Publishes a local file as `ws:path` and says what was sent. With a receipt the file
    /// is hashed first (its sha256 is part of the receipt's identity).
    pub async fn publish(
        &self,
        ws: &str,
        path: &str,
        file: &std::path::Path,
        opts: PublishOptions,
    ) -> Result<Published> {
        let f = std::fs::File::open(file)
            .map_err(|e| ClientError::local(format!("{}: {e}", file.display())))?;
        self.publish_open(ws, path, f, file, opts).await
    }

    /// [`Client::publish`] of a file opened by the caller (`shown` names it in messages):
    /// every byte hashed and sent comes through this one handle, so the caller decides, once,
    /// which file is read (`nokv mcp --local-root` opens it beneath its root). Reading starts
    /// at the file's beginning whatever its current offset.
    pub async fn publish_open(
        &self,
        ws: &str,
        path: &str,
        file: std::fs::File,
        shown: &std::path::Path,
        opts: PublishOptions,
    ) -> Result<Published> {
        let local = |e: std::io::Error| ClientError::local(format!("{}: {e}", shown.display()));
        let mut f = tokio::fs::File::from_std(file);
        let declared = match &opts.receipt {
            Some(_) => {
                f.seek(SeekFrom::Start(0)).await.map_err(local)?;
                Some(receipt::reader_sha256(&mut f).await.map_err(local)?)
            }
            None => None,
        };
        f.seek(SeekFrom::Start(0)).await.map_err(local)?;
        let size = f.metadata().await.map_err(local)?.len();
        self.publish_source(ws, path, f, size, declared, opts).await
    }

    /// Publishes exactly `size` bytes read from `reader`. A receipt needs the source's
    /// sha256 before the upload begins: use [`Client::publish`] for one.
    pub async fn publish_reader<R: AsyncRead + Unpin>(
        &self,
        ws: &str,
        path: &str,
        reader: R,
        size: u64,
        opts: PublishOptions,
    ) -> Result<pb::Entry> {
        if opts.receipt.is_some() {
            return Err(ClientError::usage(
                "a receipt needs the source's sha256 before the upload begins: publish a file",
            ));
        }
        Ok(self
            .publish_source(ws, path, reader, size, None, opts)
            .await?
            .entry)
    }

    /// The publish itself; `declared` is the source's sha256 when publishing under a receipt.
    async fn publish_source<R: AsyncRead + Unpin>(
        &self,
        ws: &str,
        path: &str,
        mut reader: R,
        size: u64,
        declared: Option<Vec<u8>>,
        opts: PublishOptions,
    ) -> Result<Published> {
        let begin_req = pb::BeginUploadRequest {
            workspace: ws.into(),
            path: path.into(),
            size,
            request_id: new_request_id(),
            receipt: opts.receipt.clone().unwrap_or_default(),
            sha256: declared.clone().unwrap_or_default(),
        };
        let begin = unary!(self, begin_upload, begin_req)?;
        if let Some(entry) = begin.committed {
            return Ok(Published {
                entry,
                sent_blocks: 0,
                resumed_blocks: 0,
                already_committed: true,
            });
        }
        let resumed_blocks = begin.recorded_blocks.len() as u32;
        // A receipt's digest was computed by the hashing pass: the sending pass need not hash
        // the file again (the server proves the declared digest over what it received).
        let hash_whole = declared.is_none();

        let (stop_renewal, mut renewal) = self.spawn_renewal(&begin);
        let mut renewal_ended = false;
        let result = tokio::select! {
            r = self.send_blocks(&begin, &mut reader, size, hash_whole, &opts) => r,
            // A failed renewal ends the publish at once with its reason: the upload can no
            // longer be committed, so the blocks in flight are cancelled (dropping
            // `send_blocks` aborts its tasks) instead of being sent for nothing.
            ended = &mut renewal => {
                renewal_ended = true;
                Err(ended.ok().flatten().unwrap_or_else(|| {
                    ClientError::local("upload lease renewal ended unexpectedly")
                }))
            }
        };
        let _ = stop_renewal.send(true);
        let renewal_error = if renewal_ended {
            None
        } else {
            renewal.await.ok().flatten()
        };

        let sent = match (result, renewal_error) {
            (Ok(sent), None) => Ok(sent),
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        };
        let (hashed, sent_blocks) = match sent {
            Ok(sent) => sent,
            Err(e) => {
                if !receipt::keep_open_after(opts.receipt.as_deref(), &e) {
                    self.abort_quietly(&begin).await;
                }
                return Err(e);
            }
        };
        let commit_req = pb::CommitUploadRequest {
            upload_id: begin.upload_id.clone(),
            upload_token: begin.upload_token.clone(),
            sha256: hashed.or_else(|| declared.clone()).unwrap_or_default(),
            request_id: new_request_id(),
        };
        let committed = match unary!(self, commit_upload, commit_req) {
            Ok(c) => c,
            // Under a receipt the commit declares the digest of the hashing pass, and the
            // server proves it over the bytes sent: a mismatch means the source changed in
            // between. Nothing was published; the upload is ended so its bytes are released.
            Err(e) if declared.is_some() && e.is("DigestMismatch") => {
                self.abort_quietly(&begin).await;
                return Err(receipt::source_changed());
            }
            Err(e) => return Err(e),
        };
        Ok(Published {
            entry: committed.entry.unwrap_or_default(),
            sent_blocks,
            resumed_blocks,
            already_committed: false,
        })
    }

    /// Reads block after block, hashing as it goes when `hash_whole`, and keeps up to
    /// `parallel` PutBlocks in flight; blocks the server named as recorded (a resumed receipt
    /// upload) are read (and hashed) but not sent. Returns the whole-body sha256 (when
    /// `hash_whole`) and the number of blocks sent.
    async fn send_blocks<R: AsyncRead + Unpin>(
        &self,
        begin: &pb::BeginUploadResponse,
        reader: &mut R,
        size: u64,
        hash_whole: bool,
        opts: &PublishOptions,
    ) -> Result<(Option<Vec<u8>>, u32)> {
        let mut sent = 0;
        let recorded: HashSet<u32> = begin.recorded_blocks.iter().copied().collect();
        let permits = Arc::new(Semaphore::new(opts.parallel.max(1)));
        let mut whole = hash_whole.then(Sha256::new);
        let mut inflight: JoinSet<Result<()>> = JoinSet::new();
        for index in 0..begin.block_count {
            let start = u64::from(index) * begin.block_size;
            let len = (size - start).min(begin.block_size) as usize;
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore open");
            // Surface a failed block before reading further.
            while let Some(done) = inflight.try_join_next() {
                done.map_err(|e| ClientError::local(format!("block task: {e}")))??;
            }
            let mut data = Vec::with_capacity(len);
            (&mut *reader)
                .take(len as u64)
                .read_to_end(&mut data)
                .await
                .map_err(|e| {
                    ClientError::local(format!("reading block {index} of the source: {e}"))
                })?;
            if data.len() != len {
                return Err(ClientError::local(
                    "the source shrank while it was being published",
                ));
            }
            if let Some(whole) = &mut whole {
                whole.update(&data);
            }
            if recorded.contains(&index) {
                drop(permit);
                if let Some(p) = &opts.progress {
                    p(len as u64);
                }
                continue;
            }
            sent += 1;
            let req = pb::PutBlockRequest {
                upload_id: begin.upload_id.clone(),
                upload_token: begin.upload_token.clone(),
                index,
                // A CRC-32C, not a second SHA-256 pass: `whole` is the cryptographic digest
                // (see nokv_proto::block_checksum).
                block_sha256: Vec::new(),
                block_crc32c: Some(block_checksum::crc32c(&data)),
                data: data.into(),
                request_id: new_request_id(),
            };
            let client = self.clone();
            let progress = opts.progress.clone();
            inflight.spawn(async move {
                let _permit = permit;
                unary!(client, put_block, req)?;
                if let Some(p) = progress {
                    p(len as u64);
                }
                Ok(())
            });
        }
        while let Some(done) = inflight.join_next().await {
            done.map_err(|e| ClientError::local(format!("block task: {e}")))??;
        }
        let mut extra = [0u8; 1];
        if reader.read(&mut extra).await.unwrap_or(0) != 0 {
            return Err(ClientError::local(
                "the source grew while it was being published",
            ));
        }
        Ok((whole.map(|w| w.finalize().to_vec()), sent))
    }

    /// Renews the lease every third of its length until stopped. Returns the error that
    /// ended renewal early, if any (the upload can no longer be committed then).
    fn spawn_renewal(
        &self,
        begin: &pb::BeginUploadResponse,
    ) -> (
        watch::Sender<bool>,
        tokio::task::JoinHandle<Option<ClientError>>,
    ) {
        let (tx, mut rx) = watch::channel(false);
        let every = Duration::from_millis((begin.lease_ms / 3).max(100));
        let req = pb::RenewUploadRequest {
            upload_id: begin.upload_id.clone(),
            upload_token: begin.upload_token.clone(),
        };
        let client = self.clone();
        let handle = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = rx.changed() => return None,
                    _ = tokio::time::sleep(every) => {}
                }
                let r = unary!(client, renew_upload, req.clone());
                if let Err(e) = r {
                    tracing::warn!(error = %e, "upload lease renewal failed");
                    return Some(e);
                }
            }
        });
        (tx, handle)
    }

    async fn abort_quietly(&self, begin: &pb::BeginUploadResponse) {
        let req = pb::AbortUploadRequest {
            upload_id: begin.upload_id.clone(),
            upload_token: begin.upload_token.clone(),
            request_id: new_request_id(),
        };
        let mut c = self.workspace_client();
        if let Err(e) = c.abort_upload(req).await {
            tracing::debug!(error = %e, "abort after a failed publish did not go through");
        }
    }
}

#[cfg(test)]
mod tests;
