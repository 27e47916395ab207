//! Where the client connects and with which credentials. Flags win over `NOKV_*`
//! environment variables, which win over the TOML file at `NOKV_CONFIG` (or
//! `~/.config/nokv/config.toml`); the daemon writes such a file as `DATA_DIR/client.toml`.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::{ClientError, Reason};

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

/// Where a token comes from and how one is issued: appended to an `Unauthenticated` answer
/// when the call carried no token.
pub const NO_TOKEN_NOTE: &str = "no token was given: pass --token, set NOKV_TOKEN, or put \
     `token = \"...\"` in the config file (NOKV_CONFIG, or ~/.config/nokv/config.toml); an \
     operator issues one with `nokv-server token issue --data-dir DATA_DIR --workspace WS \
     --role read|write|admin`";

/// Whether `NOKV_TOKEN` is present in the environment with an empty (or blank) value.
pub fn token_env_is_empty() -> bool {
    std::env::var("NOKV_TOKEN").is_ok_and(|t| t.trim().is_empty())
}

/// The endpoint used when none is configured.
const DEFAULT_ENDPOINT: &str = "https://127.0.0.1:7878";

/// Where one connection setting came from, named in every error about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag (`--endpoint`), or the caller of [`ClientConfig::resolve`].
    Flag(&'static str),
    /// An environment variable (`NOKV_TOKEN`).
    Env(&'static str),
    /// The config file at this path.
    File(PathBuf),
    /// Set nowhere: the built-in default (the endpoint, the config file's home path).
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(flag) => f.write_str(flag),
            Source::Env(var) => f.write_str(var),
            Source::File(path) => write!(f, "config file {}", path.display()),
            Source::Default => f.write_str("default"),
        }
    }
}

/// Where each resolved setting came from. Secrets are not kept here: only their source.
#[derive(Debug, Clone)]
pub struct Sources {
    pub endpoint: Source,
    pub ca: Source,
    /// `None`: no token setting anywhere. A setting present but empty (`NOKV_TOKEN=`) is
    /// `Some` with [`Sources::token_empty`] set.
    pub token: Option<Source>,
    pub token_empty: bool,
    /// The config file read, and where its path came from (`NOKV_CONFIG` or the default).
    pub file: Option<(PathBuf, Source)>,
}

/// A connection setting that cannot be used. Every variant names the setting and where it
/// came from; none contains a token. All are usage errors (the CLI exits 2): the command
/// cannot run as configured, and retrying cannot help.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    #[error("config file ({from}) {}: {why}", path.display())]
    File {
        path: PathBuf,
        from: Source,
        why: String,
    },
    #[error("CA file ({from}) {}: {why}", path.display())]
    CaFile {
        path: PathBuf,
        from: Source,
        why: String,
    },
    /// No CA and no config file: nothing says where the server is or how to trust it.
    #[error(
        "no configuration: no --ca, NOKV_CA or NOKV_CONFIG, and no ~/.config/nokv/config.toml; \
         export NOKV_CONFIG=DATA_DIR/client.toml (a fresh nokv-server prints this line), or pass \
         --endpoint, --ca and --token"
    )]
    Nothing,
    #[error(
        "no CA certificate: the config file ({from}) {} has no `ca`, and neither --ca nor NOKV_CA \
         is set",
        path.display()
    )]
    NoCa { path: PathBuf, from: Source },
    #[error("the token ({from}) contains spaces or non-ASCII characters: it is not a nokv token")]
    Token { from: Source },
    #[error("{why} (endpoint from {from})")]
    Endpoint { why: String, from: Source },
}

impl From<ConfigError> for ClientError {
    fn from(e: ConfigError) -> Self {
        ClientError::usage(e.to_string())
    }
}

impl ClientConfig {
    /// Fills unset fields from the environment, then from the config file.
    ///
    /// Tokens are trimmed of surrounding whitespace (a token read from a file or `$(cat ...)`
    /// usually ends in a newline). A token setting that is present but empty — `--token ''` or
    /// `NOKV_TOKEN=` — means "no token": it still wins over the lower layers, so an empty
    /// variable never silently falls back to the admin token of the config file.
    pub fn resolve(self) -> Result<ResolvedConfig, ClientError> {
        Ok(self.resolve_with_sources()?.0)
    }

