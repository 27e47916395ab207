//! Measuring instruments, run as `nokv-server` subcommands: never on the serving path, and
//! nothing on the serving path depends on them (the arrows point from here into the store,
//! not back). Each measures one layer alone, so a benchmark can say which layer a cost
//! belongs to:
//! * [`provider_bench`]: direct provider PUTs of blocks through the owner's one-attempt create
//!   path — the baseline a publish through the daemon is compared with;
//! * [`store_bench`]: small-file writes through the shard write path and the node committer,
//!   no gRPC, TLS or client;
//! * [`restart_bench`]: the open after kill -9, with redb's quick repair off and on;
//! * [`rpc_floor`]: the transport's floor — a `Write` that authenticates, validates, makes the
//!   body durable in a scratch file and answers, storing nothing: a floor, never a store.

pub mod provider_bench;
pub mod restart_bench;
pub mod rpc_floor;
pub mod store_bench;
