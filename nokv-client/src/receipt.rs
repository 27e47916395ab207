//! Resumable publication under a stable receipt, the client's half.
//!
//! A receipt (`PublishOptions::receipt`, `nokv publish --receipt ID`) names one logical
//! publication. Its identity is (path, size, whole-file sha256), which the server must know
//! at BeginUpload, so the SDK hashes the source file in a first pass before it begins. The
//! server then answers one of three ways (see `BeginUploadRequest.receipt` in the proto):
//! a new upload, the receipt's open upload with the indexes of the blocks it has recorded
//! (the SDK reads and hashes every block again but sends only the others, then commits), or
//! the entry an earlier run committed (nothing is sent). The same receipt with another file
//! is refused with `RequestIdReused`.
//!
//! A run under a receipt that fails with an unknown outcome (transport lost, server
//! unavailable) does not abort its upload: the rerun resumes it while its lease lives. Any
//! other failure aborts as without a receipt. Without a receipt nothing of this applies and
//! every publish is a new upload.

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::ClientError;

/// The sha256 of what `reader` yields to its end, read in 4 MiB pieces (never held in memory
/// as a whole).
pub(crate) async fn reader_sha256<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Vec<u8>> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(hasher.finalize().to_vec());
        }
        hasher.update(&buf[..n]);
    }
}

/// Whether a failed publish under a receipt leaves its upload open for a rerun to resume
/// instead of aborting it: only when the failure's outcome is unknown (the network or the
/// server went away, or stopped accepting connections — exactly the failures a rerun is for).
pub(crate) fn keep_open_after(receipt: Option<&str>, e: &ClientError) -> bool {
    receipt.is_some() && (e.outcome_unknown() || e.is_transport())
}

/// The refusal of a publish whose source changed between the hashing pass and the sending
/// pass (the server found the declared identity is not the bytes it received): nothing was
/// published.
pub(crate) fn source_changed() -> ClientError {
    ClientError::local(
        "the source changed while it was being published (its sha256 differs from the one \
         declared under the receipt); nothing was published",
    )
}
