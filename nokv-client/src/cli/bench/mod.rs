//! `nokv bench`: the probe's workers (`session`, `upload`) and the side-by-side benchmarks.

mod agent_loop;
mod cluster;
mod cluster_dir;
mod compare;
mod cpu;
mod durability;
mod failover;
mod harness;
mod limits;
mod load;
mod loops;

use std::path::PathBuf;

use clap::Subcommand;
use nokv_client::{Client, ClientError};
use serde_json::json;

use super::output::Output;
use load::BenchEnv;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// An agent's tool loop (stat a file, write a 4 KiB file), one JSON line per operation.
    #[command(
        after_help = "Examples:\n  nokv bench session --workspace probe-1 --seconds 30\n  nokv bench session --workspace probe-1 --rate 2"
    )]
    Session {
        /// Workspace to stat and write files in.
        #[arg(long)]
        workspace: String,
        /// Stop after this many seconds (default: run until SIGTERM/SIGINT).
        #[arg(long)]
        seconds: Option<f64>,
        /// Size of each written file, in bytes.
        #[arg(long, default_value_t = 4096)]
        file_size: usize,
        /// Open loop: start a stat/write pair this many times per second on average, with a
        /// jittered think time between pairs, as an agent between model turns does (default:
        /// closed loop, each pair right after the last one answered).
        #[arg(long)]
        rate: Option<f64>,
    },
    /// Publish artifacts back to back, one JSON line per artifact.
    #[command(
        after_help = "Examples:\n  nokv bench upload --workspace probe-up --size-mib 16 --seconds 30\n  nokv bench upload --workspace probe-up --pace 50"
    )]
    Upload {
        /// Workspace to publish the artifacts into.
        #[arg(long)]
        workspace: String,
        /// Size of each artifact, in MiB.
        #[arg(long, default_value_t = 16)]
        size_mib: u64,
        /// Average MiB/s to pace to (default: unpaced).
        #[arg(long)]
        pace: Option<f64>,
        /// Stop after this many seconds (default: run until SIGTERM/SIGINT).
        #[arg(long)]
        seconds: Option<f64>,
    },
    /// 4 KiB durable writes, nokv vs etcd, at each client count (default 1 and 8), with the
    /// server's and the client's CPU time per operation.
    #[command(
        after_help = "Examples:\n  nokv bench put-vs-etcd\n  nokv bench put-vs-etcd --clients 1,8,64 --metadata-durability provider"
    )]
    PutVsEtcd {
        #[command(flatten)]
        env: EnvArgs,
        /// Concurrent clients per measurement, e.g. 1,8,64.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        clients: Vec<usize>,
        /// provider: also measure a node that acknowledges only once a write is durable in
        /// the object provider (a one-node cluster on moto), beside local and etcd, with the
        /// provider PUTs per second.
        #[arg(long, value_enum, default_value = "local")]
        metadata_durability: durability::Durability,
    },
    /// What bounds a 4 KiB put here, at each client count in one run: the store alone
    /// (`nokv-server store-bench`, no RPC), a bare TLS RPC (the transport's ceiling), a
    /// refused 4 KiB write (everything but the store), the nokv put,
    /// etcd's put in plaintext and over TLS, each with server and client CPU per operation.
    #[command(
        after_help = "Examples:\n  nokv bench limits\n  nokv bench limits --clients 1,8 --seconds 10"
    )]
    Limits {
        #[command(flatten)]
        env: EnvArgs,
        /// Concurrent clients per measurement, e.g. 1,8,64.
        #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
        clients: Vec<usize>,
    },
    /// nokv Stat p50 vs a bare unary RPC on the same TLS channel.
    #[command(
        after_help = "Examples:\n  nokv bench stat-vs-rpc\n  nokv bench stat-vs-rpc --seconds 10"
    )]
    StatVsRpc {
        #[command(flatten)]
        env: EnvArgs,
    },
    /// Publish through the owner vs direct provider PUTs of the same blocks.
    #[command(
        after_help = "Examples:\n  nokv bench upload-vs-direct --providers local\n  nokv bench upload-vs-direct --size-mib 256 --rounds 3"
    )]
    UploadVsDirect {
        #[command(flatten)]
        env: EnvArgs,
        /// Size of the published file, in MiB.
        #[arg(long, default_value_t = 64)]
        size_mib: u64,
        /// Providers to measure: local, s3 (moto, started by the bench).
        #[arg(long, value_delimiter = ',', default_value = "local,s3")]
        providers: Vec<String>,
        /// Rounds per provider (the best is reported).
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Blocks in flight, the same for the publish, the restore and the direct PUTs.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        parallel: u32,
    },
    /// Small-write ops/s at 1, 8 and 64 concurrent sessions, etcd at the same counts in the
    /// same run, with the nokv/etcd ratio and CPU time per operation.
    #[command(
        after_help = "Examples:\n  nokv bench scaling\n  nokv bench scaling --metadata-durability provider"
    )]
    Scaling {
        #[command(flatten)]
        env: EnvArgs,
        /// provider: also measure a provider-durability node (see put-vs-etcd).
        #[arg(long, value_enum, default_value = "local")]
        metadata_durability: durability::Durability,
    },
    /// Cluster mode's costs: put p50 of a one-node cluster vs the embedded daemon (alternating
    /// rounds), then shard handoff times between two nodes. Starts etcd, moto and the daemons.
    /// With --json, prints one JSON document instead of the tables.
    #[command(
        after_help = "Examples:\n  nokv bench cluster\n  nokv --json bench cluster --kills 0"
    )]
    Cluster {
        #[command(flatten)]
        env: EnvArgs,
        /// Concurrent clients per put measurement.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        clients: Vec<usize>,
        /// Put rounds per daemon and client count, each --seconds long, alternating daemons.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Shard moves to time (back and forth between the two nodes).
        #[arg(long, default_value_t = 10)]
        moves: u32,
        /// Small files (1 KiB) written into the moved shard before the moves.
        #[arg(long, default_value_t = 400)]
        files: u32,
        /// Crash failovers to time on a 3-node provider-durability cluster: the owner of a
        /// workspace's shard is killed (-9) and its data dir deleted; 0 skips them.
        #[arg(long, default_value_t = 10)]
        kills: u32,
        /// 4 KiB files written into the killed owners' shard before the first kill: failover
        /// time against the size of the shard the taker restores and checkpoints.
        #[arg(long, default_value_t = 0)]
        kill_files: u32,
    },
    /// An agent's loop (grep a regex, read the matching file, edit it, stat it) with grep and
    /// edit done by the server vs the same loop done client-side (list + read every file + a
    /// local regex, then a conditional write), at each session count: p50/p99 per tool.
    /// Starts its own daemon. With --json, prints one JSON document instead of the table.
    #[command(
        after_help = "Examples:\n  nokv bench agent-loop\n  nokv bench agent-loop --sessions 1,8,32 --files 500"
    )]
    AgentLoop {
        #[command(flatten)]
        env: EnvArgs,
        /// Concurrent sessions per measurement, each on its own workspace.
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        sessions: Vec<usize>,
        /// Files in each session's workspace.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
        files: u64,
        /// Approximate size of each file, in bytes.
        #[arg(long, default_value_t = 4096)]
        file_size: usize,
    },
    /// Every comparison above but cluster, in one run.
    #[command(
        after_help = "Examples:\n  nokv bench all\n  nokv bench all --seconds 10 --out bench-out"
    )]
    All {
        #[command(flatten)]
        env: EnvArgs,
    },
}

