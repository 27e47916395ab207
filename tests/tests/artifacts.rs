//! Artifacts through the real `nokv` CLI against a real `nokv-server`: publish and restore
//! against moto's S3 server and the local provider, `stat` and `get` of artifacts,
//! republishing, stdin publishing, a corrupted block refused at restore, and an interrupted
//! restore resuming from the verified blocks of its `.partial` file.

use std::path::{Path, PathBuf};

use nokv_proto::block_checksum::BlockChecksums;
use nokv_tests::{CliOutput, Daemon, Moto, files_under, pseudo_random_bytes};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The server's block size (4 MiB).
const BLOCK: usize = 4 << 20;

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data).as_slice())
}

/// `nokv --json publish FILE TARGET`; returns the published entry.
#[track_caller]
fn publish(d: &Daemon, file: &Path, target: &str) -> Value {
    let file = file.to_str().expect("UTF-8 temp path");
    d.cli(&["--json", "publish", file, target])
        .assert_ok()
        .json()
}

/// `nokv --json stat TARGET`; returns the entry.
#[track_caller]
fn stat(d: &Daemon, target: &str) -> Value {
    d.cli(&["--json", "stat", target]).assert_ok().json()
}

/// `nokv --json restore TARGET DEST`; returns the restore summary.
#[track_caller]
fn restore(d: &Daemon, target: &str, dest: &Path) -> Value {
    let dest = dest.to_str().expect("UTF-8 temp path");
    d.cli(&["--json", "restore", target, dest])
        .assert_ok()
        .json()
}

/// `nokv get TARGET` to stdout; returns the streamed bytes.
#[track_caller]
fn get(d: &Daemon, target: &str) -> Vec<u8> {
    d.cli(&["get", target]).assert_ok().stdout.clone()
}

fn partial_of(dest: &Path) -> PathBuf {
    let mut p = dest.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

#[track_caller]
fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    // Not assert_eq!: a 16 MiB diff in a panic message helps nobody.
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        panic!(
            "{what}: {} bytes (sha256 {}), expected {} bytes (sha256 {}); first difference at {first:?}",
            got.len(),
            sha256_hex(got),
            want.len(),
            sha256_hex(want)
        );
    }
}

#[track_caller]
fn assert_artifact(entry: &Value, data: &[u8], blocks: u64, what: &str) {
    assert_eq!(entry["kind"], "artifact", "{what}: {entry}");
    assert_eq!(entry["size"], data.len() as u64, "{what}: {entry}");
    assert_eq!(entry["sha256"], sha256_hex(data), "{what}: {entry}");
    assert_eq!(entry["block_count"], blocks, "{what}: {entry}");
    assert!(
        entry["revision"].as_u64().unwrap_or(0) > 0,
        "{what}: {entry}"
    );
}

fn generation(entry: &Value) -> u64 {
    entry["generation"]
        .as_u64()
        .unwrap_or_else(|| panic!("entry without a generation: {entry}"))
}

/// The block objects the local provider holds for this daemon (its `DATA_DIR/objects`).
fn local_objects(d: &Daemon) -> Vec<PathBuf> {
    files_under(&d.data_dir().join("objects"))
}

/// Runs an SDK future to completion on a fresh runtime (these tests are otherwise
/// synchronous: they drive the CLI as a child process).
fn sdk<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

