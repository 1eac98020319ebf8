//! Gives the `tensile-worker` binary and its tests an rpath to libtorch, so
//! they run without `LD_LIBRARY_PATH`.
fn main() {
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
