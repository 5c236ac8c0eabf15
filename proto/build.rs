//! Generates the vallum.v1 code with protox (a pure-Rust protobuf compiler), so no system
//! `protoc` is needed, and writes the file descriptor set used by gRPC server reflection.
//! Also generates the client of the etcd v3 API subset in `etcd/rpc.proto` (fleet mode).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["vallum/v1/vallum.proto", "vallum/v1/fleet.proto"];
    let etcd = "etcd/rpc.proto";
    for p in protos.iter().chain([&etcd]) {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("vallum_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Requests that do not decode are INVALID_ARGUMENT (src/codec.rs).
        .codec_path("crate::codec::Codec")
        .compile_fds(fds)?;
    // Client only: vallumd talks to etcd, it does not serve its API.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(protox::compile([etcd], ["."])?)?;
    Ok(())
}
