//! How a program that starts `nokv-server` learns that it is ready and how to reach it: the
//! one stdout line that says it listens, and the `client.toml` it writes into its data dir.
//!
//! Two programs start daemons — the CLI's benchmarks (`cli/bench/harness.rs`) and the
//! black-box tests (`tests/src`) — and both read these two contracts through here, so a change
//! to either is made in one place. (The daemon prints the line only once it accepts
//! connections, and writes `client.toml` before printing it.)

use std::path::{Path, PathBuf};

use crate::error::ClientError;

/// The prefix of the daemon's ready line; the endpoint (`https://HOST:PORT`) follows.
pub const LISTENING_PREFIX: &str = "nokv-server listening on ";

/// The endpoint if `line` is the daemon's ready line.
pub fn listening_endpoint(line: &str) -> Option<&str> {
    line.strip_prefix(LISTENING_PREFIX)?
        .split_whitespace()
        .next()
}

/// What a started daemon's `client.toml` says: its CA and admin token.
#[derive(Debug, Clone)]
pub struct ClientFiles {
    pub ca: PathBuf,
    pub token: String,
}

/// Reads `DATA_DIR/client.toml`. A missing `ca` means the data dir's own `tls/ca.pem`.
pub fn client_files(data_dir: &Path) -> Result<ClientFiles, ClientError> {
    let path = data_dir.join("client.toml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ClientError::local(format!("{}: {e}", path.display())))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| ClientError::local(format!("{}: {e}", path.display())))?;
    let string = |key: &str| table.get(key).and_then(|v| v.as_str()).map(str::to_string);
    Ok(ClientFiles {
        ca: string("ca").map_or_else(|| data_dir.join("tls/ca.pem"), PathBuf::from),
        token: string("token").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_names_the_endpoint_and_nothing_else_does() {
        assert_eq!(
            listening_endpoint("nokv-server listening on https://127.0.0.1:43121\n"),
            Some("https://127.0.0.1:43121")
        );
        assert_eq!(listening_endpoint("nokv-server metrics on http://x"), None);
    }

    #[test]
    fn client_toml_token_is_read() {
        let dir = std::env::temp_dir().join(format!("nokv-launch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("client.toml"),
            "endpoint = \"https://127.0.0.1:1\"\nca = \"/x/ca.pem\"\ntoken = \"abc.def\"\n",
        )
        .unwrap();
        let files = client_files(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (files.ca, files.token.as_str()),
            (PathBuf::from("/x/ca.pem"), "abc.def")
        );
        assert!(client_files(&dir).is_err());
    }
}
