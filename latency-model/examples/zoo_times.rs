//! Predicted training-iteration times of every zoo model on the built-in
//! device profiles: the roofline, the true latencies (seed 0) and the
//! cold-start estimate, the estimate's mean absolute per-op error against
//! the truth, and the roofline split by op class.
//!
//! `cargo run -p tensile-latency-model --example zoo_times -- [batch]`

use std::collections::BTreeMap;

use tensile_graph::zoo::{self, ZooConfig};
use tensile_latency_model::{
    DeviceProfile, estimate_latencies, op_class, roofline_latencies, true_latencies,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let batch = match std::env::args().nth(1) {
        Some(b) => b.parse()?,
        None => 16,
    };
    let ms = |v: &[u64]| v.iter().sum::<u64>() as f64 / 1e6;
    for name in DeviceProfile::builtin_names() {
        let profile = DeviceProfile::builtin(name)?;
        println!(
            "{name} (batch {batch}): roofline / true / estimate ms, estimate MAPE; roofline ms by class"
        );
        for model in zoo::MODELS {
            let graph = zoo::build(model.name, &ZooConfig::new(batch))?;
            let roof = roofline_latencies(&graph, &profile);
            let truth = true_latencies(&graph, &profile, 0);
            let est = estimate_latencies(&graph, &profile);
            let errors: Vec<f64> = truth
                .iter()
                .zip(&est)
                .filter(|(t, _)| **t > 0)
                .map(|(&t, &e)| (e as f64 / t as f64 - 1.0).abs())
                .collect();
            let mape = 100.0 * errors.iter().sum::<f64>() / errors.len() as f64;
            let mut by_class = BTreeMap::new();
            for (op, &t) in graph.ops().iter().zip(&roof) {
                *by_class.entry(op_class(op).name()).or_insert(0u64) += t;
            }
            let classes: Vec<String> = by_class
                .iter()
                .filter(|(_, t)| **t > 0)
                .map(|(c, t)| format!("{c} {:.1}", *t as f64 / 1e6))
                .collect();
            println!(
                "  {:<14} {:>8.1} {:>8.1} {:>8.1} {:>5.0}%   {}",
                model.name,
                ms(&roof),
                ms(&truth),
                ms(&est),
                mape,
                classes.join(", ")
            );
        }
    }
    Ok(())
}
