//! Compiles the boxed-dispatch shim (`csrc/shim.cpp`) against the libtorch
//! that torch-sys links (its headers under `$LIBTORCH/include`, C++17, the
//! same `_GLIBCXX_USE_CXX11_ABI` as torch-sys), and gives this package's tests
//! an rpath to libtorch and, when this libtorch has it, the CUDA library
//! forced in (so that a binary built here can use a GPU where one exists; on
//! CPU machines it is unused).
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let lib = tensile_libtorch_link::libtorch_lib()
        .ok_or("torch-sys reported no DEP_TCH_LIBTORCH_LIB")?;
    let root = match std::env::var("LIBTORCH") {
        Ok(dir) => PathBuf::from(dir),
        // torch-sys reports `<libtorch>/lib`; the headers are beside it.
        Err(_) => lib
            .parent()
            .ok_or("DEP_TCH_LIBTORCH_LIB has no parent directory")?
            .to_path_buf(),
    };
    let include = root.join("include");
    if !include.join("ATen").is_dir() {
        return Err(format!("no ATen headers under {}", include.display()).into());
    }
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/shim.cpp")
        .compile("tensile_kernels_shim");
    tensile_libtorch_link::link(tensile_libtorch_link::Cuda::Always);
    Ok(())
}
