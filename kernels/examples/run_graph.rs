//! Trains a graph on the kernels with the reference loop and prints the loss
//! and the time of each iteration: `run_graph FILE.json [ITERATIONS]` or
//! `run_graph zoo:NAME:BATCH:RESOLUTION [ITERATIONS]` (CPU, one thread unless
//! `THREADS` says otherwise).
use std::time::Instant;

use tch::Device;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Limits, TensorKind};
use tensile_kernels::{Program, initial_values, run_iteration};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::args()
        .nth(1)
        .ok_or("usage: run_graph FILE.json|zoo:NAME:BATCH:RES [ITERATIONS]")?;
    let iterations: usize = std::env::args().nth(2).map_or(Ok(2), |s| s.parse())?;
    let threads: i32 = std::env::var("THREADS").map_or(Ok(1), |s| s.parse())?;
    tch::set_num_threads(threads);
    let graph = if let Some(z) = spec.strip_prefix("zoo:") {
        let parts: Vec<&str> = z.split(':').collect();
        let [name, batch, res] = parts[..] else {
            return Err("zoo:NAME:BATCH:RESOLUTION".into());
        };
        let mut cfg = ZooConfig::new(batch.parse()?);
        cfg.resolution = Some(res.parse()?);
        zoo::build(name, &cfg)?
    } else {
        tensile_graph::json::parse(&std::fs::read(&spec)?, &Limits::default())?
    };
    let t = Instant::now();
    let mut program = Program::new(&graph, Device::Cpu)?;
    println!(
        "{}: {} ops bound in {:.1} ms",
        graph.name(),
        graph.ops().len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut values = initial_values(&graph, Device::Cpu, 0, None, None)?;
    let loss = graph
        .tensors()
        .iter()
        .find(|t| t.kind == TensorKind::Output)
        .map(|t| t.id);
    for i in 0..iterations {
        let t = Instant::now();
        run_iteration(&mut program, &graph, &mut values)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let l = loss
            .and_then(|id| values.get(id))
            .map(|t| t.double_value(&[]));
        println!("iteration {i}: {ms:.1} ms, loss {l:?}");
    }
    Ok(())
}
