//! Checkpoint objects: a shard's redb file as uploaded for a graceful handoff (see
//! [`crate::shard::checkpoint`]). They live under `<prefix>/meta/<shard>/ckpt/`, beside the
//! block keys (`<prefix>/sNNNN/...`) but never among them: [`ObjectProvider::shard_of_key`]
//! does not map them to a shard, no shard record names them, so the reconciler (which deletes
//! only keys its records queue) never deletes them, and the audit counts them on their own.
//! A superseded checkpoint is deleted explicitly by the handoff that replaced it.

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{ObjectError, ObjectProvider, PutOutcome};

/// The path segment after the prefix under which all metadata objects live.
const META: &str = "meta";
/// The segment after the shard under which its checkpoints live.
const CKPT: &str = "ckpt";

impl ObjectProvider {
    /// A fresh key for a checkpoint of `shard` taken at `epoch`:
    /// `<prefix>/meta/<shard>/ckpt/<epoch>-<random>`. The random part makes every call's key
    /// unique, so an upload never overwrites an earlier one (even one whose outcome is
    /// unknown); the epoch is zero-padded so listings sort checkpoints by epoch.
    pub fn checkpoint_key(&self, shard: u32, epoch: u64) -> String {
        let rel = format!(
            "{META}/{shard:04}/{CKPT}/{epoch:020}-{}",
            crate::ids::random_hex(16)
        );
        if self.prefix.is_empty() {
            rel
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// True for a key of a single node's manifest (`<prefix>/meta/node/...`, see
    /// [`crate::standalone`]).
    pub fn is_manifest_key(&self, key: &str) -> bool {
        self.meta_key_under(key, "/node/")
    }

    /// True for a key of a node's metadata log (`<prefix>/meta/log/...`, see
    /// [`crate::provider_log`]).
    pub fn is_log_key(&self, key: &str) -> bool {
        self.meta_key_under(key, "/log/")
    }

    /// True for a key `<prefix>/meta<folder>...` with something after the folder.
    fn meta_key_under(&self, key: &str, folder: &str) -> bool {
        let rel = if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.prefix.as_str())
                .and_then(|k| k.strip_prefix('/'))
        };
        rel.and_then(|r| r.strip_prefix(META)?.strip_prefix(folder))
            .is_some_and(|rest| !rest.is_empty())
    }

