//! The `tensilectl` binary as a user runs it.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

#[path = "cli/bench.rs"]
mod bench;
#[path = "cli/gpus.rs"]
mod gpus;
#[path = "cli/tls.rs"]
mod tls;

fn tensilectl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(args)
        .output()
        .expect("tensilectl runs")
}

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit 1, one line on stderr that names the file and contains `expected`, no panic.
fn assert_rejected(out: &Output, file: &str, expected: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{file}: stderr {err}");
    assert!(!err.contains("panicked"), "{file}: {err}");
    assert_eq!(err.lines().count(), 1, "{file}: not one line: {err}");
    assert!(err.starts_with("error: "), "{file}: {err}");
    assert!(err.contains(expected), "{file}: {err:?} lacks {expected:?}");
    assert!(
        out.stdout.is_empty(),
        "{file}: printed {}",
        text(&out.stdout)
    );
}

#[test]
fn check_rejects_every_file_of_the_malformed_corpus() {
    let expected = std::fs::read_to_string(data("malformed/EXPECTED.tsv")).unwrap();
    let mut listed = 0;
    for line in expected.lines().filter(|l| !l.starts_with('#')) {
        let (file, want) = line.split_once('\t').expect("file<TAB>text");
        let path = data(&format!("malformed/{file}"));
        let out = tensilectl(&["graph", "check", path.to_str().unwrap()]);
        assert_rejected(&out, file, want);
        assert!(text(&out.stderr).contains(file), "the error names the file");
        listed += 1;
    }
    // Every file of the corpus has an expectation.
    let files = std::fs::read_dir(data("malformed")).unwrap().count();
    assert_eq!(
        files,
        listed + 1,
        "EXPECTED.tsv must list every corpus file"
    );
}