    /// [`Self::resolve`], also saying where each setting came from. The settings are checked
    /// here, so an error names the setting and its source: each endpoint must be `https://`,
    /// the CA file must be readable, the token must be one.
    pub fn resolve_with_sources(self) -> Result<(ResolvedConfig, Sources), ConfigError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut endpoint = pick(
            self.endpoint,
            "--endpoint",
            env("NOKV_ENDPOINT"),
            "NOKV_ENDPOINT",
        );
        let mut ca = pick(
            self.ca,
            "--ca",
            env("NOKV_CA").map(PathBuf::from),
            "NOKV_CA",
        );
        let mut token = pick(
            self.token,
            "--token",
            std::env::var("NOKV_TOKEN").ok(),
            "NOKV_TOKEN",
        );
        let file = match env("NOKV_CONFIG") {
            Some(p) => Some((PathBuf::from(p), Source::Env("NOKV_CONFIG"))),
            None => env("HOME")
                .map(|home| PathBuf::from(home).join(".config/nokv/config.toml"))
                .filter(|p| p.exists())
                .map(|p| (p, Source::Default)),
        };
        if let Some((path, from)) = &file {
            let fail = |why: String| ConfigError::File {
                path: path.clone(),
                from: from.clone(),
                why,
            };
            let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
            let f: ClientConfig = toml::from_str(&text).map_err(|e| fail(e.to_string()))?;
            let here = || Source::File(path.clone());
            endpoint = endpoint
                .or(f.endpoint.map(|e| (e, here())))
                .or(f.endpoints.map(|e| (e.join(","), here())));
            ca = ca.or(f.ca.map(|c| (c, here())));
            token = token.or(f.token.map(|t| (t, here())));
        }
        let (endpoint, endpoint_from) =
            endpoint.unwrap_or_else(|| (DEFAULT_ENDPOINT.into(), Source::Default));
        let (ca, ca_from) = match (ca, &file) {
            (Some(ca), _) => ca,
            (None, None) => return Err(ConfigError::Nothing),
            (None, Some((path, from))) => {
                return Err(ConfigError::NoCa {
                    path: path.clone(),
                    from: from.clone(),
                });
            }
        };
        let token_from = token.as_ref().map(|(_, from)| from.clone());
        let token = match token.as_ref().map(|(t, from)| (t.trim(), from)) {
            None | Some(("", _)) => None,
            Some((t, _)) if t.bytes().all(|b| b.is_ascii_graphic()) => Some(t.to_string()),
            Some((_, from)) => return Err(ConfigError::Token { from: from.clone() }),
        };
        let resolved = ResolvedConfig {
            endpoint,
            ca,
            token,
        };
        for e in resolved.endpoints() {
            require_https(&e).map_err(|e| ConfigError::Endpoint {
                why: e.message,
                from: endpoint_from.clone(),
            })?;
        }
        std::fs::read(&resolved.ca).map_err(|e| ConfigError::CaFile {
            path: resolved.ca.clone(),
            from: ca_from.clone(),
            why: e.to_string(),
        })?;
        let sources = Sources {
            endpoint: endpoint_from,
            ca: ca_from,
            token_empty: token_from.is_some() && resolved.token.is_none(),
            token: token_from,
            file,
        };
        Ok((resolved, sources))
    }
}

/// The first of a flag's value and an environment variable's, with its source.
fn pick<T>(
    flag: Option<T>,
    flag_name: &'static str,
    env: Option<T>,
    var: &'static str,
) -> Option<(T, Source)> {
    flag.map(|v| (v, Source::Flag(flag_name)))
        .or(env.map(|v| (v, Source::Env(var))))
}

