//! Spooling stdin to a private temporary file, for commands that need the size of their input
//! before they send it (`publish -`, and `put` of a large body from stdin).
//!
//! Invariants: the file is created new (never an existing path, never through a link) with
//! mode 0600, so other users cannot read what is piped through the CLI; it is removed when the
//! [`Spool`] is dropped — on success, on failure, and on Ctrl-C, because the CLI answers
//! SIGINT by dropping the running command (see `cli::main`) instead of dying with it.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nokv_client::ClientError;
use tokio::io::{AsyncRead, AsyncWriteExt};

/// A temporary file removed on drop.
pub struct Spool(PathBuf);

impl Spool {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes `head` followed by everything left on stdin to a new spool file.
pub async fn spool_stdin(head: &[u8]) -> Result<Spool, ClientError> {
    spool(head, &mut tokio::io::stdin()).await
}

/// Writes `head` followed by everything left in `rest` to a new spool file.
pub async fn spool<R: AsyncRead + Unpin>(head: &[u8], rest: &mut R) -> Result<Spool, ClientError> {
    let path =
        std::env::temp_dir().join(format!("nokv-stdin-{}", nokv_client::sdk::new_request_id()));
    let err = |e: std::io::Error| ClientError::local(format!("{}: {e}", path.display()));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(err)?;
    // From here on the file is ours and is removed whatever happens next.
    let spool = Spool(path.clone());
    let mut f = tokio::fs::File::from_std(f);
    f.write_all(head).await.map_err(err)?;
    tokio::io::copy(rest, &mut f)
        .await
        .map_err(|e| ClientError::local(format!("spooling stdin: {e}")))?;
    f.flush().await.map_err(err)?;
    Ok(spool)
}
