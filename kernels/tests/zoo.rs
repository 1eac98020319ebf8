//! The zoo's graphs on real kernels: every op of every model binds at a
//! small size, a small ResNet-50 and BERT train end to end through
//! `run_iteration` (the loss is finite, every parameter moves, the fused
//! optimizers' step counters advance), a seed gives the same run twice, and
//! a graph with an op that cannot run is an error naming that op.

use tch::{Device, Tensor};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{AttrValue, Graph, GraphDraft, Limits, TensorKind};
use tensile_kernels::{KernelError, Program, Values, initial_values, run_iteration, save_params};

/// Seeding and random kernels use libtorch's global generator: the tests of
/// this file take turns.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn zoo_graph(name: &str, batch: u64, resolution: u64, sgd: bool) -> Graph {
    let mut cfg = ZooConfig::new(batch);
    cfg.resolution = Some(resolution);
    if sgd {
        cfg.optimizer = tensile_graph::builder::Optimizer::sgd();
    }
    if name == "bert_base" {
        cfg.classes = Some(2);
    }
    zoo::build(name, &cfg).expect("zoo model builds")
}

fn params(graph: &Graph, values: &Values) -> Vec<Tensor> {
    graph
        .parameters()
        .map(|t| values.get(t.id).expect("parameter set").copy())
        .collect()
}

fn loss(graph: &Graph, values: &Values) -> f64 {
    let t = graph
        .tensors()
        .iter()
        .find(|t| t.kind == TensorKind::Output)
        .expect("a loss");
    values.get(t.id).expect("loss set").double_value(&[])
}

/// Trains `iterations` steps and checks the loss and that parameters move.
fn train(graph: &Graph, iterations: usize) -> (Vec<f64>, Vec<Tensor>) {
    tch::set_num_threads(1);
    let mut program = Program::new(graph, Device::Cpu).expect("binds");
    let mut values = initial_values(graph, Device::Cpu, 7, None, None).expect("initial values");
    let before = params(graph, &values);
    let mut losses = Vec::new();
    for _ in 0..iterations {
        run_iteration(&mut program, graph, &mut values).expect("iteration runs");
        losses.push(loss(graph, &values));
    }
    let after = params(graph, &values);
    for ((b, a), t) in before.iter().zip(&after).zip(graph.parameters()) {
        assert!(!b.equal(a), "parameter {} did not change", t.name);
    }
    assert!(losses.iter().all(|l| l.is_finite()), "losses {losses:?}");
    (losses, after)
}

#[test]
fn resnet50_trains_with_adam_and_sgd() {
    let _turn = turn();
    for sgd in [false, true] {
        let g = zoo_graph("resnet50", 2, 32, sgd);
        let (losses, _) = train(&g, 3);
        // At batch 2 the same batch is seen three times: the loss goes down.
        assert!(losses[2] < losses[0], "sgd={sgd}: losses {losses:?}");
    }
}

#[test]
fn bert_trains() {
    let _turn = turn();
    let g = zoo_graph("bert_base", 1, 8, false);
    let program = Program::new(&g, Device::Cpu).expect("binds");
    let random: Vec<&str> = g
        .ops()
        .iter()
        .filter(|o| program.is_random(o.id))
        .map(|o| o.op_type.as_str())
        .collect();
    assert!(
        !random.is_empty() && random.iter().all(|t| *t == "aten::native_dropout"),
        "{random:?}"
    );
    let (losses, _) = train(&g, 2);
    assert!(losses[1] < losses[0], "losses {losses:?}");
}

#[test]
fn a_seed_gives_the_same_run() {
    let _turn = turn();
    let g = zoo_graph("resnet50", 2, 32, false);
    let (l1, p1) = train(&g, 1);
    let (l2, p2) = train(&g, 1);
    assert_eq!(l1, l2);
    for (a, b) in p1.iter().zip(&p2) {
        assert!(a.equal(b));
    }
}

#[test]
fn every_zoo_op_binds() {
    let _turn = turn();
    let sizes = [
        ("vgg16", 1, 32),
        ("inception_v3", 2, 299),
        ("inception_v4", 2, 75),
        ("resnet50", 2, 32),
        ("densenet121", 2, 32),
        ("bert_base", 1, 8),
    ];
    for m in zoo::MODELS {
        let &(_, batch, res) = sizes
            .iter()
            .find(|s| s.0 == m.name)
            .expect("a size per model");
        for sgd in [false, true] {
            let g = zoo_graph(m.name, batch, res, sgd);
            if let Err(e) = Program::new(&g, Device::Cpu) {
                panic!("{} (sgd={sgd}): {e}", m.name);
            }
        }
    }
}

