//! `nokv-server`: serve (the default), issue a token, prepare a cluster TLS directory, restore
//! a backup into a new data dir, recover from a damaged redo log, or run one of the measuring
//! instruments (`provider-bench`, `store-bench`, `restart-bench`, `rpc-floor`).

use std::process::ExitCode;

use clap::Parser;
use nokv_server::config::{Cli, ClusterCommand, Command, TokenCommand};
use nokv_server::token::{Claims, Role, parse_duration, token_expiry};
use nokv_server::{bootstrap, cluster_tls, events, names, server};

/// mimalloc rather than glibc malloc: a 4 KiB write allocates and frees many short-lived
/// buffers across the tokio workers, the committer and the acknowledger, and glibc's
/// malloc/free (with its chunk consolidation) was ~13 % of the store's CPU per write in
/// `store-bench --sessions 8` (perf, issue 12); with mimalloc the allocator's share is ~9 %.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process. Where the kernel's setting is `always`
/// (as on the 2-core machines this project is measured on), the first touch of any 2 MiB of
/// fresh anonymous memory faults in a huge page and zeroes all of it; the allocator hands freed
/// memory back and takes fresh memory again as batches come and go, so the committer kept
/// zeroing 2 MiB pages for a few KiB of transaction state: `clear_page_erms` under huge-page
/// faults was 9 % of the samples of `store-bench --sessions 8` (perf, issue 12). With them off,
/// CPU per write fell 2-6 % at 8 sessions, 16 % at 64 and not at all at 1 (medians of
/// interleaved store-bench pairs; docs/architecture.md), and publish and restore measured within
/// their spread. Failing is harmless (a kernel without the option): nothing changes.
fn without_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

fn main() -> ExitCode {
    without_transparent_huge_pages();
    // One process-wide crypto provider, chosen explicitly before any TLS or store is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Token(TokenCommand::Issue {
            data_dir,
            workspace,
            role,
            ttl,
        })) => issue_token(&data_dir, &workspace, &role, &ttl),
        Some(Command::Cluster(command)) => cluster(command),
        Some(Command::RestoreBackup { data_dir, file }) => restore_backup(&data_dir, &file),
        Some(Command::ProviderBench {
            serve,
            blocks,
            parallel,
        }) => measure("provider-bench", *serve, |s| async move {
            nokv_server::instruments::provider_bench::run(&s, blocks, parallel)
                .await
                .map(|r| vec![r])
        }),
        Some(Command::StoreBench {
            serve,
            sessions,
            seconds,
            no_quick_repair,
        }) => {
            nokv_server::meta::quick_repair::set_for_measurement(!no_quick_repair);
            measure("store-bench", *serve, |s| async move {
                nokv_server::instruments::store_bench::run(&s, &sessions, seconds).await
            })
        }
        Some(Command::RestartBench {
            serve,
            fill_files,
            child: Some(role),
            no_quick_repair,
            ..
        }) => measure("restart-bench", *serve, |s| async move {
            nokv_server::instruments::restart_bench::child(&s, role, !no_quick_repair, fill_files)
                .await
                .map(|()| Vec::<nokv_server::instruments::restart_bench::Report>::new())
        }),
        Some(Command::RestartBench {
            serve,
            fill_files,
            rounds,
            flush_rounds,
            flushes,
            child: None,
            ..
        }) => measure("restart-bench", *serve, |s| async move {
            let opts = nokv_server::instruments::restart_bench::Options {
                fill_files,
                rounds,
                flush_rounds,
                flushes,
            };
            nokv_server::instruments::restart_bench::run(&s, &opts).await
        }),
        Some(Command::RpcFloor {
            data_dir,
            scratch,
            listen,
            durable,
        }) => rpc_floor(&data_dir, &scratch, &listen, durable),
        Some(Command::Recover {
            data_dir,
            accept_loss,
            json,
        }) => recover(&data_dir, accept_loss, json),
        Some(Command::Probe {
            endpoint,
            server_name,
            ca,
            answering,
            timeout,
        }) => probe(&endpoint, server_name, &ca, answering, &timeout),
        None => serve(cli.serve),
    }
}