#[derive(Debug, clap::Args)]
pub struct EnvArgs {
    /// nokv-server binary to start (default: next to this nokv).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Where daemons, etcd and scratch files live (one disk for every store).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Directory for JSON reports.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

impl EnvArgs {
    fn env(&self) -> BenchEnv {
        BenchEnv {
            server_bin: self
                .server_bin
                .clone()
                .unwrap_or_else(harness::default_server_bin),
            work_dir: self.work_dir.clone().unwrap_or_else(std::env::temp_dir),
            seconds: self.seconds,
        }
    }
}

/// Worker commands use the CLI's connection settings; comparisons start their own daemon.
pub async fn run(
    cmd: BenchCommand,
    out: Output,
    connect: impl AsyncFnOnce() -> Result<Client, ClientError>,
) -> Result<(), ClientError> {
    match cmd {
        BenchCommand::Session {
            workspace,
            seconds,
            file_size,
            rate,
        } => {
            if let Some(r) = rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
                return Err(ClientError::usage(format!(
                    "--rate must be a positive number of pairs per second, not {r}"
                )));
            }
            loops::session(&connect().await?, &workspace, seconds, file_size, rate).await;
            Ok(())
        }
        BenchCommand::Upload {
            workspace,
            size_mib,
            pace,
            seconds,
        } => {
            loops::upload(&connect().await?, &workspace, size_mib, pace, seconds).await;
            Ok(())
        }
        BenchCommand::PutVsEtcd {
            env,
            clients,
            metadata_durability,
        } => {
            let e = env.env();
            measured(
                &env.out,
                "put-vs-etcd",
                compare::put_vs_etcd(&e, &clients, metadata_durability),
            )
            .await
        }
        BenchCommand::Limits { env, clients } => {
            let e = env.env();
            measured(&env.out, "limits", limits::limits(&e, &clients)).await
        }
        BenchCommand::StatVsRpc { env } => {
            let e = env.env();
            measured(&env.out, "stat-vs-rpc", compare::stat_vs_rpc(&e)).await
        }
        BenchCommand::UploadVsDirect {
            env,
            size_mib,
            providers,
            rounds,
            parallel,
        } => {
            let e = env.env();
            let bench =
                compare::upload_vs_direct(&e, size_mib, &providers, rounds, parallel as usize);
            measured(&env.out, "upload-vs-direct", bench).await
        }
        BenchCommand::Scaling {
            env,
            metadata_durability,
        } => {
            let e = env.env();
            measured(
                &env.out,
                "scaling",
                compare::scaling(&e, metadata_durability),
            )
            .await
        }
        BenchCommand::Cluster {
            env,
            clients,
            rounds,
            moves,
            files,
            kills,
            kill_files,
        } => {
            let bench = cluster::ClusterBench {
                clients,
                rounds,
                moves,
                files,
                kills,
                kill_files,
            };
            let (report, text) = cluster::run(&env.env(), &bench).await?;
            let path = harness::save_report(&env.out, "cluster", &report)?;
            out.emit(report, || {
                format!("{text}\nreport written to {}", path.display())
            });
            Ok(())
        }
        BenchCommand::AgentLoop {
            env,
            sessions,
            files,
            file_size,
        } => {
            let bench = agent_loop::AgentLoopBench {
                sessions,
                files: files as usize,
                file_size,
            };
            let (report, text) = agent_loop::run(&env.env(), &bench).await?;
            let path = harness::save_report(&env.out, "agent-loop", &report)?;
            out.emit(report, || {
                format!("{text}\nreport written to {}", path.display())
            });
            Ok(())
        }
        BenchCommand::All { env } => {
            let e = env.env();
            let all = async {
                Ok(json!({
                    "put_vs_etcd": compare::put_vs_etcd(&e, &[1, 8], durability::Durability::Local).await?,
                    "stat_vs_rpc": compare::stat_vs_rpc(&e).await?,
                    "upload_vs_direct": compare::upload_vs_direct(&e, 64, &["local".into(), "s3".into()], 2, 4).await?,
                    "scaling": compare::scaling(&e, durability::Durability::Local).await?,
                }))
            };
            measured(&env.out, "all", all).await
        }
    }
}

