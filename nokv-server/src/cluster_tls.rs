//! The cluster TLS directory (`--tls-dir C`): one CA, one certificate per node host, the token
//! secret and an admin token, shared by every node of a cluster so that any node's certificate
//! is trusted by every client and any node's tokens are accepted by every other node.
//!
//! Layout of C (secrets 0600):
//! ```text
//! C/ca.pem  C/ca.key           the cluster CA
//! C/cluster.secret             hex token secret (same file name as in a data dir)
//! C/admin.token                admin token for every workspace
//! C/client.toml                endpoint (first host, port 7878), CA and admin token for the CLI
//! C/nodes/H.pem  C/nodes/H.key the certificate of node host H (its only name)
//! C/etcd/server.pem + .key     with --etcd-host: a serving certificate for a test/dev etcd
//! C/etcd/client.pem + .key     with --etcd-host: the nodes' etcd client certificate
//! ```
//! The etcd material lets a test or development etcd run with `--client-cert-auth
//! --trusted-ca-file C/ca.pem --cert-file C/etcd/server.pem --key-file C/etcd/server.key` and
//! nodes reach it with `--etcd-ca C/ca.pem --etcd-cert C/etcd/client.pem --etcd-key
//! C/etcd/client.key`. Such an etcd trusts every certificate of the cluster CA, node
//! certificates included; a production etcd should have a CA of its own.
//! `cluster init` builds the whole directory beside C and renames it into place, so C either
//! does not exist or is complete; it never overwrites an existing C. `cluster cert` adds one
//! host's certificate from the same CA and never replaces an existing one.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rcgen::KeyPair;

use crate::bootstrap::{BootstrapError, Material, client_toml};
use crate::pki::{
    self, ADMIN_TOKEN_FILE, SECRET_FILE, canonical, io, mkdir, read_opt, write_file, write_secret,
};

type Result<T> = std::result::Result<T, BootstrapError>;

/// Port written into `C/client.toml`: the conventional nokv port.
const CLIENT_PORT: u16 = 7878;

/// Creates the cluster directory `dir` with a certificate for each of `hosts`. Refuses when
/// `dir` exists and is not empty; nothing is left behind on failure.
/// With `etcd_hosts`, also writes etcd's serving certificate for those names and the nodes'
/// etcd client certificate ([`write_etcd`]).
pub fn init(dir: &Path, hosts: &[String], etcd_hosts: &[String]) -> Result<PathBuf> {
    let hosts = checked_hosts(hosts)?;
    let etcd_hosts = checked_etcd_hosts(etcd_hosts)?;
    if !is_absent_or_empty(dir)? {
        return Err(exists(dir));
    }
    let name = dir
        .file_name()
        .ok_or_else(|| BootstrapError::Invalid(format!("{} names no directory", dir.display())))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    mkdir(&parent)?;
    let final_dir = canonical(&parent)?.join(name);
    let staging = parent.join(format!(
        ".{}.init-{}",
        name.to_string_lossy(),
        crate::ids::random_hex(6)
    ));
    let built = (|| {
        // 0700: the directory holds the CA key and the token secret.
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging)
            .map_err(|e| io(&staging, e))?;
        let (ca_key, ca_pem) = pki::new_ca(pki::CLUSTER_CA_NAME)?;
        write_secret(&staging.join("ca.key"), ca_key.serialize_pem().as_bytes())?;
        write_file(&staging.join("ca.pem"), ca_pem.as_bytes())?;
        let secret = pki::new_secret_hex();
        write_secret(&staging.join(SECRET_FILE), secret.as_bytes())?;
        let signer = pki::parse_secret(&staging.join(SECRET_FILE), &secret)?;
        let admin = pki::issue_admin_token(&signer);
        write_secret(&staging.join(ADMIN_TOKEN_FILE), admin.as_bytes())?;
        let endpoint = format!("https://{}:{CLIENT_PORT}", url_host(&hosts[0]));
        let client = client_toml(&endpoint, &final_dir.join("ca.pem"), &admin);
        write_secret(&staging.join("client.toml"), client.as_bytes())?;
        for host in &hosts {
            write_node(&staging, &ca_key, host)?;
        }
        if !etcd_hosts.is_empty() {
            write_etcd(&staging, &ca_key, &etcd_hosts)?;
        }
        Ok(())
    })();
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    // rename(2) replaces an empty directory and fails on a non-empty one, so a C created
    // meanwhile by someone else is never overwritten either.
    if let Err(e) = fs::rename(&staging, &final_dir) {
        let _ = fs::remove_dir_all(&staging);
        return Err(match e.kind() {
            std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::AlreadyExists => {
                exists(dir)
            }
            _ => io(&final_dir, e),
        });
    }
    Ok(final_dir)
}

