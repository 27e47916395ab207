//! The daemon's log sink: tracing to stderr, where a failed write drops the line and never
//! fails, let alone panics, the thread that logged it.
//!
//! **Why this module exists (issue 42, item 3).** With stderr redirected to a file on the same
//! filesystem as the data dir (a log file, or journald on the root disk), filling that disk
//! killed the node committer for good: every write then answered `Unavailable: shard is
//! shutting down`, health said NOT SERVING, and freeing the disk brought nothing back. The
//! exact path, reproduced on a 64 MiB tmpfs holding both the data dir and the stderr file
//! (`2>>`), caught with gdb on `rust_panic` in the committer thread:
//!
//! 1. a commit fails with ENOSPC; `gate::Outage::begin` logs its one ERROR for the incident;
//! 2. `tracing_subscriber::fmt()` — as `main` built it — writes the line to stderr, which fails
//!    with ENOSPC too. The `SubscriberBuilder` turns on `log_internal_errors` by default, so its
//!    `fmt_layer` (`on_event`) reports that failure with `eprintln!` — to the same full stderr;
//! 3. `eprintln!` panics when its write fails (`failed printing to stderr: No space left on
//!    device`; std's `print_to`); the panic message itself cannot be written either, so
//!    nothing is seen;
//! 4. the panic unwinds the committer thread (`commit_loop` has nothing to stop it): its job
//!    queue closes (later writes: "shard is shutting down"), the acknowledger ends with it, and
//!    the `serving` flag it had just set to false is never set back.
//!
//! The same run killed the node's maintenance task (a `tracing::warn!` from `server::maintain`
//! on a tokio worker panicked the same way), silently ending reconciliation. With stderr on
//! another filesystem nothing failed and the store recovered by itself two seconds after space
//! was freed.
//!
//! **The rule.** Logging is a side path: it must never decide whether a write succeeds. So the
//! sink ([`Lossy`]) swallows its own write errors (and counts the lines it lost, for metrics),
//! and the subscriber is built with `log_internal_errors(false)`, so that even a sink that did
//! return an error could not make tracing print, and panic, on stderr. Either one alone stops
//! the panic; both are kept because each guards a different layer against a future change.
//! Anything else the process prints after start-up must follow the same rule (no `eprintln!`
//! or `println!` outside start-up and the offline commands). The committer itself also
//! survives what a session does (see [`crate::shard::gate`]).

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields};
use tracing_subscriber::fmt::time::{self, FormatTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Log lines lost because the sink refused them (disk full, closed pipe), since start.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines lost because the sink refused them, since the process started.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A writer that never fails: what the inner writer refuses is dropped (and counted), so a
/// full disk or a closed pipe under stderr costs log lines, never the thread that logs.
pub struct Lossy<W>(pub W);

impl<W: Write> Write for Lossy<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// Makes a [`Lossy`] writer around each writer `make` returns (one per event).
#[derive(Clone, Copy)]
pub struct LossyWriter<F>(pub F);

impl<'a, F: Fn() -> W + 'static, W: Write + 'a> MakeWriter<'a> for LossyWriter<F> {
    type Writer = Lossy<W>;

    fn make_writer(&'a self) -> Self::Writer {
        Lossy((self.0)())
    }
}

/// How each log line is written: `--log-format` (TOML `log_format`, `NOKV_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// tracing's human-readable lines; coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`, `spans`), for log
    /// shippers; never coloured.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log_format {other:?}: expected text or json")),
        }
    }
}

/// The daemon's subscriber: `filter` (an `EnvFilter` directive, `info` if it does not parse)
/// written to stderr through [`Lossy`] in `format`, with tracing's own error reports off.
/// Text is coloured only when stderr is a terminal: journald, `docker logs` and a log file get
/// no ANSI escape codes.
pub fn subscriber(filter: &str, format: LogFormat) -> Box<dyn tracing::Subscriber + Send + Sync> {
    subscriber_to(filter, format, std::io::stderr().is_terminal(), io::stderr)
}

fn subscriber_to<W: Write + 'static>(
    filter: &str,
    format: LogFormat,
    terminal: bool,
    sink: fn() -> W,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(LossyWriter(sink))
        .log_internal_errors(false);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(terminal).finish()),
        LogFormat::Json => Box::new(builder.with_ansi(false).event_format(JsonLines).finish()),
    }
}

/// Installs [`subscriber`] as the process's default.
pub fn init(filter: &str, format: LogFormat) {
    let _ = tracing::subscriber::set_global_default(subscriber(filter, format));
}

/// `--log-format json`: one JSON object per event, built with serde_json (already a
/// dependency; tracing-subscriber's `json` feature would add tracing-serde for the same).
/// `{"timestamp": RFC 3339 UTC, "level", "target", "fields": {"message", ...}, "spans":
/// [{"name", "fields"}]}` (`spans` outermost first, each span's fields as text).
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut timestamp = String::new();
        time::SystemTime.format_time(&mut format::Writer::new(&mut timestamp))?;
        let meta = event.metadata();
        let mut fields = JsonFields(serde_json::Map::new());
        event.record(&mut fields);
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let text = ext
                    .get::<FormattedFields<N>>()
                    .map_or("", |f| f.fields.as_str());
                spans.push(serde_json::json!({"name": span.name(), "fields": text}));
            }
        }
        let mut line = serde_json::json!({
            "timestamp": timestamp,
            "level": meta.level().as_str(),
            "target": meta.target(),
            "fields": fields.0,
        });
        if !spans.is_empty() {
            line["spans"] = serde_json::Value::Array(spans);
        }
        writeln!(writer, "{line}")
    }
}

