//! The command line: the `nokv-server` clap tree — the top-level [`Cli`], its subcommands
//! ([`Command`], [`TokenCommand`], [`ClusterCommand`]) and their one-off arguments.
//!
//! Owns: every flag, argument, default and help text of the subcommands. The serve settings
//! every daemon-opening subcommand flattens in are [`ServeArgs`] (see `serving.rs`); this file
//! only places them in the tree. Parsing here never validates a serve setting: that happens
//! once, in [`ServeArgs::resolve`].

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::serving::ServeArgs;

#[derive(Debug, Parser)]
#[command(
    name = "nokv-server",
    version,
    about = "nokv: a sharded, owner-mediated block store daemon for agent workspaces",
    long_about = "nokv: a sharded, owner-mediated block store daemon for agent workspaces.\n\n\
        With no flags it serves 16 shards from ./nokv-data on 127.0.0.1:7878 over TLS, using a \
        local-filesystem object provider, and prints how to point the `nokv` CLI at it.\n\n\
        Settings come from a TOML file (--config; keys are the flag names with '_' for '-'), \
        then NOKV_* environment variables, then flags; later layers win."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create and extend a cluster TLS directory (CA, node certificates, token secret, admin
    /// token) that every node of a cluster starts with via --tls-dir.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Make a new data directory from a backup file (`nokv admin backup`). Checks every digest
    /// of FILE before it creates anything; refuses a damaged file and a DIR that is not empty.
    ///
    /// The backup holds every shard's metadata, not the artifact blocks: those stay in the
    /// object provider, so start the restored node with the same provider settings (the same S3
    /// bucket and prefix; with the local provider, move the old DATA_DIR/objects to DIR/objects
    /// first), and never beside the node it was taken from on the same provider. It holds no
    /// secret either: the first start creates a new TLS identity and admin token (copy the old
    /// cluster.secret into DIR first to keep tokens already issued valid).
    RestoreBackup {
        /// The data directory to create (missing or empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// The backup file.
        file: PathBuf,
    },
    /// Measure direct provider PUTs of blocks through the same one-attempt create path the
    /// owner uses — the baseline `nokv bench upload-vs-direct` compares publishing against.
    /// Prints one JSON line; the blocks are deleted afterwards.
    ProviderBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Number of 4 MiB blocks to write.
        #[arg(long, default_value_t = 16)]
        blocks: u32,
        /// Blocks in flight at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
    },
    /// Measure the store alone: 4 KiB small-file writes through the shard write path and the
    /// node committer from tasks in this process (no gRPC, TLS or client), at each session
    /// count. Opens its own node under --data-dir (not a running daemon's). Prints one JSON
    /// line per session count.
    StoreBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// Concurrent writers per measurement, each on its own workspace.
        #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
        sessions: Vec<usize>,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Commit without redb's quick repair (the daemon always sets it): to measure what it
        /// costs.
        #[arg(long)]
        no_quick_repair: bool,
    },
    /// Measure start-up after kill -9: fills the node file under --data-dir with --fill-files
    /// 4 KiB files through the shard write path (once; later runs reuse it), then per round kills a writer
    /// child right after a periodic durable commit and times the next open of the node file,
    /// with redb's quick repair off and on, page cache kept (warm) and dropped (cold); then
    /// times the periodic durable commit both ways. Prints one JSON line per measurement and a
    /// summary. Use a data dir of its own (not a running daemon's).
    RestartBench {
        #[command(flatten)]
        serve: Box<ServeArgs>,
        /// New 4 KiB files the fill writes first (100,000 make a node file of about 1.1 GiB).
        #[arg(long, default_value_t = 100_000)]
        fill_files: u64,
        /// Rounds; each crashes and reopens once per mode and page-cache state.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Pairs of flush runs (quick repair off and on, alternating).
        #[arg(long, default_value_t = 5)]
        flush_rounds: usize,
        /// Durable commits timed per flush run.
        #[arg(long, default_value_t = 100)]
        flushes: usize,
        /// The writer the bench runs as a child process (internal).
        #[arg(long, value_enum, hide = true)]
        child: Option<RestartChild>,
        /// The child commits without quick repair (internal).
        #[arg(long, hide = true)]
        no_quick_repair: bool,
    },
    /// Measure the transport's floor: serve `Write` on the daemon's TLS and HTTP/2 settings
    /// doing only what no store can skip (authenticate, validate, make the body durable in a
    /// scratch file, answer). A measuring instrument for `nokv bench limits`, never a store:
    /// it answers writes it does not keep. Serves until SIGINT/SIGTERM.
    RpcFloor {
        /// A daemon's data directory: its TLS identity and token secret are used (read only).
        #[arg(long)]
        data_dir: PathBuf,
        /// Scratch file the bodies are written to (created; 16 MiB, zeroed first).
        #[arg(long)]
        scratch: PathBuf,
        /// Listen address; port 0 picks a free port.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where each body's durable write runs: `writer` (handed to one writer thread that
        /// fsyncs once for every body waiting, as the node committer does) or `inline` (on the
        /// async worker that received the call).
        #[arg(long, value_enum, default_value = "writer")]
        durable: crate::instruments::rpc_floor::Durable,
    },
    /// Ask a daemon's gRPC health service over TLS, for container probes (Kubernetes' `grpc:`
    /// probe speaks plaintext; the daemon's port is TLS-only). Needs no token. Exit 0 when the
    /// daemon answered SERVING (with --answering: answered at all), 1 otherwise, within
    /// --timeout.
    ///
    /// Example: nokv-server probe --ca /cluster/ca.pem --server-name nokv-0.nokv.ns.svc.cluster.local
    Probe {
        /// The daemon's endpoint, https://HOST:PORT.
        #[arg(long, default_value = "https://127.0.0.1:7878")]
        endpoint: String,
        /// The name the daemon's certificate must have, when it is not the endpoint's HOST
        /// (a pod probing itself on 127.0.0.1 with its advertised name; no DNS involved).
        #[arg(long)]
        server_name: Option<String>,
        /// CA file (PEM) the daemon's certificate is signed by (a cluster's ca.pem, or a data
        /// dir's dev CA).
        #[arg(long)]
        ca: PathBuf,
        /// Succeed when the daemon answers at all, SERVING or not (a liveness probe: restart
        /// only a process that no longer answers, not one waiting out a full disk).
        #[arg(long)]
        answering: bool,
        /// Give up after this long, e.g. 5s [default: 5s].
        #[arg(long, default_value = "5s")]
        timeout: String,
    },
    /// Start again from a damaged or missing redo log (`shards/node.redo`) that start-up
    /// refuses. Without --accept-loss it only reports what is wrong and which batches would
    /// be dropped; with it, it keeps the node file's durable state and every log record before
    /// the damage, moves the damaged log aside (`node.redo.damaged-<time>`), creates a fresh
    /// one, and reports exactly which sequence numbers it dropped. Prefer restoring from a
    /// backup (`nokv admin backup` / `nokv-server restore-backup`): the dropped batches were
    /// acknowledged. The daemon must be stopped.
    ///
    /// Example: nokv-server recover --data-dir /var/lib/nokv --accept-loss
    Recover {
        /// The data directory the daemon refuses to start on.
        #[arg(long)]
        data_dir: PathBuf,
        /// Drop what cannot be read back and start again (never the default).
        #[arg(long)]
        accept_loss: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What a `restart-bench` child process does (see [`crate::instruments::restart_bench`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartChild {
    /// Writes new files until the node file is large enough, then ends.
    Fill,
    /// Overwrites files until the bench kills it.
    Write,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a bearer token signed with the data directory's cluster secret.
    Issue {
        /// Data directory (or cluster directory from `cluster init`) holding cluster.secret.
        #[arg(long, env = "NOKV_DATA_DIR", default_value = "./nokv-data")]
        data_dir: PathBuf,
        /// Workspace name or pattern (`name`, `prefix*`, `*`); repeat for several.
        #[arg(long, required = true)]
        workspace: Vec<String>,
        /// read | write | admin
        #[arg(long, default_value = "write")]
        role: String,
        /// Lifetime, e.g. 30d, 12h, 15m, 90s.
        #[arg(long, default_value = "30d")]
        ttl: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Write a new cluster directory: one CA, a certificate per --host (C/nodes/HOST.pem and
    /// .key), the token secret, an admin token and C/client.toml; with --etcd-host, also
    /// certificates for a test/dev etcd (C/etcd/server.pem + .key) and the nodes' etcd client
    /// certificate (C/etcd/client.pem + .key). Never overwrites an existing directory.
    Init {
        /// The cluster directory to create.
        #[arg(long)]
        dir: PathBuf,
        /// A node's host name or IP address, as clients reach it; repeat for several nodes.
        #[arg(long, required = true)]
        host: Vec<String>,
        /// A name or IP address etcd is reached at; repeat for several. Writes C/etcd/server.pem
        /// (for etcd's --cert-file, with --trusted-ca-file C/ca.pem --client-cert-auth) and
        /// C/etcd/client.pem (for the nodes' --etcd-cert), both signed by the cluster CA. For
        /// a test or development etcd: such an etcd trusts every cluster-CA certificate.
        #[arg(long)]
        etcd_host: Vec<String>,
    },
    /// Add a node certificate for --host, signed by the cluster directory's CA; with
    /// --etcd-host, add the etcd certificates `cluster init --etcd-host` writes (refused when
    /// the directory has them).
    Cert {
        /// An existing cluster directory (from `cluster init`).
        #[arg(long)]
        dir: PathBuf,
        /// The new node's host name or IP address; repeat for several.
        #[arg(long, required_unless_present = "etcd_host")]
        host: Vec<String>,
        /// A name or IP address etcd is reached at; repeat for several (see `cluster init`).
        #[arg(long)]
        etcd_host: Vec<String>,
    },
}
