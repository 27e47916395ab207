//! The upload sequencer: owner-mediated artifact uploads that never hold the gate across
//! provider I/O.
//!
//! A PutBlock runs in three steps:
//! 1. **Admit** (one write session): replay a recorded request id; prove the upload current
//!    — open, token scope, lease unexpired by the shard clock read *after* the gate is taken;
//!    refuse a wrong length before the owner pays for a write; assign a fresh random attempt
//!    key and record an unknown-writer cleanup guard for it; renew the lease.
//! 2. **Write**: one create-if-absent PUT of the block with no lock held, cut off at the lease
//!    deadline.
//! 3. **Record** (a second write session at a fresh read version): reload the upload and the
//!    block, verify the attempt key and the fences, mark the block uploaded, settle the guard,
//!    record the request outcome.
//!
//! **CommitUpload proves the declared whole-file sha256 before it publishes.** Block checksums
//! (a CRC-32C, [`nokv_proto::block_checksum`]) are checked at PutBlock and catch a damaged
//! block early; the whole-file digest is the cryptographic proof and cannot be derived from
//! them. Each block
//! recorded extends the upload's running digest ([`super::upload_digest`]: the in-order
//! prefix, hashed on a bulk thread from the request's bytes; a block recorded ahead of its turn
//! is held, within a node-wide bound, until the gap before it fills); commit continues from
//! that prefix when it hashed exactly the recorded attempt keys of the first blocks, and reads
//! back from the provider only the blocks after it — every block after a restart, a handoff
//! or a block recorded twice, none when every block was hashed on the way. The read-back hashes
//! on a bulk thread, with no lock held and the lease renewed meanwhile
//! ([`Shard::verify_declared_digest`]). Either way the commit session then re-checks that it
//! publishes exactly the block keys that were hashed. A mismatch answers `DigestMismatch` and
//! changes nothing (the upload stays open). A block read back costs one provider GET; the
//! SHA-256 pass is paid once per byte either way.
//!
//! Invariants: a key is written at most once and never reused; every key the provider may
//! hold is referenced by a block or revision, guarded, or collectable; a superseded or expired
//! attempt can never mark a block uploaded. Digest checks and hashing happen before any gate.

use std::sync::Arc;

use bytes::Bytes;
use nokv_proto::block_checksum::BlockChecksums;
use nokv_proto::v1 as pb;
use sha2::{Digest, Sha256};

use super::deletion_fence::require_not_deleting;
use super::files::{not_found, retire};
use super::replay::RequestKey;
use super::{Shard, to_entry};
use crate::error::{Error, Result};
use crate::ids::random_hex;
use crate::memory::BlockMemory;
use crate::meta::{
    BlockRecord, BlockState, EntryRecord, GuardRecord, KIND_ARTIFACT, RevisionBlock,
    RevisionRecord, UploadRecord, UploadState, WriteView, WriterState,
};
use crate::object::{ObjectError, PutOutcome};
use crate::token::{Claims, Role};

/// Largest artifact accepted: the block index must fit the wire's u32.
const MAX_ARTIFACT: u64 = 1 << 40;

/// What the admit session decided.
enum Admit {
    /// The request (or an identical block) was already recorded: answer without writing.
    Done(pb::PutBlockResponse),
    /// Write `key`, then record; the lease allows the write until the shard clock reads
    /// `deadline_ms`.
    Write { key: String, deadline_ms: i64 },
}

/// Upload ids name their shard so that calls carrying only the id can be routed.
pub fn upload_shard(upload_id: &str) -> Result<u32> {
    upload_id
        .split_once('.')
        .and_then(|(s, rest)| (rest.len() == 32).then_some(s))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::InvalidArgument(format!("upload id {upload_id:?} is malformed")))
}

