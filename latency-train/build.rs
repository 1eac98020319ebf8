//! Compiles `proto/onnx.proto` (a subset of ONNX's public schema) with protox
//! (pure Rust, no system protoc) into prost messages, and gives this
//! package's tests an rpath to libtorch so they run without
//! `LD_LIBRARY_PATH` (and libtorch's CUDA library with `TENSILE_LINK_CUDA=1`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    // Its tests time kernels on CUDA (`measure::clock`) in the GPU bundle.
    tensile_libtorch_link::link(tensile_libtorch_link::Cuda::IfAsked);
    Ok(())
}
