//! The object provider: the only module that touches object_store.
//!
//! Two handles per provider. Writes go through a handle whose client never retries, so a PUT
//! makes exactly one remote attempt: a retry that later succeeds could not settle an earlier
//! attempt whose outcome was unknown. Every write is create-if-absent, so a key is never
//! overwritten. Reads, heads, lists and deletes use a handle with ordinary retries; deletes
//! are idempotent (absent counts as deleted).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
};

/// Checkpoint objects (a shard's database, uploaded for a handoff): keys, upload, verified
/// download.
pub mod checkpoint;
/// Local-provider writes around the page cache, so an upload's bytes never queue ahead of a
/// small write's fsync.
mod direct;
/// The fault-injecting fake: driven by hand in unit tests, and by the test-only
/// `NOKV_TEST_FAULTS` schedule in black-box tests (compiled in, inert unless that is set).
pub mod fault;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("object provider configuration: {0}")]
    Config(String),
    #[error("object provider: {0}")]
    Provider(String),
    /// A downloaded checkpoint is not the one its record describes (size or sha256).
    #[error("checkpoint {key} is corrupt: {reason}")]
    CheckpointCorrupt { key: String, reason: String },
}

impl From<ObjectError> for crate::error::Error {
    fn from(e: ObjectError) -> Self {
        match e {
            ObjectError::NotFound(k) => {
                crate::error::Error::Internal(format!("referenced object {k} is missing"))
            }
            ObjectError::CheckpointCorrupt { .. } => {
                crate::error::Error::DataCorrupted(e.to_string())
            }
            other => crate::error::Error::Unavailable(other.to_string()),
        }
    }
}

/// The classified outcome of one create. Only `Written` and `NotWritten` prove the writer
/// finished; `Unknown` means bytes may still land under the key, so its guard must stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Written,
    /// The key already held an object: nothing was written (create-if-absent refused). Keys
    /// with a random part never meet this; the provider log's fixed keys use it as a fence.
    Exists,
    /// Positively identified as failed before the request could reach the provider.
    NotWritten(String),
    /// Timeout, reset, cancellation or a provider answer that does not prove absence.
    Unknown(String),
}

/// Provider settings, as resolved from the server configuration.
#[derive(Debug, Clone)]
pub enum ProviderConfig {
    Local {
        root: std::path::PathBuf,
    },
    Memory,
    S3 {
        endpoint: Option<String>,
        bucket: String,
        region: String,
        /// Permit plain http; only honoured for loopback endpoints or when set explicitly.
        allow_http: bool,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
    },
}

#[derive(Clone)]
pub struct ObjectProvider {
    kind: &'static str,
    prefix: String,
    writer: Arc<dyn ObjectStore>,
    reader: Arc<dyn ObjectStore>,
    /// Local filesystem only. object_store does not fsync, but `Written` must mean durable as
    /// it does for S3: a revision references the key as soon as the record session commits.
    local: Option<Arc<object_store::local::LocalFileSystem>>,
    /// Local creates are written around the page cache ([`direct`]); off behind the
    /// fault-injecting fake, whose faults must reach every write.
    direct: bool,
}

impl std::fmt::Debug for ObjectProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectProvider({}, prefix {:?})", self.kind, self.prefix)
    }
}

