//! First-start material of a data directory: a development CA and server certificate, the
//! cluster secret, an admin token, and a ready client configuration.
//!
//! Everything is created once and reused on later starts; secrets are written with mode
//! 0600 before any content lands in them. The server certificate is re-issued (by the same
//! CA, so clients keep trusting it) only when the set of names it must cover changes.

use std::path::{Path, PathBuf};

use rcgen::KeyPair;

/// The error of key material lives in [`crate::pki`], below this module, because the
/// helpers that raise it are there; re-exported so callers keep naming it from here.
pub use crate::pki::BootstrapError;
use crate::pki::{
    self, ADMIN_TOKEN_FILE, SECRET_FILE, canonical, mkdir, read_opt, write_file, write_secret,
};
use crate::token::Signer;

type Result<T> = std::result::Result<T, BootstrapError>;

/// The loaded TLS and token material a node serves with, from a data directory (development)
/// or a cluster directory (`--tls-dir`).
pub struct Material {
    pub ca_path: PathBuf,
    /// Where the certificate and key came from, to name them when they turn out unusable.
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
    pub signer: Signer,
    pub admin_token: String,
}

pub fn ensure(data_dir: &Path, advertise: Option<&str>) -> Result<Material> {
    mkdir(data_dir)?;
    let tls = data_dir.join("tls");
    mkdir(&tls)?;

    let secret_path = data_dir.join(SECRET_FILE);
    let signer = match read_opt(&secret_path)? {
        Some(hex_secret) => pki::parse_secret(&secret_path, &hex_secret)?,
        None => {
            let s = pki::new_secret_hex();
            write_secret(&secret_path, s.as_bytes())?;
            pki::parse_secret(&secret_path, &s)?
        }
    };

    let admin_token = match read_opt(&data_dir.join(ADMIN_TOKEN_FILE))? {
        Some(t) if signer.verify(t.trim()).is_ok() => t.trim().to_string(),
        _ => {
            let t = pki::issue_admin_token(&signer);
            write_secret(&data_dir.join(ADMIN_TOKEN_FILE), t.as_bytes())?;
            t
        }
    };

    let (ca_key_path, ca_path) = (tls.join("ca.key"), tls.join("ca.pem"));
    let ca_key = match read_opt(&ca_key_path)? {
        Some(pem) => KeyPair::from_pem(&pem)?,
        None => {
            let (key, cert_pem) = pki::new_ca(pki::DEV_CA_NAME)?;
            write_secret(&ca_key_path, key.serialize_pem().as_bytes())?;
            write_file(&ca_path, cert_pem.as_bytes())?;
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
            let (cert, key) = pki::issue_leaf(ca_key, pki::DEV_CA_NAME, sans)?;
            write_secret(&key_path, key.as_bytes())?;
            write_file(&cert_path, cert.as_bytes())?;
            write_file(&sans_path, wanted.as_bytes())?;
            (cert, key)
        }
    };

    Ok(Material {
        ca_path: canonical(&ca_path)?,
        cert_path,
        key_path,
        cert_pem,
        key_pem,
        signer,
        admin_token,
    })
}

/// Writes `DATA_DIR/client.toml` for the `nokv` CLI. It holds the admin token, so it is a
/// secret file. Rewritten at a start only when its content changes (the endpoint may have):
/// a restart on a full disk must not fail on rewriting a file that is already right — the
/// store's own refusal, if any, is the message that matters there.
pub fn write_client_config(data_dir: &Path, endpoint: &str, m: &Material) -> Result<PathBuf> {
    let path = data_dir.join("client.toml");
    let body = client_toml(endpoint, &m.ca_path, &m.admin_token);
    if std::fs::read(&path).ok().as_deref() != Some(body.as_bytes()) {
        write_secret(&path, body.as_bytes())?;
    }
    canonical(&path)
}

/// The body of a `client.toml`: endpoint, CA file and admin token (no `token` line when the
/// node has no admin token: a cluster node started from a directory without `admin.token`).
pub fn client_toml(endpoint: &str, ca_path: &Path, admin_token: &str) -> String {
    if admin_token.is_empty() {
        return format!(
            "# Written by nokv-server; points the nokv CLI at nokv. This node has no admin \
             token:\n# give one with --token, NOKV_TOKEN or a `token = ...` line.\n\
             endpoint = {endpoint:?}\nca = {:?}\n",
            ca_path.display().to_string(),
        );
    }
    format!(
        "# Written by nokv-server; points the nokv CLI at nokv with the admin token.\n\
         endpoint = {endpoint:?}\nca = {:?}\ntoken = {admin_token:?}\n",
        ca_path.display().to_string(),
    )
}

/// Reads the token secret of a data (or cluster) directory (for `nokv-server token issue`).
pub fn load_signer(data_dir: &Path) -> Result<Signer> {
    let path = data_dir.join(SECRET_FILE);
    let hex_secret = read_opt(&path)?.ok_or_else(|| {
        BootstrapError::Invalid(format!(
            "{} does not exist: start nokv-server on this data dir first",
            path.display()
        ))
    })?;
    pki::parse_secret(&path, &hex_secret)
}

/// The material a daemon on `data_dir` serves with, read and never written (for
/// `nokv-server rpc-floor`, which must not re-issue a running daemon's certificate): refused
/// when any of it is missing. No admin token is loaded.
pub fn load_existing(data_dir: &Path) -> Result<Material> {
    let signer = load_signer(data_dir)?;
    let tls = data_dir.join("tls");
    let (ca_path, cert_path, key_path) = (
        tls.join("ca.pem"),
        tls.join("server.pem"),
        tls.join("server.key"),
    );
    let read = |path: &Path| {
        read_opt(path)?.ok_or_else(|| {
            BootstrapError::Invalid(format!(
                "{} does not exist: start nokv-server on this data dir first",
                path.display()
            ))
        })
    };
    let (cert_pem, key_pem) = (read(&cert_path)?, read(&key_path)?);
    read(&ca_path)?;
    Ok(Material {
        ca_path: canonical(&ca_path)?,
        cert_path,
        key_path,
        cert_pem,
        key_pem,
        signer,
        admin_token: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
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

    // Catches (issue 43, item 5): client.toml rewritten at every start — on a full disk the
    // restart then fails on `client.tmp`, hiding the real problem.
    #[test]
    fn client_toml_is_rewritten_only_when_its_content_changes() {
        let dir = tempfile::tempdir().unwrap();
        let m = ensure(dir.path(), None).unwrap();
        write_client_config(dir.path(), "https://127.0.0.1:7878", &m).unwrap();
        // Any write now fails (its temporary file cannot be created), as on a full disk.
        fs::create_dir(dir.path().join("client.tmp")).unwrap();
        write_client_config(dir.path(), "https://127.0.0.1:7878", &m)
            .expect("the same content is not written again");
        assert!(
            write_client_config(dir.path(), "https://127.0.0.1:7999", &m).is_err(),
            "a new endpoint is written"
        );
    }

    #[test]
    fn loading_existing_material_reads_what_a_start_wrote_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            load_existing(dir.path()).is_err(),
            "an empty dir has no material"
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "and stays empty"
        );
        let started = ensure(dir.path(), Some("nokv.example")).unwrap();
        let loaded = load_existing(dir.path()).unwrap();
        // `ensure` without the advertised name would have re-issued the certificate.
        assert_eq!(loaded.cert_pem, started.cert_pem);
        assert_eq!(loaded.key_pem, started.key_pem);
        assert!(loaded.signer.verify(&started.admin_token).is_ok());
    }
}
