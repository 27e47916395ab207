//! The CLI teaches itself (issue 47, section 2), through the real `nokv` and `nokv-server`:
//! every subcommand's `--help` describes its arguments, sets the connection options apart and
//! ends with examples; `ls` and `find` take a bare workspace; `ls` prints a header; `stat`
//! explains generation and revision; quotas take units and warn below usage; `get` keeps
//! binary bytes off a terminal; `restore` never replaces a file unasked; counts of one are
//! singular; health names unknown guards once; and a daemon that cannot bind its port leaves
//! no fresh data dir (with its secrets) behind.

use std::path::Path;
use std::process::{Command, Stdio};

use nokv_tests::{CliOutput, Daemon, bin, pseudo_random_bytes};
use serde_json::Value;

/// `nokv ARGS --help` (no daemon, no configuration needed): its stdout.
fn help(args: &[&str]) -> String {
    let out = Command::new(bin("nokv"))
        .args(args)
        .arg("--help")
        .env_remove("NOKV_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run nokv --help");
    assert!(
        out.status.success(),
        "nokv {} --help: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The lines of section `heading` (e.g. "Commands:") of a help text, up to the blank line
/// that ends it.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// Every subcommand path below `path` (depth first), from the "Commands:" sections of the
/// help texts; clap's own `help` command is not one of ours.
fn subcommands(path: Vec<String>, found: &mut Vec<Vec<String>>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    for line in section(&help(&args), "Commands:") {
        let name = line.split_whitespace().next().expect("command name");
        if name == "help" {
            continue;
        }
        let mut sub = path.clone();
        sub.push(name.to_string());
        found.push(sub.clone());
        subcommands(sub, found);
    }
}

#[test]
fn every_subcommand_help_describes_its_arguments_sets_the_connection_options_apart_and_ends_with_examples()
 {
    let mut all = Vec::new();
    subcommands(Vec::new(), &mut all);
    let names: Vec<String> = all.iter().map(|p| p.join(" ")).collect();
    for expected in [
        "put",
        "ls",
        "restore",
        "admin quota set",
        "bench session",
        "mcp",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    for path in &all {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let name = path.join(" ");
        let text = help(&args);

        // Each argument line names the argument and says what it is.
        let arguments = section(&text, "Arguments:");
        for (i, line) in arguments.iter().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix(['<', '[']) else {
                continue; // a continuation line of the previous argument's description
            };
            let close = rest.find(['>', ']']).expect("closing bracket");
            let described = !rest[close + 1..].trim().is_empty()
                || arguments
                    .get(i + 1)
                    .is_some_and(|next| !next.trim_start().starts_with(['<', '[']));
            assert!(
                described,
                "nokv {name}: undescribed argument {line:?}\n{text}"
            );
        }
        for target in ["<TARGET>", "[TARGET]"] {
            if let Some(line) = arguments.iter().find(|l| l.contains(target)) {
                assert!(line.contains("WS:PATH"), "nokv {name}: {line}");
            }
        }

        // The connection flags every command takes are grouped apart from its own options.
        let connection = section(&text, "Connection options:");
        assert!(
            connection.iter().any(|l| l.contains("--endpoint")),
            "nokv {name}: no Connection options section\n{text}"
        );
        assert!(
            !section(&text, "Options:")
                .iter()
                .any(|l| l.contains("--endpoint")),
            "nokv {name}: --endpoint among the command's own options\n{text}"
        );

        // It ends with examples of itself.
        let (_, examples) = text
            .trim_end()
            .rsplit_once("Examples:\n")
            .unwrap_or_else(|| panic!("nokv {name}: no Examples:\n{text}"));
        let examples: Vec<&str> = examples.lines().collect();
        assert!(
            !examples.is_empty()
                && examples.len() <= 3
                && examples
                    .iter()
                    .all(|l| l.starts_with("  ") && l.contains("nokv ")),
            "nokv {name}: the help does not end with one or two example commands\n{text}"
        );
        assert!(
            examples.iter().any(|l| l.contains(&format!("nokv {name}"))
                || l.contains(&format!("nokv --json {name}"))),
            "nokv {name}: no example runs the command itself: {examples:?}"
        );
    }
}

#[test]
fn ls_and_find_take_a_bare_workspace_as_its_root_and_ls_prints_a_header_in_human_output_only() {
    let d = Daemon::start(&[]);
    for (path, body) in [("notes/a.md", "a"), ("b.txt", "bb")] {
        d.cli_stdin(&["put", &format!("demo:{path}")], body.as_bytes())
            .assert_ok();
    }
    let human = d.cli(&["ls", "demo"]).assert_ok().stdout_str();
    let mut lines = human.lines();
    let header = lines.next().unwrap_or_default();
    for column in ["KIND", "SIZE", "GENERATION", "MODIFIED", "PATH"] {
        assert!(header.contains(column), "header {header:?}\n{human}");
    }
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{human}");
    assert!(
        rows[0].ends_with("b.txt") && rows[0].starts_with("file"),
        "{human}"
    );
    assert!(rows[1].ends_with("notes/a.md"), "{human}");

    // The same listing as `demo:`; JSON has no header, only entries.
    let paths = |doc: &Value| -> Vec<String> {
        doc["entries"]
            .as_array()
            .unwrap_or_else(|| panic!("{doc}"))
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect()
    };
    let bare = d.cli(&["--json", "ls", "demo"]).assert_ok().json();
    let colon = d.cli(&["--json", "ls", "demo:"]).assert_ok().json();
    assert_eq!(paths(&bare), ["b.txt", "notes/a.md"]);
    assert_eq!(bare, colon);
    let prefixed = d.cli(&["--json", "ls", "demo:notes/"]).assert_ok().json();
    assert_eq!(paths(&prefixed), ["notes/a.md"]);

    // find: a bare workspace (or `WS:`) is every path, as grep's scope is.
    for scope in ["demo", "demo:"] {
        let found = d.cli(&["find", scope]).assert_ok().stdout_str();
        assert_eq!(found.lines().collect::<Vec<_>>(), ["b.txt", "notes/a.md"]);
    }
    let found = d.cli(&["--json", "find", "demo"]).assert_ok().json();
    assert_eq!(paths(&found), ["b.txt", "notes/a.md"]);
    let grep = d.cli(&["grep", "a", "demo"]).assert_ok().stdout_str();
    assert!(grep.contains("notes/a.md:1:a"), "{grep}");

    // An empty workspace name is still a usage error.
    assert_eq!(d.cli(&["ls", ""]).status, 2);
    assert_eq!(d.cli(&["find", ":x"]).status, 2);
}

#[test]
fn stat_explains_generation_and_revision_in_human_output_and_json_keeps_plain_fields() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    d.cli_stdin(&["put", "demo:f.txt"], b"hi").assert_ok();
    let text = d.cli(&["stat", "demo:f.txt"]).assert_ok().stdout_str();
    let generation = text
        .lines()
        .find(|l| l.trim_start().starts_with("generation"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(generation.contains("--if-generation"), "{generation}");
    assert!(!text.contains("revision"), "a file has no revision: {text}");

    let src = dir.path().join("a.bin");
    std::fs::write(&src, b"artifact").unwrap();
    d.cli(&["publish", "-q", src.to_str().unwrap(), "demo:a.bin"])
        .assert_ok();
    let text = d.cli(&["stat", "demo:a.bin"]).assert_ok().stdout_str();
    let revision = text
        .lines()
        .find(|l| l.trim_start().starts_with("revision"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(revision.contains("nothing to pass back"), "{revision}");

    let doc = d.cli(&["--json", "stat", "demo:a.bin"]).assert_ok().json();
    assert!(
        doc["generation"].is_u64() && doc["revision"].is_u64(),
        "{doc}"
    );
}

#[test]
fn quota_set_takes_the_servers_size_units_and_warns_when_the_quota_is_already_below_usage() {
    let d = Daemon::start(&[]);
    let set = |size: &str| d.cli(&["--json", "admin", "quota", "set", "demo", size]);
    let ten_gib = set("10GiB");
    assert_eq!(ten_gib.assert_ok().json()["quota"], 10u64 << 30);
    assert!(ten_gib.stderr.is_empty(), "{}", ten_gib.stderr);
    assert_eq!(set("512k").assert_ok().json()["quota"], 512u64 << 10);

    d.cli_stdin(&["put", "demo:f.bin"], &[7u8; 100]).assert_ok();
    let below = set("10");
    assert_eq!(below.assert_ok().json()["quota"], 10, "set all the same");
    assert!(
        below.stderr.starts_with("nokv: warning: ")
            && below.stderr.contains("below")
            && below.stderr.contains("QuotaExceeded"),
        "{}",
        below.stderr
    );
    let above = set("1KiB");
    assert!(above.assert_ok().stderr.is_empty(), "{}", above.stderr);

    for bad in ["10MB", "1.5GiB", "lots"] {
        let out = set(bad);
        assert_eq!(out.status, 2, "{bad}: {}", out.stderr);
        assert!(
            out.stderr.contains("GiB"),
            "says which units: {}",
            out.stderr
        );
    }
    let get = d.cli(&["--json", "admin", "quota", "get", "demo"]);
    assert_eq!(
        get.assert_ok().json()["quota"],
        1024,
        "bad sizes changed nothing"
    );
}

/// `nokv ARGS` with stdout on a pseudo-terminal (util-linux `script`), against `d`. Returns
/// the exit status and everything the terminal showed (stdout and stderr together).
fn on_terminal(d: &Daemon, args: &[&str]) -> (i32, String) {
    let script = ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("util-linux `script` is needed to give nokv a terminal");
    let command = std::iter::once(bin("nokv").display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(script)
        .args(["-qec", &command, "/dev/null"])
        .env("NOKV_CONFIG", d.client_config())
        .env_remove("NOKV_ENDPOINT")
        .env_remove("NOKV_CA")
        .env_remove("NOKV_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run script");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn get_keeps_binary_bytes_off_a_terminal_unless_forced_and_never_checks_a_pipe() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let binary = [0x7f, b'E', b'L', b'F', 0xff, 0xfe, 0, 1];
    d.cli_stdin(&["put", "demo:bin.dat"], &binary).assert_ok();
    d.cli_stdin(&["put", "demo:text.md"], "grüße\n".as_bytes())
        .assert_ok();
    let src = dir.path().join("big.bin");
    std::fs::write(&src, pseudo_random_bytes(47, 300_000)).unwrap();
    d.cli(&["publish", "-q", src.to_str().unwrap(), "demo:big.bin"])
        .assert_ok();

    // A pipe gets the bytes as they are.
    assert_eq!(d.cli(&["get", "demo:bin.dat"]).assert_ok().stdout, binary);

    for target in ["demo:bin.dat", "demo:big.bin"] {
        let (status, shown) = on_terminal(&d, &["get", target]);
        assert_eq!(status, 2, "{target}: {shown}");
        assert!(
            shown.contains("not UTF-8") && shown.contains("--force"),
            "{target}: {shown}"
        );
        assert!(
            !shown.contains('\u{fffd}'),
            "{target}: nothing binary shown"
        );
        let (status, shown) = on_terminal(&d, &["get", target, "--force"]);
        assert_eq!(status, 0, "{target} --force: {shown}");
    }
    let (status, shown) = on_terminal(&d, &["get", "demo:text.md"]);
    assert_eq!(status, 0, "{shown}");
    assert!(shown.contains("grüße"), "{shown}");
}

#[test]
fn restore_refuses_an_existing_dest_unless_force_and_no_clobber_leaves_it_and_succeeds() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random_bytes(48, 1000);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    d.cli(&["publish", "-q", src.to_str().unwrap(), "demo:a.bin"])
        .assert_ok();
    let dest = dir.path().join("a.bin");
    let dest_s = dest.to_str().unwrap();
    let restore = |extra: &[&str]| -> CliOutput {
        let mut args = vec!["restore", "-q", "demo:a.bin", dest_s];
        args.extend(extra);
        d.cli(&args)
    };

    // A new DEST is written without any flag.
    restore(&[]).assert_ok();
    assert!(std::fs::read(&dest).unwrap() == data);

    std::fs::write(&dest, b"mine").unwrap();
    let refused = restore(&[]);
    assert_eq!(refused.status, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains(dest_s) && refused.stderr.contains("--force"),
        "{}",
        refused.stderr
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");

    let skipped = d.cli(&["--json", "restore", "demo:a.bin", dest_s, "--no-clobber"]);
    assert_eq!(skipped.assert_ok().json()["skipped"], true);
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");
    let text = restore(&["--no-clobber"]).assert_ok().stdout_str();
    assert!(text.contains("--no-clobber"), "{text}");

    assert_eq!(restore(&["--force", "--no-clobber"]).status, 2);
    restore(&["--force"]).assert_ok();
    assert!(std::fs::read(&dest).unwrap() == data, "replaced");
}

// Catches: `restore WS:PATH -` taken as a file named `-` in the working directory (and the
// summary line going to a pipe that expected the bytes).
#[test]
fn restore_to_dash_is_a_usage_error_naming_get_and_writes_no_file() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "demo:a.bin"], &[7u8; 300 * 1024])
        .assert_ok();
    let cwd = tempfile::tempdir().unwrap();
    let out = d
        .cli_command(&["restore", "demo:a.bin", "-"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("nokv get demo:a.bin -"), "{stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(
        std::fs::read_dir(cwd.path()).unwrap().count(),
        0,
        "no file written"
    );
    // What the error points at does stream the artifact.
    let got = d.cli(&["get", "demo:a.bin", "-"]);
    got.assert_ok();
    assert!(got.stdout == vec![7u8; 300 * 1024]);
}

#[test]
fn counts_of_one_read_in_the_singular() {
    let d = Daemon::start(&["--shards", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("one.bin");
    std::fs::write(&src, b"one block").unwrap();
    let published = d
        .cli(&["publish", "-q", src.to_str().unwrap(), "demo:one.bin"])
        .assert_ok()
        .stdout_str();
    assert!(published.contains("1 block,"), "{published}");
    let dest = dir.path().join("out.bin");
    let restored = d
        .cli(&["restore", "-q", "demo:one.bin", dest.to_str().unwrap()])
        .assert_ok()
        .stdout_str();
    assert!(restored.contains("1 block verified"), "{restored}");
    let health = d.cli(&["admin", "health"]).assert_ok().stdout_str();
    assert!(
        health.contains("1 shard ·") && health.contains("1 entry ·"),
        "{health}"
    );
    for text in [&published, &restored, &health] {
        for wrong in ["1 blocks", "1 shards", "1 entries"] {
            assert!(!text.contains(wrong), "{wrong}: {text}");
        }
    }
}

#[test]
fn health_json_names_unknown_guards_once_as_guards_unknown() {
    let d = Daemon::start(&["--shards", "2"]);
    let doc = d.cli(&["--json", "admin", "health"]).assert_ok().json();
    assert_eq!(doc["guards_unknown"], 0, "{doc}");
    assert!(doc.get("unknown_guards").is_none(), "{doc}");
    for shard in doc["shards"].as_array().expect("shards") {
        assert!(shard["guards_unknown"].is_u64(), "{shard}");
        assert!(shard.get("unknown_guards").is_none(), "{shard}");
    }
}

#[test]
fn a_daemon_that_cannot_bind_its_ports_leaves_no_fresh_data_dir_or_secret_behind() {
    let root = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();

    // The API port: refused before the daemon serves; the directory it created is gone.
    let fresh = root.path().join("fresh");
    let (status, _stdout, stderr) = Daemon::start_refused_in(&fresh, &["--listen", &addr]);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains(&addr), "names the address: {stderr}");
    assert!(!fresh.exists(), "the fresh data dir was left behind");

    // An existing empty directory (a mounted volume) stays, empty.
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (status, _, stderr) = Daemon::start_refused_in(&empty, &["--listen", &addr]);
    assert!(!status.success(), "{stderr}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "emptied");

    // The metrics port is bound after the shards are opened: they go too.
    let late = root.path().join("late");
    let (status, _, stderr) = Daemon::start_refused_in(&late, &["--metrics-listen", &addr]);
    assert!(!status.success(), "{stderr}");
    assert!(!late.exists(), "the fresh data dir was left behind");

    // A data dir that was in use is never touched by a failed start.
    let used = root.path().join("used");
    Daemon::start_in(&used, &[]).terminate();
    let before: Vec<_> = std::fs::read_dir(&used).unwrap().collect();
    let (status, _, stderr) = Daemon::start_refused_in(&used, &["--listen", &addr]);
    assert!(!status.success(), "{stderr}");
    assert!(used.join("tls").join("ca.key").exists(), "{stderr}");
    assert_eq!(std::fs::read_dir(&used).unwrap().count(), before.len());
}

// Catches: a publish that failed in transit leaving the user to guess whether a rerun resumes,
// starts over or publishes twice.
#[test]
fn a_publish_that_fails_in_transit_says_what_running_it_again_does() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, pseudo_random_bytes(5, 1000)).unwrap();
    let src = src.to_str().unwrap();
    // Nothing listens there: the publish fails before any block is sent.
    let nowhere = [("NOKV_ENDPOINT", "https://127.0.0.1:9")];
    let fails_in_transit_saying = |args: &[&str], says: &str| {
        let out = d.cli_with_env(args, &nowhere);
        out.assert_fails_with("Transport");
        assert!(out.stderr.contains(says), "{}", out.stderr);
    };
    fails_in_transit_saying(
        &["publish", "-q", src, "demo:a.bin", "--receipt", "r-7"],
        "run the same command again: it resumes under receipt r-7",
    );
    fails_in_transit_saying(
        &["publish", "-q", src, "demo:a.bin"],
        "--receipt ID`, a rerun resumes instead of starting over",
    );
    // A failure a rerun cannot mend gets no such hint.
    let refused = d.cli(&["publish", "-q", src, "demo:../a.bin", "--receipt", "r-8"]);
    refused.assert_fails_with("InvalidArgument");
    assert!(!refused.stderr.contains("again"), "{}", refused.stderr);
}
