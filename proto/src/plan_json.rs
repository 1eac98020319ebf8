//! The JSON format of a job's plan on disk (`"format": "tensile-plan/v1"`),
//! what `tensilectl plan -o FILE` writes and a worker reads. It mirrors the
//! contract's `Plan` message: every event (kind, tensor, trigger op,
//! delay), the tensors that start the iteration on the host, the version,
//! the prediction, and the planner's diagnostics; tensors and ops carry
//! their names beside their ids, so that a plan read against the wrong
//! graph is caught by name. Times are integer nanoseconds (the planner's
//! unit, where the wire has seconds as doubles) so a plan round-trips
//! exactly; the predicted memory time lines are not stored.
//!
//! These serde types mirror the planner's and exist only at this edge (the
//! planner is serde-free); reading validates everything against the graph,
//! and every error names the item at fault (`event 3: ...`).
//!
//! ```json
//! { "format": "tensile-plan/v1", "graph": "resnet50_b2_r224_adam", "version": 1,
//!   "start_on_host": [ {"tensor": 648, "tensor_name": "layer4.0.bn3.running_mean"} ],
//!   "events": [ {"kind": "swap_in", "tensor": 24, "tensor_name": "layer1.0.bn1.num_batches_tracked",
//!                "trigger": "after", "trigger_op": 3, "trigger_op_name": "relu", "delay_ns": 19654}, ... ],
//!   "prediction": { "vanilla_peak_bytes": 1079545644, ..., "waits": [] },
//!   "diagnostics": [ {"kind": "over_budget", "tensor": null, "tensor_name": null, "message": "..."} ] }
//! ```
//!
//! `docs/plan-format.md` documents every key and the reading rules.

use serde::{Deserialize, Serialize};
use tensile_graph::{Graph, OpId, TensorId};
use tensile_planner::{
    Diagnostic, DiagnosticKind, Event, EventKind, Gate, Plan, Prediction, Trigger, Wait,
};

