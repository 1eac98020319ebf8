//! Snapshot tests: the plans of tiny readable models, one event a line, so
//! that a change in what the planner decides shows up in review.

use expect_test::{Expect, expect};

use crate::mlp;
use tensile_graph::Graph;
use tensile_graph::builder::Optimizer;
use tensile_planner::{
    CopyModel, Event, EventKind, JobInput, JobSettings, Plan, PlannerConfig, Trigger, plan,
};

fn render(g: &Graph, p: &Plan) -> String {
    let op = |o: tensile_graph::OpId| g.op(o).name.clone();
    let mut out = String::new();
    let pr = &p.prediction;
    out += &format!(
        "peak {} -> {} bytes, time {} -> {} ns\n",
        pr.vanilla_peak_bytes, pr.planned_peak_bytes, pr.vanilla_time_ns, pr.planned_time_ns
    );
    for t in &p.start_on_host {
        out += &format!("start on host: {}\n", g.tensor(*t).name);
    }
    for &Event {
        trigger,
        delay_ns,
        kind,
        tensor,
    } in &p.events
    {
        if kind == EventKind::Release {
            continue;
        }
        let when = match trigger {
            Trigger::IterationStart => format!("start +{delay_ns}"),
            Trigger::After(o) => format!("after {} +{delay_ns}", op(o)),
            Trigger::Before(o) => format!("before {}", op(o)),
        };
        out += &format!("{when}: {} {}\n", kind.name(), g.tensor(tensor).name);
    }
    out
}

fn check(g: &Graph, copy: CopyModel, budget: Option<u64>, want: Expect) {
    let lat = vec![1_000_000; g.ops().len()];
    let mut cfg = PlannerConfig::new(copy);
    cfg.budget_bytes = budget;
    let mp = plan(&[JobInput::new(g, lat, JobSettings::default())], &cfg).expect("plans");
    want.assert_eq(&render(g, &mp.plans[0]));
}

#[test]
fn mlp_adam_weight_heavy_swaps_optimizer_state() {
    // 4 MB weights, 1 MB activations, 4 GB/s: the peak is in the optimizer
    // step, where only the state of layers updated later can be away.
    check(
        &mlp(256, 1024, 2, Optimizer::adam()),
        CopyModel::duplex(4e9, 4e9, 10_000),
        None,
        expect![[r#"
            peak 35815428 -> 35651588 bytes, time 26000000 -> 26000000 ns
            start +0: swap_out head.weight.exp_avg
            start +20240: swap_out head.weight.exp_avg_sq
            after head.backward.input +0: swap_out head.weight
            after head.backward.weight +0: swap_out grad:head.weight
            after fc1.weight.adam +919040: swap_in head.weight.exp_avg_sq
            after fc1.weight.adam +939280: swap_in head.weight.exp_avg
            after fc1.weight.adam +959520: swap_in grad:head.weight
            after fc1.weight.adam +979760: swap_in head.weight
        "#]],
    );
}

#[test]
fn mlp_sgd_activation_heavy_half_duplex() {
    // 4 MB activations, 256 kB weights, 8 GB/s on one queue: activations go
    // out in the forward pass and come back in the backward pass.
    let mut copy = CopyModel::duplex(8e9, 8e9, 10_000);
    copy.half_duplex = true;
    check(
        &mlp(4096, 256, 2, Optimizer::sgd()),
        copy,
        None,
        expect![[r#"
        peak 22050820 -> 13139968 bytes, time 26000000 -> 26000000 ns
        start on host: fc1.weight.momentum_buffer
        start on host: fc2.weight.momentum_buffer
        start +0: swap_out head.weight
        start +11280: swap_out head.weight.momentum_buffer
        after fc1 +0: swap_out x
        after fc1 +534288: swap_out fc1.weight
        after fc2 +0: swap_out act1
        after fc2 +988720: swap_in head.weight
        after fc2.backward.input +465712: swap_in act1
        after act1.backward +465712: swap_in x
        after fc1.backward.grad_t +914464: swap_in fc1.weight.momentum_buffer
        after fc1.backward.grad_t +957232: swap_in fc1.weight
        after fc1.backward.weight +957232: swap_in fc2.weight.momentum_buffer
        after fc1.weight.sgd +0: swap_out fc1.weight.momentum_buffer
        after fc1.weight.sgd +988720: swap_in head.weight.momentum_buffer
        after fc2.weight.sgd +0: swap_out fc2.weight.momentum_buffer
    "#]],
    );
}

#[test]
fn mlp_recompute_under_budget() {
    // No time to copy anything: only recomputation can lower the peak.
    let g = mlp(4096, 256, 5, Optimizer::sgd());
    check(
        &g,
        CopyModel::duplex(1e6, 1e6, 10_000),
        Some(1),
        expect![[r#"
            peak 36206596 -> 28069892 bytes, time 50000000 -> 54000000 ns
            start +0: swap_out head.weight.momentum_buffer
            before fc4.backward.weight: recompute fc3
            before fc4.backward.weight: recompute act3
            after act2.backward +750000: swap_in head.weight.momentum_buffer
            before fc2.backward.weight: recompute fc1
            before fc2.backward.weight: recompute act1
        "#]],
    );
}