impl ObjectProvider {
    pub fn open(cfg: &ProviderConfig, prefix: &str) -> Result<ObjectProvider, ObjectError> {
        let prefix = prefix.trim_matches('/').to_string();
        match cfg {
            ProviderConfig::Local { root } => {
                std::fs::create_dir_all(root)
                    .map_err(|e| ObjectError::Config(format!("{}: {e}", root.display())))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(root)
                    .map_err(|e| ObjectError::Config(e.to_string()))?
                    .with_automatic_cleanup(true);
                let fs = Arc::new(fs);
                let store: Arc<dyn ObjectStore> = fs.clone();
                let mut p = Self::from_stores("local", prefix, store.clone(), store);
                p.local = Some(fs);
                p.direct = true;
                Ok(p)
            }
            ProviderConfig::Memory => {
                let m: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
                Ok(Self::from_stores("memory", prefix, m.clone(), m))
            }
            ProviderConfig::S3 {
                endpoint,
                bucket,
                region,
                allow_http,
                access_key_id,
                secret_access_key,
            } => {
                let loopback = endpoint.as_deref().is_some_and(is_loopback_url);
                let build = |retries: Option<usize>| {
                    let mut b = object_store::aws::AmazonS3Builder::new()
                        .with_bucket_name(bucket)
                        .with_region(region)
                        .with_unsigned_payload(!payload_needs_signing(endpoint.as_deref()))
                        .with_client_options(
                            ClientOptions::new()
                                .with_allow_http(*allow_http || loopback)
                                .with_timeout(Duration::from_secs(60)),
                        );
                    if let Some(ep) = endpoint {
                        b = b.with_endpoint(ep).with_virtual_hosted_style_request(false);
                    }
                    if let (Some(id), Some(secret)) = (access_key_id, secret_access_key) {
                        b = b.with_access_key_id(id).with_secret_access_key(secret);
                    }
                    if let Some(max_retries) = retries {
                        b = b.with_retry(RetryConfig {
                            max_retries,
                            ..RetryConfig::default()
                        });
                    }
                    b.build().map_err(|e| ObjectError::Config(e.to_string()))
                };
                let writer: Arc<dyn ObjectStore> = Arc::new(build(Some(0))?);
                let reader: Arc<dyn ObjectStore> = Arc::new(build(None)?);
                Ok(Self::from_stores("s3", prefix, writer, reader))
            }
        }
    }

    /// Wraps explicit stores (used by fault-injection tests).
    pub fn from_stores(
        kind: &'static str,
        prefix: String,
        writer: Arc<dyn ObjectStore>,
        reader: Arc<dyn ObjectStore>,
    ) -> ObjectProvider {
        ObjectProvider {
            kind,
            prefix,
            writer,
            reader,
            local: None,
            direct: false,
        }
    }

