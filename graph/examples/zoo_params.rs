//! Prints every parameter of a zoo model as `name<TAB>shape`, one per line,
//! then the total, for comparison with the reference implementation's
//! `named_parameters()`.
//!
//! `cargo run -p tensile-graph --example zoo_params -- resnet50 [batch]`
use tensile_graph::zoo::{self, ZooConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "resnet50".into());
    let batch = args.next().and_then(|b| b.parse().ok()).unwrap_or(2);
    let g = match zoo::build(&name, &ZooConfig::new(batch)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    for p in g.parameters() {
        println!("{}\t{:?}", p.name, p.shape);
    }
    println!("total\t{}", g.param_count());
}
