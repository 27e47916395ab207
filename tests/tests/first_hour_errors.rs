//! Issue 47, section 1: the errors a new user meets in the first hour name the cause, the
//! setting and where it came from (a flag, the environment or the config file), and say what
//! to do. Each test runs the real `nokv` (and `nokv-server`) and reads what a user reads: the
//! stderr line and the exit status — or, for `nokv mcp`, the tool error a model reads.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use nokv_tests::{CliOutput, Daemon, bin, cli_with_config, free_port, pseudo_random_bytes};
use serde_json::{Value, json};

/// An endpoint nothing listens on (a port just freed).
fn closed_endpoint() -> String {
    format!("https://127.0.0.1:{}", free_port())
}

/// `nokv ARGS` with only `envs` as connection settings: no `NOKV_*` of the developer's
/// environment, and a `HOME` without `~/.config/nokv/config.toml`.
fn nokv_alone(home: &Path, args: &[&str], envs: &[(&str, &str)]) -> CliOutput {
    let out = Command::new(bin("nokv"))
        .args(args)
        .env_remove("NOKV_CONFIG")
        .env_remove("NOKV_ENDPOINT")
        .env_remove("NOKV_CA")
        .env_remove("NOKV_TOKEN")
        .env("HOME", home)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run nokv");
    CliOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Panics unless the run exited 2 (a usage problem) with one stderr line containing `text`.
#[track_caller]
fn assert_usage_error_saying(out: &CliOutput, text: &str) {
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        out.status == 2 && lines.len() == 1 && lines[0].contains(text),
        "expected exit 2 and one line containing {text:?}; got exit {}\nstderr: {}",
        out.status,
        out.stderr
    );
}

/// Panics unless stderr contains `text`.
#[track_caller]
fn assert_says(out: &CliOutput, text: &str) {
    assert!(
        out.stderr.contains(text),
        "expected stderr to contain {text:?}\nstderr: {}",
        out.stderr
    );
}

/// Writes a config file `name` in `dir` with `body`; returns its path.
fn config_file(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// A daemon that accepts connections and answers nothing (a stopped process; a partition
/// looks the same) fails the call with the cause once the retries are spent, instead of
/// hanging it: the kernel completes the TCP handshake for the stopped process, so only a
/// connect timeout that covers the TLS handshake too can end the wait.
#[test]
fn a_call_to_a_daemon_that_answers_nothing_fails_naming_the_cause_instead_of_hanging() {
    let d = Daemon::start(&[]);
    d.cli_stdin(&["put", "ws:a.txt"], b"x").assert_ok();
    d.signal("STOP");
    // Bounded by the harness's command deadline: a hang fails the test instead of the run.
    let out = d.cli(&["stat", "ws:a.txt"]);
    d.signal("CONT");
    out.assert_fails_with("Transport");
    assert_says(&out, "no answer while connecting");
    assert_says(&out, "stopped, overloaded or unreachable");
    // Once it answers again, so does the same call.
    d.cli(&["stat", "ws:a.txt"]).assert_ok();
}

#[test]
fn a_refused_connection_fails_at_once_naming_the_endpoint_and_where_it_came_from() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let closed = closed_endpoint();

    let out = d.cli(&["--endpoint", &closed, "stat", "ws:a.txt"]);
    out.assert_fails_with("Transport");
    assert_says(
        &out,
        &format!("cannot connect to {closed} (connection refused): is nokv-server running?"),
    );
    assert_says(&out, "(endpoint from --endpoint)");

    // Known at once: the refusal is not retried (the retry loop logs every retry at debug).
    let out = d.cli_with_env(
        &["--endpoint", &closed, "stat", "ws:a.txt"],
        &[("NOKV_LOG", "nokv_client=debug")],
    );
    assert_eq!(out.status, 1, "{}", out.stderr);
    assert!(
        !out.stderr.contains("retrying with the same request id"),
        "a refused connection was retried:\n{}",
        out.stderr
    );

    // Nothing was sent, so a mutation's outcome is known: no "outcome is unknown".
    let out = d.cli_stdin(&["--endpoint", &closed, "put", "ws:a.txt"], b"x");
    out.assert_fails_with("Transport");
    assert!(!out.stderr.contains("outcome is unknown"), "{}", out.stderr);

    let out = d.cli_with_env(&["stat", "ws:a.txt"], &[("NOKV_ENDPOINT", &closed)]);
    out.assert_fails_with("Transport");
    assert_says(&out, "(endpoint from NOKV_ENDPOINT)");

    let config = config_file(
        dir.path(),
        "client.toml",
        &format!(
            "endpoint = {closed:?}\nca = {:?}\ntoken = {:?}\n",
            d.ca_path(),
            d.admin_token()
        ),
    );
    let out = cli_with_config(&config, &["stat", "ws:a.txt"], &[], None);
    out.assert_fails_with("Transport");
    assert_says(
        &out,
        &format!("(endpoint from config file {})", config.display()),
    );
}

