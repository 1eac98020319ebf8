//! Binds every op type of every zoo model (or of a graph file given as the
//! argument) and prints, per op type, the overload chosen or why it fails.
use std::collections::BTreeMap;

use tch::Device;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_kernels::Program;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut graphs = Vec::new();
    if let Some(path) = std::env::args().nth(1) {
        let bytes = std::fs::read(&path)?;
        graphs.push(tensile_graph::json::parse(
            &bytes,
            &tensile_graph::Limits::default(),
        )?);
    } else {
        for m in zoo::MODELS {
            for sgd in [false, true] {
                let mut cfg = ZooConfig::new(2);
                cfg.resolution =
                    Some(
                        m.min_resolution
                            .max(if m.name == "bert_base" { 8 } else { 32 }),
                    );
                if sgd {
                    cfg.optimizer = tensile_graph::builder::Optimizer::sgd();
                }
                graphs.push(zoo::build(m.name, &cfg)?);
            }
        }
    }
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for g in &graphs {
        // Bind op by op so that one failure does not hide the others.
        for op in g.ops() {
            if seen.contains_key(&op.op_type) {
                continue;
            }
            let one = tensile_kernels::binding_of(op).unwrap_or_else(|e| format!("FAILS: {e}"));
            seen.insert(op.op_type.clone(), one);
        }
        match Program::new(g, Device::Cpu) {
            Ok(_) => println!("{}: binds", g.name()),
            Err(e) => println!("{}: {e}", g.name()),
        }
    }
    for (k, v) in seen {
        println!("{k:50} {v}");
    }
    Ok(())
}
