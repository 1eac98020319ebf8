//! Tidy checks over the workspace's own Rust sources, in the manner of
//! rust-analyzer's `xtask/src/tidy.rs`: every `.rs` file starts with a `//!`
//! comment that says what it is for, and stays under [`MAX_LINES`] lines. Build output, the Python virtualenv and
//! hidden directories are not ours and are skipped; generated code lives
//! in `target/` (`OUT_DIR`), so it is skipped with it. And the lean
//! crates stay lean: the scheduler's and the Python extension's
//! dependency trees hold no simulator, baseline or experiment crate, and
//! the extension's (and the session's) no libtorch.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The most lines a source file may have. Well over what a module should
/// be ("a few hundred lines"); a file this long wants splitting.
const MAX_LINES: usize = 1000;

/// Files allowed over [`MAX_LINES`], as paths from the workspace root, each
/// with why it cannot be split yet. Keep it empty; a listed file that is no
/// longer over the cap fails the test, so the list cannot go stale.
const LONG_FILES: &[(&str, &str)] = &[];

/// Directory names never searched, wherever they are: build output (`out`
/// is where experiments write, ignored by git). Hidden directories (`.git`,
/// `.venv`, `.cargo`, ...) and symbolic links are skipped too.
const SKIP_DIRS: &[&str] = &["target", "out", "node_modules", "__pycache__"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace root")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, sorted, not following symbolic links.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let kind = entry.file_type().expect("file type");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if kind.is_dir() {
            if !name.starts_with('.') && !SKIP_DIRS.contains(&name.as_ref()) {
                rust_files(&path, out);
            }
        } else if kind.is_file() && name.ends_with(".rs") {
            out.push(path);
        }
    }
    out.sort();
}

/// What is wrong with one file's text, if anything.
fn problems(text: &str, max_lines: usize, long_ok: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !text.starts_with("//!") {
        out.push("does not start with a `//!` comment saying what the file is for".to_string());
    }
    let lines = text.lines().count();
    if lines > max_lines && !long_ok {
        out.push(format!(
            "has {lines} lines, over the cap of {max_lines}: split it \
             (or list it in LONG_FILES in tests/tests/tidy.rs, saying why)"
        ));
    }
    out
}

fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.to_string_lossy().replace('\\', "/")
}

#[test]
fn every_source_file_has_a_module_doc_and_stays_small() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    // The workspace has well over a hundred files: finding few means the
    // walk went wrong, and the test would pass vacuously.
    assert!(files.len() > 100, "found only {} .rs files", files.len());
    let mut bad = Vec::new();
    for path in &files {
        let rel = relative(&root, path);
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let long_ok = LONG_FILES.iter().any(|&(f, _)| f == rel);
        for p in problems(&text, MAX_LINES, long_ok) {
            bad.push(format!("{rel} {p}"));
        }
    }
    assert!(bad.is_empty(), "tidy:\n{}", bad.join("\n"));
}

#[test]
fn every_listed_long_file_is_still_long() {
    let root = workspace_root();
    for &(file, why) in LONG_FILES {
        assert!(!why.trim().is_empty(), "{file}: say why it is long");
        let text = fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("LONG_FILES lists {file}: {e}"));
        assert!(
            text.lines().count() > MAX_LINES,
            "{file} is under {MAX_LINES} lines now: take it off LONG_FILES"
        );
    }
}

#[test]
fn the_checks_catch_what_they_are_for() {
    assert!(problems("//! Doc.\nfn f() {}\n", 10, false).is_empty());
    let undocumented = problems("fn f() {}\n", 10, false);
    assert_eq!(undocumented.len(), 1);
    assert!(undocumented[0].contains("`//!`"), "{undocumented:?}");
    // A plain or outer doc comment is not a module doc.
    assert_eq!(problems("// Note.\nfn f() {}\n", 10, false).len(), 1);
    assert_eq!(problems("/// Doc.\nfn f() {}\n", 10, false).len(), 1);
    let long = format!("//! Doc.\n{}", "fn f() {}\n".repeat(10));
    assert_eq!(problems(&long, 10, false).len(), 1);
    assert!(problems(&long, 10, true).is_empty());
}

/// The packages `package` depends on to build and run (`cargo tree -e
/// normal,build`, offline, from the lock file), one name each.
fn dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", package, "-e", "normal,build"])
        .args(["--prefix", "none", "--offline", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The simulator (`tensile-executor`), the baselines and the experiments:
/// what serving and the extension must not drag in.
const HEAVY: &[&str] = &[
    "tensile-experiments",
    "tensile-baselines",
    "tensile-executor",
];
/// libtorch's bindings: what runs inside a user's PyTorch process must not
/// link a second libtorch.
const TORCH: &[&str] = &["tch", "torch-sys"];

#[test]
fn the_scheduler_and_the_extension_plan_without_the_simulator() {
    for (package, forbidden) in [
        ("tensile-scheduler", HEAVY.to_vec()),
        ("tensile-python", [HEAVY, TORCH].concat()),
        ("tensile-session", [HEAVY, TORCH].concat()),
        ("tensile-plan-job", [HEAVY, TORCH].concat()),
    ] {
        let deps = dependencies(package);
        // A listing that names the planner is a real one.
        assert!(
            deps.iter().any(|d| d == "tensile-planner"),
            "{package}: no tensile-planner in {deps:?}"
        );
        let found: Vec<&String> = deps
            .iter()
            .filter(|d| forbidden.contains(&d.as_str()))
            .collect();
        assert!(found.is_empty(), "{package} depends on {found:?}");
    }
}