/// Adds a certificate for each of `hosts` to the existing cluster directory `dir`, signed by
/// its CA; refuses a host that already has one. With `etcd_hosts`, also adds the etcd material
/// ([`write_etcd`]), refused when the directory has it already. Checks everything before it
/// writes anything.
pub fn add_cert(dir: &Path, hosts: &[String], etcd_hosts: &[String]) -> Result<Vec<PathBuf>> {
    let hosts = if hosts.is_empty() && !etcd_hosts.is_empty() {
        Vec::new()
    } else {
        checked_hosts(hosts)?
    };
    let etcd_hosts = checked_etcd_hosts(etcd_hosts)?;
    let ca_key_path = dir.join("ca.key");
    let ca_key = read_opt(&ca_key_path)?.ok_or_else(|| {
        BootstrapError::Invalid(format!(
            "{} is not a cluster directory (no ca.key): create it with `nokv-server cluster init --dir {} --host HOST`",
            dir.display(),
            dir.display()
        ))
    })?;
    let ca_key = KeyPair::from_pem(&ca_key)?;
    if let Some(h) = hosts.iter().find(|h| node_cert(dir, h).exists()) {
        return Err(BootstrapError::Invalid(format!(
            "{} already exists: host {h} has a certificate; delete {} and {} first to replace it",
            node_cert(dir, h).display(),
            node_cert(dir, h).display(),
            node_key(dir, h).display()
        )));
    }
    if !etcd_hosts.is_empty() && etcd_file(dir, "server.pem").exists() {
        return Err(BootstrapError::Invalid(format!(
            "{} already exists: the directory has etcd certificates; delete {} first to replace them",
            etcd_file(dir, "server.pem").display(),
            dir.join("etcd").display()
        )));
    }
    let mut written = Vec::new();
    for host in &hosts {
        write_node(dir, &ca_key, host)?;
        written.push(node_cert(dir, host));
    }
    if !etcd_hosts.is_empty() {
        write_etcd(dir, &ca_key, &etcd_hosts)?;
        written.extend(["server.pem", "client.pem"].map(|f| etcd_file(dir, f)));
    }
    Ok(written)
}

/// `C/etcd/NAME`: the etcd material of a cluster directory.
pub fn etcd_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("etcd").join(name)
}

/// Common name of the nodes' etcd client certificate: the etcd user it authenticates as when
/// etcd's auth is on and no `--etcd-user` is given.
pub const ETCD_CLIENT_NAME: &str = "nokv";

/// Writes `C/etcd/server.pem` + `.key` (names: `etcd_hosts`; serverAuth and clientAuth) and
/// `C/etcd/client.pem` + `.key` (clientAuth, common name [`ETCD_CLIENT_NAME`]), both signed by
/// the cluster CA; keys 0600.
fn write_etcd(dir: &Path, ca_key: &KeyPair, etcd_hosts: &[String]) -> Result<()> {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    mkdir(&dir.join("etcd"))?;
    let (cert, key) = pki::issue_leaf_for(
        ca_key_again(ca_key)?,
        pki::CLUSTER_CA_NAME,
        etcd_hosts.to_vec(),
        "etcd",
        vec![ServerAuth, ClientAuth],
    )?;
    write_secret(&etcd_file(dir, "server.key"), key.as_bytes())?;
    write_file(&etcd_file(dir, "server.pem"), cert.as_bytes())?;
    let (cert, key) = pki::issue_leaf_for(
        ca_key_again(ca_key)?,
        pki::CLUSTER_CA_NAME,
        Vec::new(),
        ETCD_CLIENT_NAME,
        vec![ClientAuth],
    )?;
    write_secret(&etcd_file(dir, "client.key"), key.as_bytes())?;
    write_file(&etcd_file(dir, "client.pem"), cert.as_bytes())
}

/// `--etcd-host` values: like node hosts, but none is fine (no etcd material).
fn checked_etcd_hosts(hosts: &[String]) -> Result<Vec<String>> {
    if hosts.is_empty() {
        return Ok(Vec::new());
    }
    checked_hosts(hosts).map_err(|e| match e {
        BootstrapError::Invalid(m) => {
            BootstrapError::Invalid(m.replacen("--host", "--etcd-host", 1))
        }
        other => other,
    })
}

