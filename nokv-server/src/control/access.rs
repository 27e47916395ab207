//! How a node reaches etcd: over TLS (trusting only `--etcd-ca`, presenting `--etcd-cert` /
//! `--etcd-key`) and, optionally, as an etcd user whose password is read from
//! `--etcd-password-file`; and the start-up probe that turns a refusal into one line naming
//! its cause.
//!
//! Invariants:
//! * The password is held only in [`EtcdPassword`], whose `Debug` prints `<redacted>` and which
//!   has no `Display`; no error, log line or admin summary is built from it. etcd-client's own
//!   `ConnectOptions` derives `Debug` with the password in it, so a `ConnectOptions` is built
//!   only inside [`connect`] and never stored or printed.
//! * A node trusts no system roots for etcd: an `https://` endpoint is verified against
//!   `--etcd-ca` alone (configuration refuses `https://` without it, and `--etcd-ca` with
//!   `http://`).
//! * [`connect`] returns a client only after one endpoint completed the TLS handshake, accepted
//!   the credentials and answered a status call, each within [`PROBE_TIMEOUT`]. The probe dials
//!   each endpoint on its own channel: etcd-client's balanced channel retries a failing
//!   endpoint silently, so a refused certificate would only ever show as a timeout there.

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Bound on establishing TCP and TLS to one endpoint.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the whole start-up probe of one endpoint (connect, authenticate, status).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The file settings of etcd access, as configured (paths only, nothing read yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccessFiles {
    /// `--etcd-ca`: the CA etcd's serving certificate must be signed by.
    pub ca: Option<PathBuf>,
    /// `--etcd-cert`: this node's client certificate (with `key`).
    pub cert: Option<PathBuf>,
    /// `--etcd-key`: its private key.
    pub key: Option<PathBuf>,
    /// `--etcd-user`: the etcd user to authenticate as (with `password_file`).
    pub user: Option<String>,
    /// `--etcd-password-file`: a file holding only that user's password.
    pub password_file: Option<PathBuf>,
}

/// Why etcd could not be used. Each is one line naming its cause (a flag, a file, an endpoint);
/// none carries the password.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// A configured file could not be read.
    #[error("{flag} {}: {source}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A configured file does not hold what the flag needs.
    #[error("{flag} {}: {reason}", path.display())]
    BadFile {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// etcd's serving certificate does not chain to `--etcd-ca`.
    #[error("etcd's certificate at {endpoint} is not signed by --etcd-ca {} ({detail})", ca.display())]
    UntrustedServer {
        endpoint: String,
        ca: PathBuf,
        detail: String,
    },
    /// etcd's serving certificate is signed by `--etcd-ca` but not valid for the host dialled.
    #[error("etcd's certificate at {endpoint} does not name the host dialled ({detail})")]
    WrongName { endpoint: String, detail: String },
    /// etcd demands a client certificate and none was configured.
    #[error(
        "etcd at {endpoint} requires a client certificate: give --etcd-cert and --etcd-key \
         ({alert})"
    )]
    CertificateRequired { endpoint: String, alert: String },
    /// etcd refused the client certificate we presented.
    #[error(
        "etcd at {endpoint} refused our client certificate --etcd-cert {} (not signed by a CA \
         etcd trusts, or expired; {alert})",
        cert.display()
    )]
    CertificateRefused {
        endpoint: String,
        cert: PathBuf,
        alert: String,
    },
    /// etcd refused the user name or password.
    #[error(
        "etcd at {endpoint} refused user {user:?}: wrong user name or password \
         (--etcd-user, --etcd-password-file {})",
        file.display()
    )]
    AuthFailed {
        endpoint: String,
        user: String,
        file: PathBuf,
    },
    /// No answer in time.
    #[error("etcd at {endpoint} did not answer within {}s", timeout.as_secs())]
    Timeout { endpoint: String, timeout: Duration },
    /// Anything else: not listening, not speaking TLS, ...
    #[error("etcd at {endpoint} is unusable: {detail}")]
    Failed { endpoint: String, detail: String },
    /// Several endpoints, none usable: each one's cause.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Endpoints(Vec<AccessError>),
}