/// The value of the `format` key this version reads and writes.
pub const FORMAT: &str = "tensile-plan/v1";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFileJson {
    format: String,
    /// The name of the graph the plan is for.
    graph: String,
    version: u64,
    start_on_host: Vec<TensorJson>,
    /// In the order they fire: the order of events with the same trigger
    /// is kept, and matters.
    events: Vec<EventJson>,
    prediction: PredictionJson,
    #[serde(default)]
    diagnostics: Vec<DiagnosticJson>,
    /// Absent for a job that runs free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gate: Option<GateJson>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateJson {
    period_ns: u64,
    phase_ns: u64,
    epoch_ns: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorJson {
    tensor: u64,
    tensor_name: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventJson {
    /// `swap_out`, `swap_in`, `release`, `recompute`.
    kind: String,
    tensor: u64,
    tensor_name: String,
    /// `iteration_start`, `after` (the op ends) or `before` (the op starts).
    trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trigger_op: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trigger_op_name: Option<String>,
    /// After the trigger; for `before`, an order key among the events
    /// before the same op (recomputations in order, then releases).
    delay_ns: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictionJson {
    vanilla_peak_bytes: u64,
    planned_peak_bytes: u64,
    vanilla_iteration_ns: u64,
    planned_iteration_ns: u64,
    swap_outs: u64,
    swap_ins: u64,
    swapped_bytes: u64,
    recomputed_ops: u64,
    #[serde(default)]
    waits: Vec<WaitJson>,
    /// A coordinated job's pace: each op's start in its iteration, ns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    op_start_ns: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitJson {
    op: u64,
    op_name: String,
    after_recomputes: u64,
    ns: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiagnosticJson {
    /// A `DiagnosticKind` name: `no_swap_window`, `over_budget`, ...
    kind: String,
    tensor: Option<u64>,
    tensor_name: Option<String>,
    message: String,
}

/// A plan as read from a file: one job's plan and its diagnostics (whose
/// `job` is 0: a file holds one job).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanFile {
    pub plan: Plan,
    pub diagnostics: Vec<Diagnostic>,
}

/// Where in a plan file a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Event(usize),
    StartOnHost(usize),
    Prediction,
    Gate,
    Wait(usize),
    Diagnostic(usize),
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Event(i) => write!(f, "event {i}"),
            Item::StartOnHost(i) => write!(f, "start_on_host {i}"),
            Item::Prediction => f.write_str("prediction"),
            Item::Gate => f.write_str("gate"),
            Item::Wait(i) => write!(f, "wait {i}"),
            Item::Diagnostic(i) => write!(f, "diagnostic {i}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanFileError {
    #[error("not a plan: {reason}")]
    Malformed { reason: String },
    #[error("format is {found:?}, expected {FORMAT:?}")]
    Format { found: String },
    #[error("the plan is for graph {plan:?}, not {graph:?}")]
    GraphName { plan: String, graph: String },
    #[error("{at}: tensor {id} is out of range (the graph has {count} tensors)")]
    TensorOutOfRange { at: Item, id: u64, count: usize },
    #[error("{at}: tensor {id} is {actual:?} in the graph, not {named:?}")]
    TensorName {
        at: Item,
        id: u64,
        named: String,
        actual: String,
    },
    #[error("{at}: op {id} is out of range (the graph has {count} ops)")]
    OpOutOfRange { at: Item, id: u64, count: usize },
    #[error("{at}: op {id} is {actual:?} in the graph, not {named:?}")]
    OpName {
        at: Item,
        id: u64,
        named: String,
        actual: String,
    },
    #[error("{at}: unknown {what} {value:?}")]
    Unknown {
        at: Item,
        what: &'static str,
        value: String,
    },
    #[error("{at}: {reason}")]
    Invalid { at: Item, reason: String },
}

/// The plan of one job of `graph` as pretty-printed JSON, with the
/// diagnostics that concern it.
pub fn plan_to_json(plan: &Plan, diagnostics: &[Diagnostic], graph: &Graph) -> String {
    let tensor_name = |t: TensorId| graph.tensor(t).name.clone();
    let op_name = |o: OpId| graph.op(o).name.clone();
    let events = plan
        .events
        .iter()
        .map(|e| {
            let (trigger, op) = match e.trigger {
                Trigger::IterationStart => ("iteration_start", None),
                Trigger::After(op) => ("after", Some(op)),
                Trigger::Before(op) => ("before", Some(op)),
            };
            EventJson {
                kind: e.kind.name().to_string(),
                tensor: u64::from(e.tensor.0),
                tensor_name: tensor_name(e.tensor),
                trigger: trigger.to_string(),
                trigger_op: op.map(|o| u64::from(o.0)),
                trigger_op_name: op.map(op_name),
                delay_ns: e.delay_ns,
            }
        })
        .collect();
    let p = &plan.prediction;
    let file = PlanFileJson {
        format: FORMAT.to_string(),
        graph: graph.name().to_string(),
        version: plan.version,
        start_on_host: plan
            .start_on_host
            .iter()
            .map(|&t| TensorJson {
                tensor: u64::from(t.0),
                tensor_name: tensor_name(t),
            })
            .collect(),
        events,
        prediction: PredictionJson {
            vanilla_peak_bytes: p.vanilla_peak_bytes,
            planned_peak_bytes: p.planned_peak_bytes,
            vanilla_iteration_ns: p.vanilla_time_ns,
            planned_iteration_ns: p.planned_time_ns,
            swap_outs: p.swap_outs as u64,
            swap_ins: p.swap_ins as u64,
            swapped_bytes: p.swapped_bytes,
            recomputed_ops: p.recomputed_ops as u64,
            waits: p
                .waits
                .iter()
                .map(|w| WaitJson {
                    op: u64::from(w.op.0),
                    op_name: op_name(w.op),
                    after_recomputes: w.after_recomputes as u64,
                    ns: w.ns,
                })
                .collect(),
            op_start_ns: p.op_start_ns.clone(),
        },
        diagnostics: diagnostics
            .iter()
            .map(|d| DiagnosticJson {
                kind: d.kind.name().to_string(),
                tensor: d.tensor.map(|t| u64::from(t.0)),
                tensor_name: d.tensor.map(tensor_name),
                message: d.message.clone(),
            })
            .collect(),
        gate: plan.gate.map(|g| GateJson {
            period_ns: g.period_ns,
            phase_ns: g.phase_ns,
            epoch_ns: g.epoch_ns,
        }),
    };
    // Serializing plain structs of strings and integers cannot fail.
    serde_json::to_string_pretty(&file).unwrap_or_default()
}

/// Reads a plan file and validates it against `graph`.
pub fn read_plan_file(bytes: impl AsRef<[u8]>, graph: &Graph) -> Result<PlanFile, PlanFileError> {
    let bytes = bytes.as_ref();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(PlanFileError::Malformed {
            reason: "the input is empty".into(),
        });
    }
    let file: PlanFileJson =
        serde_json::from_slice(bytes).map_err(|e| PlanFileError::Malformed {
            reason: format!("invalid plan JSON: {e}"),
        })?;
    if file.format != FORMAT {
        return Err(PlanFileError::Format { found: file.format });
    }
    if file.graph != graph.name() {
        return Err(PlanFileError::GraphName {
            plan: file.graph,
            graph: graph.name().to_string(),
        });
    }
    let check = Check { graph };
    let start_on_host = file
        .start_on_host
        .iter()
        .enumerate()
        .map(|(i, t)| check.start_on_host(Item::StartOnHost(i), t))
        .collect::<Result<_, _>>()?;
    let events = file
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| check.event(Item::Event(i), e))
        .collect::<Result<_, _>>()?;
    let p = &file.prediction;
    let waits = p
        .waits
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let at = Item::Wait(i);
            Ok(Wait {
                op: check.op(at, w.op, &w.op_name)?,
                after_recomputes: count(at, w.after_recomputes)?,
                ns: w.ns,
            })
        })
        .collect::<Result<_, _>>()?;
    let at = Item::Prediction;
    let prediction = Prediction {
        vanilla_peak_bytes: p.vanilla_peak_bytes,
        planned_peak_bytes: p.planned_peak_bytes,
        vanilla_time_ns: p.vanilla_iteration_ns,
        planned_time_ns: p.planned_iteration_ns,
        swap_outs: count(at, p.swap_outs)?,
        swap_ins: count(at, p.swap_ins)?,
        swapped_bytes: p.swapped_bytes,
        recomputed_ops: count(at, p.recomputed_ops)?,
        waits,
        timeline: Vec::new(),
        vanilla_timeline: Vec::new(),
        op_start_ns: {
            check_op_starts(&p.op_start_ns, graph.ops().len())
                .map_err(|reason| PlanFileError::Invalid { at, reason })?;
            p.op_start_ns.clone()
        },
    };
    let diagnostics = file
        .diagnostics
        .iter()
        .enumerate()
        .map(|(i, d)| check.diagnostic(Item::Diagnostic(i), d))
        .collect::<Result<_, _>>()?;
    let gate = file
        .gate
        .as_ref()
        .map(|g| {
            crate::convert::check_gate(Gate {
                period_ns: g.period_ns,
                phase_ns: g.phase_ns,
                epoch_ns: g.epoch_ns,
            })
        })
        .transpose()
        .map_err(|reason| PlanFileError::Invalid {
            at: Item::Gate,
            reason,
        })?;
    Ok(PlanFile {
        plan: Plan {
            version: file.version,
            events,
            start_on_host,
            prediction,
            gate,
        },
        diagnostics,
    })
}

