//! Conversions between the wire types of [`crate::pb`] and the domain types
//! of `tensile-graph` and `tensile-planner`. Decoding validates: a graph
//! that arrives over gRPC is held to the same rules, with the same
//! messages, as one read from a file.

use tensile_graph::validate::{OpRef, TensorRef};
use tensile_graph::{
    Alias, AliasKind, AttrValue, DType, Graph, GraphDraft, GraphError, Limits, Op, OpId, Phase,
    Placement, Tensor, TensorId, TensorKind,
};

use tensile_planner::{
    Diagnostic, DiagnosticKind, Event, EventKind, Gate, Plan, Prediction, Trigger,
};

use crate::pb;

/// Domain -> wire.
pub fn graph_to_proto(graph: &Graph) -> pb::Graph {
    pb::Graph {
        name: graph.name().to_string(),
        tensors: graph.tensors().iter().map(tensor_to_proto).collect(),
        ops: graph.ops().iter().map(op_to_proto).collect(),
    }
}

/// Wire -> domain, validated under `limits`.
pub fn graph_from_proto(graph: pb::Graph, limits: &Limits) -> Result<Graph, GraphError> {
    Graph::new(draft_from_proto(graph, limits)?, limits)
}

/// Wire -> unvalidated draft: enum values are checked here, the rest by
/// [`Graph::new`].
pub fn draft_from_proto(graph: pb::Graph, limits: &Limits) -> Result<GraphDraft, GraphError> {
    // Counts first, so that no per-item work runs on an absurd message.
    limits.check_counts(graph.tensors.len(), graph.ops.len())?;
    let tensors = graph
        .tensors
        .into_iter()
        .map(tensor_from_proto)
        .collect::<Result<Vec<_>, _>>()?;
    let ops = graph
        .ops
        .into_iter()
        .map(op_from_proto)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GraphDraft {
        name: graph.name,
        tensors,
        ops,
    })
}

fn tensor_to_proto(t: &Tensor) -> pb::Tensor {
    pb::Tensor {
        id: t.id.0,
        name: t.name.clone(),
        shape: t.shape.clone(),
        dtype: dtype_to_proto(t.dtype) as i32,
        bytes: t.bytes,
        kind: kind_to_proto(t.kind) as i32,
    }
}

fn tensor_from_proto(t: pb::Tensor) -> Result<Tensor, GraphError> {
    let what = || TensorRef {
        id: u64::from(t.id),
        name: t.name.clone(),
    };
    let dtype = pb::Dtype::try_from(t.dtype)
        .ok()
        .and_then(dtype_from_proto)
        .ok_or_else(|| GraphError::Malformed {
            reason: format!("{}: unknown or unspecified dtype {}", what(), t.dtype),
        })?;
    let kind = pb::TensorKind::try_from(t.kind)
        .ok()
        .and_then(kind_from_proto)
        .ok_or_else(|| GraphError::Malformed {
            reason: format!("{}: unknown or unspecified kind {}", what(), t.kind),
        })?;
    Ok(Tensor {
        id: TensorId(t.id),
        name: t.name,
        shape: t.shape,
        dtype,
        bytes: t.bytes,
        kind,
    })
}

fn op_to_proto(o: &Op) -> pb::Op {
    pb::Op {
        id: o.id.0,
        name: o.name.clone(),
        op_type: o.op_type.clone(),
        phase: phase_to_proto(o.phase) as i32,
        inputs: o.inputs.iter().map(|t| t.0).collect(),
        outputs: o.outputs.iter().map(|t| t.0).collect(),
        attrs: o
            .attrs
            .iter()
            .map(|(k, v)| (k.clone(), attr_to_proto(v)))
            .collect(),
        aliases: o
            .aliases
            .iter()
            .map(|a| pb::Alias {
                output: a.output,
                input: a.input,
                kind: match a.kind {
                    AliasKind::InPlace => pb::AliasKind::InPlace,
                    AliasKind::View => pb::AliasKind::View,
                } as i32,
            })
            .collect(),
        placement: match o.placement {
            Placement::Device => pb::Placement::Device,
            Placement::Host => pb::Placement::Host,
        } as i32,
    }
}