/// The round trip: a 16 MiB + 1 byte random file (5 blocks) and an empty file are
/// published, `stat`ed, restored and streamed back byte-identical. Returns the big file's bytes.
fn publish_and_restore_big_and_empty(d: &Daemon, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let big = pseudo_random_bytes(seed, 16 * 1024 * 1024 + 1);
    let big_path = dir.path().join("big.bin");
    std::fs::write(&big_path, &big).unwrap();
    let empty_path = dir.path().join("empty.bin");
    std::fs::write(&empty_path, b"").unwrap();

    let published = publish(d, &big_path, "ws:builds/big.bin");
    assert_artifact(&published, &big, 5, "publish of the big file");
    assert_eq!(generation(&published), 1, "{published}");
    let published_empty = publish(d, &empty_path, "ws:builds/empty.bin");
    assert_artifact(&published_empty, b"", 0, "publish of the empty file");

    let st = stat(d, "ws:builds/big.bin");
    assert_artifact(&st, &big, 5, "stat of the big file");
    for field in ["revision", "generation", "sha256", "size"] {
        assert_eq!(st[field], published[field], "stat vs publish {field}");
    }
    let st_empty = stat(d, "ws:builds/empty.bin");
    assert_artifact(&st_empty, b"", 0, "stat of the empty file");
    assert_ne!(
        st["revision"], st_empty["revision"],
        "two publishes make two revisions"
    );

    let big_dest = dir.path().join("big.restored");
    let summary = restore(d, "ws:builds/big.bin", &big_dest);
    assert_eq!(summary["resumed_blocks"], 0, "{summary}");
    assert_eq!(summary["block_count"], 5, "{summary}");
    assert_same_bytes(
        &std::fs::read(&big_dest).unwrap(),
        &big,
        "restored big file",
    );
    assert!(!partial_of(&big_dest).exists(), "the .partial was renamed");

    let empty_dest = dir.path().join("empty.restored");
    restore(d, "ws:builds/empty.bin", &empty_dest);
    assert_eq!(
        std::fs::read(&empty_dest).unwrap(),
        b"",
        "restored empty file"
    );

    assert_same_bytes(
        &get(d, "ws:builds/big.bin"),
        &big,
        "`nokv get` of the big file",
    );
    assert!(
        get(d, "ws:builds/empty.bin").is_empty(),
        "`nokv get` of the empty file"
    );
    big
}

fn health(d: &Daemon) -> Value {
    d.cli(&["--json", "admin", "health"]).assert_ok().json()
}

#[test]
fn publish_and_restore_against_moto_s3_are_byte_identical_and_the_blocks_live_in_the_bucket() {
    let moto = Moto::start();
    moto.create_bucket("nokv-artifacts");
    let endpoint = moto.endpoint();
    let d = Daemon::start_with_env(
        &[
            "--provider",
            "s3",
            "--s3-endpoint",
            &endpoint,
            "--s3-bucket",
            "nokv-artifacts",
            "--s3-prefix",
            "art",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    );
    assert_eq!(health(&d)["provider"], "s3");

    let big = publish_and_restore_big_and_empty(&d, 1);

    // The bytes really are in moto: exactly the 5 block objects under the prefix, whose
    // concatenation in key order (index-major within the one upload) is the file.
    // `list_keys` asserts the listing answered 200 and is not truncated.
    let keys = moto.list_keys("nokv-artifacts", "art/");
    assert_eq!(keys.len(), 5, "block objects in the bucket: {keys:?}");
    let mut stored = Vec::new();
    for key in &keys {
        assert!(
            key.starts_with("art/s"),
            "key outside the prefix/shard: {key}"
        );
        let (status, object) = moto.s3("GET", &format!("/nokv-artifacts/{key}"), b"");
        assert_eq!(status, 200, "GET {key}");
        stored.extend_from_slice(&object);
    }
    assert_same_bytes(&stored, &big, "the block objects in moto, concatenated");
}

#[test]
fn publish_and_restore_against_the_local_provider_are_byte_identical() {
    let d = Daemon::start(&[]);
    assert_eq!(health(&d)["provider"], "local");

    let big = publish_and_restore_big_and_empty(&d, 2);

    let objects = local_objects(&d);
    assert_eq!(objects.len(), 5, "block objects on disk: {objects:?}");
    let mut stored = Vec::new();
    for o in &objects {
        let rel = o.strip_prefix(d.data_dir().join("objects")).unwrap();
        assert!(
            rel.starts_with("nokv"),
            "object outside the default prefix: {}",
            rel.display()
        );
        stored.extend_from_slice(&std::fs::read(o).unwrap());
    }
    assert_same_bytes(&stored, &big, "the block objects on disk, concatenated");
}

#[test]
fn publishing_over_an_artifact_bumps_the_generation_and_restores_the_new_content() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let v1 = pseudo_random_bytes(10, BLOCK + 10);
    let v2 = pseudo_random_bytes(11, 3 * 1024 * 1024);
    let (p1, p2) = (dir.path().join("v1"), dir.path().join("v2"));
    std::fs::write(&p1, &v1).unwrap();
    std::fs::write(&p2, &v2).unwrap();

    let first = publish(&d, &p1, "ws:rel/app.tar");
    assert_artifact(&first, &v1, 2, "first publish");
    let second = publish(&d, &p2, "ws:rel/app.tar");
    assert_artifact(&second, &v2, 1, "second publish");
    assert_eq!(
        generation(&second),
        generation(&first) + 1,
        "{first}\n{second}"
    );
    assert_ne!(second["revision"], first["revision"], "a new revision");

    let st = stat(&d, "ws:rel/app.tar");
    assert_artifact(&st, &v2, 1, "stat after republish");
    assert_eq!(generation(&st), generation(&second));
    assert_eq!(st["revision"], second["revision"]);

    let dest = dir.path().join("restored");
    let summary = restore(&d, "ws:rel/app.tar", &dest);
    assert_eq!(summary["revision"], second["revision"], "{summary}");
    assert_same_bytes(
        &std::fs::read(&dest).unwrap(),
        &v2,
        "restore after republish",
    );
    assert_same_bytes(&get(&d, "ws:rel/app.tar"), &v2, "get after republish");

    // Restoring over an existing DEST with --force replaces it with the current content.
    std::fs::write(&dest, b"stale").unwrap();
    d.cli(&[
        "restore",
        "ws:rel/app.tar",
        dest.to_str().unwrap(),
        "--force",
    ])
    .assert_ok();
    assert_same_bytes(&std::fs::read(&dest).unwrap(), &v2, "restore over a file");
}