/// An etcd password. Printed nowhere: `Debug` is redacted and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdPassword(String);

impl fmt::Debug for EtcdPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// TLS material, read and checked at start-up.
#[derive(Clone, Debug)]
struct Tls {
    ca_path: PathBuf,
    ca_pem: Vec<u8>,
    /// (certificate path, certificate PEM, key PEM).
    identity: Option<(PathBuf, Vec<u8>, KeyPem)>,
}

/// A private key's PEM; `Debug` is redacted.
#[derive(Clone)]
struct KeyPem(Vec<u8>);

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<private key>")
    }
}

/// etcd user credentials.
#[derive(Clone, Debug)]
struct User {
    name: String,
    password: EtcdPassword,
    file: PathBuf,
}

/// Everything a node needs to reach etcd besides its URLs: read once at start-up, so a node
/// that rejoins later uses the same material. Plain http when empty (the default).
#[derive(Clone, Debug, Default)]
pub struct EtcdAccess {
    tls: Option<Tls>,
    user: Option<User>,
}

impl EtcdAccess {
    /// Plain http, no authentication.
    pub fn plain() -> EtcdAccess {
        EtcdAccess::default()
    }

    /// Reads and checks the configured files. The certificate and key, and the user and
    /// password file, come in pairs (configuration enforces it; an unpaired one is ignored
    /// here).
    pub fn load(files: &EtcdAccessFiles) -> Result<EtcdAccess, AccessError> {
        let tls = match &files.ca {
            None => None,
            Some(ca) => {
                let ca_pem = read("--etcd-ca", ca)?;
                let certs = CertificateDer::pem_slice_iter(&ca_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("--etcd-ca", ca, format!("not PEM certificates ({e})")))?;
                if certs.is_empty() {
                    return Err(bad("--etcd-ca", ca, "holds no PEM certificate".into()));
                }
                let identity = match (&files.cert, &files.key) {
                    (Some(cert), Some(key)) => Some(load_identity(cert, key)?),
                    _ => None,
                };
                Some(Tls {
                    ca_path: ca.clone(),
                    ca_pem,
                    identity,
                })
            }
        };
        let user = match (&files.user, &files.password_file) {
            (Some(name), Some(file)) => Some(User {
                name: name.clone(),
                password: read_password(file)?,
                file: file.clone(),
            }),
            _ => None,
        };
        Ok(EtcdAccess { tls, user })
    }

    /// etcd-client's options for this access. Holds the password: build, use, drop.
    fn options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = self.tls_options() {
            options = options.with_tls(tls);
        }
        if let Some(user) = &self.user {
            options = options.with_user(user.name.clone(), user.password.0.clone());
        }
        options
    }

    fn tls_options(&self) -> Option<TlsOptions> {
        let tls = self.tls.as_ref()?;
        let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((_, cert, key)) = &tls.identity {
            options = options.identity(Identity::from_pem(cert, &key.0));
        }
        Some(options)
    }
}

fn load_identity(cert: &Path, key: &Path) -> Result<(PathBuf, Vec<u8>, KeyPem), AccessError> {
    let cert_pem = read("--etcd-cert", cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("--etcd-cert", cert, format!("not a PEM certificate ({e})")))?;
    if chain.is_empty() {
        return Err(bad("--etcd-cert", cert, "holds no PEM certificate".into()));
    }
    let key_pem = read("--etcd-key", key)?;
    PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| bad("--etcd-key", key, format!("not a PEM private key ({e})")))?;
    Ok((cert.to_path_buf(), cert_pem, KeyPem(key_pem)))
}

