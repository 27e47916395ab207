//! Key material shared by the development bootstrap of a data directory ([`crate::bootstrap`])
//! and the cluster TLS directory ([`crate::cluster_tls`]): the CA, node certificates signed by
//! it, the token secret, the admin token, and the files that hold them.
//!
//! Invariants: secret files are created with mode 0600 before any content lands in them, and
//! every file is written via a temporary file and a rename, so a crash never leaves a
//! half-written key or secret behind.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::ids::random_bytes;
use crate::token::{Claims, Role, Signer, unix_now};

/// Why key material could not be created, loaded or written. Defined here, at the bottom of
/// the key-material modules, so [`crate::bootstrap`] and [`crate::cluster_tls`] both take it
/// from below (it keeps its historical name; `bootstrap` re-exports it).
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

/// File name of the hex token secret, the same in a data directory and a cluster directory
/// (so `nokv-server token issue --data-dir C` signs with a cluster's secret).
pub const SECRET_FILE: &str = "cluster.secret";
/// File name of the admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// Common name of a data directory's development CA.
pub const DEV_CA_NAME: &str = "nokv development CA";
/// Common name of a cluster directory's CA.
pub const CLUSTER_CA_NAME: &str = "nokv cluster CA";
/// Admin tokens written at bootstrap live for ten years: they are the operator's root key for
/// a data or cluster directory and are replaced by deleting `admin.token`.
const ADMIN_TTL_SECS: u64 = 10 * 365 * 86400;

/// A freshly generated CA named `ca_name`: its private key and self-signed certificate (PEM).
pub fn new_ca(ca_name: &str) -> Result<(KeyPair, String)> {
    let key = KeyPair::generate()?;
    let cert = ca_params(ca_name)?.self_signed(&key)?;
    Ok((key, cert.pem()))
}

/// A new leaf certificate for `sans` (DNS names or IP addresses), signed by the CA whose key is
/// `ca_key` and named `ca_name` (the name must be the CA certificate's: it becomes the leaf's
/// issuer name, which chain verification matches); returns (certificate PEM, private key PEM).
pub fn issue_leaf(ca_key: KeyPair, ca_name: &str, sans: Vec<String>) -> Result<(String, String)> {
    issue_leaf_for(ca_key, ca_name, sans, "nokv-server", Vec::new())
}

/// Like [`issue_leaf`], with the leaf's common name and extended key usages chosen (an empty
/// list leaves the extension out: any use). etcd's certificates carry them explicitly: Go checks
/// `clientAuth` on a client certificate and `serverAuth` on a server one when present, and an
/// etcd with `--client-cert-auth` also dials itself (its gRPC gateway) with its server
/// certificate, so that one needs both. With etcd's auth on, the common name of a client
/// certificate is the etcd user it authenticates as.
pub fn issue_leaf_for(
    ca_key: KeyPair,
    ca_name: &str,
    sans: Vec<String>,
    common_name: &str,
    usages: Vec<ExtendedKeyUsagePurpose>,
) -> Result<(String, String)> {
    let issuer = Issuer::new(ca_params(ca_name)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new random token secret, hex as stored in [`SECRET_FILE`].
pub fn new_secret_hex() -> String {
    hex::encode(random_bytes(32))
}

/// Parses the contents of a [`SECRET_FILE`].
pub fn parse_secret(path: &Path, hex_secret: &str) -> Result<Signer> {
    let secret = hex::decode(hex_secret.trim())
        .map_err(|_| BootstrapError::Invalid(format!("{} is not hex", path.display())))?;
    Ok(Signer::new(&secret))
}

/// A long-lived admin token for every workspace.
pub fn issue_admin_token(signer: &Signer) -> String {
    signer.issue(&Claims {
        workspaces: vec!["*".into()],
        role: Role::Admin,
        expires: unix_now() + ADMIN_TTL_SECS,
    })
}

/// The CA's parameters are fixed, so the issuer can be rebuilt from the stored key alone.
fn ca_params(ca_name: &str) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, ca_name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

pub fn io(path: &Path, source: std::io::Error) -> BootstrapError {
    BootstrapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| io(p, e))
}

pub fn canonical(p: &Path) -> Result<PathBuf> {
    fs::canonicalize(p).map_err(|e| io(p, e))
}

/// The file's text, or `None` when it does not exist.
pub fn read_opt(p: &Path) -> Result<Option<String>> {
    match fs::read_to_string(p) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(p, e)),
    }
}

/// A public file (certificates).
pub fn write_file(p: &Path, body: &[u8]) -> Result<()> {
    write_with_mode(p, body, 0o644)
}

/// A secret file (keys, secret, tokens): mode 0600 from its creation.
pub fn write_secret(p: &Path, body: &[u8]) -> Result<()> {
    write_with_mode(p, body, 0o600)
}

/// Writes via a temporary file and rename, so a crash never leaves a half-written file.
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