/// An event's fields as JSON values (numbers and booleans as such, the rest as text).
struct JsonFields(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(
        &mut self,
        field: &tracing::field::Field,
        value: &(dyn std::error::Error + 'static),
    ) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::error::Error;
    use crate::meta::MetaStore;
    use crate::shard::fence::Fence;
    use crate::shard::gate::Gate;

    /// Every line the subscriber under test wrote (one buffer per test).
    fn captured(
        format: LogFormat,
        terminal: bool,
        buffer: &'static std::sync::Mutex<Vec<u8>>,
        sink: fn() -> Captured,
    ) -> String {
        let subscriber = subscriber_to("info", format, terminal, sink);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("shard", id = 3);
            let _in = span.enter();
            tracing::warn!(error = "disk full", attempts = 2u64, "commit failed");
            tracing::info!(ok = true, "recovered");
        });
        String::from_utf8(buffer.lock().unwrap().clone()).unwrap()
    }

    struct Captured(&'static std::sync::Mutex<Vec<u8>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    // Catches: `with_ansi` left at tracing's default (on), which colours journald and files.
    #[test]
    fn text_lines_carry_ansi_colour_codes_only_when_stderr_is_a_terminal() {
        static PLAIN: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
        static COLOURED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
        let plain = captured(LogFormat::Text, false, &PLAIN, || Captured(&PLAIN));
        assert!(plain.contains("commit failed"), "{plain}");
        assert!(!plain.contains('\x1b'), "{plain:?}");
        let coloured = captured(LogFormat::Text, true, &COLOURED, || Captured(&COLOURED));
        assert!(coloured.contains("\x1b["), "{coloured:?}");
    }

    #[test]
    fn json_lines_are_one_object_each_with_level_target_fields_and_spans() {
        static JSON: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
        let text = captured(LogFormat::Json, true, &JSON, || Captured(&JSON));
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(!text.contains('\x1b'), "{text:?}");
        let warn = &lines[0];
        assert_eq!(warn["level"], "WARN");
        assert_eq!(warn["target"], module_path!());
        assert_eq!(warn["fields"]["message"], "commit failed");
        assert_eq!(warn["fields"]["error"], "disk full");
        assert_eq!(warn["fields"]["attempts"], 2);
        assert_eq!(warn["spans"][0]["name"], "shard");
        assert_eq!(warn["spans"][0]["fields"], "id=3");
        assert!(warn["timestamp"].as_str().unwrap().ends_with('Z'), "{warn}");
        assert_eq!(lines[1]["fields"]["ok"], true);
    }

    /// A sink whose every write fails the way a full disk does.
    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::StorageFull))
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::StorageFull))
        }
    }

    // Catches: a sink that passes its error on (`return Err(e)` from `Lossy::write`; verified
    // red) — tracing would then report it on stderr, which is on the same full disk.
    #[test]
    fn a_line_the_sink_refuses_is_dropped_and_counted_without_an_error() {
        let before = dropped_lines();
        let mut sink = Lossy(Full);
        assert_eq!(sink.write(b"a log line\n").unwrap(), 11);
        sink.write_all(b"another\n").unwrap();
        sink.flush().unwrap();
        assert!(dropped_lines() >= before + 2);
    }

    /// Set in the child process of the test below, whose stderr is `/dev/full`.
    const CHILD: &str = "NOKV_TEST_LOGGING_STDERR_IS_FULL";

    // The production failure, end to end in a child process whose stderr is `/dev/full` (every
    // write to it fails with ENOSPC, as a log file on a full disk does), with the daemon's
    // subscriber installed: the committer logs its ERROR for a full disk, and must still be
    // running — and recover — once the disk is free. Catches: the daemon's old subscriber,
    // `tracing_subscriber::fmt().with_writer(io::stderr)` in `subscriber` (verified red: the
    // committer panics in tracing's `eprintln!`, and its `Stopped` guard's ERROR panics again
    // while unwinding, so the child aborts; without that guard the committer simply stops and
    // the child reports it).
    #[test]
    fn the_committer_survives_logging_its_error_to_a_full_stderr() {
        if std::env::var_os(CHILD).is_some() {
            return the_committer_survives_a_full_disk_under_the_daemons_subscriber();
        }
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            // No /dev/full (not Linux): nothing to run the child against.
            return;
        };
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "logging::tests::the_committer_survives_logging_its_error_to_a_full_stderr",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stderr(full)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}");
        assert!(
            stdout.contains("committer survived"),
            "the child ran nothing: {stdout}"
        );
    }

    /// The child's side: everything it reports goes to stdout (stderr is full).
    fn the_committer_survives_a_full_disk_under_the_daemons_subscriber() {
        init("info", LogFormat::Text);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let meta = MetaStore::create(&dir.path().join("g.redb")).unwrap();
            let disk = meta.faults().clone();
            let gate = Arc::new(Gate::new(meta, "t".into(), Fence::local(0)));
            let put = |name: &'static str| gate.write(move |w| Ok(w.put_inline("ws", name, b"x")?));
            put("before").await.unwrap();
            disk.fill_disk();
            // The failure the committer logs at ERROR (to the full stderr).
            let err = put("during").await.unwrap_err();
            if !matches!(err, Error::Unavailable(_)) {
                println!("unexpected error during the outage: {err:?}");
                std::process::exit(1);
            }
            disk.free_disk();
            tokio::select! {
                () = gate.wait_serving(true) => {}
                () = gate.stopped() => {
                    println!("the committer stopped during the outage");
                    std::process::exit(1);
                }
            }
            if let Err(e) = put("after").await {
                println!("the write after the outage failed: {e:?}");
                std::process::exit(1);
            }
            println!("committer survived");
        });
    }
}
