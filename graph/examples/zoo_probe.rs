//! Prints, for each zoo model named on the command line, its size at batch
//! 16 and its vanilla, keep-all and persistent memory, and how long it took
//! to build: a quick look at a model while writing it
//! (`cargo run -p tensile-graph --example zoo_probe -- resnet50 vgg16`).

use tensile_graph::Liveness;
use tensile_graph::zoo::{self, ZooConfig};
fn main() {
    for name in std::env::args().skip(1) {
        let t = std::time::Instant::now();
        let g = zoo::build(&name, &ZooConfig::new(16)).expect("zoo model builds");
        let l = Liveness::analyze(&g);
        let v = l.vanilla_footprint();
        let k = l.keep_all_footprint();
        println!(
            "{name}: params {} ops {} tensors {} vanilla_peak {:.1} MB keepall {:.1} MB persistent {:.1} MB peak_op {:?} ({:?}) built in {:?}",
            g.param_count(),
            g.ops().len(),
            g.tensors().len(),
            v.peak as f64 / 1e6,
            k.peak as f64 / 1e6,
            l.persistent_bytes() as f64 / 1e6,
            v.peak_op.map(|o| g.op(o).name.clone()),
            v.peak_op.map(|o| g.op(o).phase),
            t.elapsed()
        );
    }
}