/// Flips one byte in the middle of the stored object of block `index`; returns its path.
fn corrupt_block(d: &Daemon, index: u32) -> PathBuf {
    let name = format!("{index:08}-");
    let objects = local_objects(d);
    let target = objects
        .iter()
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&name))
        })
        .unwrap_or_else(|| panic!("no object for block {index} in {objects:?}"))
        .clone();
    let mut bytes = std::fs::read(&target).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&target, &bytes).unwrap();
    target
}

#[track_caller]
fn assert_digest_mismatch(out: &CliOutput, what: &str) {
    if out.status != 1 || out.reason() != Some("DigestMismatch") {
        panic!(
            "{what}: expected exit 1 with reason DigestMismatch, got exit {} reason {:?}\nstderr: {}",
            out.status,
            out.reason(),
            out.stderr
        );
    }
}

#[test]
fn restore_refuses_a_corrupted_block_and_leaves_no_dest() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(20, 2 * BLOCK + 5);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    publish(&d, &src, "ws:data/db.img");

    let object = corrupt_block(&d, 1);
    let corrupted = std::fs::read(&object).unwrap();

    let dest = dir.path().join("db.img");
    let dest_s = dest.to_str().unwrap();
    let out = d.cli(&["restore", "ws:data/db.img", dest_s]);
    out.assert_fails_with("DigestMismatch");
    assert!(
        out.stderr.contains("block 1"),
        "the error names the block: {}",
        out.stderr
    );
    assert!(!dest.exists(), "no DEST after a refused restore");
    // Whatever was left for a resume holds no corrupted bytes: block 1's range is not the
    // corrupted object, and it is not a complete file either.
    if let Ok(partial) = std::fs::read(partial_of(&dest)) {
        assert_ne!(
            &partial[BLOCK..2 * BLOCK],
            &corrupted[..],
            "the corrupted block was written to DEST.partial"
        );
        assert_ne!(partial, data, "DEST.partial is not a complete restore");
    }

    // A second attempt (resuming whatever verified) still refuses, and so does streaming.
    assert_digest_mismatch(&d.cli(&["restore", "ws:data/db.img", dest_s]), "retry");
    assert!(!dest.exists(), "no DEST after the retried restore");
    let streamed = d.cli(&["get", "ws:data/db.img"]);
    assert_digest_mismatch(&streamed, "`nokv get` to stdout");
    assert!(
        streamed.stdout.len() <= BLOCK,
        "get stopped at the corrupt block ({} bytes written)",
        streamed.stdout.len()
    );

    // Once the provider holds the right bytes again the restore completes from the partial.
    let mut repaired = corrupted;
    let mid = repaired.len() / 2;
    repaired[mid] ^= 0x5a;
    std::fs::write(&object, &repaired).unwrap();
    let summary = restore(&d, "ws:data/db.img", &dest);
    assert!(
        summary["resumed_blocks"].as_u64().unwrap() <= 2,
        "{summary}"
    );
    assert_same_bytes(
        &std::fs::read(&dest).unwrap(),
        &data,
        "restore after repair",
    );
}

