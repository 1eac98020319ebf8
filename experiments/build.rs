//! Gives this crate's tests an rpath to libtorch (linked through
//! tensile-latency-model), so they run without `LD_LIBRARY_PATH`.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