#[test]
fn every_zoo_model_runs_one_iteration() {
    let _turn = turn();
    // The models the other tests do not train, at their smallest sizes.
    for (name, batch, res) in [
        ("vgg16", 1, 32),
        ("densenet121", 2, 32),
        ("inception_v4", 2, 75),
    ] {
        let g = zoo_graph(name, batch, res, true);
        let mut program = Program::new(&g, Device::Cpu).expect("binds");
        let mut values = initial_values(&g, Device::Cpu, 1, None, None).expect("values");
        run_iteration(&mut program, &g, &mut values).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(loss(&g, &values).is_finite(), "{name}");
    }
}

/// A copy of `g` with op `index` changed by `f`.
fn edited(g: &Graph, index: usize, f: impl FnOnce(&mut tensile_graph::Op)) -> Graph {
    let mut draft = GraphDraft {
        name: g.name().to_string(),
        tensors: g.tensors().to_vec(),
        ops: g.ops().to_vec(),
    };
    f(&mut draft.ops[index]);
    Graph::new(draft, &Limits::default()).expect("still a valid graph")
}

fn bind_error(g: &Graph) -> String {
    match Program::new(g, Device::Cpu) {
        Err(e @ KernelError::Bind { .. }) => e.to_string(),
        Err(e) => panic!("not a binding error: {e}"),
        Ok(_) => panic!("a broken graph bound"),
    }
}

#[test]
fn an_op_that_cannot_run_is_an_error_naming_it() {
    let _turn = turn();
    let g = zoo_graph("resnet50", 2, 32, false);
    let i = g
        .ops()
        .iter()
        .position(|o| o.op_type == "aten::relu_")
        .expect("a relu");
    let name = g.ops()[i].name.clone();

    let e = bind_error(&edited(&g, i, |o| o.op_type = "aten::no_such_op".into()));
    assert!(
        e.contains(&name) && e.contains("aten::no_such_op") && e.contains("no such operator"),
        "{e}"
    );

    let e = bind_error(&edited(&g, i, |o| o.op_type = "relu_".into()));
    assert!(
        e.contains(&name) && e.contains("not an operator name"),
        "{e}"
    );

    // An op that returns a number, not tensors.
    let e = bind_error(&edited(&g, i, |o| {
        o.op_type = "aten::_local_scalar_dense".into()
    }));
    assert!(e.contains(&name) && e.contains("returns a Scalar"), "{e}");

    // A convolution without its `groups` (no default in the schema).
    let c = g
        .ops()
        .iter()
        .position(|o| o.op_type == "aten::convolution")
        .expect("a conv");
    let cname = g.ops()[c].name.clone();
    let e = bind_error(&edited(&g, c, |o| {
        o.attrs.remove("groups");
    }));
    assert!(
        e.contains(&cname) && e.contains("\"groups\"") && e.contains("missing"),
        "{e}"
    );

    // An attribute no argument has, and one of the wrong type.
    let e = bind_error(&edited(&g, c, |o| {
        o.attrs.insert("colour".into(), AttrValue::Int(1));
    }));
    assert!(e.contains(&cname) && e.contains("colour"), "{e}");
    let e = bind_error(&edited(&g, c, |o| {
        o.attrs
            .insert("stride".into(), AttrValue::Str("wide".into()));
    }));
    assert!(e.contains(&cname) && e.contains("stride"), "{e}");
}

#[test]
fn a_kernel_failure_is_an_error_naming_the_op() {
    let _turn = turn();
    let g = zoo_graph("resnet50", 2, 32, false);
    let mut program = Program::new(&g, Device::Cpu).expect("binds");
    let op = &g.ops()[0];
    // A convolution on an input of the wrong rank.
    let x = Tensor::zeros([3], (tch::Kind::Float, Device::Cpu));
    let w = Tensor::zeros([3], (tch::Kind::Float, Device::Cpu));
    let e = program
        .run(op.id, &[&x, &w])
        .expect_err("a bad input fails");
    assert!(matches!(e, KernelError::Run { .. }), "{e}");
    assert!(e.to_string().contains(&op.name), "{e}");
    let e = program
        .run(op.id, &[&x])
        .expect_err("a missing input fails");
    assert!(e.to_string().contains("1 inputs given"), "{e}");
}

