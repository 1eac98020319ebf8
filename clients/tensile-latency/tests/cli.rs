//! The `tensile-latency` binary as a user runs it.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

use std::process::{Command, Output};

fn tensile_latency(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensile-latency"))
        .args(args)
        .output()
        .expect("tensile-latency runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn profile_and_train_keep_their_flags() {
    let profile = tensile_latency(&["profile", "--help"]);
    assert!(profile.status.success(), "{}", text(&profile.stderr));
    for flag in [
        "--device",
        "--out",
        "--batches",
        "--resolution",
        "--random-builds",
        "--random-nets",
        "--loads",
        "--repeats",
        "--max-seconds",
        "--threads",
        "--seed",
    ] {
        assert!(text(&profile.stdout).contains(flag), "profile lacks {flag}");
    }
    let train = tensile_latency(&["train", "--help"]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    for flag in [
        "--data", "--out", "--device", "--epochs", "--hidden", "--seed",
    ] {
        assert!(text(&train.stdout).contains(flag), "train lacks {flag}");
    }
}

#[test]
fn train_on_a_missing_profile_is_a_clear_error() {
    let out = tensile_latency(&[
        "train",
        "--data",
        "/nonexistent/profile.jsonl",
        "--out",
        "/nonexistent/models",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("/nonexistent/profile.jsonl"), "{err}");
}

#[test]
fn latency_profile_on_cuda_without_a_gpu_is_a_clear_error() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        return; // a GPU host profiles CUDA for real
    }
    let out_file = std::env::temp_dir().join(format!("tensile-cuda-{}.jsonl", std::process::id()));
    let out = tensile_latency(&[
        "profile",
        "--device",
        "cuda",
        "--out",
        out_file.to_str().unwrap(),
        "--batches",
        "1",
        "--random-builds",
        "0",
        "--random-nets",
        "0",
    ]);
    let _ = std::fs::remove_file(&out_file);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no CUDA device"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let out_file =
        std::env::temp_dir().join(format!("tensile-latency-pipe-{}.jsonl", std::process::id()));
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    // A profile cut short at one second: its summary line goes to the
    // closed stdout.
    let out = Command::new(env!("CARGO_BIN_EXE_tensile-latency"))
        .args(["profile", "--out", out_file.to_str().unwrap()])
        .args([
            "--batches",
            "1",
            "--random-builds",
            "0",
            "--random-nets",
            "0",
        ])
        .args(["--loads", "0", "--repeats", "1", "--max-seconds", "1"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&out_file);
    let err = text(&out.stderr);
    assert!(
        err.contains("shapes from"),
        "the profile did not start: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}
