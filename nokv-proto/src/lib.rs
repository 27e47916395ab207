//! The `nokv.v1` protobuf package: generated messages, the `Workspace` and `Admin` services,
//! and the file descriptor set that server reflection publishes. Nothing else lives here, so
//! both the server and the client depend on this crate and never on each other.

pub mod v1 {
    tonic::include_proto!("nokv.v1");

    /// Encoded `FileDescriptorSet` of the package, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("nokv_descriptor");
}