    /// The same provider behind the fault-injecting fake, drawing faults from `schedule`
    /// (test-only: see [`fault::SCHEDULE_ENV`]). Durability of local writes is unchanged.
    pub fn with_fault_schedule(self, schedule: fault::Schedule) -> ObjectProvider {
        let faults = fault::Faults::scheduled(schedule);
        let wrap = |store: Arc<dyn ObjectStore>| -> Arc<dyn ObjectStore> {
            Arc::new(fault::FaultyStore::new(store, faults.clone()))
        };
        ObjectProvider {
            writer: wrap(self.writer),
            reader: wrap(self.reader),
            direct: false,
            ..self
        }
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The key of one block-write attempt. It names the shard, the upload and a fresh random
    /// attempt id, never the path or the time alone, so no two attempts ever share a key.
    pub fn block_key(&self, shard: u32, upload_id: &str, index: u32, attempt: &str) -> String {
        let rel = format!("s{shard:04}/u/{upload_id}/{index:08}-{attempt}");
        if self.prefix.is_empty() {
            rel
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// The shard a provider key belongs to, read from the `s{shard}/` segment that
    /// [`ObjectProvider::block_key`] puts after the prefix; `None` for any other key.
    pub fn shard_of_key(&self, key: &str) -> Option<u32> {
        let rel = if self.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')?
        };
        let shard = rel.strip_prefix('s')?.split_once('/')?.0;
        (shard.len() == 4).then(|| shard.parse().ok()).flatten()
    }

    /// Proves at start-up that the provider answers and the bucket and credentials work:
    /// a listing fails on a missing bucket or bad credentials, where a HEAD of an absent key
    /// would just say "not found".
    pub async fn check(&self) -> Result<(), ObjectError> {
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        self.reader
            .list_with_delimiter(prefix.as_ref())
            .await
            .map(|_| ())
            .map_err(|e| ObjectError::Provider(flatten(&e)))
    }

    /// One create-if-absent attempt with no client retry.
    pub async fn create(&self, key: &str, data: Bytes) -> PutOutcome {
        // The in-memory store keeps the very buffer it is given, for as long as the object
        // lives. A block's buffer carries its block-memory reservation (see `crate::memory`),
        // so that store gets a copy: otherwise every stored block would hold its share of the
        // budget forever and the node would refuse every block once it filled up.
        let data = if self.kind == "memory" {
            Bytes::copy_from_slice(&data)
        } else {
            data
        };
        if let Some(fs) = self.local.as_ref().filter(|_| self.direct)
            && let Some(outcome) = self.create_direct(fs, key, data.clone()).await
        {
            return outcome;
        }
        // Not local, behind the fault-injecting fake, or no O_DIRECT on this filesystem.
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .writer
            .put_opts(&Path::from(key), PutPayload::from_bytes(data), opts)
            .await
        {
            Ok(_) => match self.sync_local(key).await {
                Ok(()) => PutOutcome::Written,
                Err(e) => PutOutcome::Unknown(format!("written but not made durable: {e}")),
            },
            Err(e) => classify(&e, self.local.is_some()),
        }
    }

    /// A local create written around the page cache ([`direct`]); `None` when the filesystem
    /// does not take `O_DIRECT`, before anything was written.
    async fn create_direct(
        &self,
        fs: &object_store::local::LocalFileSystem,
        key: &str,
        data: Bytes,
    ) -> Option<PutOutcome> {
        let path = match fs.path_to_filesystem(&Path::from(key)) {
            Ok(p) => p,
            Err(e) => return Some(PutOutcome::NotWritten(e.to_string())),
        };
        let created = tokio::task::spawn_blocking(move || direct::create(&path, &data)).await;
        Some(match created {
            Ok(Ok(direct::Created::Written)) => PutOutcome::Written,
            Ok(Ok(direct::Created::Exists)) => PutOutcome::Exists,
            Ok(Ok(direct::Created::Unsupported)) => return None,
            Ok(Err(e)) if local_refusal(&e) => PutOutcome::NotWritten(e.to_string()),
            Ok(Err(e)) => PutOutcome::Unknown(e.to_string()),
            Err(e) => PutOutcome::Unknown(format!("local write task failed: {e}")),
        })
    }

    /// fsyncs a locally written object and its directory (no-op for remote providers).
    async fn sync_local(&self, key: &str) -> Result<(), String> {
        let Some(fs) = &self.local else {
            return Ok(());
        };
        let path = fs
            .path_to_filesystem(&Path::from(key))
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&path)?.sync_all()?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, ObjectError> {
        match self.reader.get(&Path::from(key)).await {
            Ok(r) => r
                .bytes()
                .await
                .map_err(|e| ObjectError::Provider(flatten(&e))),
            Err(object_store::Error::NotFound { .. }) => Err(ObjectError::NotFound(key.into())),
            Err(e) => Err(ObjectError::Provider(flatten(&e))),
        }
    }

    /// Idempotent: an absent key counts as deleted.
    pub async fn delete(&self, key: &str) -> Result<(), ObjectError> {
        match self.reader.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ObjectError::Provider(flatten(&e))),
        }
    }