/// The password file holds the password alone; one trailing line break is not part of it.
fn read_password(file: &Path) -> Result<EtcdPassword, AccessError> {
    let text = std::fs::read_to_string(file).map_err(|source| AccessError::Read {
        flag: "--etcd-password-file",
        path: file.to_path_buf(),
        source,
    })?;
    let password = text
        .strip_suffix('\n')
        .map(|p| p.strip_suffix('\r').unwrap_or(p))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(bad("--etcd-password-file", file, "is empty".into()));
    }
    if password.contains(['\n', '\r']) {
        return Err(bad(
            "--etcd-password-file",
            file,
            "holds more than one line (it must hold the password alone)".into(),
        ));
    }
    Ok(EtcdPassword(password.to_string()))
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, AccessError> {
    std::fs::read(path).map_err(|source| AccessError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

fn bad(flag: &'static str, path: &Path, reason: String) -> AccessError {
    AccessError::BadFile {
        flag,
        path: path.to_path_buf(),
        reason,
    }
}

/// Connects to etcd at `endpoints` with `access`, after probing them one by one: the client is
/// returned once one endpoint answered (TLS, credentials, a status call); when none does, the
/// error names each endpoint's cause.
pub async fn connect(endpoints: &[String], access: &EtcdAccess) -> Result<Client, AccessError> {
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match tokio::time::timeout(PROBE_TIMEOUT, probe(endpoint, access)).await {
            Ok(Ok(())) => {
                failures.clear();
                break;
            }
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push(AccessError::Timeout {
                endpoint: endpoint.clone(),
                timeout: PROBE_TIMEOUT,
            }),
        }
    }
    if !failures.is_empty() {
        return Err(if failures.len() == 1 {
            failures.remove(0)
        } else {
            AccessError::Endpoints(failures)
        });
    }
    let connected = tokio::time::timeout(
        PROBE_TIMEOUT,
        Client::connect(endpoints, Some(access.options())),
    )
    .await;
    match connected {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(classify(&endpoints.join(","), access, &e)),
        Err(_) => Err(AccessError::Timeout {
            endpoint: endpoints.join(","),
            timeout: PROBE_TIMEOUT,
        }),
    }
}

/// One endpoint on a channel of its own: connect (TCP, TLS), authenticate, ask its status.
async fn probe(endpoint: &str, access: &EtcdAccess) -> Result<(), AccessError> {
    let failed = |e: &(dyn StdError + 'static)| classify(endpoint, access, e);
    let mut channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| failed(&e))?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(tls) = access.tls_options() {
        channel = channel.tls_config(tls).map_err(|e| failed(&e))?;
    }
    let channel = channel.connect().await.map_err(|e| failed(&e))?;
    // From here the TLS handshake is complete on our side; etcd checks our certificate after
    // it (TLS 1.3), so a refusal arrives with the first call.
    let after_handshake = |e: &(dyn StdError + 'static)| match failed(e) {
        AccessError::Failed { endpoint, detail }
            if access.tls.is_some() && closed_at_once(&detail) =>
        {
            refused_certificate(endpoint, access, CLOSED_AFTER_HANDSHAKE.into())
        }
        other => other,
    };
    let mut client =
        Client::from_channel(etcd_client::Channel::Tonic(channel), Some(access.options()))
            .await
            .map_err(|e| after_handshake(&e))?;
    client.status().await.map_err(|e| after_handshake(&e))?;
    Ok(())
}

/// What a refusal looks like when etcd's alert is lost: etcd sends it and closes while our
/// first request is unread in its socket, and the kernel's reset can discard the alert before
/// we read it.
const CLOSED_AFTER_HANDSHAKE: &str = "it closed the connection right after the TLS handshake";

/// The connection ended under the first call (closed, reset, cancelled).
fn closed_at_once(detail: &str) -> bool {
    let detail = detail.to_ascii_lowercase();
    [
        "connection closed",
        "connection reset",
        "broken pipe",
        "operation was canceled",
    ]
    .iter()
    .any(|t| detail.contains(t))
}

/// The refusal of our client certificate, or of its absence.
fn refused_certificate(endpoint: String, access: &EtcdAccess, alert: String) -> AccessError {
    match access.tls.as_ref().and_then(|t| t.identity.as_ref()) {
        Some((cert, ..)) => AccessError::CertificateRefused {
            endpoint,
            cert: cert.clone(),
            alert,
        },
        None => AccessError::CertificateRequired { endpoint, alert },
    }
}

/// Names the cause of a failed probe from its error chain: a TLS alert from etcd, a
/// certificate rustls refused, an authentication refusal, or the chain's own text.
fn classify(endpoint: &str, access: &EtcdAccess, error: &(dyn StdError + 'static)) -> AccessError {
    let endpoint = endpoint.to_string();
    let mut texts = Vec::new();
    let mut tls_error = None;
    walk(error, &mut |e| {
        if tls_error.is_none() {
            tls_error = e.downcast_ref::<rustls::Error>().cloned();
        }
        let text = e.to_string();
        if !texts.iter().any(|t: &String| t.contains(&text)) {
            texts.push(text);
        }
    });
    let detail = texts.join(": ").replace(['\n', '\r'], " ");
    let tls = access.tls.as_ref();
    // An alert etcd sends after the handshake (TLS 1.3 checks the client's certificate then)
    // reaches us re-wrapped as text by the HTTP/2 layer, not as a rustls error.
    let alert = match &tls_error {
        Some(rustls::Error::AlertReceived(alert)) => Some(format!("{alert:?}")),
        _ => detail.split_once(ALERT_TEXT).map(|(_, rest)| {
            rest.split(|c: char| !c.is_ascii_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_string()
        }),
    };
    if let Some(alert) = alert {
        return refused_certificate(endpoint, access, format!("alert {alert}"));
    }
    if let Some(rustls::Error::InvalidCertificate(why)) = tls_error {
        use rustls::CertificateError as C;
        let detail = format!("{why:?}");
        return match (why, tls) {
            (C::NotValidForName | C::NotValidForNameContext { .. }, _) => {
                AccessError::WrongName { endpoint, detail }
            }
            (_, Some(tls)) => AccessError::UntrustedServer {
                endpoint,
                ca: tls.ca_path.clone(),
                detail,
            },
            (_, None) => AccessError::Failed { endpoint, detail },
        };
    }
    if let Some(user) = &access.user
        && detail.contains("authentication failed")
    {
        return AccessError::AuthFailed {
            endpoint,
            user: user.name.clone(),
            file: user.file.clone(),
        };
    }
    AccessError::Failed { endpoint, detail }
}

/// How rustls words an alert received from the peer (`rustls::Error::AlertReceived`).
const ALERT_TEXT: &str = "received fatal alert: ";

/// Visits `error` and its causes, looking through `std::io::Error`s (whose `source` skips the
/// error they wrap: a rustls error travels inside one).
fn walk(error: &(dyn StdError + 'static), visit: &mut dyn FnMut(&(dyn StdError + 'static))) {
    let mut next = Some(error);
    while let Some(e) = next {
        visit(e);
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
        {
            walk(inner, visit);
        }
        next = e.source();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_read_alone_from_its_file_and_never_appears_in_debug_output() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret-Pa55\n").unwrap();
        let access = EtcdAccess::load(&EtcdAccessFiles {
            user: Some("nokv".into()),
            password_file: Some(file.clone()),
            ..EtcdAccessFiles::default()
        })
        .unwrap();
        let user = access.user.as_ref().unwrap();
        assert_eq!(user.password, EtcdPassword("s3cret-Pa55".into()));
        let shown = format!("{access:?} {access:#?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("<redacted>") && shown.contains("nokv"),
            "{shown}"
        );
        let refused = AccessError::AuthFailed {
            endpoint: "https://e:2379".into(),
            user: "nokv".into(),
            file: file.clone(),
        };
        assert!(!refused.to_string().contains("s3cret"));
        for bad in ["", "\n", "a\nb\n"] {
            std::fs::write(&file, bad).unwrap();
            let Err(e) = read_password(&file) else {
                panic!("{bad:?} accepted")
            };
            assert!(e.to_string().contains("--etcd-password-file"), "{e}");
        }
    }

    #[test]
    fn unreadable_or_non_pem_tls_files_are_refused_naming_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let missing = dir.path().join("missing.pem");
        let files = |ca: &Path| EtcdAccessFiles {
            ca: Some(ca.to_path_buf()),
            ..EtcdAccessFiles::default()
        };
        for (ca, what) in [(&junk, "holds no PEM"), (&missing, "missing.pem")] {
            let e = EtcdAccess::load(&files(ca)).unwrap_err().to_string();
            assert!(e.starts_with("--etcd-ca ") && e.contains(what), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