/// `nokv-server probe`: one gRPC health check over TLS; exit 0 when it passed.
fn probe(
    endpoint: &str,
    server_name: Option<String>,
    ca: &std::path::Path,
    answering: bool,
    timeout: &str,
) -> ExitCode {
    let Ok(timeout) = parse_duration(timeout) else {
        eprintln!("nokv-server probe: --timeout {timeout:?}: expected e.g. 5s or 500ms");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let checked = runtime.block_on(async {
        tokio::time::timeout(
            timeout,
            server::health_status(endpoint.to_string(), server_name, ca.to_path_buf()),
        )
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
    });
    match checked {
        Ok(status) if status == "SERVING" || answering => {
            println!("{endpoint}: {status}");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("nokv-server probe: {endpoint}: {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("nokv-server probe: {endpoint}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `nokv-server recover`: see its help. Exit 0 when there is nothing to recover or the loss
/// was accepted and applied; 1 when a loss would be needed but was not accepted (or on error).
fn recover(data_dir: &std::path::Path, accept: bool, json: bool) -> ExitCode {
    let node = nokv_server::node::node_file(data_dir);
    let report = match nokv_server::meta::MetaStore::salvage(&node, accept) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nokv-server recover: {e}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        match (&report.problem, report.dropped_from) {
            (None, _) => println!(
                "{}: the redo log fits the node file (batches up to {}); nothing to recover",
                report.log.display(),
                report.applied
            ),
            (Some(problem), from) => {
                println!("{problem}");
                let dropped = match (from, report.dropped_through) {
                    (Some(a), Some(b)) => format!("batches {a}..={b}"),
                    (Some(a), None) => format!("every batch from {a} on (how many is unknown)"),
                    _ => "nothing".into(),
                };
                if report.applied_changes {
                    println!(
                        "recovered: kept batches up to {} ({} replayed from the log), dropped {dropped}",
                        report.kept_through, report.replayed
                    );
                    if let Some(aside) = &report.moved_to {
                        println!("the damaged log was moved to {}", aside.display());
                    }
                } else {
                    println!(
                        "would keep batches up to {} and drop {dropped}; rerun with --accept-loss \
                         to do so, or restore the data dir from a backup",
                        report.kept_through
                    );
                }
            }
        }
    }
    if report.problem.is_some() && !report.applied_changes {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn serve(args: nokv_server::config::ServeArgs) -> ExitCode {
    let settings = match args.resolve() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nokv-server: {e}");
            return ExitCode::from(2);
        }
    };
    // A log line that cannot be written is dropped: never a panic on the thread that logged
    // it (see `nokv_server::logging` for the full-disk failure this prevents).
    nokv_server::logging::init(&settings.log, settings.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.worker_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(server::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nokv-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn restore_backup(data_dir: &std::path::Path, file: &std::path::Path) -> ExitCode {
    match nokv_server::backup::restore(file, data_dir) {
        Ok(r) => {
            let shards: Vec<String> = r.shards.iter().map(u32::to_string).collect();
            println!(
                "restored {} of {} shard{} ({}) from {} ({} bytes) into {}",
                r.shards.len(),
                r.shard_count,
                if r.shard_count == 1 { "" } else { "s" },
                shards.join(","),
                file.display(),
                r.bytes,
                data_dir.display()
            );
            println!(
                "  start it with: nokv-server --data-dir {} --shards {} and the backed-up node's object-provider settings",
                data_dir.display(),
                r.shard_count
            );
            println!(
                "  artifact blocks are not in the backup: with the local provider, move the old DATA_DIR/objects to {} first",
                data_dir.join("objects").display()
            );
            println!(
                "  the first start creates a new TLS identity and admin token (copy the old cluster.secret in first to keep issued tokens valid)"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nokv-server restore-backup: {e}");
            ExitCode::from(2)
        }
    }
}

fn rpc_floor(
    data_dir: &std::path::Path,
    scratch: &std::path::Path,
    listen: &str,
    durable: nokv_server::instruments::rpc_floor::Durable,
) -> ExitCode {
    // The daemon's runtime: one async worker per CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(nokv_server::instruments::rpc_floor::run(
        data_dir, scratch, listen, durable,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nokv-server rpc-floor: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cluster(command: ClusterCommand) -> ExitCode {
    match command {
        ClusterCommand::Init {
            dir,
            host,
            etcd_host,
        } => match cluster_tls::init(&dir, &host, &etcd_host) {
            Ok(dir) => {
                println!("cluster directory {} written", dir.display());
                println!(
                    "  start every node with --tls-dir {} --advertise HOST (its certificate: nodes/HOST.pem)",
                    dir.display()
                );
                println!(
                    "  add a node: nokv-server cluster cert --dir {} --host HOST",
                    dir.display()
                );
                println!(
                    "  point the CLI at it: export NOKV_CONFIG={}",
                    dir.join("client.toml").display()
                );
                if !etcd_host.is_empty() {
                    print_etcd_usage(&dir);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nokv-server cluster init: {e}");
                ExitCode::from(2)
            }
        },
        ClusterCommand::Cert {
            dir,
            host,
            etcd_host,
        } => match cluster_tls::add_cert(&dir, &host, &etcd_host) {
            Ok(written) => {
                for path in written {
                    println!("wrote {}", path.display());
                }
                if !etcd_host.is_empty() {
                    print_etcd_usage(&dir);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nokv-server cluster cert: {e}");
                ExitCode::from(2)
            }
        },
    }
}

/// How the etcd material of a cluster directory is used (`cluster init/cert --etcd-host`).
fn print_etcd_usage(dir: &std::path::Path) {
    let f = |name: &str| cluster_tls::etcd_file(dir, name).display().to_string();
    println!(
        "  etcd (test/dev): etcd --client-cert-auth --trusted-ca-file {} --cert-file {} --key-file {} \\\n      \
         --listen-client-urls https://HOST:2379 --advertise-client-urls https://HOST:2379",
        dir.join("ca.pem").display(),
        f("server.pem"),
        f("server.key")
    );
    println!(
        "  nodes: --etcd https://HOST:2379 --etcd-ca {} --etcd-cert {} --etcd-key {}",
        dir.join("ca.pem").display(),
        f("client.pem"),
        f("client.key")
    );
}

/// Runs a measurement subcommand: resolves the daemon settings it shares (data dir, provider,
/// shards), runs `bench` on a runtime and prints each report as one JSON line.
fn measure<R: serde::Serialize, F>(
    name: &str,
    args: nokv_server::config::ServeArgs,
    bench: impl FnOnce(nokv_server::config::Settings) -> F,
) -> ExitCode
where
    F: std::future::Future<Output = Result<Vec<R>, String>>,
{
    let settings = match args.resolve() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nokv-server: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(bench(settings)) {
        Ok(reports) => {
            for r in reports {
                println!("{}", serde_json::to_string(&r).expect("report serialises"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nokv-server {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn issue_token(
    data_dir: &std::path::Path,
    workspaces: &[String],
    role: &str,
    ttl: &str,
) -> ExitCode {
    let result = (|| -> Result<String, String> {
        for w in workspaces {
            // `*` alone means every workspace; `prefix*` needs a valid prefix; anything else is
            // one workspace name. An empty pattern would grant nothing and hides a typo.
            match w.strip_suffix('*') {
                Some("") => {}
                Some(prefix) => {
                    names::workspace(prefix).map_err(|e| format!("--workspace {w:?}: {e}"))?;
                }
                None => {
                    names::workspace(w).map_err(|e| format!("--workspace {w:?}: {e}"))?;
                }
            }
        }
        let role: Role = role
            .parse()
            .map_err(|e: nokv_server::error::Error| e.to_string())?;
        let expires = parse_duration(ttl)
            .and_then(token_expiry)
            .map_err(|e| e.to_string())?;
        let signer = bootstrap::load_signer(data_dir).map_err(|e| e.to_string())?;
        let token = signer.issue(&Claims {
            workspaces: workspaces.to_vec(),
            role,
            expires,
        });
        // The audit event is durable before the token exists anywhere else: a token whose
        // issue could not be recorded is never printed (see nokv_server::events).
        let event = events::Event {
            at_unix_ms: events::now_unix_ms(),
            token_id: String::new(),
            role: events::Who::local().role,
            action: events::Action::TokenIssue.as_str().into(),
            target: format!(
                "token {} role={} workspaces={} ttl={}",
                events::token_id(&token),
                events::role_name(role),
                events::clip(&workspaces.join(",")),
                events::clip(ttl)
            ),
            outcome: events::OK.into(),
            reason: String::new(),
        };
        events::append_to_dir(data_dir, &event).map_err(|e| {
            format!(
                "recording the audit event in {}: {e}; no token was issued",
                data_dir.join(events::EVENTS_FILE).display()
            )
        })?;
        Ok(token)
    })();
    match result {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nokv-server token issue: {e}");
            ExitCode::from(2)
        }
    }
}