    /// Deletes `keys` in bulk (S3 DeleteObjects, up to 1,000 keys a request): the provider
    /// log's compaction, which deletes segments as fast as they are written. Absent keys
    /// count as deleted; the first failure is returned (some keys may be deleted by then).
    pub async fn delete_many(&self, keys: Vec<String>) -> Result<(), ObjectError> {
        let paths = futures::stream::iter(keys.into_iter().map(|k| Ok(Path::from(k)))).boxed();
        let mut results = self.reader.delete_stream(paths);
        while let Some(r) = results.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(ObjectError::Provider(flatten(&e))),
            }
        }
        Ok(())
    }

    /// True if `key` exists (a HEAD): the existence check after a retried delete.
    pub async fn exists(&self, key: &str) -> Result<bool, ObjectError> {
        match self.reader.head(&Path::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(ObjectError::Provider(flatten(&e))),
        }
    }

    /// Deletes what one write attempt may have left under `key`: the object and, on the
    /// local provider, its staging files (`<key>#<n>`: object_store writes there first and
    /// links the result into place, so a writer killed mid-write leaves one behind that no
    /// other record names). Idempotent like [`ObjectProvider::delete`].
    pub async fn delete_attempt(&self, key: &str) -> Result<(), ObjectError> {
        self.delete(key).await?;
        let Some(fs) = &self.local else {
            return Ok(());
        };
        let path = fs
            .path_to_filesystem(&Path::from(key))
            .map_err(|e| ObjectError::Provider(flatten(&e)))?;
        tokio::task::spawn_blocking(move || remove_staging_leftovers(&path))
            .await
            .map_err(|e| ObjectError::Provider(e.to_string()))?
            .map_err(|e| ObjectError::Provider(e.to_string()))
    }

    /// Every key under the provider prefix (for inventory and tests).
    pub async fn list_keys(&self) -> Result<Vec<String>, ObjectError> {
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        let mut stream = self.reader.list(prefix.as_ref());
        let mut keys = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(|e| ObjectError::Provider(flatten(&e)))?;
            keys.push(meta.location.to_string());
        }
        Ok(keys)
    }
}

/// One page of a provider listing (see [`ObjectProvider::list_page`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// (key, size) in key order.
    pub objects: Vec<(String, u64)>,
    /// True when nothing follows the last object: the listing is complete.
    pub last: bool,
}

impl ObjectProvider {
    /// The provider's key prefix (no leading or trailing `/`; may be empty).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Up to `limit` objects under `<prefix>/<within>` (the whole prefix when `within` is
    /// empty), in key order, strictly after `after`: one page of a resumable scan. S3 lists
    /// in key order from its start-after key, so a page reads about `limit` keys; the other
    /// providers list in no particular order, so they are listed whole and sorted (the
    /// local provider is for one machine's data).
    pub async fn list_page(
        &self,
        within: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage, ObjectError> {
        let joined = [self.prefix.as_str(), within]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        let prefix = (!joined.is_empty()).then(|| Path::from(joined.as_str()));
        let mut stream = match after {
            Some(a) => self
                .reader
                .list_with_offset(prefix.as_ref(), &Path::from(a)),
            None => self.reader.list(prefix.as_ref()),
        };
        let ordered = self.kind == "s3";
        let mut objects = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(|e| ObjectError::Provider(flatten(&e)))?;
            objects.push((meta.location.to_string(), meta.size));
            if ordered && objects.len() > limit {
                break;
            }
        }
        if !ordered {
            objects.sort();
        }
        let last = objects.len() <= limit;
        objects.truncate(limit);
        Ok(ListPage { objects, last })
    }
}

/// Removes `<path>#<n>` staging files beside `path` (exactly that name, then `#`, then
/// digits); an absent directory means there is nothing to remove.
fn remove_staging_leftovers(path: &std::path::Path) -> std::io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(suffix) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(name))
            .and_then(|rest| rest.strip_prefix('#'))
        else {
            continue;
        };
        if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// A local filesystem error that refuses a write outright (no space, read-only, not allowed,
/// too large). Raised while writing or linking a staging file, it proves the final key was
/// never created (both writers link as their last step), so the write is `NotWritten`.
fn local_refusal(io: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        io.kind(),
        ErrorKind::StorageFull
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::PermissionDenied
            | ErrorKind::QuotaExceeded
            | ErrorKind::FileTooLarge
    )
}

/// Sorts a failed create into "never sent" or "unknown". A connection that was never
/// established proves the provider received nothing; on the local provider, a file-system
/// refusal (no space, read-only, permission denied, quota) proves the final key was never
/// created: object_store writes a staging file and only links it into place as the last
/// step, which cannot have happened when writing or linking failed. Everything else may
/// have landed.
fn classify(e: &object_store::Error, local: bool) -> PutOutcome {
    if let object_store::Error::AlreadyExists { .. } = e {
        return PutOutcome::Exists;
    }
    let text = flatten(e);
    if let object_store::Error::NotSupported { .. } | object_store::Error::InvalidPath { .. } = e {
        return PutOutcome::NotWritten(text);
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if local
            && let Some(io) = err.downcast_ref::<std::io::Error>()
            && local_refusal(io)
        {
            return PutOutcome::NotWritten(text);
        }
        if let Some(r) = err.downcast_ref::<reqwest::Error>()
            && r.is_connect()
        {
            return PutOutcome::NotWritten(text);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return PutOutcome::NotWritten(text);
        }
        source = err.source();
    }
    PutOutcome::Unknown(text)
}