#[test]
fn an_interrupted_restore_resumes_from_the_verified_blocks_of_its_partial_file() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(30, 3 * BLOCK);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    publish(&d, &src, "ws:models/m.bin");

    // A complete restore through the SDK gives the reference file.
    let good = dir.path().join("good");
    let restored = sdk(async {
        let client = d.sdk().await;
        client
            .restore("ws", "models/m.bin", &good, 4, None)
            .await
            .expect("SDK restore")
    });
    assert_eq!(restored.resumed_blocks, 0);
    assert_eq!(restored.manifest.blocks.len(), 3);
    let good = std::fs::read(&good).unwrap();
    assert_same_bytes(&good, &data, "SDK restore");

    // Interrupted before the last block arrived: DEST.partial has blocks 0 and 1 only.
    let dest = dir.path().join("m.bin");
    let mut partial = good.clone();
    partial[2 * BLOCK..].fill(0);
    std::fs::write(partial_of(&dest), &partial).unwrap();
    // The user's own partial file with a looser mode is resumed, and the result is 0600.
    std::fs::set_permissions(partial_of(&dest), std::fs::Permissions::from_mode(0o644)).unwrap();
    let summary = restore(&d, "ws:models/m.bin", &dest);
    assert_eq!(summary["resumed_blocks"], 2, "{summary}");
    assert_same_bytes(&std::fs::read(&dest).unwrap(), &data, "resumed restore");
    assert!(!partial_of(&dest).exists(), "the .partial was renamed");
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "restored file mode {mode:o}");

    // A damaged block in the partial is not trusted: it is fetched again.
    std::fs::remove_file(&dest).unwrap();
    let mut partial = good.clone();
    partial[17] ^= 1;
    std::fs::write(partial_of(&dest), &partial).unwrap();
    let summary = restore(&d, "ws:models/m.bin", &dest);
    assert_eq!(summary["resumed_blocks"], 2, "{summary}");
    assert_same_bytes(
        &std::fs::read(&dest).unwrap(),
        &data,
        "restore over a bad block",
    );
}

#[test]
fn publishing_from_stdin_restores_identical_bytes() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(40, BLOCK + 12345);
    let published = d
        .cli_stdin(
            &[
                "--json",
                "publish",
                "-",
                "ws:in/piped.bin",
                "--parallel",
                "1",
            ],
            &data,
        )
        .assert_ok()
        .json();
    assert_artifact(&published, &data, 2, "stdin publish");
    assert_artifact(&stat(&d, "ws:in/piped.bin"), &data, 2, "stat");

    let dest = dir.path().join("piped.bin");
    let dest_s = dest.to_str().unwrap();
    d.cli(&["restore", "ws:in/piped.bin", dest_s, "--parallel", "2"])
        .assert_ok();
    assert_same_bytes(
        &std::fs::read(&dest).unwrap(),
        &data,
        "restore of stdin publish",
    );
}

// ---------------------------------------------------------------------------------------------
// Local file safety of restore and publish (issue 7, items 10, 12 and 17)
// ---------------------------------------------------------------------------------------------

/// Publishes `data` as `target` from a file in `dir`.
#[track_caller]
fn publish_bytes(d: &Daemon, dir: &Path, target: &str, data: &[u8]) -> Value {
    let src = dir.join("src.bin");
    std::fs::write(&src, data).unwrap();
    publish(d, &src, target)
}

#[test]
fn restore_never_follows_or_trusts_a_partial_file_planted_by_someone_else() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(50, BLOCK + 100);
    publish_bytes(&d, dir.path(), "ws:a.bin", &data);
    let dest = dir.path().join("a.bin");
    let dest_s = dest.to_str().unwrap();

    // A link at DEST.partial to a file the user can write.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, partial_of(&dest)).unwrap();
    let out = d.cli(&["restore", "ws:a.bin", dest_s]);
    out.assert_fails_with("Local");
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"precious",
        "link followed"
    );
    assert!(!dest.exists());

    // A partial file that others may write cannot be trusted as a resume point.
    std::fs::remove_file(partial_of(&dest)).unwrap();
    std::fs::write(partial_of(&dest), vec![0u8; data.len()]).unwrap();
    std::fs::set_permissions(partial_of(&dest), std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = d.cli(&["restore", "ws:a.bin", dest_s]);
    out.assert_fails_with("Local");
    assert!(
        out.stderr.contains("writable by other users"),
        "{}",
        out.stderr
    );
    assert!(!dest.exists());

    // Without the planted file the restore creates a private partial and completes.
    std::fs::remove_file(partial_of(&dest)).unwrap();
    restore(&d, "ws:a.bin", &dest);
    assert_same_bytes(&std::fs::read(&dest).unwrap(), &data, "restore");
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the restored file was created private");
}

