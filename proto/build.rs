//! Compiles `tensile/v1/tensile.proto` with protox (pure Rust, no system
//! protoc) and generates prost messages plus the tonic client and server.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "tensile/v1/tensile.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
