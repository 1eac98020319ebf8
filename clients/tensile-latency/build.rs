//! Gives the `tensile-latency` binary and its tests an rpath to libtorch
//! (linked through tensile-latency-train), so they run without
//! `LD_LIBRARY_PATH`; with `TENSILE_LINK_CUDA=1` (what `scripts/gpu-pack.sh`
//! sets) libtorch's CUDA library forced in, which CUDA latency profiling
//! needs ([`tensile_libtorch_link`]).
fn main() {
    tensile_libtorch_link::link(tensile_libtorch_link::Cuda::IfAsked);
}