/// Runs one comparison and writes its report, with how busy the machine was meanwhile (and
/// how much the hypervisor stole) printed and recorded as `machine`.
async fn measured(
    out: &std::path::Path,
    name: &str,
    bench: impl std::future::Future<Output = Result<serde_json::Value, ClientError>>,
) -> Result<(), ClientError> {
    let machine = cpu::MachineMeter::start();
    let mut report = bench.await?;
    if let Some(m) = machine.finish() {
        println!("{}", m.line());
        if let serde_json::Value::Object(o) = &mut report {
            o.insert("machine".into(), json!(m));
        }
    }
    harness::write_report(out, name, &report).map(drop)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::BenchCommand;
    use crate::cli::{Cli, Command};

    #[test]
    fn bench_put_vs_etcd_defaults_to_one_and_eight_clients_and_takes_a_client_list() {
        let clients_of = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parses");
            let Command::Bench(BenchCommand::PutVsEtcd { clients, .. }) = cli.command else {
                panic!("not bench put-vs-etcd: {:?}", cli.command);
            };
            clients
        };
        assert_eq!(clients_of(&["nokv", "bench", "put-vs-etcd"]), vec![1, 8]);
        assert_eq!(
            clients_of(&["nokv", "bench", "put-vs-etcd", "--clients", "1,8,64"]),
            vec![1, 8, 64]
        );
    }

    #[test]
    fn bench_agent_loop_defaults_to_one_and_eight_sessions_and_takes_a_session_list() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parses");
            let Command::Bench(BenchCommand::AgentLoop {
                sessions, files, ..
            }) = cli.command
            else {
                panic!("not bench agent-loop: {:?}", cli.command);
            };
            (sessions, files)
        };
        assert_eq!(parse(&["nokv", "bench", "agent-loop"]), (vec![1, 8], 200));
        assert_eq!(
            parse(&[
                "nokv",
                "bench",
                "agent-loop",
                "--sessions",
                "2,4",
                "--files",
                "3"
            ]),
            (vec![2, 4], 3)
        );
    }

    #[test]
    fn bench_cluster_defaults_to_one_and_eight_clients_three_rounds_ten_moves_400_files_and_ten_kills()
     {
        let cli = Cli::try_parse_from(["nokv", "bench", "cluster"]).expect("parses");
        let Command::Bench(BenchCommand::Cluster {
            clients,
            rounds,
            moves,
            files,
            kills,
            ..
        }) = cli.command
        else {
            panic!("not bench cluster: {:?}", cli.command);
        };
        assert_eq!(
            (clients, rounds, moves, files, kills),
            (vec![1, 8], 3, 10, 400, 10)
        );
    }

    #[test]
    fn bench_cluster_takes_a_client_list_and_the_global_json_flag() {
        let cli = Cli::try_parse_from([
            "nokv",
            "bench",
            "cluster",
            "--clients",
            "1,4",
            "--rounds",
            "2",
            "--moves",
            "5",
            "--files",
            "50",
            "--kills",
            "3",
            "--kill-files",
            "200",
            "--seconds",
            "2",
            "--json",
        ])
        .expect("parses");
        assert!(cli.json);
        let Command::Bench(BenchCommand::Cluster {
            clients,
            rounds,
            moves,
            files,
            kills,
            kill_files,
            env,
        }) = cli.command
        else {
            panic!("not bench cluster: {:?}", cli.command);
        };
        assert_eq!(
            (clients, rounds, moves, files, kills, kill_files),
            (vec![1, 4], 2, 5, 50, 3, 200)
        );
        assert_eq!(env.seconds, 2.0);
    }
}
