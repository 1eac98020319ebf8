//! Gives the `tensile-latency` binary and its tests an rpath to libtorch
//! (linked through tensile-latency-train), so they run without
//! `LD_LIBRARY_PATH`. With `TENSILE_LINK_CUDA=1` (what
//! `scripts/gpu-pack.sh` sets) it also forces libtorch's CUDA library in,
//! which nothing names but which must be loaded for libtorch to see a GPU
//! (CUDA latency profiling).
fn main() {
    println!("cargo:rerun-if-env-changed=TENSILE_LINK_CUDA");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        let cuda = std::path::Path::new(&lib).join("libtorch_cuda.so").exists();
        if cuda && std::env::var("TENSILE_LINK_CUDA").as_deref() == Ok("1") {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
