//! The server's one error enum and its mapping to gRPC status, in one place.
//!
//! Every variant is a machine-readable *reason*: the variant name travels in the
//! `nokv-reason` metadata key of the status, so clients branch on the reason rather than
//! parsing messages. Lower layers (`meta`, `object`) have their own error types that convert
//! into this one at the shard boundary.

use tonic::{Code, Status};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Metadata key carrying the reason of a failed call.
pub const REASON_KEY: &str = "nokv-reason";

/// Metadata keys of a `NotOwner` status: the owner's endpoint, its epoch for the shard, and
/// the shard. A client follows the hint only if its epoch is not older than its cached route.
pub const OWNER_HINT_KEY: &str = "nokv-owner-hint";
pub const OWNER_EPOCH_KEY: &str = "nokv-owner-epoch";
pub const OWNER_SHARD_KEY: &str = "nokv-owner-shard";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("generation mismatch: expected {expected}, current {current}")]
    GenerationMismatch { expected: u64, current: u64 },
    /// `hint` is the owner's endpoint (empty when unknown) at `epoch`.
    #[error("shard {shard} is not owned by this node")]
    NotOwner {
        shard: u32,
        hint: String,
        epoch: u64,
    },
    #[error("{0}")]
    LeaseExpired(String),
    #[error("{0}")]
    DigestMismatch(String),
    #[error("{0}")]
    RequestIdReused(String),
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// The request is well-formed but the target is in the wrong state (e.g. committing an
    /// aborted upload, or a block still missing).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Stored bytes no longer match their recorded digest: the server refuses to return
    /// them. Not retryable; the data must be restored (re-written) by its owner.
    #[error("{0}")]
    DataCorrupted(String),
    /// Retryable: the caller may send the same request (same request id) again.
    #[error("{0}")]
    Unavailable(String),
    /// The node's block-memory budget stayed in use past the wait deadline; nothing was done
    /// and the same request may be sent again later.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Internal(String),
    /// An admission cap on unresolved uploads (per workspace or per node) is reached: the
    /// BeginUpload was refused and changed nothing. Not retried automatically by clients
    /// (unlike `ResourceExhausted`): it clears only when uploads are committed or aborted.
    #[error("{0}")]
    AdmissionCapReached(String),
    /// An edit's `old` text does not occur exactly once in the file (`count` times instead):
    /// the edit changed nothing.
    #[error("the text to replace occurs {count} times in {what}; it must occur exactly once")]
    MatchCount { count: u64, what: String },
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotFound(_) => "NotFound",
            Error::AlreadyExists(_) => "AlreadyExists",
            Error::GenerationMismatch { .. } => "GenerationMismatch",
            Error::NotOwner { .. } => "NotOwner",
            Error::LeaseExpired(_) => "LeaseExpired",
            Error::DigestMismatch(_) => "DigestMismatch",
            Error::RequestIdReused(_) => "RequestIdReused",
            Error::QuotaExceeded(_) => "QuotaExceeded",
            Error::InvalidArgument(_) => "InvalidArgument",
            Error::Unauthenticated(_) => "Unauthenticated",
            Error::PermissionDenied(_) => "PermissionDenied",
            Error::FailedPrecondition(_) => "FailedPrecondition",
            Error::DataCorrupted(_) => "DataCorrupted",
            Error::Unavailable(_) => "Unavailable",
            Error::ResourceExhausted(_) => "ResourceExhausted",
            Error::Internal(_) => "Internal",
            Error::AdmissionCapReached(_) => "AdmissionCapReached",
            Error::MatchCount { .. } => "MatchCount",
        }
    }

    fn code(&self) -> Code {
        match self {
            Error::NotFound(_) => Code::NotFound,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::GenerationMismatch { .. } => Code::Aborted,
            Error::NotOwner { .. } => Code::FailedPrecondition,
            Error::LeaseExpired(_) => Code::FailedPrecondition,
            Error::DigestMismatch(_) => Code::InvalidArgument,
            Error::RequestIdReused(_) => Code::AlreadyExists,
            Error::QuotaExceeded(_) => Code::ResourceExhausted,
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::DataCorrupted(_) => Code::DataLoss,
            Error::Unavailable(_) => Code::Unavailable,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Internal(_) => Code::Internal,
            Error::AdmissionCapReached(_) => Code::ResourceExhausted,
            Error::MatchCount { .. } => Code::FailedPrecondition,
        }
    }
}

/// The control plane's errors as the API reports them. Losing ownership (or the lease) is
/// retryable: the shard is moving or its owner is rejoining, and the same request sent again
/// reaches the owner through a hint. A request never gets `NotOwner` without a hint from here.
impl From<crate::control::ControlError> for Error {
    fn from(e: crate::control::ControlError) -> Self {
        use crate::control::ControlError as C;
        match e {
            C::Etcd(_) | C::Access(_) | C::LeaseLost | C::NotOwner { .. } => Error::Unavailable(
                format!("{e}; the shard is moving or its owner is rejoining, retry"),
            ),
            C::ConfigMismatch { .. } | C::NodeIdInUse { .. } => {
                Error::FailedPrecondition(e.to_string())
            }
            C::ShardOutOfRange { .. } | C::InvalidArgument(_) => {
                Error::InvalidArgument(e.to_string())
            }
            C::Corrupt { .. } => Error::Internal(e.to_string()),
        }
    }
}

impl From<Error> for Status {
    /// Every error answer is made here, so this is where an answer derived from a failed fsync
    /// is stopped (see [`crate::fsync_latch`]).
    fn from(e: Error) -> Status {
        crate::fsync_latch::hold_if_failed();
        let mut status = Status::new(e.code(), format!("{}: {e}", e.reason()));
        let md = status.metadata_mut();
        md.insert(REASON_KEY, e.reason().parse().expect("reason is ascii"));
        if let Error::NotOwner { shard, hint, epoch } = &e {
            if let Ok(v) = hint.parse() {
                md.insert(OWNER_HINT_KEY, v);
            }
            md.insert(OWNER_EPOCH_KEY, epoch.to_string().parse().expect("digits"));
            md.insert(OWNER_SHARD_KEY, shard.to_string().parse().expect("digits"));
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_not_owner_status_carries_the_owner_hint_its_epoch_and_the_shard() {
        let s = Status::from(Error::NotOwner {
            shard: 3,
            hint: "https://b:7878".into(),
            epoch: 7,
        });
        let md = s.metadata();
        assert_eq!(md.get(REASON_KEY).unwrap(), "NotOwner");
        assert_eq!(md.get(OWNER_HINT_KEY).unwrap(), "https://b:7878");
        assert_eq!(md.get(OWNER_EPOCH_KEY).unwrap(), "7");
        assert_eq!(md.get(OWNER_SHARD_KEY).unwrap(), "3");
    }
}
