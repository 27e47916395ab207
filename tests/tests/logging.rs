//! Logs as an operator's tools see them (issue 47, section 2): the daemon and the `nokv` CLI
//! write their logs to a stderr that is a pipe here — as under journald, `docker logs` or a
//! redirect to a file — so no line may carry ANSI colour codes; and `--log-format json` makes
//! every line of the daemon's log one JSON object.

use nokv_tests::Daemon;

const ESC: &str = "\x1b[";

#[test]
fn the_daemon_writes_no_ansi_colour_codes_to_a_stderr_that_is_not_a_terminal() {
    let d = Daemon::start(&["--log", "debug"]);
    d.cli_stdin(&["put", "ws:a.txt", "-"], b"hello").assert_ok();
    let (status, _, stderr) = d.terminate_collecting_output();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("stopped cleanly"),
        "the log was read: {stderr}"
    );
    assert!(
        !stderr.contains(ESC),
        "colour codes in a piped log:\n{stderr:?}"
    );
}

#[test]
fn with_log_format_json_every_line_of_the_daemons_log_is_a_json_object() {
    let d = Daemon::start_with_env(&["--log", "debug"], &[("NOKV_LOG_FORMAT", "json")]);
    d.cli_stdin(&["put", "ws:a.txt", "-"], b"hello").assert_ok();
    let (status, _, stderr) = d.terminate_collecting_output();
    assert!(status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "stopped cleanly" && l["level"] == "INFO"),
        "{stderr}"
    );
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["target"].is_string(), "{l}");
    }
}

#[test]
fn the_cli_writes_no_ansi_colour_codes_to_a_stderr_that_is_not_a_terminal() {
    let d = Daemon::start(&[]);
    let out = d.cli_with_env(&["ls", "ws:"], &[("NOKV_LOG", "debug")]);
    out.assert_ok();
    assert!(
        out.stderr.contains("DEBUG"),
        "NOKV_LOG=debug logged nothing: {}",
        out.stderr
    );
    assert!(!out.stderr.contains(ESC), "{:?}", out.stderr);
}