/// A plan's pace (`prediction.op_start_ns`) checked for a graph of `ops`
/// ops: empty (the job runs free), or one start per op, none before the
/// one of the op before it.
pub fn check_op_starts(starts: &[u64], ops: usize) -> Result<(), String> {
    if !(starts.is_empty() || starts.len() == ops) {
        return Err(format!(
            "{} op starts for a graph of {ops} ops",
            starts.len()
        ));
    }
    match starts.windows(2).position(|w| w[1] < w[0]) {
        Some(w) => Err(format!("op {} starts before op {w}", w + 1)),
        None => Ok(()),
    }
}

/// Checks a plan made elsewhere (pushed over the wire, say) against
/// `graph` by the rules a plan file is read by: ids in range, events on
/// storage roots, recomputations of produced tensors, persistent tensors
/// starting on the host, the pace and the gate.
pub fn check_plan(plan: &Plan, graph: &Graph) -> Result<(), PlanFileError> {
    let (tensors, ops) = (graph.tensors().len(), graph.ops().len());
    let tensor = |at: Item, t: TensorId| {
        (t.index() < tensors)
            .then_some(())
            .ok_or(PlanFileError::TensorOutOfRange {
                at,
                id: u64::from(t.0),
                count: tensors,
            })
    };
    let op = |at: Item, o: OpId| {
        (o.index() < ops)
            .then_some(())
            .ok_or(PlanFileError::OpOutOfRange {
                at,
                id: u64::from(o.0),
                count: ops,
            })
    };
    for (i, e) in plan.events.iter().enumerate() {
        tensor(Item::Event(i), e.tensor)?;
        if let Trigger::After(o) | Trigger::Before(o) = e.trigger {
            op(Item::Event(i), o)?;
        }
    }
    for (i, &t) in plan.start_on_host.iter().enumerate() {
        tensor(Item::StartOnHost(i), t)?;
    }
    for (i, w) in plan.prediction.waits.iter().enumerate() {
        op(Item::Wait(i), w.op)?;
    }
    read_plan_file(plan_to_json(plan, &[], graph), graph).map(|_| ())
}

/// Reads a plan file's plan, validated against `graph`.
pub fn plan_from_json(bytes: impl AsRef<[u8]>, graph: &Graph) -> Result<Plan, PlanFileError> {
    read_plan_file(bytes, graph).map(|f| f.plan)
}

fn count(at: Item, n: u64) -> Result<usize, PlanFileError> {
    usize::try_from(n).map_err(|_| PlanFileError::Invalid {
        at,
        reason: format!("count {n} is too large"),
    })
}

/// Checks ids and names against the graph.
struct Check<'g> {
    graph: &'g Graph,
}

