//! The gRPC services. They authenticate, validate names (through [`crate::names`] only),
//! route to the owning shard and map the typed error to a status — nothing more.

pub mod admin;
pub mod body_admission;
pub mod workspace;
