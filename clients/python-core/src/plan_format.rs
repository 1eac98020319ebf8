//! The plan file format (`tensile-plan/v1`, `tensile_proto::plan_json`)
//! for Python: a plan document read and validated against its graph, and
//! a plan from the wire (a `tensile.v1.Plan` message) written as one.

use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensile_graph::Graph;
use tensile_planner::Diagnostic;
use tensile_proto::convert::{diagnostic_from_proto, plan_from_proto};
use tensile_proto::pb;
use tensile_proto::plan_json::{plan_to_json, read_plan_file};

use crate::PlanFormatError;
use crate::convert::{from_json, json_text, parse_graph};

/// Why a plan could not be had: the caller's graph, or the plan.
enum Failed {
    Graph(String),
    Plan(String),
}

impl From<Failed> for PyErr {
    fn from(f: Failed) -> PyErr {
        match f {
            Failed::Graph(why) => PyValueError::new_err(why),
            Failed::Plan(why) => PlanFormatError::new_err(why),
        }
    }
}

fn read(graph: &str, plan: &str) -> Result<String, Failed> {
    let graph = parse_graph(graph).map_err(Failed::Graph)?;
    let file = read_plan_file(plan, &graph).map_err(|e| Failed::Plan(e.to_string()))?;
    Ok(plan_to_json(&file.plan, &file.diagnostics, &graph))
}

/// A plan document (a dict or its JSON text) read and validated against
/// `graph` (a `tensile-graph/v1` dict or its JSON text) by the rules every
/// reader of plan files follows (`docs/plan-format.md`), and returned as
/// the document the format writes. Raises `PlanFormatError` naming the
/// item at fault (`event 3: tensor 12 is ...`), `ValueError` for a bad
/// graph.
#[pyfunction]
pub(crate) fn read_plan<'py>(
    py: Python<'py>,
    graph: &Bound<'py, PyAny>,
    plan: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let graph = json_text(graph, "graph")?;
    let plan = json_text(plan, "the plan")?;
    let text = py.detach(move || read(&graph, &plan))?;
    from_json(py, &text)
}

fn diagnostics_of(messages: &[Vec<u8>], graph: &Graph) -> Result<Vec<Diagnostic>, Failed> {
    messages
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let d = pb::Diagnostic::decode(bytes.as_slice()).map_err(|e| {
                Failed::Plan(format!("diagnostic {i}: not a Diagnostic message: {e}"))
            })?;
            let d = diagnostic_from_proto(&d, 0)
                .map_err(|e| Failed::Plan(format!("diagnostic {i}: {e}")))?;
            if let Some(t) = d.tensor
                && t.index() >= graph.tensors().len()
            {
                return Err(Failed::Plan(format!(
                    "diagnostic {i}: tensor {} is not in the graph ({} tensors)",
                    t.0,
                    graph.tensors().len()
                )));
            }
            Ok(d)
        })
        .collect()
}

fn from_wire(graph: &str, plan: &[u8], diagnostics: &[Vec<u8>]) -> Result<String, Failed> {
    let graph = parse_graph(graph).map_err(Failed::Graph)?;
    let message = pb::Plan::decode(plan)
        .map_err(|e| Failed::Plan(format!("not a tensile.v1.Plan message: {e}")))?;
    let p = plan_from_proto(&message, &graph).map_err(|e| Failed::Plan(format!("plan {e}")))?;
    tensile_proto::plan_json::check_plan(&p, &graph)
        .map_err(|e| Failed::Plan(format!("plan {e}")))?;
    let diagnostics = diagnostics_of(diagnostics, &graph)?;
    Ok(plan_to_json(&p, &diagnostics, &graph))
}

/// A plan from the wire (a serialized `tensile.v1.Plan`, with its
/// serialized `Diagnostic`s) as a `tensile-plan/v1` document for `graph`,
/// checked as a pushed plan is (`plan_from_proto`, then the file's
/// rules): what `tensile.plan(..., server=...)` turns a PlanGraph answer
/// into. Raises `PlanFormatError` naming what is wrong.
#[pyfunction]
#[pyo3(signature = (graph, plan, diagnostics=Vec::new()))]
pub(crate) fn plan_from_wire<'py>(
    py: Python<'py>,
    graph: &Bound<'py, PyAny>,
    plan: Vec<u8>,
    diagnostics: Vec<Vec<u8>>,
) -> PyResult<Bound<'py, PyAny>> {
    let graph = json_text(graph, "graph")?;
    let text = py.detach(move || from_wire(&graph, &plan, &diagnostics))?;
    from_json(py, &text)
}