#[test]
fn a_nokv_config_naming_a_missing_file_names_the_variable_and_exits_2() {
    let home = tempfile::tempdir().unwrap();
    let missing = home.path().join("x.toml");
    let missing = missing.to_str().unwrap();
    let out = nokv_alone(home.path(), &["stat", "ws:a"], &[("NOKV_CONFIG", missing)]);
    assert_usage_error_saying(
        &out,
        &format!("config file (NOKV_CONFIG) {missing}: No such file or directory"),
    );
}

#[test]
fn a_missing_ca_file_is_named_with_the_setting_it_came_from() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("x.pem");
    let missing = missing.to_str().unwrap();

    let out = d.cli(&["--ca", missing, "stat", "ws:a"]);
    assert_usage_error_saying(
        &out,
        &format!("CA file (--ca) {missing}: No such file or directory"),
    );

    let out = d.cli_with_env(&["stat", "ws:a"], &[("NOKV_CA", missing)]);
    assert_usage_error_saying(&out, &format!("CA file (NOKV_CA) {missing}:"));

    let config = config_file(
        dir.path(),
        "client.toml",
        &format!("endpoint = {:?}\nca = {missing:?}\n", d.endpoint()),
    );
    let out = cli_with_config(&config, &["stat", "ws:a"], &[], None);
    assert_usage_error_saying(
        &out,
        &format!("CA file (config file {}) {missing}:", config.display()),
    );
}

#[test]
fn no_configuration_at_all_is_a_usage_error_that_says_how_to_configure() {
    let home = tempfile::tempdir().unwrap();
    let out = nokv_alone(home.path(), &["stat", "ws:a"], &[]);
    assert_usage_error_saying(&out, "no configuration");
    assert_says(&out, "NOKV_CONFIG=DATA_DIR/client.toml");
}

#[test]
fn without_a_token_the_error_says_where_a_token_comes_from_and_how_to_issue_one() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let tokenless = config_file(
        dir.path(),
        "client.toml",
        &format!("endpoint = {:?}\nca = {:?}\n", d.endpoint(), d.ca_path()),
    );
    let out = cli_with_config(&tokenless, &["stat", "ws:a"], &[], None);
    out.assert_fails_with("Unauthenticated");
    for text in [
        "missing bearer token",
        "--token",
        "NOKV_TOKEN",
        "`token = ",
        "nokv-server token issue --data-dir DATA_DIR --workspace WS --role read|write|admin",
    ] {
        assert_says(&out, text);
    }

    // The command the message names is the real one: it issues a token that works.
    let issued = d.token("ws", "read", None);
    cli_with_config(
        &tokenless,
        &["stat", "ws:a"],
        &[("NOKV_TOKEN", &issued)],
        None,
    )
    .assert_fails_with("NotFound");

    // A token that was given but refused is named by its source (never by its value).
    let out = d.cli_with_env(&["stat", "ws:a"], &[("NOKV_TOKEN", "nokv1.00.00")]);
    out.assert_fails_with("Unauthenticated");
    assert_says(&out, "(token from NOKV_TOKEN)");
    assert!(!out.stderr.contains("nokv1.00.00"), "{}", out.stderr);
}

#[test]
fn a_token_for_another_workspace_says_what_it_covers_and_where_it_came_from() {
    let d = Daemon::start(&[]);
    let token = d.token("team-*", "write", None);
    let out = d.cli_with_env(&["stat", "other:a.txt"], &[("NOKV_TOKEN", &token)]);
    out.assert_fails_with("PermissionDenied");
    assert_says(&out, "token is not valid for workspace \"other\"");
    assert_says(&out, "it covers workspace \"team-*\" with role write");
    assert_says(&out, "(token from NOKV_TOKEN)");
    assert!(!out.stderr.contains(&token), "the token was printed");

    let read = d.token("team-a", "read", None);
    let out = d.cli_stdin(&["--token", &read, "put", "team-a:a.txt"], b"x");
    out.assert_fails_with("PermissionDenied");
    assert_says(&out, "it covers workspace \"team-a\" with role read");
    assert_says(&out, "(token from --token)");
}

