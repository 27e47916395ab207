//! Start-up safety and storage faults of a data directory, through the real `nokv-server`
//! and `nokv` binaries: one daemon per directory, shard files that must exist and be whole,
//! a damaged TLS key, and stored bodies that no longer match their digest.

use std::path::{Path, PathBuf};

use nokv_tests::{Daemon, files_under};

/// A stopped data dir with one small file written through the CLI.
fn stopped_data_dir_with(target: &str, body: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    d.cli_stdin(&["put", target], body).assert_ok();
    assert!(d.terminate().success());
    dir
}

/// The node file: every shard's tables.
fn node_file(dir: &Path) -> PathBuf {
    dir.join("shards").join("node.redb")
}

/// Asserts a refused start: non-zero exit, never listening, no panic, and a stderr line that
/// names `file` and says to restore it.
#[track_caller]
fn assert_refused_naming(dir: &Path, file: &Path) {
    let (status, stdout, stderr) = Daemon::start_refused_in(dir, &[]);
    assert!(!status.success(), "exit status {status}\nstderr: {stderr}");
    assert!(!stdout.contains("listening"), "stdout: {stdout}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    let named = stderr
        .lines()
        .filter(|l| l.contains(&file.display().to_string()))
        .collect::<Vec<_>>();
    assert_eq!(
        named.len(),
        1,
        "one line names {}\nstderr: {stderr}",
        file.display()
    );
    assert!(
        named[0].contains("restore"),
        "says what to do: {}",
        named[0]
    );
}

#[test]
fn start_up_refuses_a_missing_or_empty_node_file_by_name_and_never_recreates_it() {
    let dir = stopped_data_dir_with("w1:kept.txt", b"must not be lost");
    let d = dir.path();
    let file = node_file(d);
    let backup = tempfile::tempdir().unwrap().keep().join("node.redb");
    std::fs::copy(&file, &backup).unwrap();

    // Emptied file: refused, and left empty (not reinitialised).
    std::fs::write(&file, b"").unwrap();
    assert_refused_naming(d, &file);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0);

    // Removed file: refused, and not created.
    std::fs::remove_file(&file).unwrap();
    assert_refused_naming(d, &file);
    assert!(!file.exists(), "a missing node file is never recreated");

    // Restored from the backup, the directory serves its data again.
    std::fs::copy(&backup, &file).unwrap();
    let daemon = Daemon::start_in(d, &[]);
    let out = daemon.cli(&["get", "w1:kept.txt"]);
    assert_eq!(out.assert_ok().stdout, b"must not be lost");
}

#[test]
fn an_empty_per_shard_file_beside_the_node_file_is_refused_by_name_and_never_deleted() {
    let dir = stopped_data_dir_with("w1:kept.txt", b"must not be lost");
    let d = dir.path();
    // The layout before the node file had one file per shard; an emptied one of those
    // names must stop start-up rather than vanish.
    let planted = d.join("shards").join("0000.redb");
    std::fs::write(&planted, b"").unwrap();
    assert_refused_naming(d, &planted);
    assert_eq!(
        std::fs::metadata(&planted).map(|m| m.len()).ok(),
        Some(0),
        "the file is left as it was"
    );

    std::fs::remove_file(&planted).unwrap();
    let daemon = Daemon::start_in(d, &[]);
    let out = daemon.cli(&["get", "w1:kept.txt"]);
    assert_eq!(out.assert_ok().stdout, b"must not be lost");
}

/// A way to damage a file's bytes.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

#[test]
fn a_corrupt_node_file_stops_start_up_with_one_line_naming_it_and_no_panic() {
    let dir = stopped_data_dir_with("w1:a", b"x");
    let d = dir.path();
    let file = node_file(d);
    let pristine = std::fs::read(&file).unwrap();
    let damages: [(&str, Damage); 3] = [
        // Inside the file (the head of every b-tree page after the header, so start-up
        // reads at least one damaged page whatever the table layout): redb reaches
        // `unreachable!` or reports corruption.
        (
            "corrupt pages",
            Box::new(|b| {
                for page in (8192..b.len().saturating_sub(64)).step_by(4096) {
                    b[page..page + 64].fill(0xff);
                }
            }),
        ),
        ("truncated", Box::new(|b| b.truncate(b.len() / 2 + 100))),
        ("garbage", Box::new(|b| b.fill(b'?'))),
    ];
    for (what, damage) in damages {
        let mut bytes = pristine.clone();
        damage(&mut bytes);
        std::fs::write(&file, &bytes).unwrap();
        eprintln!("case: {what}");
        assert_refused_naming(d, &file);
    }
}

#[test]
fn a_small_file_whose_stored_body_was_damaged_reads_as_data_corrupted_not_wrong_bytes() {
    let body: Vec<u8> = (0..600u32)
        .flat_map(|i| format!("probe-{i:05};").into_bytes())
        .collect();
    let dir = stopped_data_dir_with("w1:doc.txt", &body);
    let d = dir.path();
    // Flip one byte in every stored copy of the body (the daemon is stopped).
    let needle = &body[..64];
    let mut flipped = 0;
    for file in files_under(&d.join("shards")) {
        let mut bytes = std::fs::read(&file).unwrap();
        let hits: Vec<usize> = bytes
            .windows(needle.len())
            .enumerate()
            .filter(|(_, w)| *w == needle)
            .map(|(i, _)| i)
            .collect();
        for at in &hits {
            bytes[at + 10] ^= 0x01;
        }
        if !hits.is_empty() {
            std::fs::write(&file, &bytes).unwrap();
            flipped += hits.len();
        }
    }
    assert!(flipped > 0, "the body is stored inline in the node file");

    let daemon = Daemon::start_in(d, &[]);
    daemon.cli(&["stat", "w1:doc.txt"]).assert_ok();
    daemon
        .cli(&["get", "w1:doc.txt"])
        .assert_fails_with("DataCorrupted");
}

