//! Where the client connects and with which credentials. Flags win over `NOKV_*`
//! environment variables, which win over the TOML file at `NOKV_CONFIG` (or
//! `~/.config/nokv/config.toml`); the daemon writes such a file as `DATA_DIR/client.toml`.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::ClientError;

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct ClientConfig {
    /// One endpoint, or several separated by commas (`--endpoint A,B,C`, `NOKV_ENDPOINT`).
    pub endpoint: Option<String>,
    /// Several endpoints (TOML `endpoints = [...]`); `endpoint` wins when both are set.
    pub endpoints: Option<Vec<String>>,
    /// PEM file of the CA that signed the server certificate.
    pub ca: Option<PathBuf>,
    pub token: Option<String>,
}

/// Appended to an `Unauthenticated` answer when `NOKV_TOKEN` is set but empty, so the user
/// learns why the token in the config file was not used.
pub const EMPTY_TOKEN_NOTE: &str = "NOKV_TOKEN is set but empty, which means no token (the token in the config file is not \
     used); unset NOKV_TOKEN to use it";

/// Whether `NOKV_TOKEN` is present in the environment with an empty (or blank) value.
pub fn token_env_is_empty() -> bool {
    std::env::var("NOKV_TOKEN").is_ok_and(|t| t.trim().is_empty())
}

impl ClientConfig {
    /// Fills unset fields from the environment, then from the config file.
    ///
    /// Tokens are trimmed of surrounding whitespace (a token read from a file or `$(cat ...)`
    /// usually ends in a newline). A token setting that is present but empty — `--token ''` or
    /// `NOKV_TOKEN=` — means "no token": it still wins over the lower layers, so an empty
    /// variable never silently falls back to the admin token of the config file.
    pub fn resolve(mut self) -> Result<ResolvedConfig, ClientError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        self.endpoint = self.endpoint.or_else(|| env("NOKV_ENDPOINT"));
        self.ca = self.ca.or_else(|| env("NOKV_CA").map(PathBuf::from));
        self.token = self.token.or_else(|| std::env::var("NOKV_TOKEN").ok());
        let file = env("NOKV_CONFIG").map(PathBuf::from).or_else(|| {
            let home = env("HOME")?;
            let p = PathBuf::from(home).join(".config/nokv/config.toml");
            p.exists().then_some(p)
        });
        if let Some(path) = file {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ClientError::local(format!("{}: {e}", path.display())))?;
            let f: ClientConfig = toml::from_str(&text)
                .map_err(|e| ClientError::local(format!("{}: {e}", path.display())))?;
            self.endpoint = self
                .endpoint
                .or(f.endpoint)
                .or(f.endpoints.map(|e| e.join(",")));
            self.ca = self.ca.or(f.ca);
            self.token = self.token.or(f.token);
        }
        let token = match self.token.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(t) if t.bytes().all(|b| b.is_ascii_graphic()) => Some(t.to_string()),
            Some(_) => {
                return Err(ClientError::usage(
                    "the token contains spaces or non-ASCII characters: it is not a nokv token",
                ));
            }
        };
        Ok(ResolvedConfig {
            endpoint: self
                .endpoint
                .unwrap_or_else(|| "https://127.0.0.1:7878".into()),
            ca: self.ca.ok_or_else(|| {
                ClientError::local(
                    "no CA certificate: pass --ca, set NOKV_CA, or export NOKV_CONFIG=DATA_DIR/client.toml",
                )
            })?,
            token,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ResolvedConfig {
    /// One endpoint or a comma-separated list, tried in order (see [`Self::endpoints`]).
    pub endpoint: String,
    pub ca: PathBuf,
    pub token: Option<String>,
}

impl ResolvedConfig {
    /// The configured endpoints in order, blanks dropped; never empty (a blank setting means
    /// the default endpoint).
    pub fn endpoints(&self) -> Vec<String> {
        let list: Vec<String> = self
            .endpoint
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        if list.is_empty() {
            vec!["https://127.0.0.1:7878".into()]
        } else {
            list
        }
    }
}
