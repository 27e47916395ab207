//! Argument parsing and dispatch of the `nokv` CLI. Exit status: 0 success, 1 the operation
//! failed (typed reason on stderr), 2 usage error (also a connection setting that cannot be
//! used: no configuration, a config or CA file that cannot be read), 130 interrupted (Ctrl-C).
//!
//! Ctrl-C (SIGINT) and SIGTERM do not kill the process outright: the running command's future
//! is dropped, so every guard it holds (a stdin spool file, an upload's lease renewal) cleans
//! up first.

mod admin;
mod agent_ops;
mod artifacts;
mod backup;
mod bench;
mod crash_point;
mod files;
mod mcp;
mod output;
mod progress;
mod spool;
mod target;
mod workspaces;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nokv_client::{Client, ClientConfig, ClientError, Reason};

use output::Output;
use target::Target;

#[derive(Debug, Parser)]
#[command(
    name = "nokv",
    version,
    about = "Client for nokv, the block store for agent workspaces",
    after_help = "Connection settings come from flags, then NOKV_ENDPOINT / NOKV_CA / NOKV_TOKEN, \
        then the TOML file at NOKV_CONFIG (or ~/.config/nokv/config.toml). A fresh daemon \
        prints the NOKV_CONFIG line to use. Paths are written WS:PATH (workspace, colon, path \
        in it), e.g. demo:notes/todo.md.\n\n\
        Examples:\n  \
        echo hello | nokv put demo:notes/todo.md\n  \
        nokv ls demo"
)]
pub struct Cli {
    /// Server URL, e.g. https://127.0.0.1:7878, or several separated by commas (tried in
    /// order; `NotOwner` hints are followed).
    #[arg(long, global = true, help_heading = CONNECTION)]
    endpoint: Option<String>,
    /// CA certificate (PEM) that signed the server certificate.
    #[arg(long, global = true, help_heading = CONNECTION)]
    ca: Option<PathBuf>,
    /// Bearer token (prefer NOKV_TOKEN: flags are visible in the process list).
    #[arg(long, global = true, help_heading = CONNECTION)]
    token: Option<String>,
    /// Print one JSON document instead of human text.
    #[arg(long, global = true, help_heading = GLOBAL)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Help heading of the connection flags every subcommand takes (apart from its own options).
const CONNECTION: &str = "Connection options";
/// Help heading of the other flags every subcommand takes.
const GLOBAL: &str = "Global options";

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a file from FILE or stdin. A body over the inline limit (256 KiB) is published
    /// as an artifact instead (streamed, as `publish` does).
    #[command(after_help = "Examples:\n  \
        echo 'buy milk' | nokv put demo:notes/todo.md\n  \
        nokv put demo:src/main.rs ./main.rs --if-generation 3")]
    Put {
        /// Where to write, as WS:PATH (workspace and path, e.g. demo:notes/todo.md).
        target: Target,
        /// Source file; `-` or omitted reads stdin.
        file: Option<PathBuf>,
        /// Fail with AlreadyExists if the path exists.
        #[arg(long, conflicts_with = "if_generation")]
        create_only: bool,
        /// Write only if the current generation is N; 0 means "only if it does not exist"
        /// (like --create-only). Small files only.
        #[arg(long)]
        if_generation: Option<u64>,
        /// Request id: resending a request with the id it was first sent with applies it at
        /// most once (default: random; printed when the outcome is unknown). Small files only.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Read a file or artifact into FILE or stdout. Bytes that are not UTF-8 text are not
    /// printed to a terminal unless --force.
    #[command(after_help = "Examples:\n  \
        nokv get demo:notes/todo.md\n  \
        nokv get demo:builds/app.tar ./app.tar")]
    Get {
        /// What to read, as WS:PATH (e.g. demo:notes/todo.md).
        target: Target,
        /// Destination file (replaced if it exists); `-` or omitted writes stdout.
        file: Option<PathBuf>,
        /// Print bytes that are not UTF-8 text even when stdout is a terminal (refused
        /// otherwise: they can garble it). A pipe or a file is never checked.
        #[arg(long)]
        force: bool,
    },
    /// Show an entry without its body: kind, size, sha256, generation (what --if-generation
    /// takes), modification time; for an artifact also its revision and blocks.
    #[command(after_help = "Examples:\n  \
        nokv stat demo:notes/todo.md\n  \
        nokv --json stat demo:builds/app.tar")]
    Stat {
        /// The entry, as WS:PATH (e.g. demo:notes/todo.md).
        target: Target,
    },
    /// List entries under a prefix, with a header (kind, size, generation, modified, path).
    #[command(after_help = "Examples:\n  \
        nokv ls demo\n  \
        nokv ls demo:notes/ --limit 50")]
    Ls {
        /// WS (the whole workspace) or WS:PREFIX (the paths that start with PREFIX, e.g.
        /// demo:notes/).
        #[arg(value_parser = Target::workspace_or_prefix, value_name = "WS[:PREFIX]")]
        target: Target,
        /// Page size (1-1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Fetch one page starting at this cursor (default: every page).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Delete an entry.
    #[command(after_help = "Examples:\n  \
        nokv rm demo:notes/old.md\n  \
        nokv rm demo:notes/todo.md --if-generation 4")]
    Rm {
        /// The entry to delete, as WS:PATH (e.g. demo:notes/old.md).
        target: Target,
        /// Delete only if the current generation is N (N >= 1: an entry that exists has a
        /// generation of at least 1, so 0 could never match; omit the flag to delete
        /// unconditionally).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        if_generation: Option<u64>,
        /// Request id: resending a request with the id it was first sent with applies it at
        /// most once (default: random; printed when the outcome is unknown).
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Replace exactly one occurrence of --old with --new in a small text file, on the
    /// server in one step. Fails with MatchCount (naming the count) when --old occurs zero or
    /// several times; nothing changes then.
    #[command(after_help = "Examples:\n  \
        nokv edit demo:src/lib.rs --old 'fn old_name' --new 'fn new_name'\n  \
        nokv edit demo:notes/todo.md --old '- [ ] milk' --new '- [x] milk' --if-generation 2")]
    Edit {
        /// The file to edit, as WS:PATH (e.g. demo:src/lib.rs).
        target: Target,
        /// The text to replace; it must occur exactly once.
        #[arg(long, allow_hyphen_values = true)]
        old: String,
        /// The replacement (may be empty).
        #[arg(long, allow_hyphen_values = true)]
        new: String,
        /// Edit only if the current generation is N (N >= 1; GenerationMismatch otherwise).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        if_generation: Option<u64>,
        /// Request id: resending a request with the id it was first sent with applies it at
        /// most once (default: random; printed when the outcome is unknown).
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Append FILE or stdin to a small file atomically (creating it); refused past the
    /// inline limit.
    #[command(after_help = "Examples:\n  \
        echo 'step 3 done' | nokv append demo:logs/run.log\n  \
        nokv append demo:logs/run.log ./more.log")]
    Append {
        /// The file to append to, as WS:PATH (e.g. demo:logs/run.log).
        target: Target,
        /// Source file; `-` or omitted reads stdin.
        file: Option<PathBuf>,
        /// Request id: resending a request with the id it was first sent with applies it at
        /// most once (default: random; printed when the outcome is unknown).
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Paths matching a glob: `*` and `?` within one segment, `**` across segments, `[abc]`
    /// classes (e.g. `ws:src/**/*.rs`).
    #[command(after_help = "Examples:\n  \
        nokv find 'demo:src/**/*.rs'\n  \
        nokv find demo --limit 20")]
    Find {
        /// WS (every path in the workspace) or WS:GLOB (e.g. 'demo:src/**/*.rs'; quote it so
        /// the shell does not expand it). A GLOB ending in / means everything under that
        /// directory (demo:src/ is demo:src/**).
        #[arg(value_parser = Target::workspace_or_prefix, value_name = "WS[:GLOB]")]
        target: Target,
        /// At most N paths (default: every match).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
    /// Search the small files of a workspace on the server, grep-style: `path:line:text`
    /// (context lines `path-line-text`). Non-UTF-8 files are skipped, and artifacts unless
    /// `--include-artifacts`.
    #[command(after_help = "Examples:\n  \
        nokv grep 'TODO|FIXME' demo\n  \
        nokv grep -i -C 2 'fn main' 'demo:src/**/*.rs'")]
    Grep {
        /// Regular expression (Rust `regex` syntax), matched line by line.
        regex: String,
        /// WS (every path) or WS:GLOB; a GLOB ending in / means everything under that
        /// directory (demo:notes/ is demo:notes/**).
        #[arg(value_name = "WS[:GLOB]")]
        scope: agent_ops::Scope,
        /// Case-insensitive.
        #[arg(short = 'i', long)]
        ignore_case: bool,
        /// Lines of context around each match (0-10).
        #[arg(short = 'C', long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10))]
        context: u32,
        /// Stop after N matches (1-10000) [server default: 100].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10000))]
        max_matches: Option<u32>,
        /// Also search artifacts (read block by block from the provider, after the small
        /// files); they are skipped otherwise.
        #[arg(long)]
        include_artifacts: bool,
    },
    /// Publish a large file as an artifact, in 4 MiB blocks.
    #[command(after_help = "Examples:\n  \
        nokv publish ./app.tar demo:builds/app.tar\n  \
        nokv publish ./model.bin demo:models/m.bin --receipt model-v3")]
    Publish {
        /// Source file; `-` reads stdin.
        file: PathBuf,
        /// The artifact to create or replace, as WS:PATH (e.g. demo:builds/app.tar).
        target: Target,
        /// Blocks in flight at once (1 or more).
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        parallel: usize,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Stable receipt naming this publication (1-128 printable ASCII characters): rerunning
        /// the same command after a crash or a network failure resumes its open upload and
        /// sends only the missing blocks; after success it writes nothing and prints the
        /// committed entry. Another file under the same receipt is refused (RequestIdReused).
        /// Default: none (every run is a new upload).
        #[arg(long)]
        receipt: Option<String>,
    },
    /// Restore an artifact into DEST (verified, atomic, resumable). An existing DEST is
    /// refused (exit 2) unless --force replaces it or --no-clobber leaves it (exit 0); an
    /// interrupted restore's DEST.partial is resumed either way.
    #[command(after_help = "Examples:\n  \
        nokv restore demo:builds/app.tar ./app.tar\n  \
        nokv restore demo:models/m.bin ./m.bin --force")]
    Restore {
        /// The artifact, as WS:PATH (e.g. demo:builds/app.tar).
        target: Target,
        /// The local file to create: written to DEST.partial, verified, then renamed to DEST
        /// (so not `-`: `nokv get WS:PATH -` streams an artifact to stdout).
        dest: PathBuf,
        /// Replace DEST if it exists.
        #[arg(long, conflicts_with = "no_clobber")]
        force: bool,
        /// If DEST exists, leave it, download nothing and succeed (exit 0).
        #[arg(long)]
        no_clobber: bool,
        /// Blocks fetched at once (1 or more).
        #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        parallel: usize,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Serve the workspace tools to an agent host over MCP (stdio): `nokv_read`,
    /// `nokv_edit`, `nokv_grep`, ... See the README, "Use nokv from an agent host".
    #[command(after_help = "Examples:\n  \
        nokv mcp --workspace demo\n  \
        nokv mcp --workspace demo --read-only --local-root none")]
    Mcp(mcp::McpArgs),
    /// Benchmarks and the interference probe's workers.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv bench all\n  \
        nokv bench put-vs-etcd --clients 1,8"
    )]
    Bench(bench::BenchCommand),
    /// Operator commands (admin token).
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv admin health\n  \
        nokv admin quota set demo 10GiB"
    )]
    Admin(AdminCommand),
    /// Whole-workspace commands.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv workspace delete scratch --yes"
    )]
    Workspace(workspaces::WorkspaceCommand),
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Node status and per-shard counters.
    #[command(after_help = "Examples:\n  \
        nokv admin health\n  \
        nokv --json admin health")]
    Health,
    /// Accounting check: classify every provider object as referenced, guarded, collectable
    /// or unaccounted (prints the counts and the first 20 unaccounted keys). Run it after
    /// reconciliation settled: a key written or deleted during the audit can show up as
    /// unaccounted once; one unaccounted twice is leaked.
    #[command(after_help = "Examples:\n  \
        nokv admin audit\n  \
        nokv --json admin audit")]
    Audit,
    /// Cluster membership and shard ownership: nodes (id, endpoint, alive) and shards (owner,
    /// epoch, state, last checkpoint size and age). The embedded default shows itself owning
    /// every shard at epoch 0.
    #[command(after_help = "Examples:\n  \
        nokv admin cluster\n  \
        nokv --json admin cluster")]
    Cluster,
    /// Shard commands.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv admin shard move 3 node-b"
    )]
    Shard(ShardCommand),
    /// Audit events of the node, newest first: who (token id, role), what (action, target),
    /// when, outcome. Never shows a token, key or secret.
    #[command(after_help = "Examples:\n  \
        nokv admin events\n  \
        nokv admin events --limit 200")]
    Events {
        /// How many events (1-1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// The inventory: a durable, paged scan of the provider prefix that quarantines objects no
    /// record accounts for (it never deletes anything).
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv admin inventory start\n  \
        nokv admin inventory status"
    )]
    Inventory(InventoryCommand),
    /// List quarantine observations: objects the inventory found that no record accounts for
    /// (key, size, first and last seen, shard). They are kept, never deleted.
    #[command(after_help = "Examples:\n  \
        nokv admin quarantine\n  \
        nokv --json admin quarantine --limit 1000")]
    Quarantine {
        /// Observations to list, 1 to 1000 [default: 100].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
    /// Per-workspace byte quotas.
    #[command(
        subcommand,
        after_help = "Examples:\n  \
        nokv admin quota set demo 10GiB\n  \
        nokv admin quota get demo"
    )]
    Quota(admin::QuotaCommand),
    /// The operations ledger: uploads and deletes with state, attempts and last error,
    /// ordered by shard then id. Summaries never show object keys or secrets.
    #[command(after_help = "Examples:\n  \
        nokv admin ops --state dead_letter\n  \
        nokv admin ops --state open --limit 20")]
    Ops {
        /// Only operations in this state (repeatable, up to 8): open, committed, aborted,
        /// reclaimed, deleting, deleted, dead_letter.
        #[arg(long = "state")]
        states: Vec<String>,
        /// Operations per page, 1-100 [server default: 50].
        #[arg(long)]
        limit: Option<u32>,
        /// Continue after this cursor (the `next` of the previous page).
        #[arg(long, default_value = "")]
        after: String,
    },
    /// Back up the node's metadata to DEST: a consistent copy of every shard it serves, holding
    /// every write acknowledged before the call, streamed and checked (sha256 printed). Written
    /// to DEST.partial first; an existing DEST is refused unless --force. Artifact blocks are
    /// not in it (they stay in the object provider) and neither are secrets. Restore with
    /// `nokv-server restore-backup --data-dir DIR DEST`.
    #[command(after_help = "Examples:\n  \
        nokv admin backup ./nokv-backup.bin\n  \
        nokv admin backup ./nokv-backup.bin --force")]
    Backup {
        /// The backup file to write.
        dest: PathBuf,
        /// Replace DEST if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Retry a delete operation's cleanup now (e.g. a dead letter after a provider outage):
    /// completed | pending | already_in_progress | provider_error.
    #[command(after_help = "Examples:\n  \
        nokv admin ops --state dead_letter\n  \
        nokv admin retry OP_ID")]
    Retry {
        /// Operation id, as `nokv admin ops` shows it.
        operation_id: String,
    },
}