#[test]
fn check_accepts_a_valid_graph() {
    let out = tensilectl(&["graph", "check", data("valid/tiny.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("is a valid graph (7 ops, 9 tensors, 128 params)"));
}

#[test]
fn check_refuses_gigabytes_before_reading_them() {
    // A sparse 3 GiB file: refused from its size, without reading it.
    let dir = std::env::temp_dir().join(format!("tensilectl-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.json");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(3 << 30)
        .unwrap();
    let start = std::time::Instant::now();
    let out = tensilectl(&["graph", "check", path.to_str().unwrap()]);
    assert_rejected(
        &out,
        "big.json",
        "the input is 3221225472 bytes, over the limit of 268435456 bytes",
    );
    assert!(start.elapsed().as_secs() < 10, "it read the file");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_reads_stdin_with_the_same_limit() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(["graph", "check", "--max-bytes", "1000", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // Writing may fail once the reader stops at the limit: that is the point.
    let _ = stdin.write_all(&vec![b' '; 1 << 20]);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_rejected(&out, "-", "over the limit of 1000 bytes");
    let missing = tensilectl(&["graph", "check", "/nonexistent/graph.json"]);
    assert_rejected(&missing, "missing", "cannot read /nonexistent/graph.json");
    let dir = tensilectl(&["graph", "check", env!("CARGO_MANIFEST_DIR")]);
    assert_rejected(&dir, "dir", "is a directory");
}

#[test]
fn export_then_check_and_stats_agree_with_the_zoo() {
    let dir = std::env::temp_dir().join(format!("tensilectl-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("resnet50.json");
    let out = tensilectl(&[
        "graph",
        "export",
        "--model",
        "resnet50",
        "--batch",
        "4",
        "-o",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let check = tensilectl(&["graph", "check", path.to_str().unwrap()]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("25557032 params"));
    let from_file = tensilectl(&["graph", "stats", path.to_str().unwrap(), "--json"]);
    let from_zoo = tensilectl(&[
        "graph", "stats", "--model", "resnet50", "--batch", "4", "--json",
    ]);
    let a: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&from_zoo.stdout).unwrap();
    assert_eq!(a, b);
    for key in [
        "params",
        "param_bytes",
        "ops",
        "tensors",
        "vanilla_peak_bytes",
    ] {
        assert!(a[key].as_u64().is_some_and(|v| v > 0), "missing {key}");
    }
    assert_eq!(a["params"], 25_557_032);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zoo_lists_every_model_with_its_parameter_count() {
    let out = tensilectl(&["zoo", "--batch", "2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let models: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<(String, u64)> = models
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["model"].as_str().unwrap().to_string(),
                m["params"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("vgg16", 138_357_544),
            ("inception_v3", 27_161_264),
            ("inception_v4", 42_679_816),
            ("resnet50", 25_557_032),
            ("densenet121", 7_978_856),
            ("bert_base", 109_483_778),
        ]
        .map(|(n, p)| (n.to_string(), p))
    );
}

#[test]
fn usage_errors_are_clear() {
    let out = tensilectl(&["graph", "stats", "--model", "resnet5", "--batch", "2"]);
    assert_rejected(
        &out,
        "stats",
        "unknown model \"resnet5\"; the zoo has vgg16, inception_v3",
    );
    let out = tensilectl(&[
        "graph",
        "stats",
        "--model",
        "resnet50",
        "--optimizer",
        "lamb",
    ]);
    assert_rejected(
        &out,
        "stats",
        "unknown optimizer \"lamb\" (expected adam, sgd, adam-in-backward, sgd-in-backward, adam-on-host or sgd-on-host)",
    );
    let out = tensilectl(&[
        "bench",
        "colocate",
        "--cases",
        "bert_base:16x2:lamb-in-backward",
    ]);
    assert_rejected(
        &out,
        "colocate",
        "--cases: \"bert_base:16x2:lamb-in-backward\": bench colocate: unknown optimizer \"lamb-in-backward\"",
    );
    let out = tensilectl(&["graph", "stats"]);
    assert_rejected(&out, "stats", "name a zoo model with --model");
    let out = tensilectl(&["graph", "export", "--model", "vgg16", "--batch", "0"]);
    assert_rejected(&out, "export", "batch size 0 is out of range");
}

#[test]
fn plan_prints_the_figures_as_json() {
    let out = tensilectl(&["plan", "--model", "resnet50", "--batch", "2", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let vanilla = v["vanilla_peak_bytes"].as_u64().unwrap();
    let planned = v["planned_peak_bytes"].as_u64().unwrap();
    assert!(planned < vanilla, "{v}");
    assert!(v["swap_outs"].as_u64().unwrap() > 0);
}

/// A temporary directory of this test process, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("tensilectl-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `graph export` of a zoo model into `dir`.
fn exported(dir: &TempDir, model: &str, batch: &str) -> String {
    let path = dir.path(&format!("{model}-b{batch}.json"));
    let out = tensilectl(&[
        "graph", "export", "--model", model, "--batch", batch, "-o", &path,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    path
}

#[test]
fn plan_takes_a_graph_file_and_plans_it_as_the_zoo_model() {
    let dir = TempDir::new("plan-file");
    let file = exported(&dir, "resnet50", "2");
    let mut from_file = json_of(&["plan", &file, "--json"]);
    let mut from_zoo = json_of(&["plan", "--model", "resnet50", "--batch", "2", "--json"]);
    assert_eq!(
        from_file["model"], "resnet50_b2_r224_adam",
        "the graph's name"
    );
    assert_eq!(from_file["batch"], serde_json::Value::Null);
    assert_eq!(from_zoo["batch"], 2);
    for v in [&mut from_file, &mut from_zoo] {
        let o = v.as_object_mut().unwrap();
        for key in ["model", "batch", "plan_ms"] {
            o.remove(key);
        }
    }
    assert_eq!(from_file, from_zoo);
    let tiny = data("valid/tiny.json");
    let out = tensilectl(&["plan", tiny.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("tiny on a6000\n"),
        "{}",
        text(&out.stdout)
    );
    // A bad file names itself; a file and a model at once is bad usage.
    let bad = data("malformed/cyclic.json");
    let out = tensilectl(&["plan", bad.to_str().unwrap()]);
    assert_rejected(&out, "cyclic.json", "cyclic.json");
    let out = tensilectl(&["plan", tiny.to_str().unwrap(), "--model", "vgg16"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn plan_writes_the_plan_itself_for_a_worker_to_read() {
    use tensile_graph::zoo::{self, ZooConfig};
    use tensile_planner::EventKind;
    use tensile_proto::plan_json::read_plan_file;
    let dir = TempDir::new("plan-out");
    let out = dir.path("plan.json");
    let report = json_of(&[
        "plan", "--model", "resnet50", "--batch", "2", "--json", "-o", &out,
    ]);
    let written = std::fs::read_to_string(&out).unwrap();
    let v: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(v["format"], "tensile-plan/v1");
    assert_eq!(v["graph"], "resnet50_b2_r224_adam");
    let graph = zoo::build("resnet50", &ZooConfig::new(2)).unwrap();
    let file = read_plan_file(&written, &graph).unwrap();
    let count = |kind| file.plan.count(kind) as u64;
    assert_eq!(
        count(EventKind::SwapOut),
        report["swap_outs"].as_u64().unwrap()
    );
    assert_eq!(
        count(EventKind::SwapIn),
        report["swap_ins"].as_u64().unwrap()
    );
    assert_eq!(
        count(EventKind::Release),
        report["releases"].as_u64().unwrap()
    );
    assert_eq!(
        file.plan.prediction.planned_peak_bytes,
        report["planned_peak_bytes"].as_u64().unwrap()
    );
    // The same plan, from the exported graph: a file plans like the zoo.
    let graph_file = exported(&dir, "resnet50", "2");
    let out2 = dir.path("plan2.json");
    let o = tensilectl(&["plan", &graph_file, "-o", &out2]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let again = read_plan_file(std::fs::read(&out2).unwrap(), &graph).unwrap();
    assert_eq!(again, file);
    // A plan is checked against the graph it is read with.
    let other = zoo::build("vgg16", &ZooConfig::new(2)).unwrap();
    let err = read_plan_file(&written, &other).unwrap_err().to_string();
    assert!(err.contains("the plan is for graph"), "{err}");
}

#[test]
fn sim_jobs_mix_zoo_models_and_graph_files() {
    let dir = TempDir::new("sim-file");
    let file = exported(&dir, "resnet50", "2");
    let tiny = data("valid/tiny.json");
    let jobs = format!("{file},vgg16:2,{}", tiny.to_str().unwrap());
    let v = json_of(&["sim", "--jobs", &jobs, "--iterations", "2", "--json"]);
    let names: Vec<&str> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["resnet50_b2_r224_adam", "vgg16_b2_r224_adam", "tiny"]
    );
    // The exported graph runs exactly as the zoo model it came from.
    let zoo = json_of(&["sim", "--jobs", "resnet50:2", "--iterations", "2", "--json"]);
    let alone = json_of(&["sim", "--jobs", &file, "--iterations", "2", "--json"]);
    assert_eq!(alone["system"]["peak_bytes"], zoo["system"]["peak_bytes"]);
    assert_eq!(alone["system"]["time_s"], zoo["system"]["time_s"]);
    let missing = dir.path("missing.json");
    let out = tensilectl(&["sim", "--jobs", &missing]);
    assert_rejected(&out, "missing", "missing.json");
}

/// `--one-process`: two copies as threads of one process pay the a6000's
/// base (512 MiB) once, so together they peak lower by exactly one base.
#[test]
fn sim_one_process_pays_the_base_once() {
    let peak = |extra: &[&str]| {
        let mut args = vec![
            "sim",
            "--jobs",
            "resnet50:2,resnet50:2",
            "--policy",
            "vanilla",
            "--iterations",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_of(&args)["system"]["peak_bytes"].as_u64().unwrap()
    };
    assert_eq!(peak(&[]) - peak(&["--one-process"]), 512 << 20);
}

#[test]
fn sim_with_exact_latencies_and_no_sharing_never_stalls() {
    let out = tensilectl(&[
        "sim",
        "--jobs",
        "resnet50:2,bert_base:2",
        "--exact",
        "--no-sharing",
        "--iterations",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "peak_vanilla_bytes",
        "peak_bytes",
        "msr",
        "time_vanilla_s",
        "time_s",
        "eor",
        "cbr",
        "stall_s",
        "passive_swaps",
        "swapped_bytes",
        "recomputed_ops",
        "plan_ms",
    ] {
        assert!(v["system"].get(key).is_some(), "system.{key} missing: {v}");
    }
    assert_eq!(v["system"]["stall_s"].as_f64(), Some(0.0), "{v}");
    assert_eq!(v["system"]["passive_swaps"].as_u64(), Some(0));
    for job in v["jobs"].as_array().unwrap() {
        assert!(
            job["peak_bytes"].as_u64() < job["peak_vanilla_bytes"].as_u64(),
            "{job}"
        );
        assert_eq!(job["eor"].as_f64(), Some(0.0), "{job}");
    }
    // Exact latencies: every job measures exactly its predicted peak, and
    // the jobs together stay under the sum of their peaks.
    for job in v["jobs"].as_array().unwrap() {
        assert_eq!(job["peak_bytes"], job["predicted_peak_bytes"], "{job}");
    }
    let global = v["system"]["peak_bytes"].as_u64().unwrap();
    assert!(
        global <= v["predicted_sum_of_peaks_bytes"].as_u64().unwrap(),
        "{v}"
    );
}

#[test]
fn sim_refuses_bad_input_with_a_reason() {
    for (args, reason) in [
        (
            vec!["sim", "--jobs", "resnet50"],
            "expected MODEL:BATCH or a graph file",
        ),
        (vec!["sim", "--jobs", "resnet50:x"], "is not a number"),
        (vec!["sim", "--jobs", "nope:2"], "unknown model"),
        (vec!["sim", "--policy", "magic"], "unknown policy"),
        (vec!["sim", "--device", "tpu9"], "unknown device"),
        (vec!["sim", "--iterations", "0"], "--iterations"),
        (
            vec!["sim", "--policy", "knapsack", "--activation-budget", "1.5"],
            "--activation-budget",
        ),
        (
            vec!["sim", "--latency-models", "/no/such/dir"],
            "/no/such/dir",
        ),
        (vec!["bench", "paper", "--device", "tpu9"], "unknown device"),
        (
            vec!["bench", "paper", "--policies", "magic"],
            "unknown policy",
        ),
        (vec!["bench", "paper", "--iterations", "1"], "--iterations"),
        (vec!["bench", "planner", "--jobs", "4,0"], "--jobs"),
        (vec!["bench", "planner", "--jobs", "four"], "--jobs"),
        (vec!["bench", "planner", "--max-moves", "0"], "--max-moves"),
        (
            vec!["bench", "planner", "--time-cap-s", "0"],
            "--time-cap-s",
        ),
        (vec!["bench", "planner", "--models", "lenet"], "lenet"),
    ] {
        let out = tensilectl(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(reason), "{args:?}: {err}");
    }
}

#[test]
fn latency_eval_json_scores_the_shipped_models() {
    let out = tensilectl(&["latency", "eval", "--json", "--batch", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let per = v["per_op_type"].as_object().unwrap();
    let conv = &per["aten::convolution"];
    assert!(conv["samples"].as_u64().unwrap() > 0);
    assert!(conv["mape"].as_f64().unwrap().is_finite());
    assert_eq!(conv["source"], "model");
    let ms = v["predict_ms_per_model"].as_object().unwrap();
    assert!(ms["resnet50"].as_f64().unwrap() > 0.0);
    // The split of each prediction's time, and the distinct rows it ran.
    for d in v["predict_detail"].as_array().unwrap() {
        for part in ["features_ms", "runs_ms", "other_ms"] {
            assert!(d[part].as_f64().unwrap() >= 0.0, "{part} in {d}");
        }
        let rows = d["rows"].as_u64().unwrap();
        assert!(d["run_calls"].as_u64().unwrap() > 0, "{d}");
        assert!(rows > 0 && rows <= d["from_model"].as_u64().unwrap(), "{d}");
    }
    assert!(
        v["model_bytes"].as_u64().unwrap() < 10 << 20,
        "shipped models under 10 MB"
    );
}

#[test]
fn latency_eval_without_onnx_runtime_is_a_clear_error() {
    let out = tensilectl(&[
        "latency",
        "eval",
        "--ort-lib",
        "/nonexistent/libonnxruntime.so",
    ]);
    assert_rejected(
        &out,
        "ort",
        "cannot load ONNX Runtime from /nonexistent/libonnxruntime.so",
    );
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let out = tensilectl(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_policy_runs_by_name_and_reports_against_vanilla() {
    for policy in [
        "vanilla",
        "tensile",
        "vdnn-conv",
        "capuchin",
        "save-on-cpu",
        "offload-stream",
        "checkpoint-blocks",
        "knapsack",
    ] {
        let v = json_of(&[
            "sim",
            "--jobs",
            "resnet50:2",
            "--policy",
            policy,
            "--iterations",
            "3",
            "--json",
        ]);
        assert_eq!(v["policy"], policy, "{v}");
        let sys = &v["system"];
        let (peak, vanilla) = (
            sys["peak_bytes"].as_u64(),
            sys["peak_vanilla_bytes"].as_u64(),
        );
        if policy == "vanilla" {
            assert_eq!(peak, vanilla, "{policy}");
        } else {
            // Every policy here saves memory on ResNet-50.
            assert!(peak < vanilla, "{policy}: {sys}");
        }
    }
}

#[test]
fn the_learned_cold_start_is_used_on_its_device_and_says_so() {
    let learned = json_of(&[
        "sim",
        "--jobs",
        "resnet50:2",
        "--device",
        "cpu",
        "--iterations",
        "2",
        "--json",
    ]);
    let how = learned["cold_start_latencies"].as_str().unwrap();
    assert!(how.starts_with("learned models"), "{how}");
    let roofline = json_of(&[
        "sim",
        "--jobs",
        "resnet50:2",
        "--device",
        "cpu",
        "--latency-models",
        "roofline",
        "--iterations",
        "2",
        "--json",
    ]);
    assert_eq!(roofline["cold_start_latencies"], "roofline estimate");
    // The learned models are closer to the device's latencies than the
    // roofline estimate the planner had before.
    let (l, r) = (
        learned["cold_start_error"].as_f64().unwrap(),
        roofline["cold_start_error"].as_f64().unwrap(),
    );
    assert!(l > 0.0 && l < r, "learned {l} vs roofline {r}");
    // A GPU profile has no learned models: the estimate.
    let gpu = json_of(&["sim", "--jobs", "resnet50:2", "--iterations", "2", "--json"]);
    assert_eq!(gpu["cold_start_latencies"], "roofline estimate");
}

/// The dynamic section of `bin` as `readelf -d` prints it, or why it
/// cannot be read here (no binutils).
fn dynamic_section(bin: &str) -> Result<String, String> {
    let out = Command::new("readelf")
        .args(["-d", bin])
        .output()
        .map_err(|e| format!("readelf: {e}"))?;
    assert!(
        out.status.success(),
        "readelf -d {bin}: {}",
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

#[test]
fn tensilectl_links_no_libtorch() {
    let bin = env!("CARGO_BIN_EXE_tensilectl");
    let dynamic = match dynamic_section(bin) {
        Ok(d) => d,
        Err(why) => {
            println!("skipped: cannot read {bin}'s dynamic section ({why})");
            return;
        }
    };
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    // readelf names the C library of any dynamic executable: the section
    // was read.
    assert!(
        needed.iter().any(|l| l.contains("libc.so")),
        "no NEEDED entries read from {dynamic}"
    );
    for l in &needed {
        for lib in ["libtorch", "libc10", "libtorch_cpu", "libtorch_cuda"] {
            assert!(!l.contains(lib), "tensilectl needs {lib}: {l}");
        }
    }
    // Nor a search path into a torch installation.
    for l in dynamic
        .lines()
        .filter(|l| l.contains("(RPATH)") || l.contains("(RUNPATH)"))
    {
        assert!(!l.contains("torch"), "tensilectl searches torch: {l}");
    }
}

#[test]
fn operator_commands_start_without_torch_libraries() {
    for args in [
        &["--help"][..],
        &["status", "--help"],
        &["budget", "--help"],
        &["watch", "--help"],
        &["plan", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tensilectl"))
            .args(args)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_PRELOAD")
            .output()
            .expect("tensilectl runs");
        assert!(
            out.status.success(),
            "tensilectl {args:?} without LD_LIBRARY_PATH: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).contains("Usage: tensilectl"), "{args:?}");
    }
}

#[test]
fn making_latency_models_is_another_binary() {
    let out = tensilectl(&["latency", "profile", "--help"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let help = tensilectl(&["latency", "--help"]);
    assert!(
        text(&help.stdout).contains("tensile-latency profile|train"),
        "{}",
        text(&help.stdout)
    );
}

#[test]
fn tensilectl_depends_on_neither_tch_nor_torch_sys() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "tensilectl", "-e", "normal,build"])
        .args(["--prefix", "none", "--offline", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo tree: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let deps: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // A listing that names the ONNX Runtime binding was read whole.
    assert!(deps.contains(&"ort"), "no ort in {deps:?}");
    for torch in [
        "tch",
        "torch-sys",
        "tensile-latency-train",
        "tensile-kernels",
    ] {
        assert!(!deps.contains(&torch), "tensilectl depends on {torch}");
    }
}

/// Runs tensilectl with stdout a pipe whose reader has already gone, so
/// that its first write fails with a broken pipe.
fn with_stdout_closed(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("tensilectl runs")
}

#[test]
fn a_closed_stdout_ends_quietly() {
    for args in [
        &["zoo"][..],
        &["graph", "export", "--model", "resnet50", "--batch", "2"],
        &["plan", "--model", "resnet50", "--batch", "2"],
    ] {
        let out = with_stdout_closed(args);
        let err = text(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

#[test]
fn head_takes_the_first_line_and_tensilectl_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensilectl"))
        .args(["graph", "export", "--model", "vgg16", "--batch", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    // The reader (and the pipe) dropped after one line of a graph far
    // larger than a pipe's buffer.
    assert_eq!(first.trim(), "{");
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{:?}: {err}", out.status);
}

#[test]
fn sizes_in_mb_take_decimals_and_name_the_flag_when_wrong() {
    // Accepted, below the vanilla peak: the plan keeps under it.
    let v = json_of(&[
        "plan",
        "--model",
        "resnet50",
        "--batch",
        "2",
        "--budget-mb",
        "900.5",
        "--json",
    ]);
    let planned = v["planned_peak_bytes"].as_u64().unwrap();
    assert!(
        v["vanilla_peak_bytes"].as_u64().unwrap() > 900_500_000,
        "{v}"
    );
    assert!(planned <= 900_500_000, "{v}");
    for (args, flag, why) in [
        (
            &["plan", "--model", "resnet50", "--budget-mb", "1.5x"][..],
            "--budget-mb",
            "not a size in MB",
        ),
        (
            &["plan", "--model", "resnet50", "--budget-mb", "-1"],
            "--budget-mb",
            "is negative",
        ),
        (
            &["plan", "--model", "resnet50", "--budget-mb", "0"],
            "--budget-mb",
            "above 0",
        ),
        (
            &["demo", "--budget-mb", "abc"],
            "--budget-mb",
            "not a size in MB",
        ),
        (&["budget", "-2.5"], "<MB>", "is negative"),
    ] {
        let out = tensilectl(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("invalid digit"), "{args:?}: {err}");
    }
}

#[test]
fn an_unreachable_scheduler_is_named_once_with_what_to_do() {
    let dir = TempDir::new("unreachable");
    let sock = dir.0.join("none.sock");
    let server = format!("unix:{}", sock.display());
    for cmd in [&["status"][..], &["watch", "1"], &["budget", "500"]] {
        let out = tensilectl(&[cmd, &["--server", &server]].concat());
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "cannot reach the scheduler at {server}: no such socket"
            )),
            "{err}"
        );
        assert!(
            err.contains("start tensile-scheduler") && err.contains("--server"),
            "{err}"
        );
        assert!(!err.contains("os error"), "{err}");
    }
}
