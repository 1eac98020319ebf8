//! Compiles `proto/onnx.proto` (a subset of ONNX's public schema) with protox
//! (pure Rust, no system protoc) into prost messages, and gives this
//! package's tests an rpath to libtorch so they run without
//! `LD_LIBRARY_PATH`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    tensile_libtorch_link::link(tensile_libtorch_link::Cuda::Never);
    Ok(())
}
