//! The onnxruntime wheel of the Python environment this executable is
//! installed in. A wheel puts its binaries in the environment's scripts
//! folder (`PREFIX/bin`, the `tensile` wheel does so with
//! `tensile-scheduler`) and its packages in `PREFIX/lib/pythonX.Y/site-packages`
//! (`dist-packages` on Debian's system Python, `lib64` on some
//! distributions), so the binary finds the onnxruntime wheel's library
//! in `.../onnxruntime/capi/` under its own prefix. A virtual environment
//! that sees its base interpreter's packages (`include-system-site-packages
//! = true` in its `pyvenv.cfg`, as Ray's pip runtime environments are
//! made) may have onnxruntime there instead: the base prefix, the parent
//! of the config's `home`, is searched after the environment's own.

use std::path::{Path, PathBuf};

/// The ONNX Runtime library of the onnxruntime wheel installed beside the
/// executable `exe` (`PREFIX/bin/NAME`), if any.
pub(super) fn beside(exe: &Path) -> Option<PathBuf> {
    in_environment(exe.parent()?.parent()?)
}

/// The ONNX Runtime library of the onnxruntime wheel installed in the
/// Python environment `prefix` (`sys.prefix`), if any.
pub(super) fn in_environment(prefix: &Path) -> Option<PathBuf> {
    prefixes(prefix).iter().find_map(|p| in_prefix(p))
}

/// `prefix`, then its base interpreter's prefix when `prefix` is a virtual
/// environment that includes the system's packages.
fn prefixes(prefix: &Path) -> Vec<PathBuf> {
    let mut out = vec![prefix.to_path_buf()];
    let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg")) else {
        return out;
    };
    let value = |key: &str| {
        cfg.lines().find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let system = value("include-system-site-packages").is_some_and(|v| v == "true");
    if system
        && let Some(home) = value("home")
        && let Some(base) = Path::new(&home).parent()
    {
        out.push(base.to_path_buf());
    }
    out
}

/// `PREFIX/{lib,lib64}/python3*/{site,dist}-packages/onnxruntime/capi/libonnxruntime.so*`,
/// the first in name order.
fn in_prefix(prefix: &Path) -> Option<PathBuf> {
    for lib in ["lib", "lib64"] {
        for python in sorted_entries(&prefix.join(lib), "python3") {
            for packages in ["site-packages", "dist-packages"] {
                let capi = python.join(packages).join("onnxruntime").join("capi");
                if let Some(found) = sorted_entries(&capi, "libonnxruntime.so")
                    .into_iter()
                    .find(|p| p.is_file())
                {
                    return Some(found);
                }
            }
        }
    }
    None
}

/// The entries of `dir` whose names start with `prefix`, sorted; none when
/// `dir` cannot be read.
fn sorted_entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty folder (removed when dropped) to lay out environments in.
    struct Scratch(tempfile::TempDir);

    impl Scratch {
        fn new() -> Scratch {
            Scratch(tempfile::tempdir().expect("scratch folder"))
        }

        /// Creates the file `rel` (and its folders) with some bytes; its path.
        fn file(&self, rel: &str) -> PathBuf {
            let path = self.0.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("folders");
            std::fs::write(&path, b"x").expect("file");
            path
        }
    }

    const CAPI: &str = "onnxruntime/capi";

    #[test]
    fn finds_the_wheel_in_the_environment_of_the_executable() {
        let s = Scratch::new();
        let exe = s.file("venv/bin/tensile-scheduler");
        let lib = s.file(&format!(
            "venv/lib/python3.11/site-packages/{CAPI}/libonnxruntime.so.1.31.1"
        ));
        s.file(&format!(
            "venv/lib/python3.11/site-packages/{CAPI}/libonnxruntime_providers_shared.so"
        ));
        assert_eq!(beside(&exe), Some(lib));
    }

    #[test]
    fn debian_dist_packages_and_lib64_count() {
        let s = Scratch::new();
        let exe = s.file("usr/local/bin/tensile-scheduler");
        let lib = s.file(&format!(
            "usr/local/lib/python3.11/dist-packages/{CAPI}/libonnxruntime.so.1.31.1"
        ));
        assert_eq!(beside(&exe), Some(lib));

        let exe = s.file("opt/bin/tensile-scheduler");
        let lib = s.file(&format!(
            "opt/lib64/python3.12/site-packages/{CAPI}/libonnxruntime.so.1.31.1"
        ));
        assert_eq!(beside(&exe), Some(lib));
    }

    #[test]
    fn a_venv_with_system_packages_falls_back_to_its_base_prefix() {
        let s = Scratch::new();
        let base_lib = s.file(&format!(
            "base/lib/python3.11/site-packages/{CAPI}/libonnxruntime.so.1.31.1"
        ));
        s.file("base/bin/python3.11");
        let exe = s.file("venv/bin/tensile-scheduler");
        let home = s.0.path().join("base/bin");
        let cfg = format!(
            "home = {}\ninclude-system-site-packages = true\nversion = 3.11.7\n",
            home.display()
        );
        std::fs::write(s.0.path().join("venv/pyvenv.cfg"), &cfg).expect("pyvenv.cfg");
        assert_eq!(beside(&exe), Some(base_lib.clone()));

        // The environment's own wheel comes first.
        let own = s.file(&format!(
            "venv/lib/python3.11/site-packages/{CAPI}/libonnxruntime.so.1.31.1"
        ));
        assert_eq!(beside(&exe), Some(own.clone()));
        std::fs::remove_file(&own).expect("remove");

        // Without system packages the base is not searched.
        let isolated = cfg.replace("= true", "= false");
        std::fs::write(s.0.path().join("venv/pyvenv.cfg"), isolated).expect("pyvenv.cfg");
        assert_eq!(beside(&exe), None);
    }

    #[test]
    fn nothing_outside_a_python_environment() {
        let s = Scratch::new();
        // A cargo build: target/debug/NAME.
        let exe = s.file("target/debug/tensile-scheduler");
        assert_eq!(beside(&exe), None);
        // A capi folder without the library.
        s.file(&format!(
            "target/lib/python3.11/site-packages/{CAPI}/__init__.py"
        ));
        assert_eq!(beside(&exe), None);
        assert_eq!(beside(Path::new("/")), None);
    }
}
