//! Cluster mode: the etcd flags (`--etcd`, `--cluster`, `--node-id`, `--advertise`,
//! `--node-ttl`, `--tls-dir`) and how etcd is reached (`--etcd-ca`, `--etcd-cert`/`--etcd-key`,
//! `--etcd-user`/`--etcd-password-file`), resolved into [`ClusterSettings`].
//!
//! Invariants: cluster settings exist exactly when `--etcd` is given, and then every one is
//! set and valid; without `--etcd` every cluster-only flag is refused (`--node-id`, `--advertise`
//! and `--tls-dir` also serve a single node). The etcd access flags fit the URLs and each
//! other (https:// needs `--etcd-ca`, certificate with key, user with password file); only
//! their paths are kept here, the files are read when the node joins. Each refusal is one line
//! naming the flag at fault, and each of these flags is validated here and nowhere else.

use std::path::PathBuf;
use std::time::Duration;

use super::error::ConfigError;
use super::serving::ServeArgs;
use crate::control::access::EtcdAccessFiles;
use crate::token::parse_duration;

/// Default TTL of a cluster node's etcd lease.
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);

/// The refusal of `--etcd` without `--tls-dir`, one line.
pub const ETCD_NEEDS_TLS_DIR: &str = "--etcd needs --tls-dir: every node of a cluster must share one CA and token secret \
     (create them with `nokv-server cluster init`); per-node development CAs would make the cluster unusable";

/// Cluster-mode settings, present exactly when `--etcd` is given (validated: every field set).
/// The embedded default has none and never touches etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// etcd endpoint URLs (http:// or https://), at least one.
    pub etcd: Vec<String>,
    /// Cluster name (`--cluster`).
    pub cluster: String,
    /// This node's id (`--node-id`).
    pub node_id: String,
    /// Where other nodes and clients reach this node (`--advertise`).
    pub advertise: String,
    /// TTL of the node's etcd lease (whole seconds, at least 1s).
    pub node_ttl: Duration,
    /// The shared cluster TLS directory (`--tls-dir`).
    pub tls_dir: PathBuf,
    /// How etcd is reached: `--etcd-ca`, `--etcd-cert`/`--etcd-key`, `--etcd-user`/
    /// `--etcd-password-file` (paths only; read when the node joins).
    pub etcd_access: EtcdAccessFiles,
}

/// Takes the cluster settings out of `args` (leaving `--node-id`, `--advertise` and
/// `--tls-dir`, which a single node uses too) and validates them with the node's identity:
/// `--node-id` must be a valid id, and `--tls-dir` needs `--advertise` or `--node-id` to
/// choose this node's certificate.
pub(super) fn cluster(args: &mut ServeArgs) -> Result<Option<ClusterSettings>, ConfigError> {
    let access = EtcdAccessFiles {
        ca: args.etcd_ca.take(),
        cert: args.etcd_cert.take(),
        key: args.etcd_key.take(),
        user: args.etcd_user.take(),
        password_file: args.etcd_password_file.take(),
    };
    let cluster = cluster_settings(
        args.etcd.take(),
        args.cluster.take(),
        args.node_id.clone(),
        args.advertise.clone(),
        args.node_ttl.take(),
        args.tls_dir.clone(),
        access,
    )?;
    if let Some(id) = &args.node_id {
        check_id("--node-id", id)?;
    }
    if args.tls_dir.is_some() && args.advertise.is_none() && args.node_id.is_none() {
        return Err(ConfigError(
                "--tls-dir needs --advertise HOST or --node-id ID to choose this node's certificate (C/nodes/HOST.pem)".into(),
            ));
    }
    Ok(cluster)
}

