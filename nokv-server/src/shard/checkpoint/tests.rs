//! Checkpoint tests: a real shard (gate, redb file) and the local provider, as a handoff
//! between two nodes sharing one bucket would use them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::object::ProviderConfig;
use crate::shard::ShardConfig;
use crate::token::Signer;

struct Fixture {
    dir: tempfile::TempDir,
    shard: Arc<Shard>,
    provider: ObjectProvider,
    /// Where the local provider keeps its objects (tests alter them there).
    objects: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    let provider = ObjectProvider::open(
        &ProviderConfig::Local {
            root: objects.clone(),
        },
        "pfx",
    )
    .unwrap();
    let meta = MetaStore::create(&dir.path().join("0005.redb")).unwrap();
    let bulk = Arc::new(crate::bulk::Bulk::new(1, None).unwrap());
    let shard = Shard::open(
        5,
        meta,
        provider.clone(),
        bulk,
        Signer::new(b"k"),
        ShardConfig::default(),
    );
    Fixture {
        dir,
        shard,
        provider,
        objects,
    }
}

impl Fixture {
    /// Writes `n` small files `f0..` to workspace `ws`, each its own acknowledged session.
    async fn write_files(&self, n: usize) {
        for i in 0..n {
            let (name, body) = (format!("f{i}"), format!("body {i}"));
            self.shard
                .gate
                .write(move |w| Ok(w.put_inline("ws", &name, body.as_bytes())?))
                .await
                .unwrap();
        }
    }

    fn scratch(&self) -> PathBuf {
        self.dir.path().join("0005.ckpt")
    }

    fn object_path(&self, key: &str) -> PathBuf {
        self.objects.join(key)
    }
}

/// Every inline file `f0..f{n-1}` of `ws` in the store at `path`, with its body.
fn files_in(path: &Path, n: usize) -> Vec<(String, Option<Vec<u8>>)> {
    let store = MetaStore::open_plain(path).unwrap();
    (0..n)
        .map(|i| {
            let name = format!("f{i}");
            let body = store
                .read(|r| Ok::<_, Error>(r.inline("ws", &name)?))
                .unwrap();
            (name, body)
        })
        .collect()
}

// Catches: a restore that installs something other than the snapshot (e.g. an empty store),
// and a take that leaves its scratch file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_restored_into_a_fresh_path_holds_every_entry_of_the_shard() {
    let f = fixture();
    f.write_files(25).await;

    let ckpt = take(&f.shard, &f.provider, 4, &f.scratch()).await.unwrap();
    assert!(!f.scratch().exists(), "the scratch file is removed");
    assert!(f.provider.is_checkpoint_key(&ckpt.key), "{}", ckpt.key);
    assert!(ckpt.key.starts_with("pfx/meta/0005/ckpt/"), "{}", ckpt.key);
    let uploaded = std::fs::read(f.object_path(&ckpt.key)).unwrap();
    assert_eq!(uploaded.len() as u64, ckpt.size);
    assert_eq!(hex::encode(Sha256::digest(&uploaded)), ckpt.sha256);

    let other_node = tempfile::tempdir().unwrap();
    let dest = other_node.path().join("shards").join("0005.redb");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    restore(&f.provider, &ckpt, &dest).await.unwrap();
    assert!(!temp_path(&dest).exists());

    let restored = files_in(&dest, 25);
    for (name, body) in &restored {
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(
            body.as_deref(),
            Some(format!("body {i}").as_bytes()),
            "{name}"
        );
    }
    let counts = |path: &Path| {
        let c = MetaStore::open_plain(path)
            .unwrap()
            .read(|r| Ok::<_, Error>(r.counts()?))
            .unwrap();
        (c.entries, c.uploads, c.guards, c.collectable)
    };
    let source = f.shard.counts().await.unwrap();
    assert_eq!(
        counts(&dest),
        (
            source.entries,
            source.uploads,
            source.guards,
            source.collectable
        )
    );
}

/// A destination shard file with known content, to prove a refused restore leaves it alone.
fn existing_destination(dir: &Path) -> (PathBuf, Vec<u8>) {
    let dest = dir.join("0005.redb");
    let store = MetaStore::create(&dest).unwrap();
    store
        .write(|w| Ok::<_, Error>(w.put_inline("ws", "mine", b"the next owner's own")?))
        .unwrap();
    drop(store);
    let before = std::fs::read(&dest).unwrap();
    (dest, before)
}

// Catches: a restore that skips the digest or size check, and one that writes the
// destination (or leaves its temporary file) before the checkpoint was verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_checkpoint_or_a_wrong_declared_digest_is_refused_and_the_destination_is_unchanged()
 {
    let f = fixture();
    f.write_files(10).await;
    let ckpt = take(&f.shard, &f.provider, 1, &f.scratch()).await.unwrap();
    let node = tempfile::tempdir().unwrap();
    let (dest, before) = existing_destination(node.path());

    // The record is right, the declared digest is not.
    let wrong_digest = Checkpoint {
        sha256: hex::encode(Sha256::digest(b"some other database")),
        ..ckpt.clone()
    };
    let err = restore(&f.provider, &wrong_digest, &dest)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
    assert_eq!(std::fs::read(&dest).unwrap(), before);
    assert!(!temp_path(&dest).exists());

    // The record is right, the object was altered (one byte flipped, same size).
    let object = f.object_path(&ckpt.key);
    let mut bytes = std::fs::read(&object).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();
    let err = restore(&f.provider, &ckpt, &dest).await.unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
    assert_eq!(std::fs::read(&dest).unwrap(), before);
    assert!(!temp_path(&dest).exists());

    // The object was truncated.
    std::fs::write(&object, &bytes[..middle]).unwrap();
    let err = restore(&f.provider, &ckpt, &dest).await.unwrap_err();
    assert!(matches!(err, Error::DataCorrupted(_)), "{err:?}");
    assert_eq!(std::fs::read(&dest).unwrap(), before);
}

// Catches: installing a verified object without proving it opens as a store (a checkpoint
// uploaded from the wrong file would replace the shard file), and leaving `dest.tmp` behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_checkpoint_that_is_not_a_shard_store_is_refused_and_its_temp_file_removed() {
    let f = fixture();
    let data = Bytes::from(vec![0x5a; 8192]);
    let key = f.provider.checkpoint_key(5, 2);
    f.provider.put_checkpoint(&key, data.clone()).await.unwrap();
    let ckpt = Checkpoint {
        key,
        sha256: hex::encode(Sha256::digest(&data)),
        size: data.len() as u64,
        covers: 0,
    };
    let node = tempfile::tempdir().unwrap();
    let (dest, before) = existing_destination(node.path());

    let err = restore(&f.provider, &ckpt, &dest).await.unwrap_err();
    assert!(
        matches!(err, Error::Internal(ref m) if m.contains("not a shard store")),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), before);
    assert!(!temp_path(&dest).exists());
}

// Catches: a checkpoint key the reconciler's records could name (it would be deleted by a
// pass), and a `discard` that does not delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_survives_reconciler_passes_until_it_is_discarded() {
    let f = fixture();
    f.write_files(3).await;
    let ckpt = take(&f.shard, &f.provider, 1, &f.scratch()).await.unwrap();
    f.shard.reconcile().await.unwrap();
    f.shard.reconcile().await.unwrap();
    assert!(f.provider.list_keys().await.unwrap().contains(&ckpt.key));

    discard(&f.provider, &ckpt.key).await.unwrap();
    assert!(!f.provider.list_keys().await.unwrap().contains(&ckpt.key));
    discard(&f.provider, &ckpt.key).await.unwrap();
}
