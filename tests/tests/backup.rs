//! Online backup and restore against real processes (issue 42, item 5): `nokv admin backup`
//! on a daemon under write load, `nokv-server restore-backup` into a new data dir, a daemon
//! started on it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nokv_proto::v1 as pb;
use nokv_tests::{Daemon, pseudo_random_bytes, server_command};
use sha2::{Digest, Sha256};

/// Writers that keep writing while the backup runs.
const WRITERS: usize = 8;

fn body(tag: &str) -> Vec<u8> {
    format!("body of {tag}\n").repeat(3).into_bytes()
}

async fn write(c: &nokv_client::Client, ws: &str, path: &str) -> Vec<u8> {
    let data = body(&format!("{ws}:{path}"));
    c.write(pb::WriteRequest {
        workspace: ws.into(),
        path: path.into(),
        data: data.clone().into(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("write {ws}:{path}: {e}"));
    data
}

fn restore_backup(data_dir: &Path, file: &Path) -> nokv_tests::CliOutput {
    server_command(&[
        "restore-backup",
        "--data-dir",
        data_dir.to_str().unwrap(),
        file.to_str().unwrap(),
    ])
}

/// The whole round trip under load: files written first (small files over many shards and
/// one artifact), then the backup taken while eight clients keep writing; the backup is
/// restored into a new data dir (with the local provider's `objects/` moved over, as the
/// README says), a daemon starts on it, and every write acknowledged before the backup
/// started reads back with its bytes, the artifact included. "Acknowledged before": a writer
/// reads the `started` flag after its write was answered, and the flag is set before the
/// backup command is run — no clock involved.
///
/// Mutation caught (verified red): the backup skipping one shard (`take` dropping the last
/// served shard: the answer's `shards` lacks shard 15; a restore of such a file would not
/// start, its node file lacking shard 15's tables).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_taken_while_eight_clients_write_restores_every_write_acknowledged_before_it() {
    let root = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (root.path().join("old"), root.path().join("new"));
    let d = Daemon::start_in(&old_dir, &[]);
    let c = d.sdk().await;

    let mut expected: Vec<(String, String, Vec<u8>)> = Vec::new();
    for i in 0..48 {
        let (ws, path) = (format!("team-{}", i % 24), format!("notes/{i}.md"));
        let data = write(&c, &ws, &path).await;
        expected.push((ws, path, data));
    }
    let artifact = pseudo_random_bytes(42, 600 * 1024);
    let src = root.path().join("artifact.bin");
    std::fs::write(&src, &artifact).unwrap();
    d.cli(&["publish", "-q", src.to_str().unwrap(), "team-0:big.bin"])
        .assert_ok();

    let started = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (first_ack, mut first_acks) = tokio::sync::mpsc::channel::<()>(WRITERS);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (c, started, stop, first_ack) =
                (c.clone(), started.clone(), stop.clone(), first_ack.clone());
            tokio::spawn(async move {
                let (mut before, mut after) = (Vec::new(), 0u64);
                let ws = format!("load-{w}");
                for k in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let path = format!("w{w}/{k}");
                    let data = write(&c, &ws, &path).await;
                    if started.load(Ordering::SeqCst) {
                        after += 1;
                    } else {
                        before.push((ws.clone(), path, data));
                    }
                    if k == 0 {
                        first_ack.send(()).await.unwrap();
                    }
                }
                (before, after)
            })
        })
        .collect();
    // Every writer is writing before the backup starts.
    for _ in 0..WRITERS {
        first_acks.recv().await.unwrap();
    }
    let file = root.path().join("node.backup");
    started.store(true, Ordering::SeqCst);
    let out = tokio::task::block_in_place(|| {
        d.cli(&["--json", "admin", "backup", file.to_str().unwrap()])
    });
    stop.store(true, Ordering::SeqCst);
    let doc = out.assert_ok().json();
    let mut during = 0;
    for w in writers {
        let (before, after) = w.await.unwrap();
        expected.extend(before);
        during += after;
    }
    eprintln!("writes acknowledged after the backup started: {during}");

    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(doc["path"], file.to_str().unwrap());
    assert_eq!(doc["bytes"].as_u64(), Some(bytes.len() as u64));
    assert_eq!(doc["sha256"], hex::encode(Sha256::digest(&bytes)));
    let shards: Vec<u64> = (0..16).collect();
    assert_eq!(doc["shards"], serde_json::json!(shards));
    assert!(!partial(&file).exists(), "the partial file is gone");
    let events = d.cli(&["--json", "admin", "events"]).assert_ok().json();
    let backup_events: Vec<_> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "Backup")
        .collect();
    assert_eq!(backup_events.len(), 1, "{events}");
    assert_eq!(backup_events[0]["outcome"], "ok");
    assert_eq!(d.terminate().code(), Some(0));

    let restored = restore_backup(&new_dir, &file);
    restored.assert_ok();
    assert!(
        restored.stdout_str().contains("restored 16 of 16 shards"),
        "{}",
        restored.stdout_str()
    );
    // Artifact blocks live in the provider, not in the backup: the local provider's directory
    // moves to the new data dir.
    std::fs::rename(old_dir.join("objects"), new_dir.join("objects")).unwrap();
    let r = Daemon::start_in(&new_dir, &[]);
    let rc = r.sdk().await;
    for (ws, path, data) in &expected {
        let got = rc
            .read(ws, path)
            .await
            .unwrap_or_else(|e| panic!("{ws}:{path} after restore: {e}"));
        assert!(got.data == *data, "{ws}:{path} reads back other bytes");
    }
    let out = root.path().join("artifact.out");
    r.cli(&["restore", "-q", "team-0:big.bin", out.to_str().unwrap()])
        .assert_ok();
    assert!(std::fs::read(&out).unwrap() == artifact, "artifact differs");
}

