//! Used from build scripts (`[build-dependencies]`) of the packages that
//! link libtorch through torch-sys: gives their binaries and tests an rpath
//! to libtorch, so that they run without `LD_LIBRARY_PATH`, and forces
//! libtorch's CUDA library in where [`Cuda`] says so. Loading
//! `libtorch_cuda.so` registers the CUDA backend, and since nothing names
//! one of its symbols the linker (`--as-needed`) would drop it, and the
//! binary would never see a GPU.
//!
//! torch-sys reports libtorch's `lib/` as `DEP_TCH_LIBTORCH_LIB` to the
//! build scripts of the packages that depend on it directly.

use std::path::PathBuf;

/// When libtorch's CUDA library is forced in (only ever where this
/// libtorch has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cuda {
    /// Never: the package needs no GPU.
    Never,
    /// With `TENSILE_LINK_CUDA=1` (what `scripts/gpu-pack.sh` sets): builds
    /// for a CPU machine leave it out, so that every process does not load
    /// the CUDA libraries for nothing.
    IfAsked,
    /// Always.
    Always,
}

/// libtorch's `lib/`, as torch-sys reports it to this build script; none
/// when this package does not depend on torch-sys directly.
pub fn libtorch_lib() -> Option<PathBuf> {
    std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from)
}

/// Prints the link arguments: the rpath to libtorch's `lib/`, and the CUDA
/// library as `cuda` says. Nothing where torch-sys reported no libtorch.
/// Returns libtorch's `lib/`.
pub fn link(cuda: Cuda) -> Option<PathBuf> {
    if cuda == Cuda::IfAsked {
        println!("cargo:rerun-if-env-changed=TENSILE_LINK_CUDA");
    }
    let lib = libtorch_lib()?;
    for arg in link_args(
        &lib,
        cuda,
        std::env::var("TENSILE_LINK_CUDA").ok().as_deref(),
    ) {
        println!("cargo:rustc-link-arg={arg}");
    }
    Some(lib)
}

/// The link arguments for libtorch in `lib`, `asked` being
/// `TENSILE_LINK_CUDA`.
fn link_args(lib: &std::path::Path, cuda: Cuda, asked: Option<&str>) -> Vec<String> {
    let mut args = vec![format!("-Wl,-rpath,{}", lib.display())];
    let wanted = match cuda {
        Cuda::Never => false,
        Cuda::IfAsked => asked == Some("1"),
        Cuda::Always => true,
    };
    if wanted && lib.join("libtorch_cuda.so").exists() {
        args.push("-Wl,--no-as-needed,-ltorch_cuda,--as-needed".to_string());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    const RPATH: &str = "-Wl,-rpath,";
    const CUDA: &str = "-Wl,--no-as-needed,-ltorch_cuda,--as-needed";

    #[test]
    fn the_rpath_always_and_cuda_only_where_asked_and_present() {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let dir = tmp.path();
        let rpath = format!("{RPATH}{}", dir.display());
        let only_rpath = vec![rpath.clone()];
        // No CUDA library here: never forced in.
        for cuda in [Cuda::Never, Cuda::IfAsked, Cuda::Always] {
            assert_eq!(link_args(dir, cuda, Some("1")), only_rpath);
        }
        std::fs::write(dir.join("libtorch_cuda.so"), b"").expect("a stand-in libtorch_cuda.so");
        assert_eq!(link_args(dir, Cuda::Never, Some("1")), only_rpath);
        assert_eq!(link_args(dir, Cuda::IfAsked, None), only_rpath);
        assert_eq!(link_args(dir, Cuda::IfAsked, Some("0")), only_rpath);
        assert_eq!(
            link_args(dir, Cuda::IfAsked, Some("1")),
            [rpath.clone(), CUDA.to_string()]
        );
        assert_eq!(
            link_args(dir, Cuda::Always, None),
            [rpath, CUDA.to_string()]
        );
    }
}