/// The error and its sources on one line (object_store nests the useful part).
fn flatten(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    // Provider bodies (S3 XML) carry newlines; errors are reported on one line.
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether SigV4 must cover each PUT's body (its SHA-256 in the signature) or may use
/// `UNSIGNED-PAYLOAD`, as AWS's own SDKs do over HTTPS. The payload hash guards the body in
/// transit only where nothing else does: plain HTTP to another host. Over TLS (whose records
/// are authenticated) or loopback (no wire) it is one more SHA-256 pass over every block —
/// measured against moto, 0.9 ms of the owner's CPU per MiB published, a fifth of it — for
/// nothing: each block's checksum is already checked at PutBlock and on every read.
fn payload_needs_signing(endpoint: Option<&str>) -> bool {
    match endpoint {
        // AWS's own endpoints: HTTPS.
        None => false,
        Some(ep) => {
            let https = ep
                .get(..8)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
            !(https || is_loopback_url(ep))
        }
    }
}

fn is_loopback_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let host = rest.split(['/', '?']).next().unwrap_or("");
    let host = match host.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "localhost" | "127.0.0.1" | "[::1]" | "::1") || host.starts_with("127.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_bodies_are_signed_only_over_plain_http_to_another_host() {
        assert!(payload_needs_signing(Some("http://s3.example.com")));
        assert!(payload_needs_signing(Some("http://10.0.0.1:9000")));
        assert!(!payload_needs_signing(Some("https://s3.example.com")));
        assert!(!payload_needs_signing(Some("HTTPS://minio.internal:9000")));
        assert!(!payload_needs_signing(Some("http://127.0.0.1:9000")));
        assert!(
            !payload_needs_signing(None),
            "AWS's default endpoints are HTTPS"
        );
    }

    #[test]
    fn only_loopback_endpoints_get_plain_http_implicitly() {
        assert!(is_loopback_url("http://127.0.0.1:9000"));
        assert!(is_loopback_url("http://localhost:9000/"));
        assert!(is_loopback_url("http://[::1]:9000"));
        assert!(!is_loopback_url("http://s3.example.com"));
        assert!(!is_loopback_url("http://10.0.0.1:9000"));
    }

    // Catches: the in-memory provider storing the caller's buffer, which keeps the buffer's
    // block-memory reservation alive as long as the object (the budget never comes back).
    #[tokio::test]
    async fn a_block_stored_in_memory_gives_its_block_memory_back() {
        let p = ObjectProvider::open(&ProviderConfig::Memory, "pfx").unwrap();
        let budget = crate::memory::BlockMemory::new(1024, std::time::Duration::from_millis(10));
        let held = budget
            .reserve(1024)
            .await
            .unwrap()
            .hold(Bytes::from(vec![7u8; 1024]));
        assert_eq!(p.create("k", held).await, PutOutcome::Written);
        assert!(
            budget.reserve(1024).await.is_ok(),
            "the budget is free again"
        );
        assert_eq!(p.get("k").await.unwrap(), vec![7u8; 1024]);
    }

    #[tokio::test]
    async fn create_never_overwrites_a_key_and_delete_is_idempotent() {
        let p = ObjectProvider::open(&ProviderConfig::Memory, "pfx").unwrap();
        let key = p.block_key(1, "u", 0, "a");
        assert_eq!(
            p.create(&key, Bytes::from_static(b"one")).await,
            PutOutcome::Written
        );
        assert_eq!(
            p.create(&key, Bytes::from_static(b"two")).await,
            PutOutcome::Exists
        );
        assert_eq!(p.get(&key).await.unwrap(), Bytes::from_static(b"one"));
        p.delete(&key).await.unwrap();
        p.delete(&key).await.unwrap();
        assert!(matches!(p.get(&key).await, Err(ObjectError::NotFound(_))));
    }

    #[test]
    fn local_refusals_that_prove_the_key_never_existed_are_not_written() {
        use std::io::{Error as IoError, ErrorKind};
        let local_error = |kind: ErrorKind| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(IoError::new(kind, "refused")),
        };
        for kind in [
            ErrorKind::StorageFull,
            ErrorKind::ReadOnlyFilesystem,
            ErrorKind::PermissionDenied,
        ] {
            let out = classify(&local_error(kind), true);
            assert!(
                matches!(out, PutOutcome::NotWritten(_)),
                "{kind:?}: {out:?}"
            );
            // A remote provider's answer proves nothing about what landed.
            let out = classify(&local_error(kind), false);
            assert!(
                matches!(out, PutOutcome::Unknown(_)),
                "remote {kind:?}: {out:?}"
            );
        }
        let out = classify(&local_error(ErrorKind::TimedOut), true);
        assert!(matches!(out, PutOutcome::Unknown(_)), "{out:?}");
    }

    // Catches: the local provider's direct writer (object/direct.rs) putting an object where
    // object_store does not look for it, or leaving a staging file that lists as an object.
    #[tokio::test]
    async fn a_local_object_written_around_the_page_cache_reads_and_lists_as_its_key_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        let p = ObjectProvider::open(&ProviderConfig::Local { root: root.clone() }, "pfx").unwrap();
        let key = p.block_key(3, "up", 0, "att");
        let block: Vec<u8> = (0..4 * 1024 * 1024 + 5).map(|i| (i % 253) as u8).collect();
        let block = Bytes::from(block);
        assert_eq!(p.create(&key, block.clone()).await, PutOutcome::Written);
        assert_eq!(
            p.create(&key, Bytes::from_static(b"x")).await,
            PutOutcome::Exists
        );
        assert_eq!(p.get(&key).await.unwrap(), block);
        // A staging file a killed writer left beside it is not an object.
        std::fs::write(format!("{}#123", root.join(&key).display()), b"partial").unwrap();
        assert_eq!(p.list_keys().await.unwrap(), vec![key]);
    }

    #[tokio::test]
    async fn deleting_an_attempt_also_removes_its_local_staging_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        let p = ObjectProvider::open(&ProviderConfig::Local { root: root.clone() }, "pfx").unwrap();
        let key = p.block_key(1, "u", 0, "abc");
        let neighbour = p.block_key(1, "u", 0, "abcd");
        assert_eq!(
            p.create(&neighbour, Bytes::from_static(b"live")).await,
            PutOutcome::Written
        );
        // What a writer killed with -9 in the middle of its write leaves behind.
        let path = root.join(&key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let leftover = |n: &str| std::path::PathBuf::from(format!("{}#{n}", path.display()));
        std::fs::write(leftover("1"), b"partial").unwrap();
        std::fs::write(leftover("2"), b"partial").unwrap();
        let other = std::path::PathBuf::from(format!("{}#1", root.join(&neighbour).display()));
        std::fs::write(&other, b"another attempt's staging").unwrap();

        p.delete_attempt(&key).await.unwrap();
        assert!(!leftover("1").exists() && !leftover("2").exists());
        assert!(
            other.exists(),
            "another key's staging file is not this attempt's"
        );
        assert_eq!(
            p.get(&neighbour).await.unwrap(),
            Bytes::from_static(b"live")
        );
        p.delete_attempt(&key).await.unwrap();
    }

    #[tokio::test]
    async fn a_refused_connection_is_classified_as_not_written() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cfg = ProviderConfig::S3 {
            endpoint: Some("http://127.0.0.1:1".into()),
            bucket: "b".into(),
            region: "us-east-1".into(),
            allow_http: false,
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
        };
        let p = ObjectProvider::open(&cfg, "").unwrap();
        let out = p.create("k", Bytes::from_static(b"x")).await;
        assert!(matches!(out, PutOutcome::NotWritten(_)), "{out:?}");
    }
}
