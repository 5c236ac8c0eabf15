//! Vallum's gRPC API, package `vallum.v1`, generated at build time from
//! `proto/vallum/v1/vallum.proto` and `fleet.proto` with protox and tonic-prost-build (no
//! system protoc), and the client of the etcd v3 API subset fleet mode uses
//! (`proto/etcd/rpc.proto`).

pub mod codec;
pub mod local;

/// The `vallum.v1` package: messages, clients (`*_client`) and servers (`*_server`).
pub mod v1 {
    tonic::include_proto!("vallum.v1");
}

/// The encoded `FileDescriptorSet` of the API, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("vallum_descriptor");

/// The subset of etcd's v3 API (package `etcdserverpb`) that fleet mode uses: clients only.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
