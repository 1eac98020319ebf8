//! `tensile-worker --job SPEC --job SPEC`: different jobs in one process,
//! each under a plan file of its own, train bit-identical to each job run
//! alone (under its plan, and vanilla); bad specs are clear errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use tensile_graph::Graph;
use tensile_graph::builder::Optimizer;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_planner::{CopyModel, JobSettings};

use crate::{latencies, planned};

fn worker_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tensile-worker"));
    c.env("RUST_BACKTRACE", "0");
    c
}

/// Runs the worker with `args`; its stdout, or a panic with its stderr.
fn ok(args: &[&str]) -> String {
    let out = worker_bin().args(args).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}

/// A plan file for `g` at half its vanilla peak.
fn plan_file(g: &Graph, path: &Path) -> u64 {
    let p = planned(
        g,
        latencies(g),
        CopyModel::duplex(4e9, 4e9, 5_000),
        JobSettings::default(),
        0.5,
    );
    std::fs::write(path, tensile_proto::plan_json::plan_to_json(&p, &[], g)).expect("write");
    p.prediction.swapped_bytes
}

#[test]
fn two_different_jobs_in_one_process_train_as_each_alone() {
    let _heavy = crate::heavy();
    let dir = std::env::temp_dir().join(format!("tensile-worker-jobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let f = |name: &str| -> PathBuf { dir.join(name) };
    // A ResNet-50 from the zoo and an MLP from a graph file.
    let config = ZooConfig {
        resolution: Some(32),
        optimizer: Optimizer::sgd(),
        ..ZooConfig::new(2)
    };
    let resnet = zoo::build("resnet50", &config).expect("zoo");
    let mlp = tensile_graph::builder::mlp(64, 256, 4, true, Optimizer::adam()).expect("mlp");
    std::fs::write(f("mlp.json"), tensile_graph::json::to_string(&mlp)).expect("write");
    let swapped = [
        plan_file(&resnet, &f("resnet.plan.json")),
        plan_file(&mlp, &f("mlp.plan.json")),
    ];
    assert!(
        swapped.iter().all(|&b| b > 0),
        "plans that move nothing prove little: {swapped:?}"
    );
    let common = ["--threads", "1", "--iterations", "2", "--json"];
    let resnet_job = [
        "--model",
        "resnet50",
        "--batch",
        "2",
        "--resolution",
        "32",
        "--optimizer",
        "sgd",
    ];
    let mlp_file = f("mlp.json");
    let mlp_job = ["--graph", s(&mlp_file)];
    // Each alone, vanilla and under its plan.
    for (job, name) in [(&resnet_job[..], "resnet"), (&mlp_job[..], "mlp")] {
        let plan = f(&format!("{name}.plan.json"));
        for (policy, tag) in [
            (vec!["--vanilla"], "vanilla"),
            (vec!["--plan", s(&plan)], "plan"),
        ] {
            let out = f(&format!("{name}-{tag}.safetensors"));
            ok(&[job, &policy[..], &common[..], &["--save-params", s(&out)]].concat());
        }
    }
    // Both in one process, each under its plan.
    let specs = [
        format!(
            "model=resnet50,batch=2,resolution=32,optimizer=sgd,plan={},name=r",
            s(&f("resnet.plan.json"))
        ),
        format!(
            "graph={},plan={},name=m",
            s(&f("mlp.json")),
            s(&f("mlp.plan.json"))
        ),
    ];
    let stdout = ok(&[
        &["--job", &specs[0], "--job", &specs[1]][..],
        &common[..],
        &["--save-params", s(&f("both.safetensors"))],
    ]
    .concat());
    // Every line names its job; each ran its iterations and moved bytes.
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    for job in 0..2u64 {
        let mine: Vec<_> = lines
            .iter()
            .filter(|l| l["job"].as_u64() == Some(job))
            .collect();
        assert_eq!(mine.len(), 2, "job {job}: {stdout}");
        let moved: u64 = mine
            .iter()
            .filter_map(|l| l["swapped_bytes"].as_u64())
            .sum();
        assert!(moved > 0, "job {job} moved nothing: {stdout}");
    }
    // The process's --save-params, numbered by job, bit-identical to each
    // job alone, under its plan and vanilla.
    for (i, name) in ["resnet", "mlp"].iter().enumerate() {
        let both = std::fs::read(f(&format!("both.{i}.safetensors"))).expect("saved");
        for tag in ["plan", "vanilla"] {
            let alone = std::fs::read(f(&format!("{name}-{tag}.safetensors"))).expect("saved");
            assert!(
                both == alone,
                "{name} in one process with another job trained differently from {name} alone ({tag})"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_job_spec_is_a_clear_error() {
    let _heavy = crate::heavy();
    let cases: [(&[&str], i32, &str); 5] = [
        (&["--job", "model=resnet50,batch=two"], 1, "batch=two"),
        (&["--job", "batch=2"], 1, "name a zoo model"),
        (&["--job", "model=resnet50,colour=red"], 1, "unknown key"),
        (
            &["--job", "model=no_such_model,batch=2"],
            1,
            "no_such_model",
        ),
        // One job's flags and --job do not mix.
        (
            &["--job", "model=resnet50", "--model", "vgg16"],
            2,
            "--model",
        ),
    ];
    for (args, code, says) in cases {
        let out = worker_bin()
            .args(args)
            .arg("--vanilla")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