/// Validates the cluster flags: all of them or (apart from `--node-id`) none. Each refusal is
/// one line naming what is missing.
fn cluster_settings(
    etcd: Option<String>,
    cluster: Option<String>,
    node_id: Option<String>,
    advertise: Option<String>,
    node_ttl: Option<String>,
    tls_dir: Option<PathBuf>,
    access: EtcdAccessFiles,
) -> Result<Option<ClusterSettings>, ConfigError> {
    let Some(etcd) = etcd else {
        let stray: Vec<&str> = [
            ("--cluster", cluster.is_some()),
            ("--node-ttl", node_ttl.is_some()),
            ("--etcd-ca", access.ca.is_some()),
            ("--etcd-cert", access.cert.is_some()),
            ("--etcd-key", access.key.is_some()),
            ("--etcd-user", access.user.is_some()),
            ("--etcd-password-file", access.password_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if !stray.is_empty() {
            return Err(ConfigError(format!(
                "{} only apply with --etcd (cluster mode)",
                stray.join(" and ")
            )));
        }
        return Ok(None);
    };
    let Some(tls_dir) = tls_dir else {
        return Err(ConfigError(ETCD_NEEDS_TLS_DIR.into()));
    };
    let missing: Vec<&str> = [
        ("--cluster NAME", cluster.is_none()),
        ("--node-id ID", node_id.is_none()),
        ("--advertise HOST:PORT", advertise.is_none()),
    ]
    .into_iter()
    .filter_map(|(flag, absent)| absent.then_some(flag))
    .collect();
    if !missing.is_empty() {
        return Err(ConfigError(format!(
            "--etcd needs {}: a cluster node must say which cluster it joins, who it is and where it is reached",
            missing.join(", ")
        )));
    }
    let urls: Vec<String> = etcd
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect();
    if urls.is_empty() {
        return Err(ConfigError("--etcd needs at least one URL".into()));
    }
    if let Some(bad) = urls
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")) || u.len() <= 8)
    {
        return Err(ConfigError(format!(
            "--etcd {bad:?} is not an http:// or https:// URL"
        )));
    }
    check_access(&urls, &access)?;
    let (cluster, node_id) = (cluster.unwrap_or_default(), node_id.unwrap_or_default());
    check_id("--cluster", &cluster)?;
    check_id("--node-id", &node_id)?;
    let node_ttl = match node_ttl {
        None => DEFAULT_NODE_TTL,
        Some(s) => parse_duration(&s).map_err(|e| ConfigError(format!("--node-ttl: {e}")))?,
    };
    if node_ttl < Duration::from_secs(1) || node_ttl.subsec_nanos() != 0 {
        return Err(ConfigError(
            "--node-ttl must be whole seconds, at least 1s (etcd leases are granted in seconds)"
                .into(),
        ));
    }
    Ok(Some(ClusterSettings {
        etcd: urls,
        cluster,
        node_id,
        advertise: advertise.unwrap_or_default(),
        node_ttl,
        tls_dir,
        etcd_access: access,
    }))
}

/// The etcd access flags fit the URLs and each other: all URLs https:// with `--etcd-ca`, or
/// all http:// without TLS files; certificate and key together; user and password file
/// together.
fn check_access(urls: &[String], access: &EtcdAccessFiles) -> Result<(), ConfigError> {
    let https = urls.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != urls.len() {
        return Err(ConfigError(
            "--etcd mixes http:// and https:// URLs: use https:// for every endpoint".into(),
        ));
    }
    if https == 0 {
        if let Some(flag) = [
            ("--etcd-ca", access.ca.is_some()),
            ("--etcd-cert", access.cert.is_some()),
            ("--etcd-key", access.key.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, set)| set.then_some(flag))
        {
            return Err(ConfigError(format!(
                "{flag} needs https:// --etcd URLs (given: {})",
                urls.join(",")
            )));
        }
    } else if access.ca.is_none() {
        return Err(ConfigError(format!(
            "--etcd {} needs --etcd-ca FILE: the CA etcd's certificate is checked against (no \
             system roots are trusted for etcd)",
            urls.join(",")
        )));
    }
    match (&access.cert, &access.key) {
        (Some(_), None) => return Err(ConfigError("--etcd-cert needs --etcd-key".into())),
        (None, Some(_)) => return Err(ConfigError("--etcd-key needs --etcd-cert".into())),
        _ => {}
    }
    match (&access.user, &access.password_file) {
        (Some(_), None) => Err(ConfigError(
            "--etcd-user needs --etcd-password-file (a file holding only the password)".into(),
        )),
        (None, Some(_)) => Err(ConfigError(
            "--etcd-password-file needs --etcd-user (the etcd user the password is for)".into(),
        )),
        (Some(user), Some(_)) if user.trim().is_empty() || user.contains(['\n', '\r']) => Err(
            ConfigError("--etcd-user must be a non-empty user name".into()),
        ),
        _ => Ok(()),
    }
}

/// Cluster names and node ids become etcd key segments: 1-64 of letters, digits, '.', '_', '-'.
fn check_id(flag: &str, id: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{flag} {id:?} must be 1-64 letters, digits, '.', '_' or '-' (not starting with '.')"
        )))
    }
}
