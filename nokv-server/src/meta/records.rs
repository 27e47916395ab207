//! The durable record formats of a shard, encoded with prost so that fields can be added
//! without a migration (unknown tags are skipped, missing ones default).

use nokv_proto::block_checksum::BlockChecksums;

/// Kind of a path's entry, shared with the wire enum's numbering.
pub const KIND_FILE: i32 = 1;
pub const KIND_ARTIFACT: i32 = 2;

/// The current state of one path. Inline bytes of small files live in their own table so
/// that Stat and List never read bodies.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EntryRecord {
    #[prost(int32, tag = "1")]
    pub kind: i32,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub sha256: Vec<u8>,
    #[prost(uint64, tag = "4")]
    pub generation: u64,
    #[prost(int64, tag = "5")]
    pub modified_ms: i64,
    /// Artifacts: the immutable revision the path points at.
    #[prost(uint64, tag = "6")]
    pub revision: u64,
    #[prost(uint32, tag = "7")]
    pub block_count: u32,
    #[prost(bytes = "vec", tag = "8")]
    pub manifest_sha256: Vec<u8>,
}

/// The recorded outcome of one mutation, keyed by (workspace, request id).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplayRecord {
    /// SHA-256 over the operation name and the request without its request id.
    #[prost(bytes = "vec", tag = "1")]
    pub fingerprint: Vec<u8>,
    /// The encoded response message returned to the first caller.
    #[prost(bytes = "vec", tag = "2")]
    pub response: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub created_ms: i64,
    /// Set when the recorded outcome is a refusal (e.g. `AlreadyExists`): its reason name.
    #[prost(string, tag = "4")]
    pub refusal: String,
    #[prost(string, tag = "5")]
    pub refusal_message: String,
    /// `GenerationMismatch` refusals: the generations involved.
    #[prost(uint64, tag = "6")]
    pub expected: u64,
    #[prost(uint64, tag = "7")]
    pub current: u64,
    /// `MatchCount` refusals (Edit): how often the text occurred, and in what.
    #[prost(uint64, tag = "8")]
    pub match_count: u64,
    #[prost(string, tag = "9")]
    pub match_subject: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum UploadState {
    Unspecified = 0,
    /// Accepting blocks while its lease is live.
    Open = 1,
    /// Published as a revision; its block keys now belong to that revision.
    Committed = 2,
    /// Ended by the client; its block keys are collectable.
    Aborted = 3,
    /// Claimed by the reconciler after expiry; an attempt of it still has a guard (its bytes
    /// may still land), so it is unresolved.
    Deleting = 4,
    /// Claimed after expiry and every attempt's guard settled: nothing of it remains but
    /// collectable keys, which the reconciler deletes on its own.
    Reclaimed = 5,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UploadRecord {
    #[prost(string, tag = "1")]
    pub workspace: String,
    #[prost(string, tag = "2")]
    pub path: String,
    #[prost(uint64, tag = "3")]
    pub size: u64,
    #[prost(uint32, tag = "4")]
    pub block_count: u32,
    #[prost(enumeration = "UploadState", tag = "5")]
    pub state: i32,
    /// Shard clock; checked only after the gate is taken.
    #[prost(int64, tag = "6")]
    pub lease_expires_ms: i64,
    #[prost(int64, tag = "7")]
    pub created_ms: i64,
    /// Set when committed.
    #[prost(uint64, tag = "8")]
    pub revision: u64,
    /// Shard clock when the upload became terminal (committed, aborted or claimed after
    /// expiry); its record is pruned once the replay window that could reference it ended.
    #[prost(int64, tag = "9")]
    pub ended_ms: i64,
    /// The receipt this upload was begun under, or empty (see [`ReceiptRecord`]).
    #[prost(string, tag = "10")]
    pub receipt: String,
    /// True while the upload holds a byte reservation of `size` in its workspace's usage
    /// (see [`UsageRecord`]): set by the BeginUpload session that created it, cleared by the
    /// session that consumes (commit) or releases (abort, reclaim, workspace deletion) it.
    /// Uploads begun before quotas existed hold none.
    #[prost(bool, tag = "20")]
    pub reserved: bool,
    /// The upload's id in the shard's operations ledger (see [`crate::shard::operations`]);
    /// assigned by the first `put_upload`, never reused.
    #[prost(uint64, tag = "11")]
    pub operation: u64,
}

impl UploadRecord {
    /// A new open upload whose lease runs `lease_ms` from `now` (shard clock).
    pub fn open(
        workspace: &str,
        path: &str,
        size: u64,
        block_count: u32,
        now: i64,
        lease_ms: i64,
        receipt: &str,
    ) -> UploadRecord {
        UploadRecord {
            workspace: workspace.to_string(),
            path: path.to_string(),
            size,
            block_count,
            state: UploadState::Open as i32,
            lease_expires_ms: now + lease_ms,
            created_ms: now,
            revision: 0,
            ended_ms: 0,
            receipt: receipt.to_string(),
            reserved: false,
            operation: 0,
        }
    }

    /// Committed, aborted, claimed or reclaimed: no request can change it any more.
    pub fn is_ended(&self) -> bool {
        matches!(
            UploadState::try_from(self.state),
            Ok(UploadState::Committed
                | UploadState::Aborted
                | UploadState::Deleting
                | UploadState::Reclaimed)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum BlockState {
    Unspecified = 0,
    /// An attempt key is assigned and guarded; the provider write may be in flight.
    Pending = 1,
    /// The provider confirmed the write of `key` and the record session saw the same key.
    Uploaded = 2,
}

/// One block of an open upload. Its `key` is the attempt key of the latest admitted write;
/// the record session marks the block uploaded only if the key still matches, so a
/// superseded attempt can never publish into the block.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BlockRecord {
    #[prost(uint64, tag = "1")]
    pub length: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub sha256: Vec<u8>,
    #[prost(string, tag = "3")]
    pub key: String,
    #[prost(enumeration = "BlockState", tag = "4")]
    pub state: i32,
    /// The block's CRC-32C when it was declared with one. With `sha256` these are the block's
    /// checksums ([`BlockChecksums`]): at least one is present.
    #[prost(fixed32, optional, tag = "5")]
    pub crc32c: Option<u32>,
}

impl BlockRecord {
    pub fn checksums(&self) -> BlockChecksums {
        BlockChecksums {
            sha256: self.sha256.clone(),
            crc32c: self.crc32c,
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RevisionBlock {
    #[prost(uint64, tag = "1")]
    pub length: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub sha256: Vec<u8>,
    #[prost(string, tag = "3")]
    pub key: String,
    /// As [`BlockRecord::crc32c`]: revisions published before CRC-32C have a sha256 only.
    #[prost(fixed32, optional, tag = "4")]
    pub crc32c: Option<u32>,
}

impl RevisionBlock {
    pub fn checksums(&self) -> BlockChecksums {
        BlockChecksums {
            sha256: self.sha256.clone(),
            crc32c: self.crc32c,
        }
    }
}

/// An immutable published artifact. Revision numbers come from the shard's sequence and are
/// never reused.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RevisionRecord {
    #[prost(string, tag = "1")]
    pub workspace: String,
    #[prost(string, tag = "2")]
    pub path: String,
    #[prost(uint64, tag = "3")]
    pub size: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub sha256: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub manifest_sha256: Vec<u8>,
    #[prost(uint64, tag = "6")]
    pub block_size: u64,
    #[prost(message, repeated, tag = "7")]
    pub blocks: Vec<RevisionBlock>,
    #[prost(int64, tag = "8")]
    pub created_ms: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum WriterState {
    Unspecified = 0,
    /// The provider write may still land (in flight, timed out, or its writer crashed).
    Unknown = 1,
    /// The writer positively finished (written or identified as never sent).
    Finished = 2,
}

/// A cleanup guard for one object key, recorded *before* the provider write so that bytes
/// landing after any crash or lost response are still accounted for.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GuardRecord {
    #[prost(string, tag = "1")]
    pub upload_id: String,
    #[prost(enumeration = "WriterState", tag = "2")]
    pub writer: i32,
    #[prost(int64, tag = "3")]
    pub created_ms: i64,
    #[prost(uint32, tag = "4")]
    pub attempts: u32,
    #[prost(int64, tag = "5")]
    pub last_attempt_ms: i64,
    /// Shard clock of the first successful delete of the key while the writer was unknown:
    /// the attempt's cleanup was done once. The guard itself stays (bytes may still land
    /// late and must keep being deleted), but it no longer holds its upload unresolved.
    #[prost(int64, tag = "6")]
    pub deleted_ms: i64,
    /// Length of the block the attempt writes (the bytes its delete operation releases).
    #[prost(uint64, tag = "7")]
    pub bytes: u64,
    /// The delete operation of this guard in the operations ledger, once the guard became a
    /// delete intent (its upload no longer live); 0 before.
    #[prost(uint64, tag = "8")]
    pub operation: u64,
}

/// One logical publication named by a client's stable receipt, keyed by (workspace,
/// receipt). Its identity (path, size, whole-file sha256) never changes; `upload_id` names
/// the receipt's latest upload (a new one replaces an expired or ended one). The record lives
/// exactly as long as the upload record it names: pruning that record removes it too.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReceiptRecord {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub sha256: Vec<u8>,
    #[prost(string, tag = "4")]
    pub upload_id: String,
    #[prost(int64, tag = "5")]
    pub created_ms: i64,
    /// Set by the commit that published the receipt's upload: the entry it published.
    #[prost(message, optional, tag = "6")]
    pub committed: Option<EntryRecord>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum WorkspaceState {
    Unspecified = 0,
    /// Fenced: every mutation of the workspace is refused while its contents are released.
    Deleting = 1,
}

/// A workspace that has a state of its own. Workspaces are implicit (they exist by having
/// entries), so only a workspace being deleted has a record; the record is removed when the
/// deletion completes, which frees the name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkspaceRecord {
    #[prost(enumeration = "WorkspaceState", tag = "1")]
    pub state: i32,
    /// Shard clock when the deletion fence was set.
    #[prost(int64, tag = "2")]
    pub deleting_since_ms: i64,
    /// Progress of the deletion through the retired-revision index: the last (retired ms,
    /// revision) examined, so each page resumes after it (valid once `retired_cursor_set`).
    #[prost(int64, tag = "3")]
    pub retired_cursor_ms: i64,
    #[prost(uint64, tag = "4")]
    pub retired_cursor_rev: u64,
    #[prost(bool, tag = "5")]
    pub retired_cursor_set: bool,
    /// The request id of the call that set the fence: the session that completes the
    /// deletion records the totals below as that call's answer, so its retry gets them.
    #[prost(string, tag = "6")]
    pub request_id: String,
    /// What the deletion released so far.
    #[prost(uint64, tag = "7")]
    pub entries_removed: u64,
    #[prost(uint64, tag = "8")]
    pub uploads_ended: u64,
    #[prost(uint64, tag = "9")]
    pub retired_released: u64,
}

/// The inventory scan of one shard (one record per shard store; see
/// [`crate::shard::inventory`]). Its cursor and counters change only in the session that
/// commits a page's observations, so a restart resumes exactly after the last committed page.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InventoryRecord {
    /// Number of the running scan, or of the last one when idle (0: never scanned).
    #[prost(uint64, tag = "1")]
    pub scan: u64,
    #[prost(bool, tag = "2")]
    pub running: bool,
    /// The last key of the last committed page (the listing resumes strictly after it), or
    /// a jump target past a key range the scan skips; empty at the start of a scan.
    #[prost(string, tag = "3")]
    pub cursor: String,
    #[prost(uint64, tag = "4")]
    pub pages: u64,
    #[prost(uint64, tag = "5")]
    pub objects: u64,
    /// Shard clock when the running (or last) scan started.
    #[prost(int64, tag = "6")]
    pub started_ms: i64,
    /// Shard clock when the last scan committed its final page (0: none completed).
    #[prost(int64, tag = "7")]
    pub last_completed_ms: i64,
    #[prost(uint64, tag = "8")]
    pub completed: u64,
    /// A completed scan whose absent observations are still being removed (0: none): every
    /// observation last seen by an earlier scan was absent from that complete scan.
    #[prost(uint64, tag = "9")]
    pub sweep_scan: u64,
    /// The last observation key the absence sweep examined.
    #[prost(string, tag = "10")]
    pub sweep_cursor: String,
}

/// An object the inventory found under the shard's key space that no record accounts for.
/// An observation only: nothing ever deletes the object because of it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QuarantineRecord {
    #[prost(uint64, tag = "1")]
    pub size: u64,
    /// Shard clock.
    #[prost(int64, tag = "2")]
    pub first_seen_ms: i64,
    #[prost(int64, tag = "3")]
    pub last_seen_ms: i64,
    /// The scan that saw it last.
    #[prost(uint64, tag = "4")]
    pub seen_scan: u64,
}

/// The byte accounting of one workspace in its shard (see [`crate::shard::quota`]). Every
/// field changes only inside the write session that changes the state it counts.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UsageRecord {
    /// The workspace's byte quota; `None`: unlimited.
    #[prost(uint64, optional, tag = "1")]
    pub quota: Option<u64>,
    /// Sum of the sizes of the workspace's live entries (small files and artifacts).
    #[prost(uint64, tag = "2")]
    pub used_bytes: u64,
    /// Sum of the declared sizes of the uploads holding a reservation.
    #[prost(uint64, tag = "3")]
    pub reserved_bytes: u64,
    /// Uploads holding a reservation: the workspace's unresolved uploads (open, or claimed
    /// after expiry with an attempt still unsettled).
    #[prost(uint64, tag = "4")]
    pub reservations: u64,
}

impl UsageRecord {
    /// Nothing counted and no quota set: the record may be dropped (absent reads as this).
    pub fn is_empty(&self) -> bool {
        self.quota.is_none()
            && self.used_bytes == 0
            && self.reserved_bytes == 0
            && self.reservations == 0
    }
}

/// The ledger state of an operation, upload or delete (transition table:
/// [`crate::shard::operations`]). Names are the operator-facing contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpState {
    Open,
    Committed,
    Aborted,
    Reclaimed,
    Deleting,
    Deleted,
    DeadLetter,
}