#[test]
fn ctrl_c_during_restore_exits_130_and_says_the_partial_file_is_kept_for_a_rerun() {
    let d = Daemon::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.bin");
    // 24 blocks of 4 MiB, fetched one at a time: the restore is still running when the
    // partial file appears and the daemon is paused.
    std::fs::write(&src, pseudo_random_bytes(47, 24 * (4 << 20))).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:big.bin", "--quiet"])
        .assert_ok();

    let dest = dir.path().join("out.bin");
    let partial = dir.path().join("out.bin.partial");
    let mut child = d
        .cli_command(&[
            "restore",
            "ws:big.bin",
            dest.to_str().unwrap(),
            "--parallel",
            "1",
            "--quiet",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nokv restore");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !partial.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the restore ended before its partial file was seen"
        );
        assert!(std::time::Instant::now() < deadline, "no partial file");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Paused, the daemon sends nothing more: the restore cannot finish before the signal.
    d.signal("STOP");
    let still_running = child.try_wait().unwrap().is_none();
    let kill = |sig: &str, pid: u32| {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    kill("-INT", child.id());
    let out = child.wait_with_output().unwrap();
    d.signal("CONT");
    assert!(still_running, "the restore finished before it was paused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "nokv: interrupted; partial kept at {}: rerun the same command to resume",
            partial.display()
        )),
        "{stderr}"
    );
    assert!(partial.exists(), "the partial file was removed");
    assert!(!dest.exists());

    // Rerunning resumes and completes.
    d.cli(&["restore", "ws:big.bin", dest.to_str().unwrap(), "--quiet"])
        .assert_ok();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&src).unwrap());
    assert!(!partial.exists());
}

/// A `nokv mcp` session driven over stdio, one JSON-RPC line per message.
struct Mcp {
    child: std::process::Child,
    stdout: BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl Mcp {
    fn start(mut cmd: Command, local_root: &Path) -> Mcp {
        let mut child = cmd
            .args(["mcp", "--local-root", local_root.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nokv mcp");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut mcp = Mcp {
            child,
            stdout,
            next_id: 0,
        };
        mcp.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "first_hour_errors", "version": "0"},
            }),
        );
        mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "nokv mcp closed stdout");
            let v: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// The `{reason, message, hint}` of a tool call that must fail.
    fn tool_error(&mut self, tool: &str, arguments: Value) -> Value {
        let r = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let result = &r["result"];
        assert_eq!(result["isError"], json!(true), "{tool}: {r}");
        result["structuredContent"]["error"].clone()
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn hint(error: &Value) -> String {
    error["hint"].as_str().unwrap_or_default().to_string()
}

#[test]
fn mcp_hints_match_the_call_and_the_failure() {
    const UNKNOWN: &str = "the outcome is unknown";
    let d = Daemon::start(&[]);
    let root = tempfile::tempdir().unwrap();
    let read = json!({"workspace": "ws", "path": "a.txt"});
    let write = json!({"workspace": "ws", "path": "a.txt", "content": "x"});

    // A refused connection sent nothing: no tool is told its outcome is unknown.
    let mut refused = Mcp::start(
        {
            let mut c = d.cli_command(&[]);
            c.env("NOKV_ENDPOINT", closed_endpoint());
            c
        },
        root.path(),
    );
    for (tool, args) in [("nokv_read", &read), ("nokv_write", &write)] {
        let e = refused.tool_error(tool, args.clone());
        assert_eq!(e["reason"], "Transport", "{tool}: {e}");
        assert!(hint(&e).contains("nothing was sent"), "{tool}: {e}");
        assert!(!hint(&e).contains(UNKNOWN), "{tool}: {e}");
    }
    drop(refused);

    // A server that accepts and drops every connection: a read can simply be repeated, a
    // write's outcome is unknown.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dropping = format!("https://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let mut unreachable = Mcp::start(
        {
            let mut c = d.cli_command(&[]);
            c.env("NOKV_ENDPOINT", &dropping);
            c
        },
        root.path(),
    );
    let e = unreachable.tool_error("nokv_read", read.clone());
    assert_eq!(e["reason"], "Transport", "{e}");
    assert!(!hint(&e).contains(UNKNOWN), "{e}");
    assert!(hint(&e).contains("changes nothing"), "{e}");
    let e = unreachable.tool_error("nokv_write", write.clone());
    assert!(hint(&e).contains(UNKNOWN), "{e}");
    drop(unreachable);

    // IsArtifact and Local errors get hints too.
    let src = root.path().join("big.bin");
    std::fs::write(&src, pseudo_random_bytes(5, (4 << 20) + 1)).unwrap();
    d.cli(&["publish", src.to_str().unwrap(), "ws:big.bin", "--quiet"])
        .assert_ok();
    let mut mcp = Mcp::start(d.cli_command(&[]), root.path());
    let e = mcp.tool_error("nokv_read", json!({"workspace": "ws", "path": "big.bin"}));
    assert_eq!(e["reason"], "IsArtifact", "{e}");
    assert!(hint(&e).contains("nokv_restore"), "{e}");
    let e = mcp.tool_error(
        "nokv_publish",
        json!({"workspace": "ws", "path": "p.bin", "local_path": "no-such-file.bin"}),
    );
    assert_eq!(e["reason"], "Local", "{e}");
    assert!(hint(&e).contains("local_path"), "{e}");
}