fn op_from_proto(o: pb::Op) -> Result<Op, GraphError> {
    let what = || OpRef {
        id: u64::from(o.id),
        name: o.name.clone(),
    };
    let phase = pb::Phase::try_from(o.phase)
        .ok()
        .and_then(phase_from_proto)
        .ok_or_else(|| GraphError::Malformed {
            reason: format!("{}: unknown or unspecified phase {}", what(), o.phase),
        })?;
    let placement = match pb::Placement::try_from(o.placement) {
        Ok(pb::Placement::Device) => Placement::Device,
        Ok(pb::Placement::Host) => Placement::Host,
        Err(_) => {
            return Err(GraphError::Malformed {
                reason: format!("{}: unknown placement {}", what(), o.placement),
            });
        }
    };
    let aliases = o
        .aliases
        .iter()
        .map(|a| {
            let kind = match pb::AliasKind::try_from(a.kind) {
                Ok(pb::AliasKind::InPlace) => AliasKind::InPlace,
                Ok(pb::AliasKind::View) => AliasKind::View,
                _ => {
                    return Err(GraphError::Malformed {
                        reason: format!("{}: unknown or unspecified alias kind {}", what(), a.kind),
                    });
                }
            };
            Ok(Alias {
                output: a.output,
                input: a.input,
                kind,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let attrs = o
        .attrs
        .iter()
        .map(|(k, v)| {
            attr_from_proto(v)
                .map(|v| (k.clone(), v))
                .ok_or_else(|| GraphError::Malformed {
                    reason: format!("{}: attribute {k:?} has no value", what()),
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(Op {
        id: OpId(o.id),
        name: o.name,
        op_type: o.op_type,
        attrs,
        inputs: o.inputs.into_iter().map(TensorId).collect(),
        outputs: o.outputs.into_iter().map(TensorId).collect(),
        aliases,
        phase,
        placement,
    })
}

fn attr_to_proto(v: &AttrValue) -> pb::AttrValue {
    use pb::attr_value::Value;
    let value = match v {
        AttrValue::Int(i) => Value::Int(*i),
        AttrValue::Float(f) => Value::Float(*f),
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::Str(s) => Value::Str(s.clone()),
        AttrValue::Ints(v) => Value::Ints(pb::IntList { values: v.clone() }),
        AttrValue::Floats(v) => Value::Floats(pb::FloatList { values: v.clone() }),
    };
    pb::AttrValue { value: Some(value) }
}

fn attr_from_proto(v: &pb::AttrValue) -> Option<AttrValue> {
    use pb::attr_value::Value;
    Some(match v.value.as_ref()? {
        Value::Int(i) => AttrValue::Int(*i),
        Value::Float(f) => AttrValue::Float(*f),
        Value::Bool(b) => AttrValue::Bool(*b),
        Value::Str(s) => AttrValue::Str(s.clone()),
        Value::Ints(l) => AttrValue::Ints(l.values.clone()),
        Value::Floats(l) => AttrValue::Floats(l.values.clone()),
    })
}

pub fn dtype_to_proto(d: DType) -> pb::Dtype {
    match d {
        DType::F32 => pb::Dtype::F32,
        DType::F16 => pb::Dtype::F16,
        DType::BF16 => pb::Dtype::Bf16,
        DType::F64 => pb::Dtype::F64,
        DType::I64 => pb::Dtype::I64,
        DType::I32 => pb::Dtype::I32,
        DType::I16 => pb::Dtype::I16,
        DType::I8 => pb::Dtype::I8,
        DType::U8 => pb::Dtype::U8,
        DType::Bool => pb::Dtype::Bool,
    }
}

pub fn dtype_from_proto(d: pb::Dtype) -> Option<DType> {
    Some(match d {
        pb::Dtype::Unspecified => return None,
        pb::Dtype::F32 => DType::F32,
        pb::Dtype::F16 => DType::F16,
        pb::Dtype::Bf16 => DType::BF16,
        pb::Dtype::F64 => DType::F64,
        pb::Dtype::I64 => DType::I64,
        pb::Dtype::I32 => DType::I32,
        pb::Dtype::I16 => DType::I16,
        pb::Dtype::I8 => DType::I8,
        pb::Dtype::U8 => DType::U8,
        pb::Dtype::Bool => DType::Bool,
    })
}

pub fn kind_to_proto(k: TensorKind) -> pb::TensorKind {
    match k {
        TensorKind::Input => pb::TensorKind::Input,
        TensorKind::Parameter => pb::TensorKind::Parameter,
        TensorKind::Buffer => pb::TensorKind::Buffer,
        TensorKind::Activation => pb::TensorKind::Activation,
        TensorKind::Gradient => pb::TensorKind::Gradient,
        TensorKind::OptimizerState => pb::TensorKind::OptimizerState,
        TensorKind::Workspace => pb::TensorKind::Workspace,
        TensorKind::Output => pb::TensorKind::Output,
    }
}

pub fn kind_from_proto(k: pb::TensorKind) -> Option<TensorKind> {
    Some(match k {
        pb::TensorKind::Unspecified => return None,
        pb::TensorKind::Input => TensorKind::Input,
        pb::TensorKind::Parameter => TensorKind::Parameter,
        pb::TensorKind::Buffer => TensorKind::Buffer,
        pb::TensorKind::Activation => TensorKind::Activation,
        pb::TensorKind::Gradient => TensorKind::Gradient,
        pb::TensorKind::OptimizerState => TensorKind::OptimizerState,
        pb::TensorKind::Workspace => TensorKind::Workspace,
        pb::TensorKind::Output => TensorKind::Output,
    })
}

pub fn phase_to_proto(p: Phase) -> pb::Phase {
    match p {
        Phase::Forward => pb::Phase::Forward,
        Phase::Backward => pb::Phase::Backward,
        Phase::Optimizer => pb::Phase::Optimizer,
    }
}

pub fn phase_from_proto(p: pb::Phase) -> Option<Phase> {
    Some(match p {
        pb::Phase::Unspecified => return None,
        pb::Phase::Forward => Phase::Forward,
        pb::Phase::Backward => Phase::Backward,
        pb::Phase::Optimizer => Phase::Optimizer,
    })
}

/// Domain -> wire. `job_id` is the service's id of the job the planner
/// knew as `d.job` (an index into the jobs it planned together).
pub fn diagnostic_to_proto(d: &Diagnostic, job_id: u64) -> pb::Diagnostic {
    pb::Diagnostic {
        kind: diagnostic_kind_to_proto(d.kind) as i32,
        job_id,
        tensor: d.tensor.map(|t| t.0),
        message: d.message.clone(),
    }
}

/// Wire -> domain, for the job at index `job` of the caller's batch. An
/// unknown or unspecified kind is an error naming the value.
pub fn diagnostic_from_proto(d: &pb::Diagnostic, job: usize) -> Result<Diagnostic, UnknownEnum> {
    let kind = pb::DiagnosticKind::try_from(d.kind)
        .ok()
        .and_then(diagnostic_kind_from_proto)
        .ok_or(UnknownEnum {
            what: "diagnostic kind",
            value: d.kind,
        })?;
    Ok(Diagnostic {
        job,
        kind,
        tensor: d.tensor.map(TensorId),
        message: d.message.clone(),
    })
}

/// A wire enum value this side does not know, or left unspecified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown or unspecified {what} {value}")]
pub struct UnknownEnum {
    pub what: &'static str,
    pub value: i32,
}

pub fn diagnostic_kind_to_proto(k: DiagnosticKind) -> pb::DiagnosticKind {
    match k {
        DiagnosticKind::NoSwapWindow => pb::DiagnosticKind::NoSwapWindow,
        DiagnosticKind::SwapRateLimit => pb::DiagnosticKind::SwapRateLimit,
        DiagnosticKind::NotRecomputable => pb::DiagnosticKind::NotRecomputable,
        DiagnosticKind::OverBudget => pb::DiagnosticKind::OverBudget,
        DiagnosticKind::PlanningCapped => pb::DiagnosticKind::PlanningCapped,
    }
}

pub fn diagnostic_kind_from_proto(k: pb::DiagnosticKind) -> Option<DiagnosticKind> {
    Some(match k {
        pb::DiagnosticKind::Unspecified => return None,
        pb::DiagnosticKind::NoSwapWindow => DiagnosticKind::NoSwapWindow,
        pb::DiagnosticKind::SwapRateLimit => DiagnosticKind::SwapRateLimit,
        pb::DiagnosticKind::NotRecomputable => DiagnosticKind::NotRecomputable,
        pb::DiagnosticKind::OverBudget => DiagnosticKind::OverBudget,
        pb::DiagnosticKind::PlanningCapped => DiagnosticKind::PlanningCapped,
    })
}

/// Domain -> wire: a job's plan under the service's `job_id`. Times become
/// seconds; the prediction keeps its figures, not its time lines.
pub fn plan_to_proto(plan: &Plan, job_id: u64) -> pb::Plan {
    let events = plan
        .events
        .iter()
        .map(|e| {
            let (trigger, op) = match e.trigger {
                Trigger::After(op) => (pb::TriggerKind::After, op.0),
                Trigger::Before(op) => (pb::TriggerKind::Before, op.0),
                Trigger::IterationStart => (pb::TriggerKind::IterationStart, 0),
            };
            pb::PlanEvent {
                kind: event_kind_to_proto(e.kind) as i32,
                tensor: e.tensor.0,
                trigger_op: op,
                delay_s: e.delay_ns as f64 / 1e9,
                trigger: trigger as i32,
            }
        })
        .collect();
    pb::Plan {
        job_id,
        version: plan.version,
        events,
        host_bytes: 0,
        prediction: Some(prediction_to_proto(&plan.prediction)),
        start_on_host: plan.start_on_host.iter().map(|t| t.0).collect(),
        gate: plan.gate.map(gate_to_proto),
    }
}

/// A plan's gate on the wire.
pub fn gate_to_proto(g: Gate) -> pb::IterationGate {
    pb::IterationGate {
        period_ns: g.period_ns,
        phase_ns: g.phase_ns,
        epoch_ns: g.epoch_ns,
    }
}

/// The longest gate period a plan may carry: an hour (a longer one would
/// hold a job for hours between iterations).
pub const MAX_GATE_PERIOD_NS: u64 = 3_600_000_000_000;

/// Checks a gate's numbers: a period of 1 ns to [`MAX_GATE_PERIOD_NS`], a
/// phase within it.
pub fn check_gate(g: Gate) -> Result<Gate, String> {
    if g.period_ns == 0 || g.period_ns > MAX_GATE_PERIOD_NS {
        return Err(format!(
            "gate period {} ns is not in 1 ns to 1 hour",
            g.period_ns
        ));
    }
    if g.phase_ns >= g.period_ns {
        return Err(format!(
            "gate phase {} ns is not less than its period {} ns",
            g.phase_ns, g.period_ns
        ));
    }
    Ok(g)
}

/// Domain -> wire: what a plan predicts.
pub fn prediction_to_proto(p: &Prediction) -> pb::PlanPrediction {
    pb::PlanPrediction {
        vanilla_peak_bytes: p.vanilla_peak_bytes,
        planned_peak_bytes: p.planned_peak_bytes,
        vanilla_iteration_s: p.vanilla_time_ns as f64 / 1e9,
        planned_iteration_s: p.planned_time_ns as f64 / 1e9,
        swapped_bytes: p.swapped_bytes,
        recomputed_ops: u32::try_from(p.recomputed_ops).unwrap_or(u32::MAX),
        op_start_s: p.op_start_ns.iter().map(|&t| t as f64 / 1e9).collect(),
    }
}

/// Checks a pace (one start per op, finite, from 0, non-decreasing) and
/// turns it into nanoseconds; names what is wrong.
pub fn check_pace(starts_s: &[f64], ops: usize) -> Result<Vec<u64>, String> {
    if starts_s.is_empty() {
        return Ok(Vec::new());
    }
    if starts_s.len() != ops {
        return Err(format!(
            "{} op starts for a graph of {ops} ops",
            starts_s.len()
        ));
    }
    let mut prev = 0u64;
    starts_s
        .iter()
        .enumerate()
        .map(|(op, &s)| {
            if !(s.is_finite() && (0.0..=MAX_GATE_PERIOD_NS as f64 / 1e9).contains(&s)) {
                return Err(format!("op {op} starts at {s} s, not in 0 s to 1 hour"));
            }
            let ns = (s * 1e9).round() as u64;
            if ns < prev {
                return Err(format!("op {op} starts before op {}", op - 1));
            }
            prev = ns;
            Ok(ns)
        })
        .collect()
}

/// What is wrong with a plan that arrived over the wire, for `graph`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanFromProtoError {
    #[error("event {index}: {0}", index = .1)]
    Enum(UnknownEnum, usize),
    #[error("event {index}: tensor {tensor} is not in the graph ({tensors} tensors)")]
    Tensor {
        index: usize,
        tensor: u32,
        tensors: usize,
    },
    #[error("event {index}: trigger op {op} is not in the graph ({ops} ops)")]
    Op { index: usize, op: u32, ops: usize },
    #[error("event {index}: delay {delay_s} s is not a finite number >= 0")]
    Delay { index: usize, delay_s: f64 },
    #[error("start_on_host: tensor {tensor} is not in the graph ({tensors} tensors)")]
    StartOnHost { tensor: u32, tensors: usize },
    #[error("gate: {0}")]
    Gate(String),
    #[error("prediction: {0}")]
    Pace(String),
}

/// Wire -> domain, checked against `graph`: every tensor and op exists,
/// every enum is known, every delay finite and non-negative. The
/// prediction's figures come back (the swap counts, which the wire does
/// not carry, counted from the events); its time lines and waits do not
/// travel.
pub fn plan_from_proto(plan: &pb::Plan, graph: &Graph) -> Result<Plan, PlanFromProtoError> {
    let (tensors, ops) = (graph.tensors().len(), graph.ops().len());
    let mut events = Vec::with_capacity(plan.events.len());
    for (index, e) in plan.events.iter().enumerate() {
        let kind = pb::EventKind::try_from(e.kind)
            .ok()
            .and_then(event_kind_from_proto)
            .ok_or(PlanFromProtoError::Enum(
                UnknownEnum {
                    what: "event kind",
                    value: e.kind,
                },
                index,
            ))?;
        if e.tensor as usize >= tensors {
            return Err(PlanFromProtoError::Tensor {
                index,
                tensor: e.tensor,
                tensors,
            });
        }
        let op = || {
            if (e.trigger_op as usize) < ops {
                Ok(OpId(e.trigger_op))
            } else {
                Err(PlanFromProtoError::Op {
                    index,
                    op: e.trigger_op,
                    ops,
                })
            }
        };
        let trigger = match pb::TriggerKind::try_from(e.trigger) {
            Ok(pb::TriggerKind::After) => Trigger::After(op()?),
            Ok(pb::TriggerKind::Before) => Trigger::Before(op()?),
            Ok(pb::TriggerKind::IterationStart) => Trigger::IterationStart,
            Err(_) => {
                return Err(PlanFromProtoError::Enum(
                    UnknownEnum {
                        what: "trigger kind",
                        value: e.trigger,
                    },
                    index,
                ));
            }
        };
        if !(e.delay_s.is_finite() && e.delay_s >= 0.0) {
            return Err(PlanFromProtoError::Delay {
                index,
                delay_s: e.delay_s,
            });
        }
        events.push(Event {
            trigger,
            delay_ns: (e.delay_s * 1e9).round() as u64,
            kind,
            tensor: TensorId(e.tensor),
        });
    }
    let start_on_host = plan
        .start_on_host
        .iter()
        .map(|&t| {
            if (t as usize) < tensors {
                Ok(TensorId(t))
            } else {
                Err(PlanFromProtoError::StartOnHost { tensor: t, tensors })
            }
        })
        .collect::<Result<_, _>>()?;
    let gate = plan
        .gate
        .map(|g| {
            check_gate(Gate {
                period_ns: g.period_ns,
                phase_ns: g.phase_ns,
                epoch_ns: g.epoch_ns,
            })
        })
        .transpose()
        .map_err(PlanFromProtoError::Gate)?;
    let p = plan.prediction.clone().unwrap_or_default();
    let count = |kind| events.iter().filter(|e: &&Event| e.kind == kind).count();
    let (swap_outs, swap_ins) = (count(EventKind::SwapOut), count(EventKind::SwapIn));
    Ok(Plan {
        version: plan.version,
        events,
        start_on_host,
        gate,
        prediction: Prediction {
            vanilla_peak_bytes: p.vanilla_peak_bytes,
            planned_peak_bytes: p.planned_peak_bytes,
            vanilla_time_ns: (p.vanilla_iteration_s.max(0.0) * 1e9).round() as u64,
            planned_time_ns: (p.planned_iteration_s.max(0.0) * 1e9).round() as u64,
            swapped_bytes: p.swapped_bytes,
            recomputed_ops: p.recomputed_ops as usize,
            swap_outs,
            swap_ins,
            op_start_ns: check_pace(&p.op_start_s, ops).map_err(PlanFromProtoError::Pace)?,
            ..Prediction::default()
        },
    })
}

pub fn event_kind_to_proto(k: EventKind) -> pb::EventKind {
    match k {
        EventKind::SwapOut => pb::EventKind::SwapOut,
        EventKind::SwapIn => pb::EventKind::SwapIn,
        EventKind::Release => pb::EventKind::Release,
        EventKind::Recompute => pb::EventKind::Recompute,
    }
}

pub fn event_kind_from_proto(k: pb::EventKind) -> Option<EventKind> {
    Some(match k {
        pb::EventKind::Unspecified => return None,
        pb::EventKind::SwapOut => EventKind::SwapOut,
        pb::EventKind::SwapIn => EventKind::SwapIn,
        pb::EventKind::Release => EventKind::Release,
        pb::EventKind::Recompute => EventKind::Recompute,
    })
}
