//! Online backup of a node's metadata, and the data dir a backup restores into.
//!
//! **What a backup is.** A consistent standalone copy of the tables of every shard the node
//! serves, in one file ([`format`]): a header, one section per shard — each the same
//! single-shard store a cluster checkpoint exports ([`crate::meta::MetaStore::export_each`]) —
//! and a trailer whose sha256 covers every byte. [`take`] copies all the shards in one job on
//! the node's committer, between two write batches and from one read snapshot, so the backup
//! holds every write acknowledged before the call (and possibly some later ones), and the
//! shards agree with each other. It streams the file to the caller in chunks from scratch
//! files in the data dir; neither side ever holds it whole in memory.
//!
//! **What a backup carries, and what it does not.**
//! * Metadata only: every shard's entries, small-file bodies, generations, replay records,
//!   uploads, revisions, guards, ledger, quotas, inventory and quarantine rows.
//! * Not the artifact blocks: they live in the object provider, and a restored node finds them
//!   there through the same provider settings (same S3 bucket and prefix, or — local
//!   provider — the old data dir's `objects/` directory moved into the new one). Blocks the
//!   provider deleted after the backup (collected after an overwrite or a delete) are gone;
//!   reading an artifact whose blocks are gone fails, it is never served wrong.
//! * No secret: no cluster secret, admin token, TLS key or certificate — a backup file is
//!   metadata an operator can store like any other, and streaming it never puts a secret on
//!   the wire. A restored data dir gets new ones on its first start (new admin token in its
//!   `client.toml`; tokens signed by the old secret stop working unless the operator copies
//!   the old `cluster.secret` in before that start). Nor the audit log (`events.jsonl`), which
//!   is the old node's history, not its state.
//!
//! **Restore** ([`restore`]) proves the whole file before it creates anything, then builds the
//! new data dir's `shards/` beside it and renames it into place with its `COUNT` already
//! written, so a crash leaves either no `shards/` or a complete one.

pub mod format;
mod restore;
mod take;

use std::path::PathBuf;

pub use restore::{Restored, restore};
pub use take::{Sink, Summary, sweep_scratch, take};

/// Errors of the backup layer. Restore's refusals name the file or directory and say what
/// to do; they surface through `nokv-server restore-backup`, never through the API.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "backup {file} is damaged ({damage}); nothing was restored: use an intact copy of the backup"
    )]
    Damaged { file: PathBuf, damage: Damage },
    #[error(
        "refusing to restore into {dir}: it is not empty (restore-backup creates a new data dir; name a new or empty directory)"
    )]
    NotEmpty { dir: PathBuf },
    #[error(transparent)]
    Meta(#[from] crate::meta::MetaError),
    /// The node changed under the backup (a shard handed off, a scratch file that changed
    /// size): the backup is abandoned; taking it again is safe.
    #[error("backup abandoned: {0}; retry")]
    Interrupted(String),
    /// The node refused the copy (a store out of service, a shard that left).
    #[error(transparent)]
    Node(#[from] crate::error::Error),
    /// The caller went away; nothing is left behind.
    #[error("the caller went away before the backup was sent")]
    CallerGone,
}

/// How a backup file fails its checks (see [`format`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("it does not start like a nokv backup")]
    NotABackup,
    #[error("format version {0} is not one this nokv-server reads")]
    Version(u32),
    #[error("it ends early, at byte {offset}")]
    Truncated { offset: u64 },
    #[error("its framing is wrong at byte {offset}")]
    Framing { offset: u64 },
    #[error("shard {shard}'s section fails its sha256")]
    Section { shard: u32 },
    #[error("the file fails its sha256")]
    File,
    #[error("there are bytes after its end, at byte {offset}")]
    TrailingBytes { offset: u64 },
}

impl From<BackupError> for crate::error::Error {
    fn from(e: BackupError) -> Self {
        use crate::error::Error;
        match e {
            BackupError::Meta(m) => m.into(),
            BackupError::Node(e) => e,
            BackupError::Interrupted(_) | BackupError::CallerGone => {
                Error::Unavailable(e.to_string())
            }
            BackupError::Damaged { .. } => Error::DataCorrupted(e.to_string()),
            BackupError::NotEmpty { .. } => Error::FailedPrecondition(e.to_string()),
            BackupError::Io { .. } => Error::Internal(e.to_string()),
        }
    }
}
