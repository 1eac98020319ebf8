//! Gives the `tensile-worker` binary and its tests an rpath to libtorch, so
//! they run without `LD_LIBRARY_PATH`; with `TENSILE_LINK_CUDA=1` (what
//! `scripts/gpu-pack.sh` sets) libtorch's CUDA library forced in, so that
//! it sees a GPU ([`tensile_libtorch_link`]).
fn main() {
    tensile_libtorch_link::link(tensile_libtorch_link::Cuda::IfAsked);
}
