//! Parity with PyTorch: ResNet-18 traced by our tracer (resolution 64,
//! batch 2, Adam), run for 3 iterations on the kernels from the same init and
//! batch as PyTorch's own 3 training steps (`parity.py`, run from `.venv`);
//! every parameter and buffer must be within 1e-5 relative of PyTorch's (the
//! test prints how many are bit-identical: all of them, today). Traced Adam
//! bakes its bias corrections into the graph at the traced step, so this also
//! checks that the kernels recompute them at every step; a small perceptron
//! does the same over 5 steps of AdamW and of SGD with momentum. One thread on
//! both sides (a different thread count changes reduction order). And the
//! tracer's transformer encoder binds and trains, as do graphs traced from a
//! spread of torchvision models (ViT and Swin bind only: slow on a CPU).
//! The negative control: with the scalars left as baked, Adam is off by about
//! 1e-3 relative after 3 steps, so the test can tell. And the zoo's own
//! ResNet-50 and DenseNet-121 graphs (batch 2, resolution 32) against
//! torchvision's with `fused=True` Adam (and SGD): bit-identical after 3 steps
//! as well.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tch::{Device, Tensor};
use tensile_graph::{Graph, Limits, TensorKind};
use tensile_kernels::{Program, initial_values, run_iteration, save_params};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Runs `parity.py` with `args` into a fresh directory.
fn python(args: &[&str]) -> PathBuf {
    let root = root();
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    let dir = std::env::temp_dir().join(format!(
        "tensile-parity-{}-{}",
        std::process::id(),
        args.join("-")
    ));
    let status = Command::new(&python)
        .arg(root.join("kernels/tests/parity.py"))
        .arg(&dir)
        .args(args)
        .env("PYTHONPATH", root.join("clients/python/src"))
        .status()
        .expect("python runs");
    assert!(status.success(), "parity.py {args:?} failed: {status}");
    dir
}

fn load_graph(path: &Path) -> Graph {
    let path = if path.is_dir() {
        path.join("graph.json")
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&path).expect("graph written");
    tensile_graph::json::parse(&bytes, &Limits::default()).expect("a valid graph")
}

fn loss_of(graph: &Graph, values: &tensile_kernels::Values) -> f64 {
    let id = graph
        .tensors()
        .iter()
        .find(|t| t.kind == TensorKind::Output)
        .expect("a loss")
        .id;
    values.get(id).expect("loss set").double_value(&[])
}

/// Trains `model` with `optimizer` for `steps` on both sides and compares:
/// the worst relative difference of a parameter or buffer, and whether the
/// losses agree within 1e-5.
fn compare(model: &str, optimizer: &str, steps: usize, baked: bool) -> (f64, bool) {
    let n = steps.to_string();
    let mut args = vec!["--model", model, "--optimizer", optimizer, "--steps", &n];
    if baked {
        args.push("--baked");
    }
    let dir = python(&args);
    let graph = load_graph(&dir);
    let label = format!("{model}/{optimizer}");
    against_pytorch(&dir, &graph, steps, &label)
}

/// Runs `graph` for `steps` from the init and batch PyTorch wrote in `dir`
/// and compares with PyTorch's result there.
fn against_pytorch(dir: &Path, graph: &Graph, steps: usize, label: &str) -> (f64, bool) {
    let (model, optimizer) = label.split_once('/').unwrap_or((label, ""));
    tch::set_num_threads(1);
    let mut program = Program::new(graph, Device::Cpu).expect("every op binds");
    let mut values = initial_values(
        graph,
        Device::Cpu,
        0,
        Some(&dir.join("init.safetensors")),
        Some(&dir.join("inputs.safetensors")),
    )
    .expect("init and batch load");
    let mut losses = Vec::new();
    for _ in 0..steps {
        run_iteration(&mut program, graph, &mut values).expect("iteration runs");
        losses.push(loss_of(graph, &values));
    }
    let ours = dir.join("ours.safetensors");
    save_params(graph, &values, &ours).expect("saved");

    let torch_losses: Vec<f64> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("losses.json")).expect("losses"))
            .expect("json");
    println!("{model}/{optimizer}: losses ours {losses:?}, PyTorch {torch_losses:?}");
    let theirs: BTreeMap<String, Tensor> = Tensor::read_safetensors(dir.join("torch.safetensors"))
        .expect("PyTorch's result")
        .into_iter()
        .collect();
    let mine: BTreeMap<String, Tensor> = Tensor::read_safetensors(&ours)
        .expect("ours")
        .into_iter()
        .collect();
    assert_eq!(
        theirs.keys().collect::<Vec<_>>(),
        mine.keys().collect::<Vec<_>>(),
        "the same parameters and buffers"
    );
    let (mut identical, mut worst) = (0, (0.0f64, String::new()));
    for (name, t) in &theirs {
        let m = &mine[name];
        if m.equal(t) {
            identical += 1;
            continue;
        }
        let (a, b) = (m.to_kind(tch::Kind::Double), t.to_kind(tch::Kind::Double));
        let diff = (&a - &b).abs().max().double_value(&[]);
        let scale = b.abs().max().double_value(&[]).max(1e-30);
        if diff / scale > worst.0 {
            worst = (diff / scale, name.clone());
        }
    }
    println!(
        "{model}/{optimizer}: {identical} of {} tensors bit-identical after {steps} steps; \
         worst relative difference {:.3e} {}",
        theirs.len(),
        worst.0,
        worst.1
    );
    // PyTorch's losses went through JSON as text: compare within 1e-5 too.
    let losses_agree = losses
        .iter()
        .zip(&torch_losses)
        .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs());
    std::fs::remove_dir_all(dir).ok();
    (worst.0, losses_agree)
}

