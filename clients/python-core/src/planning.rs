//! One graph planned in the process: `tensile-plan-job`'s `plan_job`, what
//! `tensilectl plan GRAPH --device D [--budget-mb N] [--no-recompute] -o
//! PLAN` runs, so that the same graph, profile and budget give the same
//! plan document. The GIL is released from the graph's parsing to the
//! plan's writing.

use std::path::{Path, PathBuf};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensile_plan_job::{ColdStart, PlanOptions, PlanReport, device_profile, plan_job};
use tensile_proto::plan_json::plan_to_json;

use crate::PlanningError;
use crate::convert::{from_json, json_text, parse_graph};

/// What a plan made in the process is, before it becomes Python objects.
struct Planned {
    plan: String,
    report: String,
    warnings: Vec<String>,
}

/// Why planning failed: the caller's graph, or the planning itself.
enum Failed {
    Graph(String),
    Planning(String),
}

/// `e` and its causes on one line, `: `-joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

fn plan_text(graph: &str, device: &str, opts: &PlanOptions) -> Result<Planned, Failed> {
    let graph = parse_graph(graph).map_err(Failed::Graph)?;
    let profile = device_profile(device).map_err(|e| Failed::Planning(chain(&e)))?;
    let outcome = plan_job(&graph, &profile, opts).map_err(|e| Failed::Planning(chain(&e)))?;
    let mp = &outcome.plan;
    let Some(plan) = mp.plans.first() else {
        return Err(Failed::Planning("the planner returned no plan".into()));
    };
    let report = PlanReport::new(graph.name().to_string(), None, &profile, &outcome);
    Ok(Planned {
        plan: plan_to_json(plan, &mp.diagnostics, &graph),
        report: serde_json::to_string(&report)
            .map_err(|e| Failed::Planning(format!("the report: {e}")))?,
        warnings: outcome.warnings,
    })
}

/// Plans `graph` (a `tensile-graph/v1` dict or its JSON text) alone on the
/// device profile `device` (`a6000`, `h100`, `h200`, `paper`, `cpu`, or a profile
/// file), as `tensilectl plan` does.
///
/// `budget_bytes`: the memory the plan should fit (None: no budget);
/// `recompute`: whether it may recompute; `stop_at_budget`: stop once it
/// fits instead of swapping all that can be hidden; `latency_models`:
/// where the cold-start latencies come from (`auto`, `roofline`, or a
/// model directory). Learned models run on the ONNX Runtime of this
/// Python environment's onnxruntime wheel (`ORT_DYLIB_PATH` wins).
///
/// Returns `{"plan": <tensile-plan/v1 dict>, "report": <what tensilectl
/// plan --json prints>, "warnings": [str]}`. Raises `ValueError` for a bad
/// graph or argument and `PlanningError` when planning fails.
#[pyfunction]
#[pyo3(signature = (graph, device, *, budget_bytes=None, recompute=true, stop_at_budget=false, latency_models="auto"))]
pub(crate) fn plan<'py>(
    py: Python<'py>,
    graph: &Bound<'py, PyAny>,
    device: &str,
    budget_bytes: Option<u64>,
    recompute: bool,
    stop_at_budget: bool,
    latency_models: &str,
) -> PyResult<Bound<'py, PyDict>> {
    if budget_bytes == Some(0) {
        return Err(PyValueError::new_err("budget_bytes must be positive"));
    }
    if stop_at_budget && budget_bytes.is_none() {
        return Err(PyValueError::new_err("stop_at_budget needs budget_bytes"));
    }
    let text = json_text(graph, "graph")?;
    let prefix: PathBuf = py.import("sys")?.getattr("prefix")?.extract()?;
    let opts = PlanOptions {
        budget_bytes,
        stop_at_budget,
        recompute,
        cold_start: ColdStart::parse(latency_models),
        ort_library: tensile_latency_model::predict::ort_library_in_environment(Path::new(&prefix)),
        ..PlanOptions::default()
    };
    let device = device.to_owned();
    let planned = py
        .detach(move || plan_text(&text, &device, &opts))
        .map_err(|f| match f {
            Failed::Graph(why) => PyValueError::new_err(why),
            Failed::Planning(why) => PlanningError::new_err(why),
        })?;
    let out = PyDict::new(py);
    out.set_item("plan", from_json(py, &planned.plan)?)?;
    out.set_item("report", from_json(py, &planned.report)?)?;
    out.set_item("warnings", planned.warnings)?;
    Ok(out)
}
