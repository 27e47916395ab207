//! First-start material of a data directory: a development CA and server certificate, the
//! cluster secret, an admin token, and a ready client configuration.
//!
//! Everything is created once and reused on later starts; secrets are written with mode
//! 0600 before any content lands in them. The server certificate is re-issued (by the same
//! CA, so clients keep trusting it) only when the set of names it must cover changes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::ids::random_bytes;
use crate::token::{Claims, Role, Signer, unix_now};

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, BootstrapError>;

/// The loaded material of a data directory.
pub struct Material {
    pub ca_path: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
    pub signer: Signer,
    pub admin_token: String,
}

const CA_NAME: &str = "nokv development CA";
/// Admin tokens written at bootstrap live for ten years: they are the operator's root key for
/// a development data directory and are replaced by deleting `admin.token`.
const ADMIN_TTL_SECS: u64 = 10 * 365 * 86400;

pub fn ensure(data_dir: &Path, advertise: Option<&str>) -> Result<Material> {
    mkdir(data_dir)?;
    let tls = data_dir.join("tls");
    mkdir(&tls)?;

    let secret = match read_opt(&data_dir.join("cluster.secret"))? {
        Some(hex_secret) => hex::decode(hex_secret.trim())
            .map_err(|_| BootstrapError::Invalid("cluster.secret is not hex".into()))?,
        None => {
            let s = random_bytes(32);
            write_secret(&data_dir.join("cluster.secret"), hex::encode(&s).as_bytes())?;
            s
        }
    };
    let signer = Signer::new(&secret);

    let admin_token = match read_opt(&data_dir.join("admin.token"))? {
        Some(t) if signer.verify(t.trim()).is_ok() => t.trim().to_string(),
        _ => {
            let t = signer.issue(&Claims {
                workspaces: vec!["*".into()],
                role: Role::Admin,
                expires: unix_now() + ADMIN_TTL_SECS,
            });
            write_secret(&data_dir.join("admin.token"), t.as_bytes())?;
            t
        }
    };

    let (ca_key_path, ca_path) = (tls.join("ca.key"), tls.join("ca.pem"));
    let ca_key = match read_opt(&ca_key_path)? {
        Some(pem) => KeyPair::from_pem(&pem)?,
        None => {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            write_secret(&ca_key_path, key.serialize_pem().as_bytes())?;
            write_file(&ca_path, cert.pem().as_bytes())?;
            key
        }
    };

    let mut sans = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Some(host) = advertise.filter(|h| !sans.iter().any(|s| s == h)) {
        sans.push(host.to_string());
    }
    let (cert_path, key_path, sans_path) = (
        tls.join("server.pem"),
        tls.join("server.key"),
        tls.join("server.sans"),
    );
    let wanted = sans.join("\n");
    let current = (
        read_opt(&cert_path)?,
        read_opt(&key_path)?,
        read_opt(&sans_path)?,
    );
    let (cert_pem, key_pem) = match current {
        (Some(c), Some(k), Some(s)) if s == wanted => {
            // A stored key that does not parse would only surface when TLS starts; refuse
            // here, naming the file and the way out.
            KeyPair::from_pem(&k).map_err(|e| {
                BootstrapError::Invalid(format!(
                    "{} is not a usable private key ({e}); restore it, or delete it and {} to have new ones issued",
                    key_path.display(),
                    cert_path.display()
                ))
            })?;
            (c, k)
        }
        _ => {
            let issuer = Issuer::new(ca_params()?, ca_key);
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(sans)?;
            params
                .distinguished_name
                .push(DnType::CommonName, "nokv-server");
            let cert = params.signed_by(&key, &issuer)?;
            write_secret(&key_path, key.serialize_pem().as_bytes())?;
            write_file(&cert_path, cert.pem().as_bytes())?;
            write_file(&sans_path, wanted.as_bytes())?;
            (cert.pem(), key.serialize_pem())
        }
    };

    Ok(Material {
        ca_path: fs::canonicalize(&ca_path).map_err(|e| io(&ca_path, e))?,
        cert_pem,
        key_pem,
        signer,
        admin_token,
    })
}

/// Writes `DATA_DIR/client.toml` for the `nokv` CLI. It holds the admin token, so it is a
/// secret file. Rewritten on every start because the endpoint may have changed.
pub fn write_client_config(data_dir: &Path, endpoint: &str, m: &Material) -> Result<PathBuf> {
    let path = data_dir.join("client.toml");
    let body = format!(
        "# Written by nokv-server; points the nokv CLI at this daemon with its admin token.\n\
         endpoint = {endpoint:?}\nca = {:?}\ntoken = {:?}\n",
        m.ca_path.display().to_string(),
        m.admin_token
    );
    write_secret(&path, body.as_bytes())?;
    fs::canonicalize(&path).map_err(|e| io(&path, e))
}

/// Reads the cluster secret of a data directory (for `nokv-server token issue`).
pub fn load_signer(data_dir: &Path) -> Result<Signer> {
    let path = data_dir.join("cluster.secret");
    let hex_secret = read_opt(&path)?.ok_or_else(|| {
        BootstrapError::Invalid(format!(
            "{} does not exist: start nokv-server on this data dir first",
            path.display()
        ))
    })?;
    let secret = hex::decode(hex_secret.trim())
        .map_err(|_| BootstrapError::Invalid("cluster.secret is not hex".into()))?;
    Ok(Signer::new(&secret))
}

/// The CA's parameters are fixed, so the issuer can be rebuilt from the stored key alone.
fn ca_params() -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

fn io(path: &Path, source: std::io::Error) -> BootstrapError {
    BootstrapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| io(p, e))
}

fn read_opt(p: &Path) -> Result<Option<String>> {
    match fs::read_to_string(p) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(p, e)),
    }
}

fn write_file(p: &Path, body: &[u8]) -> Result<()> {
    write_with_mode(p, body, 0o644)
}

fn write_secret(p: &Path, body: &[u8]) -> Result<()> {
    write_with_mode(p, body, 0o600)
}

/// Writes via a temporary file and rename, so a crash never leaves a half-written secret.
fn write_with_mode(p: &Path, body: &[u8], mode: u32) -> Result<()> {
    let tmp = p.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| io(&tmp, e))?;
    f.write_all(body).map_err(|e| io(&tmp, e))?;
    f.sync_all().map_err(|e| io(&tmp, e))?;
    fs::rename(&tmp, p).map_err(|e| io(p, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn first_start_creates_secret_files_0600_and_later_starts_reuse_them() {
        let dir = tempfile::tempdir().unwrap();
        let a = ensure(dir.path(), None).unwrap();
        for f in [
            "cluster.secret",
            "admin.token",
            "tls/ca.key",
            "tls/server.key",
        ] {
            let mode = fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let b = ensure(dir.path(), None).unwrap();
        assert_eq!(a.admin_token, b.admin_token);
        assert_eq!(a.cert_pem, b.cert_pem);
        let c = ensure(dir.path(), Some("nokv.example")).unwrap();
        assert_ne!(
            a.cert_pem, c.cert_pem,
            "a new advertised name re-issues the certificate"
        );
        assert!(b.signer.verify(&a.admin_token).is_ok());
    }
}