    /// True for a key [`ObjectProvider::checkpoint_key`] makes (under this provider's prefix).
    pub fn is_checkpoint_key(&self, key: &str) -> bool {
        let rel = if self.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.prefix.as_str())
                .and_then(|k| k.strip_prefix('/'))
        };
        let Some(rest) = rel.and_then(|r| r.strip_prefix(META)?.strip_prefix('/')) else {
            return false;
        };
        match rest.split('/').collect::<Vec<_>>().as_slice() {
            [shard, CKPT, name] => {
                shard.len() == 4 && shard.parse::<u32>().is_ok() && !name.is_empty()
            }
            _ => false,
        }
    }

    /// Uploads a checkpoint under a fresh key (create-if-absent, one attempt, durable like
    /// any write). An error leaves the outcome open: the object may still land under `key`;
    /// being unique, it is then an orphan that the audit counts as a checkpoint.
    pub async fn put_checkpoint(&self, key: &str, data: Bytes) -> Result<(), ObjectError> {
        match self.create(key, data).await {
            PutOutcome::Written => Ok(()),
            PutOutcome::NotWritten(e) | PutOutcome::Unknown(e) => Err(ObjectError::Provider(
                format!("uploading checkpoint {key}: {e}"),
            )),
            PutOutcome::Exists => Err(ObjectError::Provider(format!(
                "uploading checkpoint {key}: the key is taken"
            ))),
        }
    }

    /// Downloads a checkpoint and proves it is the one recorded: exactly `size` bytes whose
    /// sha256 is `sha256_hex`. Anything else is refused with [`ObjectError::CheckpointCorrupt`]
    /// (a checkpoint is a whole database: a wrong byte must never be served).
    pub async fn get_checkpoint(
        &self,
        key: &str,
        sha256_hex: &str,
        size: u64,
    ) -> Result<Bytes, ObjectError> {
        let data = self.get(key).await?;
        let corrupt = |reason: String| ObjectError::CheckpointCorrupt {
            key: key.to_string(),
            reason,
        };
        if data.len() as u64 != size {
            return Err(corrupt(format!(
                "{} bytes, the checkpoint record says {size}",
                data.len()
            )));
        }
        // Hashing a whole database is CPU work: off the async workers.
        let (data, digest) = tokio::task::spawn_blocking(move || {
            let digest = hex::encode(Sha256::digest(&data));
            (data, digest)
        })
        .await
        .map_err(|e| ObjectError::Provider(format!("hashing checkpoint {key}: {e}")))?;
        if !digest.eq_ignore_ascii_case(sha256_hex) {
            return Err(corrupt(format!(
                "sha256 {digest}, the checkpoint record says {sha256_hex}"
            )));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::ProviderConfig;

    fn provider(prefix: &str) -> ObjectProvider {
        ObjectProvider::open(&ProviderConfig::Memory, prefix).unwrap()
    }

    // Catches: a key without its random part (two checkpoints of one epoch would collide and
    // the second upload would be refused), and a checkpoint key that maps to a shard (the
    // audit would classify it with that shard's ledger and report it unaccounted).
    #[test]
    fn checkpoint_keys_are_unique_per_call_and_are_never_block_keys() {
        for prefix in ["pfx", ""] {
            let p = provider(prefix);
            let a = p.checkpoint_key(3, 7);
            let b = p.checkpoint_key(3, 7);
            assert_ne!(a, b);
            let expected = if prefix.is_empty() {
                "meta/0003/ckpt/00000000000000000007-".to_string()
            } else {
                format!("{prefix}/meta/0003/ckpt/00000000000000000007-")
            };
            assert!(a.starts_with(&expected), "{a}");
            assert!(p.is_checkpoint_key(&a), "{a}");
            assert_eq!(p.shard_of_key(&a), None, "{a}");

            let block = p.block_key(3, "u", 0, "x");
            assert!(!p.is_checkpoint_key(&block), "{block}");
            assert_eq!(p.shard_of_key(&block), Some(3));
        }
        // Another provider prefix's checkpoint is not this provider's.
        let other = provider("other").checkpoint_key(1, 1);
        assert!(!provider("pfx").is_checkpoint_key(&other));
    }

    // Catches: skipping either check in `get_checkpoint` (a truncated or altered database
    // would be handed to the restore).
    #[tokio::test]
    async fn a_checkpoint_of_the_wrong_size_or_digest_is_refused() {
        let p = provider("pfx");
        let key = p.checkpoint_key(0, 1);
        let data = Bytes::from_static(b"a shard database");
        p.put_checkpoint(&key, data.clone()).await.unwrap();
        let sha = hex::encode(Sha256::digest(&data));
        let size = data.len() as u64;

        assert_eq!(p.get_checkpoint(&key, &sha, size).await.unwrap(), data);
        let wrong_size = p.get_checkpoint(&key, &sha, size + 1).await.unwrap_err();
        assert!(
            matches!(wrong_size, ObjectError::CheckpointCorrupt { ref reason, .. } if reason.contains("bytes")),
            "{wrong_size:?}"
        );
        let other = hex::encode(Sha256::digest(b"another database"));
        let wrong_digest = p.get_checkpoint(&key, &other, size).await.unwrap_err();
        assert!(
            matches!(wrong_digest, ObjectError::CheckpointCorrupt { ref reason, .. } if reason.contains("sha256")),
            "{wrong_digest:?}"
        );
    }

    #[tokio::test]
    async fn a_checkpoint_key_is_never_overwritten() {
        let p = provider("pfx");
        let key = p.checkpoint_key(0, 1);
        p.put_checkpoint(&key, Bytes::from_static(b"first"))
            .await
            .unwrap();
        assert!(
            p.put_checkpoint(&key, Bytes::from_static(b"second"))
                .await
                .is_err()
        );
        assert_eq!(p.get(&key).await.unwrap(), Bytes::from_static(b"first"));
    }
}
