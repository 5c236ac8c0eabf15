//! Generates the vallum.v1 code with protox (a pure-Rust protobuf compiler), so no system
//! `protoc` is needed, and writes the file descriptor set used by gRPC server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "vallum/v1/vallum.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
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
    Ok(())
}