/// `DEST.partial` of a backup written to `dest`.
fn partial(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// A stopped daemon's backup: (the tempdir holding it all, the backup file).
fn small_backup() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(&root.path().join("node"), &[]);
    d.cli_stdin(&["put", "ws:a.md"], b"alpha").assert_ok();
    let file = root.path().join("node.backup");
    d.cli(&["admin", "backup", file.to_str().unwrap()])
        .assert_ok();
    drop(d);
    (root, file)
}

/// Restore never writes into a directory that holds anything: it names the directory, exits
/// 2, and leaves what was there alone. An empty directory is taken.
/// Mutation caught (verified red): `require_empty` accepting any directory.
#[test]
fn restore_refuses_a_data_dir_that_is_not_empty_and_names_it() {
    let (root, file) = small_backup();
    let dir = root.path().join("occupied");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep.txt"), b"mine").unwrap();

    let out = restore_backup(&dir, &file);
    assert_eq!(out.status, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("is not empty") && out.stderr.contains(dir.to_str().unwrap()),
        "{}",
        out.stderr
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["keep.txt"], "nothing added");
    assert_eq!(std::fs::read(dir.join("keep.txt")).unwrap(), b"mine");

    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    restore_backup(&empty, &file).assert_ok();
    assert!(empty.join("shards").join("node.redb").is_file());
}

/// One flipped byte anywhere — the header, a shard's body, the trailer's digest — is refused
/// with the damage named, and nothing is created; the intact file then restores, and a daemon
/// serves what it holds.
/// Mutation caught (verified red): the reader not comparing the trailer's digest (the flipped
/// shard count in the header is then restored as if intact).
#[test]
fn restore_refuses_a_backup_with_a_flipped_byte_and_creates_nothing() {
    let (root, file) = small_backup();
    let intact = std::fs::read(&file).unwrap();
    let header = 12; // the shard count
    let body = intact.len() / 2;
    let last = intact.len() - 1;
    for at in [header, body, last] {
        let mut bad = intact.clone();
        bad[at] ^= 0x20;
        let damaged = root.path().join(format!("damaged-{at}.backup"));
        std::fs::write(&damaged, &bad).unwrap();
        let dir = root.path().join(format!("from-{at}"));
        let out = restore_backup(&dir, &damaged);
        assert_eq!(out.status, 2, "byte {at}: {}", out.stderr);
        assert!(
            out.stderr.contains("is damaged") && out.stderr.contains(damaged.to_str().unwrap()),
            "byte {at}: {}",
            out.stderr
        );
        assert!(!dir.exists(), "byte {at}: {} was created", dir.display());
    }

    let dir = root.path().join("restored");
    restore_backup(&dir, &file).assert_ok();
    let d = Daemon::start_in(&dir, &[]);
    assert_eq!(d.cli(&["get", "ws:a.md"]).assert_ok().stdout, b"alpha");
}

/// Only an admin token scoped to every workspace may take a backup: a write token, a read
/// token and an admin token for some workspaces are refused with PermissionDenied, nothing is
/// written on the client, and no audit event is recorded (they were never admitted).
/// Mutation caught (verified red): the handler without `admit_who`.
#[test]
fn a_backup_needs_an_admin_token_for_every_workspace() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("node.backup");
    for (scope, role) in [("*", "write"), ("*", "read"), ("team-*", "admin")] {
        let token = d.token(scope, role, None);
        d.cli_with_env(
            &["admin", "backup", dest.to_str().unwrap()],
            &[("NOKV_TOKEN", &token)],
        )
        .assert_fails_with("PermissionDenied");
        assert!(!dest.exists() && !partial(&dest).exists(), "{role} {scope}");
    }
    let events = d.cli(&["--json", "admin", "events"]).assert_ok().json();
    assert!(
        !events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "Backup"),
        "{events}"
    );
}

/// An existing DEST is refused (usage error, exit 2, file untouched) unless `--force`, which
/// replaces it with a complete backup.
#[test]
fn an_existing_destination_is_kept_unless_the_backup_is_forced() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("node.backup");
    std::fs::write(&dest, b"an older backup").unwrap();

    let out = d.cli(&["admin", "backup", dest.to_str().unwrap()]);
    assert_eq!(out.status, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--force"), "{}", out.stderr);
    assert_eq!(std::fs::read(&dest).unwrap(), b"an older backup");

    let doc = d
        .cli(&[
            "--json",
            "admin",
            "backup",
            "--force",
            dest.to_str().unwrap(),
        ])
        .assert_ok()
        .json();
    let bytes = std::fs::read(&dest).unwrap();
    assert_eq!(doc["sha256"], hex::encode(Sha256::digest(&bytes)));
    assert!(!partial(&dest).exists());
}
