//! Golden outputs: `tensilectl sim --json` for every zoo model alone at
//! batch 16, three ResNet-50s at batch 2 and the mixed five, under every
//! policy on `a6000` and `h100`; `plan --json` for every zoo model; `bench
//! paper --quick --json`. They pin behaviour while code moves: each run's
//! JSON must stay byte-identical to `tests/golden/NAME.json`, timing fields
//! (wall-clock planning and bench times) aside.
//!
//! A deliberate change of behaviour regenerates them with
//! `TENSILE_BLESS=1 cargo test -p tensilectl --test golden`, in a commit of
//! its own that says why.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// Wall-clock fields: they differ from run to run.
const TIMING_KEYS: [&str; 6] = [
    "plan_ms",
    "first_plan_ms",
    "replan_mean_ms",
    "replan_max_ms",
    "wall_s",
    "planning_ms",
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn cases() -> Vec<(String, Vec<String>)> {
    let text = std::fs::read_to_string(dir().join("CASES")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, args) = l.split_once('\t').expect("NAME<TAB>ARGS");
            let args = args.split(' ').map(str::to_string).collect();
            (name.to_string(), args)
        })
        .collect()
}

/// Drops the timing fields, at any depth.
fn normalize(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| !TIMING_KEYS.contains(&k.as_str()));
            map.values_mut().for_each(normalize);
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// The case's normalized output, or why it failed.
fn run(args: &[String]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let mut v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    normalize(&mut v);
    Ok(serde_json::to_string_pretty(&v).unwrap() + "\n")
}

#[test]
fn outputs_match_the_goldens() {
    let bless = std::env::var_os("TENSILE_BLESS").is_some();
    let cases = cases();
    assert!(cases.len() > 100, "the case list is incomplete");
    let queue = Mutex::new(cases.iter());
    let failures = Mutex::new(Vec::<String>::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let Some((name, args)) = queue.lock().unwrap().next() else {
                        return;
                    };
                    let path = dir().join(format!("{name}.json"));
                    let verdict = match run(args) {
                        Err(e) => Some(format!("{name}: tensilectl failed: {e}")),
                        Ok(got) if bless => {
                            std::fs::write(&path, got).unwrap();
                            None
                        }
                        Ok(got) => match std::fs::read_to_string(&path) {
                            Err(e) => Some(format!("{name}: no golden ({e})")),
                            Ok(want) if want == got => None,
                            Ok(want) => Some(first_difference(name, &want, &got)),
                        },
                    };
                    failures.lock().unwrap().extend(verdict);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} goldens differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The first differing line, with its number, for the failure message.
fn first_difference(name: &str, want: &str, got: &str) -> String {
    let mut lines = want.lines().zip(got.lines()).enumerate();
    match lines.find(|(_, (a, b))| a != b) {
        Some((i, (a, b))) => format!("{name}: line {}: want {a:?}, got {b:?}", i + 1),
        None => format!(
            "{name}: {} lines wanted, {} got",
            want.lines().count(),
            got.lines().count()
        ),
    }
}