impl Check<'_> {
    fn tensor(&self, at: Item, id: u64, named: &str) -> Result<TensorId, PlanFileError> {
        let count = self.graph.tensors().len();
        let t = u32::try_from(id)
            .ok()
            .map(TensorId)
            .filter(|t| t.index() < count)
            .ok_or(PlanFileError::TensorOutOfRange { at, id, count })?;
        let actual = &self.graph.tensor(t).name;
        if actual != named {
            return Err(PlanFileError::TensorName {
                at,
                id,
                named: named.to_string(),
                actual: actual.clone(),
            });
        }
        Ok(t)
    }

    fn op(&self, at: Item, id: u64, named: &str) -> Result<OpId, PlanFileError> {
        let count = self.graph.ops().len();
        let o = u32::try_from(id)
            .ok()
            .map(OpId)
            .filter(|o| o.index() < count)
            .ok_or(PlanFileError::OpOutOfRange { at, id, count })?;
        let actual = &self.graph.op(o).name;
        if actual != named {
            return Err(PlanFileError::OpName {
                at,
                id,
                named: named.to_string(),
                actual: actual.clone(),
            });
        }
        Ok(o)
    }

    fn start_on_host(&self, at: Item, t: &TensorJson) -> Result<TensorId, PlanFileError> {
        let id = self.tensor(at, t.tensor, &t.tensor_name)?;
        if !self.graph.is_persistent(id) {
            return Err(PlanFileError::Invalid {
                at,
                reason: format!(
                    "tensor {} {:?} is not persistent: only persistent storage begins an iteration on the host",
                    t.tensor, t.tensor_name
                ),
            });
        }
        Ok(id)
    }

    fn event(&self, at: Item, e: &EventJson) -> Result<Event, PlanFileError> {
        let kind = match e.kind.as_str() {
            "swap_out" => EventKind::SwapOut,
            "swap_in" => EventKind::SwapIn,
            "release" => EventKind::Release,
            "recompute" => EventKind::Recompute,
            _ => {
                return Err(PlanFileError::Unknown {
                    at,
                    what: "event kind",
                    value: e.kind.clone(),
                });
            }
        };
        let tensor = self.tensor(at, e.tensor, &e.tensor_name)?;
        // Events act on whole storages, named by their root tensor.
        let root = self.graph.storage_root(tensor);
        if root != tensor {
            return Err(PlanFileError::Invalid {
                at,
                reason: format!(
                    "tensor {} {:?} shares the storage of tensor {} {:?}: events name the storage's root",
                    e.tensor,
                    e.tensor_name,
                    root.0,
                    self.graph.tensor(root).name
                ),
            });
        }
        if kind == EventKind::Recompute && self.graph.producer(tensor).is_none() {
            return Err(PlanFileError::Invalid {
                at,
                reason: format!(
                    "tensor {} {:?} has no producer to recompute it",
                    e.tensor, e.tensor_name
                ),
            });
        }
        let op = || -> Result<OpId, PlanFileError> {
            match (e.trigger_op, &e.trigger_op_name) {
                (Some(id), Some(name)) => self.op(at, id, name),
                _ => Err(PlanFileError::Invalid {
                    at,
                    reason: format!(
                        "trigger {:?} needs trigger_op and trigger_op_name",
                        e.trigger
                    ),
                }),
            }
        };
        let trigger = match e.trigger.as_str() {
            "iteration_start" if e.trigger_op.is_none() && e.trigger_op_name.is_none() => {
                Trigger::IterationStart
            }
            "iteration_start" => {
                return Err(PlanFileError::Invalid {
                    at,
                    reason: "trigger \"iteration_start\" has no trigger op".into(),
                });
            }
            "after" => Trigger::After(op()?),
            "before" => Trigger::Before(op()?),
            _ => {
                return Err(PlanFileError::Unknown {
                    at,
                    what: "trigger",
                    value: e.trigger.clone(),
                });
            }
        };
        Ok(Event {
            trigger,
            delay_ns: e.delay_ns,
            kind,
            tensor,
        })
    }

    fn diagnostic(&self, at: Item, d: &DiagnosticJson) -> Result<Diagnostic, PlanFileError> {
        let kind = DiagnosticKind::from_name(&d.kind).ok_or_else(|| PlanFileError::Unknown {
            at,
            what: "diagnostic kind",
            value: d.kind.clone(),
        })?;
        let tensor = match (d.tensor, &d.tensor_name) {
            (None, None) => None,
            (Some(id), Some(name)) => Some(self.tensor(at, id, name)?),
            _ => {
                return Err(PlanFileError::Invalid {
                    at,
                    reason: "tensor and tensor_name go together".into(),
                });
            }
        };
        Ok(Diagnostic {
            job: 0,
            kind,
            tensor,
            message: d.message.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
