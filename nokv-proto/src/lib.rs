//! The `nokv.v1` protobuf package: generated messages, the `Workspace` and `Admin` services,
//! the file descriptor set that server reflection publishes, and what both ends must agree
//! on (the wire limit, the input lengths, the byte-size syntax, the block checksums). Nothing else lives here, so
//! both the server and the client depend on this crate and never on each other.

/// gRPC message limit of both ends: one 4 MiB block plus generous framing overhead. Defined
/// here, the bottom of the server and the client, so the two cannot drift apart.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024 + 64 * 1024;

/// Longest workspace path (or listing prefix) the server accepts, in bytes. Here so that the
/// client's MCP schemas publish the very limit the server enforces.
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest glob (Find, Grep's path filter) the server accepts, in bytes: a path may be spelt
/// with classes and escapes around it.
pub const MAX_GLOB_BYTES: usize = 8192;

/// Longest regex source Grep compiles, in bytes.
pub const MAX_REGEX_BYTES: usize = 4096;

pub mod block_checksum;
pub mod size;

pub mod v1 {
    tonic::include_proto!("nokv.v1");

    /// Encoded `FileDescriptorSet` of the package, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("nokv_descriptor");
}