/// Loads what a node serves with from the cluster directory `dir`: the CA, the certificate of
/// the first of `candidates` (host names: the advertised host, then the node id) that has one,
/// the token secret and, when the directory has one, the admin token (nodes do not need it:
/// a deployment may mount only the CA, the token secret and the node's own key, keeping the
/// admin token for operators; the node's `client.toml` then holds no token). Writes nothing.
pub fn load(dir: &Path, candidates: &[&str]) -> Result<Material> {
    let secret_path = dir.join(SECRET_FILE);
    let secret = read_opt(&secret_path)?.ok_or_else(|| {
        BootstrapError::Invalid(format!(
            "--tls-dir {}: no {SECRET_FILE}; create the directory with `nokv-server cluster init`",
            dir.display()
        ))
    })?;
    let signer = pki::parse_secret(&secret_path, &secret)?;
    let admin_path = dir.join(ADMIN_TOKEN_FILE);
    let admin_token = match read_opt(&admin_path)?.map(|t| t.trim().to_string()) {
        None => String::new(),
        Some(t) if signer.verify(&t).is_ok() => t,
        Some(_) => {
            return Err(BootstrapError::Invalid(format!(
                "--tls-dir {}: {} is not signed by {SECRET_FILE}",
                dir.display(),
                admin_path.display()
            )));
        }
    };
    let ca_path = dir.join("ca.pem");
    if !ca_path.is_file() {
        return Err(BootstrapError::Invalid(format!(
            "--tls-dir {}: no ca.pem",
            dir.display()
        )));
    }
    let host = candidates
        .iter()
        .find(|h| valid_host(h) && node_cert(dir, h).is_file())
        .ok_or_else(|| {
            BootstrapError::Invalid(format!(
                "--tls-dir {}: no node certificate for {}; add one with `nokv-server cluster cert --dir {} --host {}`",
                dir.display(),
                candidates
                    .iter()
                    .map(|c| node_cert(dir, c).display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
                dir.display(),
                candidates.first().copied().unwrap_or("HOST")
            ))
        })?;
    let (cert_path, key_path) = (node_cert(dir, host), node_key(dir, host));
    let cert_pem = read_opt(&cert_path)?.unwrap_or_default();
    let key_pem = read_opt(&key_path)?
        .ok_or_else(|| BootstrapError::Invalid(format!("{} is missing", key_path.display())))?;
    KeyPair::from_pem(&key_pem).map_err(|e| {
        BootstrapError::Invalid(format!(
            "{} is not a usable private key ({e})",
            key_path.display()
        ))
    })?;
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

/// Host names whose certificate a node may serve with, in order of preference: the host of
/// `--advertise` (a `HOST:PORT` form loses its port), then `--node-id`.
pub fn cert_candidates<'a>(advertise: Option<&'a str>, node_id: Option<&'a str>) -> Vec<&'a str> {
    let host = advertise.map(|a| {
        if let Some(inner) = a.strip_prefix('[') {
            // [v6]:port or [v6]
            inner.split(']').next().unwrap_or(inner)
        } else {
            match a.rsplit_once(':') {
                Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
                    h
                }
                _ => a,
            }
        }
    });
    host.into_iter().chain(node_id).collect()
}

pub fn node_cert(dir: &Path, host: &str) -> PathBuf {
    dir.join("nodes").join(format!("{host}.pem"))
}

pub fn node_key(dir: &Path, host: &str) -> PathBuf {
    dir.join("nodes").join(format!("{host}.key"))
}

fn write_node(dir: &Path, ca_key: &KeyPair, host: &str) -> Result<()> {
    mkdir(&dir.join("nodes"))?;
    let (cert, key) = pki::issue_leaf(
        ca_key_again(ca_key)?,
        pki::CLUSTER_CA_NAME,
        vec![host.to_string()],
    )?;
    write_secret(&node_key(dir, host), key.as_bytes())?;
    write_file(&node_cert(dir, host), cert.as_bytes())
}

/// rcgen's issuer consumes its key; the CA key is re-read from its PEM for each certificate.
fn ca_key_again(key: &KeyPair) -> Result<KeyPair> {
    Ok(KeyPair::from_pem(&key.serialize_pem())?)
}

/// Hosts name files and certificate SANs: DNS names or IP addresses only, no duplicates.
fn checked_hosts(hosts: &[String]) -> Result<Vec<String>> {
    if hosts.is_empty() {
        return Err(BootstrapError::Invalid(
            "give at least one --host (a node's DNS name or IP address)".into(),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for h in hosts {
        if !valid_host(h) {
            return Err(BootstrapError::Invalid(format!(
                "--host {h:?} is not a DNS name or IP address (no port, no scheme)"
            )));
        }
        if !out.contains(h) {
            out.push(h.clone());
        }
    }
    Ok(out)
}

/// A host is an IP address or a DNS name of letters, digits, '-' and '.' (no empty label);
/// this also keeps it a safe file name.
pub fn valid_host(h: &str) -> bool {
    if h.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// A host as written in a URL (IPv6 addresses in brackets).
fn url_host(h: &str) -> String {
    match h.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => h.to_string(),
    }
}

fn is_absent_or_empty(dir: &Path) -> Result<bool> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(dir, e)),
    }
}

fn exists(dir: &Path) -> BootstrapError {
    BootstrapError::Invalid(format!(
        "{} already exists and is not empty: cluster init never overwrites a cluster directory \
         (its CA and secret are what every node trusts); choose another --dir, or add a node \
         with `nokv-server cluster cert --dir {} --host HOST`",
        dir.display(),
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cluster_init_writes_secrets_0600_and_a_client_config_and_never_overwrites() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("cluster");
        init(&c, &hosts(&["node-a", "10.0.0.2"]), &[]).unwrap();
        for f in [
            "ca.key",
            "cluster.secret",
            "admin.token",
            "client.toml",
            "nodes/node-a.key",
            "nodes/10.0.0.2.key",
        ] {
            let mode = fs::metadata(c.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let mode = fs::metadata(&c).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the directory itself");
        let client = fs::read_to_string(c.join("client.toml")).unwrap();
        assert!(client.contains("https://node-a:7878"), "{client}");
        let before = fs::read(c.join("cluster.secret")).unwrap();
        let e = init(&c, &hosts(&["node-b"]), &[]).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        assert_eq!(fs::read(c.join("cluster.secret")).unwrap(), before);
        let leftovers: Vec<_> = fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no staging directory left behind");
    }

    #[test]
    fn cluster_cert_adds_a_host_once_and_nodes_load_their_own_certificate() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("c");
        init(&c, &hosts(&["a.example"]), &[]).unwrap();
        add_cert(&c, &hosts(&["b.example"]), &[]).unwrap();
        assert!(add_cert(&c, &hosts(&["b.example"]), &[]).is_err());
        let a = load(&c, &["a.example"]).unwrap();
        let b = load(&c, &["nope", "b.example"]).unwrap();
        assert_ne!(a.cert_pem, b.cert_pem);
        assert_eq!(a.ca_path, b.ca_path);
        assert!(b.signer.verify(&a.admin_token).is_ok());
        // A node directory without the admin token (what a pod mounts) still loads.
        fs::remove_file(c.join("admin.token")).unwrap();
        assert_eq!(load(&c, &["b.example"]).unwrap().admin_token, "");
        fs::write(c.join("admin.token"), "nokv1.forged.00").unwrap();
        assert!(
            load(&c, &["b.example"]).is_err(),
            "an unsigned admin token is refused"
        );
        fs::remove_file(c.join("admin.token")).unwrap();
        let Err(e) = load(&c, &["c.example"]) else {
            panic!("a host without a certificate loaded one")
        };
        let e = e.to_string();
        assert!(e.contains("cluster cert"), "{e}");
    }

    #[test]
    fn etcd_hosts_add_an_etcd_server_and_client_certificate_once_with_secret_keys() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("c");
        init(&c, &hosts(&["n1"]), &hosts(&["127.0.0.1", "etcd"])).unwrap();
        for f in ["server.key", "client.key"] {
            let mode = fs::metadata(etcd_file(&c, f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let server = fs::read_to_string(etcd_file(&c, "server.pem")).unwrap();
        assert!(server.starts_with("-----BEGIN CERTIFICATE-----"));
        let e = add_cert(&c, &[], &hosts(&["etcd"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists"), "{e}");
        let plain = root.path().join("plain");
        init(&plain, &hosts(&["n1"]), &[]).unwrap();
        assert!(!plain.join("etcd").exists());
        let written = add_cert(&plain, &[], &hosts(&["etcd"])).unwrap();
        assert_eq!(written.len(), 2);
        assert!(etcd_file(&plain, "client.key").is_file());
    }

    #[test]
    fn the_certificate_is_chosen_by_the_advertised_host_without_its_port_then_by_node_id() {
        assert_eq!(cert_candidates(Some("n1:7878"), Some("id")), ["n1", "id"]);
        assert_eq!(cert_candidates(Some("n1"), None), ["n1"]);
        assert_eq!(cert_candidates(Some("[::1]:7878"), None), ["::1"]);
        assert_eq!(cert_candidates(Some("::1"), None), ["::1"]);
        assert_eq!(cert_candidates(None, Some("id")), ["id"]);
    }

    #[test]
    fn hosts_that_are_not_names_or_addresses_are_refused_and_write_nothing() {
        let root = tempfile::tempdir().unwrap();
        let c = root.path().join("c");
        for bad in ["", "../x", "a/b", "h:7878", "https://h", "a..b"] {
            assert!(init(&c, &hosts(&[bad]), &[]).is_err(), "{bad:?}");
            assert!(
                init(&c, &hosts(&["n1"]), &hosts(&[bad])).is_err(),
                "--etcd-host {bad:?}"
            );
            assert!(!c.exists(), "{bad:?}");
        }
        assert!(init(&c, &[], &[]).is_err());
    }
}
