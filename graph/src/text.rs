//! A readable text rendering of a graph and its liveness, one op per line,
//! for snapshot tests and for people reading small graphs.
//!
//! ```text
//! op2   forward   aten::addmm   fc   (t3 b, t0 x, t4 fc.weight.t) -> t5 fc [4, 16] f32   +256 B  free t0 x  | 1.2 KiB
//! ```

use std::fmt::Write;

use crate::ir::{Graph, TensorId};
use crate::liveness::Liveness;

/// Renders the tensors, then each op with what it allocates and frees and
/// the bytes resident while it runs (vanilla: free after last use).
pub fn render(graph: &Graph) -> String {
    let live = Liveness::analyze(graph);
    let footprint = live.vanilla_footprint();
    let mut out = String::new();
    let name = |t: TensorId| format!("{t} {}", graph.tensor(t).name);
    let _ = writeln!(out, "graph {}", graph.name());
    for t in graph.tensors() {
        let storage = graph.storage_root(t.id);
        let alias = if storage == t.id {
            String::new()
        } else {
            format!(" (memory of {storage})")
        };
        let _ = writeln!(
            out,
            "  {} {:?} {} {} {} B{alias}",
            name(t.id),
            t.shape,
            t.dtype.name(),
            t.kind.name(),
            t.bytes
        );
    }
    let _ = writeln!(out, "at start: {} B", footprint.at_start);
    for (op, during) in graph.ops().iter().zip(&footprint.during) {
        let ins: Vec<String> = op.inputs.iter().map(|&t| name(t)).collect();
        let outs: Vec<String> = op.outputs.iter().map(|&t| name(t)).collect();
        let alloc: u64 = live.allocs[op.id.index()]
            .iter()
            .map(|s| live.storages[s.index()].bytes)
            .sum();
        let frees: Vec<String> = live.frees[op.id.index()]
            .iter()
            .map(|s| format!("{}", live.storages[s.index()].root))
            .collect();
        let _ = write!(
            out,
            "{} {}{} {} {} ({}) -> ({}) +{alloc} B",
            op.id,
            op.phase.name(),
            if op.on_host() { " on host" } else { "" },
            op.op_type,
            op.name,
            ins.join(", "),
            outs.join(", ")
        );
        if !frees.is_empty() {
            let _ = write!(out, ", free {}", frees.join(" "));
        }
        let _ = writeln!(out, " | {during} B");
    }
    let _ = writeln!(
        out,
        "vanilla peak: {} B{}",
        footprint.peak,
        footprint
            .peak_op
            .map(|o| format!(" during {o}"))
            .unwrap_or_default()
    );
    out
}
