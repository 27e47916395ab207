//! `nokv`: the command-line client.

mod cli;

fn main() -> std::process::ExitCode {
    // One process-wide crypto provider, chosen explicitly before any TLS config is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    cli::main()
}
