//! Vallum's gRPC API, package `vallum.v1`, generated at build time from
//! `proto/vallum/v1/vallum.proto` with protox and tonic-prost-build (no system protoc).

pub mod codec;

/// The `vallum.v1` package: messages, clients (`*_client`) and servers (`*_server`).
pub mod v1 {
    tonic::include_proto!("vallum.v1");
}

/// The encoded `FileDescriptorSet` of the API, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("vallum_descriptor");