#[derive(Debug, Subcommand)]
enum InventoryCommand {
    /// Start a scan now on every shard that is not scanning (idempotent).
    #[command(after_help = "Examples:\n  \
        nokv admin inventory start")]
    Start,
    /// Per shard and overall: running or idle, pages done, objects seen, last completed scan,
    /// cursor position (an opaque token), quarantined count.
    #[command(after_help = "Examples:\n  \
        nokv admin inventory status\n  \
        nokv --json admin inventory status")]
    Status,
}

#[derive(Debug, Subcommand)]
enum ShardCommand {
    /// Hand shard S gracefully to node NODE (cluster mode): drain, checkpoint, release. Returns
    /// once NODE owns it (NODE may still answer a retryable Unavailable for the moment it
    /// takes to open the checkpoint); clients see at most a retry.
    #[command(after_help = "Examples:\n  \
        nokv admin cluster\n  \
        nokv admin shard move 3 node-b")]
    Move {
        /// Shard number (0 to shard count - 1).
        shard: u32,
        /// Id of the node to take the shard (`--node-id` of a live node).
        node: String,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("NOKV_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // No colour codes in a log file, journald or an MCP host's log (`nokv mcp`).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let out = Output { json: cli.json };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Bench workers end on SIGTERM/SIGINT themselves and exit 0 with their figures (the probe
    // stops them that way), so only other commands are cut short by a signal.
    let own_signals = matches!(cli.command, Command::Bench(_));
    let partial = resumable_partial(&cli.command);
    let result = runtime.block_on(async {
        if own_signals {
            return Some(run(cli, out).await);
        }
        tokio::select! {
            // Polled first, so the SIGINT handler is installed before the command starts.
            biased;
            _ = interrupted() => None,
            r = run(cli, out) => Some(r),
        }
    });
    // A blocking stdin read may still be running; it must not hold the exit up.
    runtime.shutdown_background();
    match result {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            out.error(&e);
            ExitCode::from(if e.reason == Reason::Usage { 2 } else { 1 })
        }
        None => {
            match partial.filter(|p| p.symlink_metadata().is_ok()) {
                Some(p) => eprintln!(
                    "nokv: interrupted; partial kept at {}: rerun the same command to resume",
                    p.display()
                ),
                None => eprintln!("nokv: interrupted"),
            }
            ExitCode::from(130)
        }
    }
}

/// The `DEST.partial` an interrupted command leaves on purpose: a restore (also `get` of an
/// artifact into a file) keeps its verified blocks there, and rerunning it resumes from them.
/// Every other temporary file is removed when the command is cut short.
fn resumable_partial(command: &Command) -> Option<PathBuf> {
    match command {
        Command::Restore { dest, .. } => Some(nokv_client::restore::partial_path(dest)),
        Command::Get {
            file: Some(dest), ..
        } if dest.as_os_str() != "-" => Some(nokv_client::restore::partial_path(dest)),
        _ => None,
    }
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM. The handlers are installed on the first
/// poll; if they cannot be, the signal keeps its default action (the process dies).
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

async fn run(cli: Cli, out: Output) -> Result<(), ClientError> {
    let cfg = ClientConfig {
        endpoint: cli.endpoint,
        endpoints: None,
        ca: cli.ca,
        token: cli.token,
    };
    if let Command::Bench(cmd) = cli.command {
        return bench::run(cmd, out, async || Client::connect(&cfg.resolve()?).await).await;
    }
    if let Command::Mcp(args) = cli.command {
        // An agent host shows a server that exits as "Connection closed" and nothing more:
        // a configuration problem is served as every tool call's answer instead (see mcp).
        let client = match cfg.resolve_with_sources() {
            Ok((cfg, sources)) => Client::connect(&cfg).await.map_err(|e| sources.explain(e)),
            Err(e) => Err(e.into()),
        };
        return mcp::run(client, args).await;
    }
    if let Command::Workspace(cmd) = &cli.command {
        cmd.confirmed()?;
    }
    // Every error about a setting names where that setting came from.
    let (cfg, sources) = cfg.resolve_with_sources()?;
    let client = Client::connect(&cfg)
        .await
        .map_err(|e| sources.explain(e))?;
    dispatch(&client, cli.command, out)
        .await
        .map_err(|e| sources.explain(e))
}

async fn dispatch(client: &Client, command: Command, out: Output) -> Result<(), ClientError> {
    match command {
        Command::Bench(_) => unreachable!("handled above"),
        Command::Put {
            target,
            file,
            create_only,
            if_generation,
            request_id,
        } => {
            files::put(
                client,
                out,
                &target,
                file,
                create_only,
                if_generation,
                request_id,
            )
            .await
        }
        Command::Get {
            target,
            file,
            force,
        } => files::get(client, out, &target, file, force).await,
        Command::Stat { target } => files::stat(client, out, &target).await,
        Command::Ls {
            target,
            limit,
            cursor,
        } => files::ls(client, out, &target, limit, cursor).await,
        Command::Rm {
            target,
            if_generation,
            request_id,
        } => files::rm(client, out, &target, if_generation, request_id).await,
        Command::Edit {
            target,
            old,
            new,
            if_generation,
            request_id,
        } => agent_ops::edit(client, out, &target, old, new, if_generation, request_id).await,
        Command::Append {
            target,
            file,
            request_id,
        } => agent_ops::append(client, out, &target, file, request_id).await,
        Command::Find { target, limit } => agent_ops::find(client, out, &target, limit).await,
        Command::Grep {
            regex,
            scope,
            ignore_case,
            context,
            max_matches,
            include_artifacts,
        } => {
            let args = agent_ops::GrepArgs {
                regex,
                scope,
                ignore_case,
                context,
                max_matches: max_matches.unwrap_or(0),
                include_artifacts,
            };
            agent_ops::grep(client, out, args).await
        }
        Command::Publish {
            file,
            target,
            parallel,
            quiet,
            receipt,
        } => artifacts::publish(client, out, &file, &target, parallel, quiet, receipt).await,
        Command::Restore {
            target,
            dest,
            force,
            no_clobber,
            parallel,
            quiet,
        } => {
            let clobber = match (force, no_clobber) {
                (true, _) => artifacts::Clobber::Replace,
                (false, true) => artifacts::Clobber::Skip,
                (false, false) => artifacts::Clobber::Refuse,
            };
            artifacts::restore(client, out, &target, &dest, parallel, quiet, clobber).await
        }
        Command::Admin(AdminCommand::Health) => admin::health(client, out).await,
        Command::Admin(AdminCommand::Audit) => admin::audit(client, out).await,
        Command::Admin(AdminCommand::Cluster) => admin::cluster(client, out).await,
        Command::Admin(AdminCommand::Ops {
            states,
            limit,
            after,
        }) => admin::ops(client, out, &states, limit, &after).await,
        Command::Admin(AdminCommand::Retry { operation_id }) => {
            admin::retry(client, out, &operation_id).await
        }
        Command::Admin(AdminCommand::Shard(ShardCommand::Move { shard, node })) => {
            admin::move_shard(client, out, shard, &node).await
        }
        Command::Admin(AdminCommand::Backup { dest, force }) => {
            backup::backup(client, out, &dest, force).await
        }
        Command::Admin(AdminCommand::Events { limit }) => admin::events(client, out, limit).await,
        Command::Admin(AdminCommand::Inventory(InventoryCommand::Start)) => {
            admin::inventory_start(client, out).await
        }
        Command::Admin(AdminCommand::Inventory(InventoryCommand::Status)) => {
            admin::inventory_status(client, out).await
        }
        Command::Admin(AdminCommand::Quarantine { limit }) => {
            admin::quarantine(client, out, limit.unwrap_or(0)).await
        }
        Command::Admin(AdminCommand::Quota(cmd)) => admin::quota(client, out, cmd).await,
        Command::Workspace(cmd) => workspaces::run(client, out, cmd).await,
        Command::Mcp(_) => unreachable!("handled in run"),
    }
}