#[test]
fn restore_to_a_destination_it_cannot_replace_fails_before_downloading_and_leaves_no_partial() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    publish_bytes(
        &d,
        dir.path(),
        "ws:a.bin",
        &pseudo_random_bytes(51, BLOCK + 1),
    );
    let into_dir = dir.path().join("existing-dir");
    std::fs::create_dir(&into_dir).unwrap();
    let no_parent = dir.path().join("missing").join("a.bin");
    for dest in [&into_dir, &no_parent] {
        let out = d.cli(&["restore", "ws:a.bin", dest.to_str().unwrap()]);
        assert_eq!(out.status, 2, "{}: {}", dest.display(), out.stderr);
        assert!(!partial_of(dest).exists(), "{}", dest.display());
    }
    let out = d.cli(&["restore", "ws:a.bin", into_dir.to_str().unwrap()]);
    assert!(out.stderr.contains("is a directory"), "{}", out.stderr);
    assert!(
        files_under(&into_dir).is_empty(),
        "the directory is untouched"
    );
    // `get` to a file goes the same way.
    let out = d.cli(&["get", "ws:a.bin", into_dir.to_str().unwrap()]);
    assert_eq!(out.status, 2, "{}", out.stderr);
}

/// A revision the shard no longer serves stands for one retired by an overwrite after the
/// restore fetched its manifest (and whose blocks were collected since): the server answers
/// `NotFound` for the revision, and the client must say what happened.
#[test]
fn a_restore_whose_revision_is_gone_fails_saying_the_artifact_was_replaced() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    publish_bytes(&d, dir.path(), "ws:a.bin", &pseudo_random_bytes(52, 1000));
    let dest = dir.path().join("a.bin");
    let err = sdk(async {
        let client = d.sdk().await;
        let mut m = client.manifest("ws", "a.bin").await.unwrap();
        m.revision += 1_000_000;
        client
            .restore_manifest("ws", "a.bin", m, &dest, 1, None)
            .await
            .expect_err("a revision that is gone cannot be restored")
    });
    assert!(err.is("NotFound"), "{err:?}");
    assert!(err.message.contains("replaced"), "{err:?}");
    assert!(!dest.exists());
}

#[test]
fn the_stdin_spool_file_is_private_and_removed_on_ctrl_c() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Stdio;
    let d = Daemon::start(&[]);
    let spool_dir = tempfile::tempdir().unwrap();
    let mut child = d
        .cli_command(&["publish", "-", "ws:piped.bin", "--quiet"])
        .env("TMPDIR", spool_dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nokv");
    // Stdin stays open: the CLI is still spooling when it is interrupted.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&[7u8; 64 * 1024]).unwrap();
    stdin.flush().unwrap();

    // The spool file's appearance is the signal that the CLI is spooling.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let spool = loop {
        if let Some(f) = files_under(spool_dir.path()).into_iter().next() {
            break f;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no spool file appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let mode = std::fs::metadata(&spool).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the spool file is private");

    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        files_under(spool_dir.path()).is_empty(),
        "the spool file was left behind"
    );
    d.cli(&["stat", "ws:piped.bin"])
        .assert_fails_with("NotFound");
}

