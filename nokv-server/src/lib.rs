//! nokv-server: a sharded, owner-mediated block store daemon for agent workspaces.
//!
//! Layering, top to bottom (arrows point down only):
//! `server` (composition) → `service` (gRPC: auth, names, routing, status mapping) →
//! `node` (which shards, where) → `shard` (gate, files, replay, sequencer) →
//! `meta` (redb, the only durable truth) and `object` (object_store, the only provider I/O).

pub mod audit;
pub mod auth;
pub mod backup;
pub mod bootstrap;
pub mod bulk;
pub mod cluster;
pub mod cluster_tls;
pub mod config;
pub mod control;
pub mod dir_lock;
pub mod error;
pub mod events;
pub mod fair_read;
pub mod fsync_latch;
pub mod glob;
pub mod ids;
pub mod instruments;
pub mod inventory;
pub mod logging;
pub mod memory;
pub mod meta;
pub mod metrics;
pub mod names;
pub mod node;
pub mod object;
pub mod peer_probe;
pub mod pki;
pub mod placement;
pub mod pressure;
pub mod provider_log;
pub mod route;
pub mod server;
pub mod service;
pub mod shard;
pub mod standalone;
pub mod takeover;
pub mod token;