impl OpState {
    pub const ALL: [OpState; 7] = [
        OpState::Open,
        OpState::Committed,
        OpState::Aborted,
        OpState::Reclaimed,
        OpState::Deleting,
        OpState::Deleted,
        OpState::DeadLetter,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpState::Open => "open",
            OpState::Committed => "committed",
            OpState::Aborted => "aborted",
            OpState::Reclaimed => "reclaimed",
            OpState::Deleting => "deleting",
            OpState::Deleted => "deleted",
            OpState::DeadLetter => "dead_letter",
        }
    }

    pub fn parse(name: &str) -> Option<OpState> {
        OpState::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Still owns provider bytes or accounting that nobody has settled: counted by the
    /// oldest-unresolved age, never pruned.
    pub fn unresolved(self) -> bool {
        matches!(
            self,
            OpState::Open | OpState::Deleting | OpState::DeadLetter
        )
    }

    /// The ledger state of an upload record.
    pub fn of_upload(rec: &UploadRecord) -> OpState {
        match UploadState::try_from(rec.state) {
            Ok(UploadState::Committed) => OpState::Committed,
            Ok(UploadState::Aborted) => OpState::Aborted,
            Ok(UploadState::Deleting) => OpState::Deleting,
            Ok(UploadState::Reclaimed) => OpState::Reclaimed,
            _ => OpState::Open,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum DeleteState {
    Unspecified = 0,
    /// In the reconciler's automatic queue.
    Deleting = 1,
    /// The provider confirmed the key absent; the row is history until pruned.
    Deleted = 2,
    /// Failed `--delete-attempts` times: out of the automatic queue, record and accounting
    /// kept until an operator retries it.
    DeadLetter = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum DeleteKind {
    Unspecified = 0,
    /// A key no longer referenced (an aborted or reclaimed upload's block, a released
    /// revision's block): queued in the collectable set.
    Block = 1,
    /// A write attempt's key, guarded by its cleanup guard.
    Attempt = 2,
}

/// One row of the operations ledger, keyed by operation id. An upload operation's row only
/// names its upload (`upload_id`): the [`UploadRecord`] is its truth. A delete operation's
/// row is the delete intent itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperationRecord {
    #[prost(string, tag = "1")]
    pub upload_id: String,
    #[prost(enumeration = "DeleteKind", tag = "2")]
    pub kind: i32,
    /// The object key to delete. Never leaves the shard in a summary.
    #[prost(string, tag = "3")]
    pub key: String,
    #[prost(string, tag = "4")]
    pub workspace: String,
    #[prost(uint64, tag = "5")]
    pub bytes: u64,
    #[prost(enumeration = "DeleteState", tag = "6")]
    pub state: i32,
    /// Delete attempts made (failed ones, plus the one that succeeded).
    #[prost(uint32, tag = "7")]
    pub attempts: u32,
    /// The last failure, secret-free (no key, endpoint or credential).
    #[prost(string, tag = "8")]
    pub last_error: String,
    #[prost(int64, tag = "9")]
    pub created_ms: i64,
    #[prost(int64, tag = "10")]
    pub updated_ms: i64,
}

impl OperationRecord {
    pub fn is_upload(&self) -> bool {
        !self.upload_id.is_empty()
    }

    /// The ledger state of a delete operation.
    pub fn op_state(&self) -> OpState {
        match DeleteState::try_from(self.state) {
            Ok(DeleteState::Deleted) => OpState::Deleted,
            Ok(DeleteState::DeadLetter) => OpState::DeadLetter,
            _ => OpState::Deleting,
        }
    }
}

/// One operation as the ledger shows it, whatever its kind: what summaries are built from.
/// It carries no object key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRow {
    pub id: u64,
    /// `upload`, `delete` (a block key) or `attempt_delete` (a guarded attempt key).
    pub kind: &'static str,
    pub state: OpState,
    pub workspace: String,
    pub bytes: u64,
    pub attempts: u32,
    pub last_error: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

impl LedgerRow {
    pub fn of_upload(id: u64, u: &UploadRecord) -> LedgerRow {
        LedgerRow {
            id,
            kind: "upload",
            state: OpState::of_upload(u),
            workspace: u.workspace.clone(),
            bytes: u.size,
            attempts: 0,
            last_error: String::new(),
            created_ms: u.created_ms,
            updated_ms: u.ended_ms.max(u.created_ms),
        }
    }

    pub fn of_delete(id: u64, d: &OperationRecord) -> LedgerRow {
        LedgerRow {
            id,
            kind: if d.kind == DeleteKind::Attempt as i32 {
                "attempt_delete"
            } else {
                "delete"
            },
            state: d.op_state(),
            workspace: d.workspace.clone(),
            bytes: d.bytes,
            attempts: d.attempts,
            last_error: d.last_error.clone(),
            created_ms: d.created_ms,
            updated_ms: d.updated_ms,
        }
    }
}