#[test]
fn a_commit_whose_declared_sha256_is_wrong_answers_digest_mismatch_and_publishes_nothing() {
    use nokv_proto::v1 as pb;
    let d = Daemon::start(&[]);
    let body = pseudo_random_bytes(12, BLOCK + 100);
    let mut wrong = body.clone();
    *wrong.last_mut().unwrap() ^= 1;
    let status = sdk(async {
        let client = d.sdk().await;
        let up = put_raw_blocks(&client, "lie.bin", &body, BlockChecksums::of).await;
        let mut ws = client.workspace_client();
        // Every block is what it claims; the whole-file digest is that of other bytes.
        ws.commit_upload(pb::CommitUploadRequest {
            upload_id: up.upload_id.clone(),
            upload_token: up.upload_token.clone(),
            sha256: Sha256::digest(&wrong).to_vec(),
            request_id: "commit-lie".into(),
        })
        .await
        .unwrap_err()
    });
    let reason = status
        .metadata()
        .get("nokv-reason")
        .and_then(|v| v.to_str().ok());
    assert_eq!(reason, Some("DigestMismatch"), "{status:?}");
    let out = d.cli(&["--json", "stat", "ws:lie.bin"]);
    out.assert_fails_with("NotFound");
}

/// Blocks declared with a sha256 only, as clients before CRC-32C sent them: the daemon still
/// takes them and records the sha256, `nokv restore` (which now expects CRC-32C blocks) checks
/// that sha256 block by block, and a damaged one is still refused by name.
#[test]
fn an_artifact_published_with_sha256_blocks_restores_and_its_blocks_are_still_checked() {
    use nokv_proto::v1 as pb;
    let d = Daemon::start(&[]);
    let body = pseudo_random_bytes(21, 2 * BLOCK + 7);
    sdk(async {
        let client = d.sdk().await;
        let sha256_only = |b: &[u8]| BlockChecksums {
            sha256: Sha256::digest(b).to_vec(),
            crc32c: None,
        };
        let up = put_raw_blocks(&client, "old.bin", &body, sha256_only).await;
        let mut ws = client.workspace_client();
        ws.commit_upload(pb::CommitUploadRequest {
            upload_id: up.upload_id.clone(),
            upload_token: up.upload_token.clone(),
            sha256: Sha256::digest(&body).to_vec(),
            request_id: "commit-old".into(),
        })
        .await
        .unwrap();
        let m = ws
            .get_manifest(pb::GetManifestRequest {
                workspace: "ws".into(),
                path: "old.bin".into(),
            })
            .await
            .unwrap()
            .into_inner();
        for (b, want) in m.blocks.iter().zip(body.chunks(BLOCK)) {
            assert_eq!(b.sha256, Sha256::digest(want).to_vec());
            assert_eq!(b.crc32c, None, "no CRC-32C was declared, none is recorded");
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("old.bin");
    let dest_s = dest.to_str().unwrap();
    d.cli(&["restore", "ws:old.bin", dest_s]).assert_ok();
    assert_same_bytes(
        &std::fs::read(&dest).unwrap(),
        &body,
        "restore of sha256 blocks",
    );

    corrupt_block(&d, 1);
    let again = dir.path().join("again.bin");
    let out = d.cli(&["restore", "ws:old.bin", again.to_str().unwrap()]);
    out.assert_fails_with("DigestMismatch");
    assert!(
        out.stderr.contains("block 1"),
        "names the block: {}",
        out.stderr
    );
    assert!(!again.exists(), "no DEST after a refused restore");
}

/// Begins an upload of `body` as `ws:path` and puts every block over raw gRPC, each declaring
/// `checksums(block)`: what a client other than this SDK (an older one, a lying one) sends.
async fn put_raw_blocks(
    client: &nokv_client::Client,
    path: &str,
    body: &[u8],
    checksums: impl Fn(&[u8]) -> BlockChecksums,
) -> nokv_proto::v1::BeginUploadResponse {
    use nokv_proto::v1 as pb;
    let mut ws = client.workspace_client();
    let up = ws
        .begin_upload(pb::BeginUploadRequest {
            workspace: "ws".into(),
            path: path.into(),
            size: body.len() as u64,
            request_id: format!("begin-{path}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for (i, b) in body.chunks(BLOCK).enumerate() {
        let declared = checksums(b);
        ws.put_block(pb::PutBlockRequest {
            upload_id: up.upload_id.clone(),
            upload_token: up.upload_token.clone(),
            index: i as u32,
            block_sha256: declared.sha256,
            block_crc32c: declared.crc32c,
            data: b.to_vec().into(),
            request_id: format!("put-{path}-{i}"),
        })
        .await
        .unwrap();
    }
    up
}