#[test]
fn params_round_trip_through_safetensors() {
    let _turn = turn();
    let g = zoo_graph("resnet50", 2, 32, false);
    let dir = std::env::temp_dir().join(format!("tensile-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("p.safetensors");
    let values = initial_values(&g, Device::Cpu, 3, None, None).expect("values");
    save_params(&g, &values, &path).expect("saved");
    let loaded = initial_values(&g, Device::Cpu, 99, Some(&path), None).expect("loaded");
    for t in g.parameters() {
        assert!(
            values
                .get(t.id)
                .expect("set")
                .equal(loaded.get(t.id).expect("set")),
            "{}",
            t.name
        );
    }
    // A file missing a parameter, or with a foreign tensor, is refused.
    let t = Tensor::zeros([2], (tch::Kind::Float, Device::Cpu));
    Tensor::write_safetensors(&[("nope", &t)], &path).expect("written");
    let e = initial_values(&g, Device::Cpu, 0, Some(&path), None).expect_err("refused");
    assert!(e.to_string().contains("no tensor named"), "{e}");
    let e = initial_values(&g, Device::Cpu, 0, None, Some(&path)).expect_err("refused");
    assert!(e.to_string().contains("no tensor named \"input\""), "{e}");
    let e =
        initial_values(&g, Device::Cpu, 0, None, Some(&dir.join("absent"))).expect_err("refused");
    assert!(e.to_string().contains("absent"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn cuda_memory_statistics_or_a_clear_error() {
    let _turn = turn();
    if !tch::Cuda::is_available() {
        let e = tensile_kernels::cuda_memory(0, false).expect_err("no GPU: an error");
        assert!(e.to_string().contains("no such CUDA device"), "{e}");
        let e = tensile_kernels::cuda_empty_cache().expect_err("no GPU: an error");
        assert!(e.to_string().contains("no CUDA device"), "{e}");
        eprintln!("skipped: no CUDA device (checked that asking for one is a clear error)");
        return;
    }
    // With a GPU: a 4 MiB tensor shows in the allocated bytes and the peak.
    let before = tensile_kernels::cuda_memory(0, true).expect("stats");
    let t = Tensor::zeros([1 << 20], (tch::Kind::Float, Device::Cuda(0)));
    let during = tensile_kernels::cuda_memory(0, false).expect("stats");
    assert!(
        during.allocated >= before.allocated + (4 << 20),
        "{before:?} {during:?}"
    );
    assert!(during.allocated_peak >= during.allocated);
    drop(t);
    let after = tensile_kernels::cuda_memory(0, true).expect("stats");
    assert!(after.allocated < during.allocated && after.allocated_peak >= during.allocated);
    // Emptying the cache gives back what no tensor holds: reserved comes
    // down to at most what it was, and never below what is allocated.
    tensile_kernels::cuda_empty_cache().expect("empty the cache");
    let emptied = tensile_kernels::cuda_memory(0, false).expect("stats");
    assert!(
        emptied.reserved <= after.reserved && emptied.reserved >= emptied.allocated,
        "{after:?} {emptied:?}"
    );
}

#[test]
fn an_overload_in_the_op_name_binds() {
    let _turn = turn();
    let g = zoo_graph("resnet50", 2, 32, false);
    let i = g
        .ops()
        .iter()
        .position(|o| o.op_type == "aten::relu_")
        .expect("a relu");
    let ok = edited(&g, i, |o| o.op_type = "aten::relu_.default".into());
    let program = Program::new(&ok, Device::Cpu).expect("binds");
    assert_eq!(program.binding(g.ops()[i].id).map(|b| b.0), Some(""));
    let e = bind_error(&edited(&g, i, |o| {
        o.op_type = "aten::relu_.sideways".into()
    }));
    assert!(e.contains("relu_") && e.contains("sideways"), "{e}");
}

#[test]
fn allocator_settings_apply_or_name_what_is_wrong() {
    let _turn = turn();
    let e = tensile_kernels::set_allocator_settings("expandable_segments:maybe")
        .expect_err("not a boolean");
    assert!(e.to_string().contains("expandable_segments:maybe"), "{e}");
    let e = tensile_kernels::set_allocator_settings("max_split_size_mb").expect_err("no value");
    assert!(e.to_string().contains("max_split_size_mb"), "{e}");
    tensile_kernels::set_allocator_settings("expandable_segments:True").expect("a valid setting");
    if tch::Cuda::is_available() {
        // Allocations still work, and come back to the allocator's stats.
        let before = tensile_kernels::cuda_memory(0, false).expect("stats");
        let t = Tensor::zeros([1 << 20], (tch::Kind::Float, Device::Cuda(0)));
        let during = tensile_kernels::cuda_memory(0, false).expect("stats");
        assert!(during.allocated >= before.allocated + (4 << 20));
        drop(t);
    }
    tensile_kernels::set_allocator_settings("expandable_segments:False").expect("back");
}