/// Every file of a data dir except the shard stores and their redo log (the running daemon's
/// maintenance may commit to those) and the provider's objects, with its content.
fn data_dir_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            !p.starts_with(dir.join("objects"))
                && p.extension().is_none_or(|e| e != "redb" && e != "redo")
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

#[test]
fn a_second_start_on_a_running_data_dir_is_refused_before_it_writes_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_in(dir.path(), &[]);
    d.cli_stdin(&["put", "w1:a"], b"x").assert_ok();
    let before = data_dir_files(dir.path());

    let (status, stdout, stderr) = Daemon::start_refused_in(dir.path(), &[]);
    assert!(!status.success(), "{status}");
    assert!(!stdout.contains("listening"), "{stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    let canonical = std::fs::canonicalize(dir.path()).unwrap();
    assert!(
        lines[0].contains(&canonical.display().to_string()) && lines[0].contains("in use"),
        "{stderr}"
    );

    assert_eq!(data_dir_files(dir.path()), before, "no file was rewritten");
    // The CLI still reaches the running daemon through its unchanged client.toml.
    d.cli(&["get", "w1:a"]).assert_ok();
}

#[test]
fn a_garbage_server_key_fails_start_up_before_the_banner_naming_the_key_file() {
    let dir = stopped_data_dir_with("w1:a", b"x");
    let key = dir.path().join("tls").join("server.key");
    let garbage = b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n".to_vec();
    // A well-formed key that does not belong to the certificate: the CA's.
    let foreign = std::fs::read(dir.path().join("tls").join("ca.key")).unwrap();
    for (what, bytes) in [("garbage", garbage), ("foreign key", foreign)] {
        std::fs::write(&key, bytes).unwrap();
        let (status, stdout, stderr) = Daemon::start_refused_in(dir.path(), &[]);
        assert!(!status.success(), "{what}: {status}");
        assert!(!stdout.contains("listening"), "{what}: {stdout}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 1, "{what}: one line: {stderr}");
        assert!(
            lines[0].contains(&key.display().to_string()),
            "{what}: {stderr}"
        );
    }
}

/// A small tmpfs mounted for one test; unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// `None` (with the reason printed) when this environment does not permit mounting.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                eprintln!("skipped: cannot mount a tmpfs here: {}", why.trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_shard_recovers_by_itself_after_disk_full() {
    let Some(fs) = Tmpfs::mount("20m") else {
        return;
    };
    // Ballast to free later: what an operator does once the disk filled up.
    let ballast = fs.0.path().join("ballast");
    std::fs::write(&ballast, vec![0u8; 4 << 20]).unwrap();
    let data = fs.0.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let d = Daemon::start_in(&data, &[]);

    let body = nokv_tests::pseudo_random_bytes(7, 200_000);
    let mut written = Vec::new();
    let full = (0..200)
        .map(|i| {
            (
                format!("w1:f{i}"),
                d.cli_stdin(&["put", &format!("w1:f{i}")], &body),
            )
        })
        .find_map(|(target, out)| match out.status {
            0 => {
                written.push(target);
                None
            }
            _ => Some(out),
        })
        .expect("the disk fills up");
    // The failed write is retryable, not an Internal error.
    full.assert_fails_with("Unavailable");
    assert!(!written.is_empty());

    std::fs::remove_file(&ballast).unwrap();
    // No restart: the same daemon takes writes again and kept every acknowledged one. Nothing
    // tells it that space came back: its store reopens on its next attempt (a capped back-off,
    // and reopening replays the redo log, which needs space), so the client does what the
    // error tells it — retries the same request until the answer is no longer Unavailable.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let args = ["put", "--request-id", "after-disk-full", "w1:after"];
    loop {
        let out = d.cli_stdin(&args, &body);
        if out.status == 0 || std::time::Instant::now() > deadline {
            out.assert_ok();
            break;
        }
        out.assert_fails_with("Unavailable");
    }
    for target in written.iter().chain([&"w1:after".to_string()]) {
        assert_eq!(d.cli(&["get", target]).assert_ok().stdout, body, "{target}");
    }
    let h = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    assert_eq!(h["status"], "SERVING", "{h}");
    let errors: Vec<String> = d
        .stderr()
        .lines()
        .filter(|l| l.contains("ERROR"))
        .map(String::from)
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "the outage is logged at ERROR once: {errors:#?}"
    );
    assert!(errors[0].contains("metadata store failed"), "{}", errors[0]);
}

/// A supervisor (or a test) may send SIGTERM the moment the daemon prints that it listens;
/// the daemon must then stop gracefully (exit 0), not die of the signal's default action
/// because its handler was only installed when the server first polled for it.
#[test]
fn a_daemon_told_to_stop_the_moment_it_listens_stops_gracefully() {
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start_in(dir.path(), &[]);
        let (status, _, stderr) = d.terminate_collecting_output();
        assert!(status.success(), "{status}\nstderr: {stderr}");
    }
}
