//! `nokv`: the command-line client.

mod cli;

fn main() -> std::process::ExitCode {
    end_quietly_on_a_closed_stdout();
    // One process-wide crypto provider, chosen explicitly before any TLS config is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    cli::main()
}

/// Like any Unix filter, ends quietly when the reader of stdout goes away (`nokv ls | head`)
/// instead of panicking (exit 101, a backtrace): the exit status is 141, what a shell shows
/// for a process killed by SIGPIPE. SIGPIPE itself stays ignored (Rust's default): a peer
/// that resets a connection mid-write must surface as a typed transport error, not kill the
/// process.
fn end_quietly_on_a_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info)
    }));
}