impl Sources {
    /// `e` with the source of the setting it is about: the endpoint of a refused connection,
    /// the CA of an untrusted certificate, the token of an `Unauthenticated` or
    /// `PermissionDenied` answer (and, with no token at all, where one comes from and how one
    /// is issued). Other errors are returned as they are.
    pub fn explain(&self, e: ClientError) -> ClientError {
        let note = match &e.reason {
            Reason::Refused => format!("(endpoint from {})", self.endpoint),
            Reason::Transport if e.message.starts_with("cannot connect") => {
                format!("(endpoint from {})", self.endpoint)
            }
            Reason::Untrusted => format!("(CA from {})", self.ca),
            Reason::Server(r) if r == "Unauthenticated" => match &self.token {
                None => format!("; {NO_TOKEN_NOTE}"),
                Some(Source::Env("NOKV_TOKEN")) if self.token_empty => {
                    format!("; {EMPTY_TOKEN_NOTE}")
                }
                Some(from) if self.token_empty => {
                    format!("; {from} is empty, which means no token; {NO_TOKEN_NOTE}")
                }
                Some(from) => format!(
                    "(token from {from}); a new one is issued with `nokv-server token issue \
                     --data-dir DATA_DIR --workspace WS --role read|write|admin`"
                ),
            },
            Reason::Server(r) if r == "PermissionDenied" => match &self.token {
                Some(from) => format!("(token from {from})"),
                None => return e,
            },
            _ => return e,
        };
        let sep = if note.starts_with(';') { "" } else { " " };
        ClientError {
            message: format!("{}{sep}{note}", e.message),
            ..e
        }
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
            vec![DEFAULT_ENDPOINT.into()]
        } else {
            list
        }
    }
}

/// nokv speaks only gRPC over TLS: an endpoint without a scheme, or with any scheme but
/// `https://`, is refused here with a message that says so, instead of failing later with an
/// HTTP/2 protocol error from a plaintext or non-HTTP peer.
pub fn require_https(endpoint: &str) -> Result<(), ClientError> {
    match endpoint.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => Ok(()),
        Some((scheme, rest)) => Err(ClientError::usage(format!(
            "endpoint {endpoint:?} uses {scheme}://: `https://` required (nokv serves only TLS), \
             e.g. https://{rest}"
        ))),
        None => Err(ClientError::usage(format!(
            "endpoint {endpoint:?} has no scheme: `https://` required, e.g. https://{endpoint}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(token: Option<Source>, token_empty: bool) -> Sources {
        Sources {
            endpoint: Source::Env("NOKV_ENDPOINT"),
            ca: Source::File(PathBuf::from("/d/client.toml")),
            token,
            token_empty,
            file: Some((PathBuf::from("/d/client.toml"), Source::Env("NOKV_CONFIG"))),
        }
    }

    fn server(reason: &str, message: &str) -> ClientError {
        ClientError {
            reason: Reason::Server(reason.into()),
            code: None,
            message: message.into(),
        }
    }

    #[test]
    fn each_error_about_a_setting_names_where_that_setting_came_from() {
        let s = sources(Some(Source::Flag("--token")), false);
        let refused = crate::error::refused("https://h:1");
        assert!(
            s.explain(refused)
                .message
                .ends_with("is nokv-server running? (endpoint from NOKV_ENDPOINT)")
        );
        let denied = s.explain(server("PermissionDenied", "x"));
        assert_eq!(denied.message, "x (token from --token)");
        let local = s.explain(ClientError::local("disk full"));
        assert_eq!(
            local.message, "disk full",
            "unrelated errors are left alone"
        );
        let e = ConfigError::CaFile {
            path: "/x.pem".into(),
            from: Source::Flag("--ca"),
            why: "No such file or directory (os error 2)".into(),
        };
        assert_eq!(
            e.to_string(),
            "CA file (--ca) /x.pem: No such file or directory (os error 2)"
        );
        assert_eq!(ClientError::from(e).reason, Reason::Usage);
    }

    #[test]
    fn an_unauthenticated_call_without_a_token_says_where_one_comes_from() {
        let none = sources(None, false).explain(server("Unauthenticated", "missing bearer token"));
        assert!(none.message.contains(NO_TOKEN_NOTE), "{}", none.message);
        let empty = sources(Some(Source::Env("NOKV_TOKEN")), true)
            .explain(server("Unauthenticated", "missing bearer token"));
        assert!(
            empty.message.contains(EMPTY_TOKEN_NOTE),
            "{}",
            empty.message
        );
    }
}
