//! What the commands print: graph statistics as a struct (for `--json`) and
//! as human-readable text.

use serde::Serialize;
use tensile_cli::format_mb;
use tensile_graph::{Graph, Liveness, Phase};
use tensile_latency_model::DeviceProfile;

/// Statistics of one graph. JSON keys are part of the CLI's contract.
#[derive(Debug, Serialize)]
pub(crate) struct GraphStats {
    pub(crate) name: String,
    pub(crate) ops: usize,
    pub(crate) tensors: usize,
    pub(crate) forward_ops: usize,
    pub(crate) backward_ops: usize,
    pub(crate) optimizer_ops: usize,
    pub(crate) params: u64,
    pub(crate) param_bytes: u64,
    /// Parameters, buffers and optimizer state: memory that lives across iterations.
    pub(crate) persistent_bytes: u64,
    /// Resident when the iteration starts (persistent storage and the inputs).
    pub(crate) start_bytes: u64,
    /// Peak of a framework that frees every tensor after its last use.
    pub(crate) vanilla_peak_bytes: u64,
    /// The op during which that peak is reached.
    pub(crate) vanilla_peak_op: Option<String>,
    /// Peak when nothing is freed inside the iteration (the TENSILE authors' vanilla).
    pub(crate) keep_all_peak_bytes: u64,
}

impl GraphStats {
    pub(crate) fn of(graph: &Graph) -> GraphStats {
        let live = Liveness::analyze(graph);
        let vanilla = live.vanilla_footprint();
        let phase = |p| graph.ops().iter().filter(|o| o.phase == p).count();
        GraphStats {
            name: graph.name().to_string(),
            ops: graph.ops().len(),
            tensors: graph.tensors().len(),
            forward_ops: phase(Phase::Forward),
            backward_ops: phase(Phase::Backward),
            optimizer_ops: phase(Phase::Optimizer),
            params: graph.param_count(),
            param_bytes: graph.param_bytes(),
            persistent_bytes: live.persistent_bytes(),
            start_bytes: vanilla.at_start,
            vanilla_peak_bytes: vanilla.peak,
            vanilla_peak_op: vanilla.peak_op.map(|o| graph.op(o).name.clone()),
            keep_all_peak_bytes: live.keep_all_footprint().peak,
        }
    }

    pub(crate) fn print_text(&self) {
        tensile_cli::outln!("graph                {}", self.name);
        tensile_cli::outln!(
            "ops                  {} ({} forward, {} backward, {} optimizer)",
            self.ops,
            self.forward_ops,
            self.backward_ops,
            self.optimizer_ops
        );
        tensile_cli::outln!("tensors              {}", self.tensors);
        tensile_cli::outln!("params               {}", self.params);
        tensile_cli::outln!("param bytes          {}", format_mb(self.param_bytes));
        tensile_cli::outln!("persistent bytes     {}", format_mb(self.persistent_bytes));
        tensile_cli::outln!("resident at start    {}", format_mb(self.start_bytes));
        tensile_cli::outln!(
            "vanilla peak         {}{}",
            format_mb(self.vanilla_peak_bytes),
            self.vanilla_peak_op
                .as_deref()
                .map(|o| format!(" (during {o})"))
                .unwrap_or_default()
        );
        tensile_cli::outln!(
            "keep-all peak        {}",
            format_mb(self.keep_all_peak_bytes)
        );
    }
}

/// The devices' names, comma separated (what a benchmark runs on).
pub(crate) fn device_names(devices: &[DeviceProfile]) -> String {
    devices
        .iter()
        .map(|d| d.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