fn parity(model: &str, optimizer: &str, steps: usize) {
    let (worst, losses_agree) = compare(model, optimizer, steps, false);
    assert!(losses_agree, "{model}/{optimizer}: the losses differ");
    assert!(
        worst <= 1e-5,
        "{model}/{optimizer}: a tensor differs by {worst:.3e} relative"
    );
}

#[test]
fn the_zoos_graphs_match_torchvision_with_fused_optimizers() {
    // The zoo's own graphs (their backward pass, their fused Adam / SGD)
    // against torchvision's models with `fused=True`, batch 2, resolution 32.
    for (model, optimizer, zoo_optimizer) in [
        (
            "resnet50",
            "adam",
            tensile_graph::builder::Optimizer::adam(),
        ),
        ("resnet50", "sgd", tensile_graph::builder::Optimizer::sgd()),
        (
            "densenet121",
            "adam",
            tensile_graph::builder::Optimizer::adam(),
        ),
    ] {
        let dir = python(&["--zoo", model, "--optimizer", optimizer, "--steps", "3"]);
        let mut cfg = tensile_graph::zoo::ZooConfig::new(2);
        cfg.resolution = Some(32);
        cfg.optimizer = zoo_optimizer;
        let graph = tensile_graph::zoo::build(model, &cfg).expect("builds");
        let label = format!("zoo-{model}/{optimizer}");
        let (worst, losses_agree) = against_pytorch(&dir, &graph, 3, &label);
        assert!(losses_agree && worst <= 1e-5, "{label}: worst {worst:.3e}");
    }
}

#[test]
fn baked_step_scalars_would_be_wrong() {
    // The negative control: with Adam's bias corrections left as traced (at
    // step 2), step 1 already differs, so the parity test can tell.
    let (worst, _) = compare("mlp", "adam", 3, true);
    assert!(
        worst > 1e-5,
        "baked scalars went unnoticed (worst {worst:.3e})"
    );
}

#[test]
fn resnet18_matches_pytorch_after_three_adam_steps() {
    parity("resnet18", "adam", 3);
}

#[test]
fn every_adamw_and_sgd_step_matches_pytorch() {
    parity("mlp", "adamw", 5);
    parity("mlp", "sgd", 5);
}

#[test]
fn the_tracers_transformer_encoder_binds_and_trains() {
    let dir = python(&["--model", "encoder", "--trace-only"]);
    let graph = load_graph(&dir);
    let mut program = Program::new(&graph, Device::Cpu).expect("every op binds");
    let mut values = initial_values(&graph, Device::Cpu, 0, None, None).expect("seeded");
    let mut losses = Vec::new();
    for _ in 0..3 {
        run_iteration(&mut program, &graph, &mut values).expect("iteration runs");
        losses.push(loss_of(&graph, &values));
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn torchvision_graphs_bind_and_train() {
    let run = [
        "mobilenet_v2",
        "efficientnet_b0",
        "googlenet",
        "squeezenet1_0",
        "shufflenet_v2_x0_5",
    ];
    let bind_only = ["vit_b_16", "swin_t"];
    let all: Vec<&str> = run.iter().chain(&bind_only).copied().collect();
    let dir = python(&["--torchvision", &all.join(",")]);
    tch::set_num_threads(1);
    for name in all {
        let graph = load_graph(&dir.join(format!("graph_{name}.json")));
        let mut program =
            Program::new(&graph, Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        if run.contains(&name) {
            let mut values = initial_values(&graph, Device::Cpu, 0, None, None).expect("seeded");
            run_iteration(&mut program, &graph, &mut values)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(loss_of(&graph, &values).is_finite(), "{name}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