impl Shard {
    pub async fn begin_upload(
        &self,
        mut req: pb::BeginUploadRequest,
    ) -> Result<pb::BeginUploadResponse> {
        if req.size > MAX_ARTIFACT {
            return Err(Error::InvalidArgument(format!(
                "artifact size {} exceeds the limit of {MAX_ARTIFACT} bytes",
                req.size
            )));
        }
        if !req.receipt.is_empty() {
            return self.begin_receipt_upload(req).await;
        }
        let request_id = std::mem::take(&mut req.request_id);
        let key = RequestKey::new(&req.workspace, &request_id, "BeginUpload", &req);
        let block_size = self.cfg.block_size;
        let block_count = req.size.div_ceil(block_size) as u32;
        let lease_ms = self.cfg.upload_lease.as_millis() as i64;
        let upload_id = format!("{}.{}", self.id, random_hex(16));
        let upload_token = self.signer.upload_capability(&upload_id);
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                if let Some(done) = key.recorded(w)? {
                    return done;
                }
                require_not_deleting(w, &req.workspace)?;
                let now = clock.now_ms();
                let mut rec = UploadRecord::open(
                    &req.workspace,
                    &req.path,
                    req.size,
                    block_count,
                    now,
                    lease_ms,
                    "",
                );
                // Before any provider I/O: a refusal here changes nothing.
                accounts.reserve(w, &mut rec)?;
                w.put_upload(&upload_id, &rec)?;
                let resp = pb::BeginUploadResponse {
                    upload_id,
                    upload_token,
                    block_size,
                    block_count,
                    lease_expires_ms: rec.lease_expires_ms,
                    lease_ms: lease_ms as u64,
                    ..Default::default()
                };
                key.record(w, &resp, now)?;
                Ok(resp)
            })
            .await
    }

    /// The three-step sequence described in the module docs.
    pub async fn put_block(
        self: &Arc<Self>,
        claims: Claims,
        mut req: pb::PutBlockRequest,
    ) -> Result<pb::PutBlockResponse> {
        // Before any gate: capability, size bound and the body digest.
        self.signer
            .verify_upload_capability(&req.upload_id, &req.upload_token)?;
        if req.data.len() as u64 > self.cfg.block_size {
            return Err(Error::InvalidArgument(format!(
                "block is {} bytes; blocks are at most {} bytes",
                req.data.len(),
                self.cfg.block_size
            )));
        }
        let digest = BlockChecksums::from(&req);
        if digest.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "block {} declares no checksum: send block_crc32c (or block_sha256)",
                req.index
            )));
        }
        self.bulk.admit(req.data.len() as u64).await;
        // Check on a bulk thread: a block's checksums (a sha256 is 4 MiB of SHA-256) must
        // neither stall the async workers that serve other requests nor outrank them for the
        // CPU.
        let body = std::mem::take(&mut req.data);
        let (data, digest) = self
            .bulk
            .run(async move {
                let ok = digest.matches(&body);
                (body, ok.then_some(digest))
            })
            .await?;
        let Some(digest) = digest else {
            return Err(Error::DigestMismatch(format!(
                "block {} body does not match its declared checksum",
                req.index
            )));
        };
        let request_id = std::mem::take(&mut req.request_id);
        req.upload_token.clear();
        // The fingerprint covers the declared digest, which the body was just proven to match.
        let mut key = RequestKey::new("", &request_id, "PutBlock", &req);
        let (upload_id, index, length) = (req.upload_id.clone(), req.index, data.len() as u64);

        let claim = self.claims.claim(&upload_id, index).await;

        // 1. Admit.
        let (lease_ms, shard, object) = (
            self.cfg.upload_lease.as_millis() as i64,
            self.id,
            self.object.clone(),
        );
        let block_size = self.cfg.block_size;
        let admit = {
            let (upload_id, digest, clock) =
                (upload_id.clone(), digest.clone(), self.clock.clone());
            self.gate
                .write(move |w| {
                    let mut upload = load_upload(w, &upload_id)?;
                    key.workspace = upload.workspace.clone();
                    // Authorization first, replay second: a recorded outcome is only ever
                    // shown to a caller allowed to make the request.
                    claims.require(&upload.workspace, Role::Write)?;
                    if let Some(done) = key.recorded(w)? {
                        return Ok((Admit::Done(done?), key));
                    }
                    require_not_deleting(w, &upload.workspace)?;
                    let now = clock.now_ms();
                    require_open_and_live(&upload, now)?;
                    let block_count = upload.block_count;
                    if index >= block_count {
                        let s = if block_count == 1 { "" } else { "s" };
                        return Err(Error::InvalidArgument(format!(
                            "block index {index} is out of range (upload has {block_count} block{s})"
                        )));
                    }
                    let expected_len = block_len(upload.size, index, block_size);
                    if length != expected_len {
                        return Err(Error::InvalidArgument(format!(
                            "block {index} must be {expected_len} bytes, got {length}"
                        )));
                    }
                    if let Some(b) = w.block(&upload_id, index)?
                        && b.state == BlockState::Uploaded as i32
                    {
                        if !b.checksums().agrees_with(&digest) {
                            return Err(Error::DigestMismatch(format!(
                                "block {index} was already uploaded with different content"
                            )));
                        }
                        let resp = pb::PutBlockResponse {
                            index,
                            lease_expires_ms: upload.lease_expires_ms,
                        };
                        key.record(w, &resp, now)?;
                        return Ok((Admit::Done(resp), key));
                    }
                    let attempt = random_hex(12);
                    let object_key = object.block_key(shard, &upload_id, index, &attempt);
                    w.put_block(
                        &upload_id,
                        index,
                        &BlockRecord {
                            length,
                            sha256: digest.sha256,
                            crc32c: digest.crc32c,
                            key: object_key.clone(),
                            state: BlockState::Pending as i32,
                        },
                    )?;
                    w.put_guard(
                        &object_key,
                        &GuardRecord {
                            upload_id: upload_id.clone(),
                            writer: WriterState::Unknown as i32,
                            created_ms: now,
                            attempts: 0,
                            last_attempt_ms: 0,
                            deleted_ms: 0,
                            bytes: length,
                            operation: 0,
                        },
                    )?;
                    upload.lease_expires_ms = now + lease_ms;
                    w.put_upload(&upload_id, &upload)?;
                    Ok((
                        Admit::Write {
                            key: object_key,
                            deadline_ms: upload.lease_expires_ms,
                        },
                        key,
                    ))
                })
                .await?
        };
        let (object_key, deadline_ms, key) = match admit {
            (Admit::Done(resp), _) => return Ok(resp),
            (
                Admit::Write {
                    key: k,
                    deadline_ms,
                },
                key,
            ) => (k, deadline_ms, key),
        };

        // 2 and 3 run detached from the caller: once a write is admitted it is written and
        // recorded even if the caller goes away, so a retry or a waiting duplicate finds the
        // block recorded instead of paying for another write. The claim travels along.
        let shard = self.clone();
        tokio::spawn(async move {
            let _claim = claim;
            // 2. Write, with no lock held and at bulk priority; the lease bounds the attempt:
            // when the shard clock reaches its deadline the write is dropped and its outcome
            // is unknown (the bytes may still land), so its guard stays.
            let (object, clock) = (shard.object.clone(), shard.clock.clone());
            let create_key = object_key.clone();
            let kept = data.clone();
            let outcome = shard
                .bulk
                .run(async move {
                    tokio::select! {
                        o = object.create(&create_key, data) => o,
                        () = clock.reached(deadline_ms) => {
                            PutOutcome::Unknown("provider write outlived the upload lease".into())
                        }
                    }
                })
                .await?;
            // 3. Record. A refusal is the session's outcome, not its failure: the session
            // commits the settled guard and the caller hears the refusal.
            let clock = shard.clock.clone();
            let recorded_key = object_key.clone();
            let recorded_upload = upload_id.clone();
            let answer = shard
                .gate
                .write(move |w| {
                    let now = clock.now_ms();
                    record_block(
                        w,
                        &key,
                        &upload_id,
                        index,
                        &object_key,
                        outcome,
                        lease_ms,
                        now,
                    )
                })
                .await?;
            if answer.is_ok() {
                // Recorded: the bytes join the upload's running digest (hashing is bulk work).
                let (digests, lease) = (shard.digests.clone(), shard.cfg.upload_lease);
                shard
                    .bulk
                    .run(async move {
                        digests.recorded(&recorded_upload, index, &recorded_key, &kept, lease)
                    })
                    .await?;
            }
            answer
        })
        .await
        .map_err(|e| Error::Internal(format!("block sequence task failed: {e}")))?
    }

    pub async fn renew_upload(
        &self,
        claims: Claims,
        req: pb::RenewUploadRequest,
    ) -> Result<pb::RenewUploadResponse> {
        self.signer
            .verify_upload_capability(&req.upload_id, &req.upload_token)?;
        let lease_expires_ms = self.extend_lease(claims, req.upload_id).await?;
        Ok(pb::RenewUploadResponse { lease_expires_ms })
    }

    /// One session: proves the upload open, live and the caller's, and renews its lease.
    async fn extend_lease(&self, claims: Claims, upload_id: String) -> Result<i64> {
        let lease_ms = self.cfg.upload_lease.as_millis() as i64;
        let clock = self.clock.clone();
        self.gate
            .write(move |w| {
                let mut upload = load_upload(w, &upload_id)?;
                claims.require(&upload.workspace, Role::Write)?;
                require_not_deleting(w, &upload.workspace)?;
                let now = clock.now_ms();
                require_open_and_live(&upload, now)?;
                upload.lease_expires_ms = now + lease_ms;
                w.put_upload(&upload_id, &upload)?;
                Ok(upload.lease_expires_ms)
            })
            .await
    }

    /// Proves a commit's declared whole-file sha256 before the commit session: continues the
    /// in-order prefix the recorded blocks extended, reads the blocks after it (if any) back
    /// from the provider in index order and hashes them on a bulk thread, with no lock held,
    /// renewing the upload's lease every third of it meanwhile (the client stopped renewing
    /// when it sent the commit).
    ///
    /// Returns the verified block keys in index order, which the commit session requires to
    /// be exactly the keys it publishes, or `None` when there is nothing to verify here —
    /// the upload is not the caller's, not open, has missing blocks, or this request already
    /// has a recorded outcome — so that the session gives its usual answer (refusal or
    /// replay) and never publishes unverified. A mismatch is `DigestMismatch` and changes
    /// nothing: the upload stays open and may be committed with the right digest.
    async fn verify_declared_digest(
        &self,
        claims: &Claims,
        key: &RequestKey,
        req: &pb::CommitUploadRequest,
    ) -> Result<Option<Vec<String>>> {
        let upload_id = req.upload_id.clone();
        let snapshot = self
            .gate
            .read(|r| {
                let Some(upload) = r.upload(&upload_id)? else {
                    return Ok(None);
                };
                claims.require(&upload.workspace, Role::Write)?;
                if upload.state != UploadState::Open as i32
                    || r.replay(&upload.workspace, &key.request_id)?.is_some()
                {
                    return Ok(None);
                }
                let blocks = r.blocks(&upload_id)?;
                let mut keys = Vec::with_capacity(upload.block_count as usize);
                for i in 0..upload.block_count {
                    match blocks.iter().find(|(idx, _)| *idx == i) {
                        Some((_, b)) if b.state == BlockState::Uploaded as i32 => keys.push((
                            b.key.clone(),
                            block_len(upload.size, i, self.cfg.block_size),
                        )),
                        _ => return Ok(None),
                    }
                }
                Ok(Some(keys))
            })
            .await?;
        let Some(keys) = snapshot else {
            return Ok(None);
        };
        let recorded: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
        // The prefix hashed as the blocks were recorded (see `upload_digest`): only the blocks
        // after it are read back — none when they were recorded in order.
        let prefix = self.digests.finish(&upload_id, &recorded);
        let mut hasher = prefix.hasher;
        let rest = &keys[prefix.blocks..];
        let renew_every = self.cfg.upload_lease / 3;
        let mut renewed = tokio::time::Instant::now();
        if !rest.is_empty() {
            self.extend_lease(claims.clone(), upload_id.clone()).await?;
        }
        for (k, length) in rest {
            if renewed.elapsed() >= renew_every {
                self.extend_lease(claims.clone(), upload_id.clone()).await?;
                renewed = tokio::time::Instant::now();
            }
            // Reading back and hashing is bulk work: it yields to interactive requests.
            self.bulk.admit(*length).await;
            let (object, k) = (self.object.clone(), k.clone());
            hasher = self
                .bulk
                .run(async move {
                    let bytes = object.get(&k).await?;
                    hasher.update(&bytes);
                    Ok::<_, Error>(hasher)
                })
                .await??;
        }
        if hasher.finalize().as_slice() != req.sha256.as_slice() {
            return Err(declared_digest_mismatch());
        }
        Ok(Some(recorded))
    }

    /// Publishes atomically: every block recorded → one session creates the immutable
    /// revision, points the path at it with a new generation and makes the previous
    /// revision's blocks collectable.
    pub async fn commit_upload(
        &self,
        claims: Claims,
        mut req: pb::CommitUploadRequest,
    ) -> Result<pb::CommitUploadResponse> {
        self.signer
            .verify_upload_capability(&req.upload_id, &req.upload_token)?;
        if req.sha256.len() != 32 {
            return Err(Error::InvalidArgument("sha256 must be 32 bytes".into()));
        }
        let request_id = std::mem::take(&mut req.request_id);
        req.upload_token.clear();
        let mut key = RequestKey::new("", &request_id, "CommitUpload", &req);
        // Before the session: prove the declared digest over the recorded blocks' bytes.
        let verified = self.verify_declared_digest(&claims, &key, &req).await?;
        let block_size = self.cfg.block_size;
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                let mut upload = load_upload(w, &req.upload_id)?;
                key.workspace = upload.workspace.clone();
                claims.require(&upload.workspace, Role::Write)?;
                if let Some(done) = key.recorded(w)? {
                    return done;
                }
                require_not_deleting(w, &upload.workspace)?;
                let now = clock.now_ms();
                require_open_and_live(&upload, now)?;
                let blocks = w.blocks(&req.upload_id)?;
                let mut manifest = Sha256::new();
                let mut rev_blocks = Vec::with_capacity(blocks.len());
                for i in 0..upload.block_count {
                    let b = blocks
                        .iter()
                        .find(|(idx, b)| *idx == i && b.state == BlockState::Uploaded as i32)
                        .map(|(_, b)| b)
                        .ok_or_else(|| {
                            Error::FailedPrecondition(format!("block {i} has not been uploaded"))
                        })?;
                    b.checksums().feed_manifest(&mut manifest);
                    rev_blocks.push(RevisionBlock {
                        length: b.length,
                        sha256: b.sha256.clone(),
                        crc32c: b.crc32c,
                        key: b.key.clone(),
                    });
                }
                // Publish only the exact block set whose bytes were hashed. Uploaded blocks of
                // an open upload never change, so a difference means the verification saw an
                // earlier state (a block recorded meanwhile): nothing is recorded, retry.
                let keys: Vec<&str> = rev_blocks.iter().map(|b| b.key.as_str()).collect();
                if verified
                    .as_deref()
                    .map(|v| v.iter().map(String::as_str).eq(keys.iter().copied()))
                    != Some(true)
                {
                    return Err(Error::Unavailable(
                        "the upload's blocks changed while the commit was verified; retry".into(),
                    ));
                }
                let manifest = manifest.finalize().to_vec();
                let (ws, path) = (upload.workspace.clone(), upload.path.clone());
                let revision = w.next_sequence("revision")?;
                w.put_revision(
                    revision,
                    &RevisionRecord {
                        workspace: ws.clone(),
                        path: path.clone(),
                        size: upload.size,
                        sha256: req.sha256.clone(),
                        manifest_sha256: manifest.clone(),
                        block_size,
                        blocks: rev_blocks,
                        created_ms: now,
                    },
                )?;
                if let Some(old) = w.entry(&ws, &path)? {
                    retire(w, &old, now)?;
                    w.remove_inline(&ws, &path)?;
                    accounts.release_entry(w, &ws, old.size)?;
                }
                let entry = EntryRecord {
                    kind: KIND_ARTIFACT,
                    size: upload.size,
                    sha256: req.sha256.clone(),
                    generation: w.next_generation(&ws, &path)?,
                    modified_ms: now,
                    revision,
                    block_count: upload.block_count,
                    manifest_sha256: manifest,
                };
                w.put_entry(&ws, &path, &entry)?;
                super::receipts::on_commit(w, &req.upload_id, &upload, &req.sha256, &entry)?;
                accounts.consume(w, &mut upload)?;
                upload.state = UploadState::Committed as i32;
                upload.ended_ms = now;
                upload.revision = revision;
                w.put_upload(&req.upload_id, &upload)?;
                w.remove_blocks(&req.upload_id)?;
                let resp = pb::CommitUploadResponse {
                    entry: Some(to_entry(&ws, &path, &entry)),
                };
                key.record(w, &resp, now)?;
                Ok(resp)
            })
            .await
    }

    /// Ends an open upload; its uploaded blocks become collectable, pending ones keep their
    /// guards. Aborting an aborted upload succeeds; aborting a committed one is refused.
    pub async fn abort_upload(
        &self,
        claims: Claims,
        mut req: pb::AbortUploadRequest,
    ) -> Result<pb::AbortUploadResponse> {
        self.signer
            .verify_upload_capability(&req.upload_id, &req.upload_token)?;
        let request_id = std::mem::take(&mut req.request_id);
        req.upload_token.clear();
        let mut key = RequestKey::new("", &request_id, "AbortUpload", &req);
        self.digests.forget(&req.upload_id);
        let clock = self.clock.clone();
        let accounts = self.accounts.clone();
        self.gate
            .write(move |w| {
                let mut upload = load_upload(w, &req.upload_id)?;
                key.workspace = upload.workspace.clone();
                claims.require(&upload.workspace, Role::Write)?;
                if let Some(done) = key.recorded(w)? {
                    return done;
                }
                let now = clock.now_ms();
                match UploadState::try_from(upload.state) {
                    Ok(UploadState::Committed) => {
                        return Err(Error::FailedPrecondition(
                            "upload is already committed".into(),
                        ));
                    }
                    Ok(UploadState::Open) => {
                        for (_, b) in w.blocks(&req.upload_id)? {
                            if b.state == BlockState::Uploaded as i32 {
                                w.queue_delete(&b.key, &upload.workspace, b.length, now)?;
                            }
                        }
                        w.remove_blocks(&req.upload_id)?;
                        accounts.release(w, &mut upload)?;
                        upload.state = UploadState::Aborted as i32;
                        upload.ended_ms = now;
                        w.put_upload(&req.upload_id, &upload)?;
                    }
                    _ => {}
                }
                let resp = pb::AbortUploadResponse {};
                key.record(w, &resp, now)?;
                Ok(resp)
            })
            .await
    }

    pub async fn get_manifest(&self, ws: &str, path: &str) -> Result<pb::GetManifestResponse> {
        self.gate
            .read_fenced(|r| {
                let e = r.entry(ws, path)?.ok_or_else(|| not_found(ws, path))?;
                if e.kind != KIND_ARTIFACT {
                    return Err(Error::FailedPrecondition(format!(
                        "{ws}:{path} is a small file, not an artifact"
                    )));
                }
                let rev = r.revision(e.revision)?.ok_or_else(|| {
                    Error::Internal(format!("revision {} is missing", e.revision))
                })?;
                Ok(pb::GetManifestResponse {
                    revision: e.revision,
                    size: rev.size,
                    sha256: rev.sha256.clone(),
                    block_size: rev.block_size,
                    blocks: rev
                        .blocks
                        .iter()
                        .enumerate()
                        .map(|(i, b)| pb::BlockInfo {
                            index: i as u32,
                            length: b.length,
                            sha256: b.sha256.clone(),
                            crc32c: b.crc32c,
                        })
                        .collect(),
                    entry: Some(to_entry(ws, path, &e)),
                })
            })
            .await
    }

    /// The bytes of one block of a live revision, read with no lock held. The block's length
    /// is reserved from `memory` before the fetch; the returned bytes carry the reservation.
    pub async fn read_block(
        &self,
        ws: &str,
        revision: u64,
        index: u32,
        memory: &BlockMemory,
    ) -> Result<Bytes> {
        let (key, length) = self
            .gate
            .read_fenced(|r| {
                let rev = match r.revision(revision)? {
                    Some(rev) if rev.workspace == ws => rev,
                    Some(_) => {
                        return Err(Error::NotFound(format!("revision {revision} not found")));
                    }
                    // Issued once and gone now: only the end of a retired grace drops one.
                    None if revision != 0 && revision <= r.last_sequence("revision")? => {
                        return Err(no_longer_readable(revision));
                    }
                    None => return Err(Error::NotFound(format!("revision {revision} not found"))),
                };
                rev.blocks
                    .get(index as usize)
                    .map(|b| (b.key.clone(), b.length))
                    .ok_or_else(|| Error::NotFound(format!("block {index} not found")))
            })
            .await?;
        self.fetch_block(revision, &key, length, memory).await
    }

    /// The bytes of block `key` (`length` bytes) of a revision, read with no lock held: bulk
    /// work that yields to interactive requests, its length reserved from `memory` before the
    /// fetch (the returned bytes carry the reservation). Restores and Grep read blocks here.
    pub(crate) async fn fetch_block(
        &self,
        revision: u64,
        key: &str,
        length: u64,
        memory: &BlockMemory,
    ) -> Result<Bytes> {
        self.bulk.admit(length).await;
        let reserved = memory.reserve(length).await?;
        match self.object.get(key).await {
            Ok(data) => Ok(reserved.hold(data)),
            // The revision was live when its key was read, but the read then waited (bulk
            // admission, block memory): its retired grace may have ended meanwhile and its
            // blocks been deleted. That is the replaced-artifact answer, not a lost object.
            Err(ObjectError::NotFound(k)) => {
                let live = self
                    .gate
                    .read(|r| Ok(r.revision(revision)?.is_some()))
                    .await?;
                Err(if live {
                    ObjectError::NotFound(k).into()
                } else {
                    no_longer_readable(revision)
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The answer for a revision issued once and gone now: only the end of a retired grace drops
/// one (the artifact was replaced or deleted).
fn no_longer_readable(revision: u64) -> Error {
    Error::NotFound(format!(
        "revision {revision} is no longer readable: the artifact was replaced or deleted and its \
         retired-grace period has ended"
    ))
}

fn declared_digest_mismatch() -> Error {
    Error::DigestMismatch(
        "the declared sha256 does not match the uploaded bytes; nothing was published".into(),
    )
}

/// The length block `index` must have in an artifact of `size` bytes.
fn block_len(size: u64, index: u32, block_size: u64) -> u64 {
    size.saturating_sub(u64::from(index) * block_size)
        .min(block_size)
}

fn load_upload(w: &WriteView, upload_id: &str) -> Result<UploadRecord> {
    w.upload(upload_id)?
        .ok_or_else(|| Error::NotFound(format!("upload {upload_id} not found")))
}

/// The fences every upload mutation checks inside its session, by the shard clock.
fn require_open_and_live(upload: &UploadRecord, now: i64) -> Result<()> {
    match UploadState::try_from(upload.state) {
        Ok(UploadState::Open) => {}
        Ok(UploadState::Committed) => {
            return Err(Error::FailedPrecondition(
                "upload is already committed".into(),
            ));
        }
        Ok(UploadState::Aborted) => {
            return Err(Error::FailedPrecondition("upload was aborted".into()));
        }
        _ => return Err(Error::LeaseExpired("upload is being cleaned up".into())),
    }
    if upload.lease_expires_ms <= now {
        return Err(Error::LeaseExpired("the upload's lease has expired".into()));
    }
    Ok(())
}

/// The record session of a PutBlock (step 3).
///
/// Returns the session's *outcome*: `Ok(Ok(response))` when the block was recorded,
/// `Ok(Err(refusal))` when the attempt may not publish — its provider write was not sent,
/// its outcome is unknown, or the upload is no longer open and live or the block names
/// another attempt's key. A refusal still commits the one bookkeeping change it makes: a
/// writer known to be finished has its guard marked `Finished`, so that the reconciler
/// removes the guard once the key is deleted instead of deleting it again on every pass. An
/// outer `Err` is a failure of the session itself and rolls everything back. Invariant: a
/// refused attempt changes nothing but its own guard. `now` is the shard clock read inside
/// this session.
#[allow(clippy::too_many_arguments)]
fn record_block(
    w: &mut WriteView,
    key: &RequestKey,
    upload_id: &str,
    index: u32,
    object_key: &str,
    outcome: PutOutcome,
    lease_ms: i64,
    now: i64,
) -> Result<Result<pb::PutBlockResponse>> {
    let finished = |w: &mut WriteView| -> Result<()> {
        if let Some(mut g) = w.guard(object_key)? {
            g.writer = WriterState::Finished as i32;
            w.put_guard(object_key, &g)?;
        }
        Ok(())
    };
    match outcome {
        PutOutcome::Written => {}
        PutOutcome::NotWritten(why) => {
            finished(w)?;
            return Ok(Err(Error::Unavailable(format!(
                "block write was not sent: {why}"
            ))));
        }
        // An attempt key is random, so it cannot exist unless something else wrote it: the
        // guard stays an unknown-writer guard, and the reconciler deletes what is there.
        PutOutcome::Exists => {
            return Ok(Err(Error::Unavailable(
                "block write found its attempt key taken; retry".into(),
            )));
        }
        // Unknown: the guard stays an unknown-writer guard; the bytes may still land.
        PutOutcome::Unknown(why) => {
            return Ok(Err(Error::Unavailable(format!(
                "block write outcome unknown: {why}"
            ))));
        }
    }
    let Some(mut upload) = w.upload(upload_id)? else {
        finished(w)?;
        return Ok(Err(Error::NotFound(format!(
            "upload {upload_id} not found"
        ))));
    };
    let block = w.block(upload_id, index)?;
    let current = block.as_ref().is_some_and(|b| b.key == object_key);
    if let Err(e) = require_open_and_live(&upload, now).and_then(|_| {
        if current {
            Ok(())
        } else {
            Err(Error::FailedPrecondition(format!(
                "block {index} was superseded by a newer attempt"
            )))
        }
    }) {
        // The writer finished but may not publish: its bytes are left to the guard.
        finished(w)?;
        return Ok(Err(e));
    }
    let mut block = block.expect("checked current");
    block.state = BlockState::Uploaded as i32;
    w.put_block(upload_id, index, &block)?;
    // The key is now referenced by the block record, which protects it from here on.
    w.remove_guard(object_key)?;
    upload.lease_expires_ms = now + lease_ms;
    w.put_upload(upload_id, &upload)?;
    let resp = pb::PutBlockResponse {
        index,
        lease_expires_ms: upload.lease_expires_ms,
    };
    key.record(w, &resp, now)?;
    Ok(Ok(resp))
}

#[cfg(test)]
mod tests;
