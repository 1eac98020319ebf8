//! Compiles `tensile/v1/tensile.proto` with protox (pure Rust, no system
//! protoc) and generates prost messages plus the tonic client and server.
//! Also writes the encoded file descriptor set, which the scheduler's gRPC
//! reflection service serves (grpcurl, grpc_health_probe need it).
use protox::prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "tensile/v1/tensile.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("tensile_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
