//! The nokv Rust SDK: a TLS gRPC client for the `nokv.v1` API with typed errors and
//! request-id retries, plus the pieces the `nokv` CLI is built from.
//!
//! Depends on `nokv-proto` only — never on the server.

pub mod channel;
pub mod config;
pub mod dir;
pub mod error;
pub mod launch;
pub mod publish;
mod receipt;
pub mod restore;
pub mod route;
pub mod sdk;

pub use config::ClientConfig;
pub use error::{ClientError, Reason};
pub use sdk::Client;
