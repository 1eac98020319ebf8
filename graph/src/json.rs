//! The JSON format of graphs on disk (`"format": "tensile-graph/v1"`).
//!
//! These serde types mirror the domain types of [`crate::ir`] and exist only
//! at this edge; parsing goes file bytes -> [`GraphFile`] -> [`GraphDraft`]
//! -> validated [`Graph`], and each step names what it rejects.
//!
//! ```json
//! { "format": "tensile-graph/v1", "name": "tiny",
//!   "tensors": [ {"id": 0, "name": "x", "shape": [2, 3], "dtype": "f32", "bytes": 24, "kind": "input"}, ... ],
//!   "ops": [ {"id": 0, "name": "fc", "type": "aten::addmm", "phase": "forward",
//!             "inputs": [2, 0, 1], "outputs": [3], "attrs": {"beta": 1}, "aliases": []}, ... ] }
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ir::{
    Alias, AliasKind, AttrValue, DType, Graph, GraphDraft, Op, OpId, Phase, Placement, Tensor,
    TensorId, TensorKind,
};
use crate::validate::{GraphError, Limits, OpRef, TensorRef};

/// The value of the `format` key this version reads and writes.
pub const FORMAT: &str = "tensile-graph/v1";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphFile {
    format: String,
    name: String,
    tensors: Vec<TensorJson>,
    ops: Vec<OpJson>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorJson {
    id: u64,
    name: String,
    shape: Vec<u64>,
    dtype: String,
    bytes: u64,
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpJson {
    id: u64,
    name: String,
    #[serde(rename = "type")]
    op_type: String,
    phase: String,
    inputs: Vec<u64>,
    outputs: Vec<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attrs: BTreeMap<String, AttrJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    aliases: Vec<AliasJson>,
    /// `"host"` for an op that runs on the host; absent: on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    placement: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum AttrJson {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AliasJson {
    output: u32,
    input: u32,
    kind: String,
}

/// Parses and validates a graph from JSON bytes.
pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Graph, GraphError> {
    Graph::new(parse_draft(bytes, limits)?, limits)
}

/// Parses JSON bytes into an unvalidated draft (for tools that repair or
/// inspect graphs before validation).
pub fn parse_draft(bytes: &[u8], limits: &Limits) -> Result<GraphDraft, GraphError> {
    let len = bytes.len() as u64;
    if len > limits.max_input_bytes {
        return Err(GraphError::InputTooLarge {
            bytes: len,
            limit: limits.max_input_bytes,
        });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(GraphError::Malformed {
            reason: "the input is empty".into(),
        });
    }
    let file: GraphFile = serde_json::from_slice(bytes).map_err(|e| GraphError::Malformed {
        reason: format!("invalid graph JSON: {e}"),
    })?;
    if file.format != FORMAT {
        return Err(GraphError::Malformed {
            reason: format!("format is {:?}, expected {FORMAT:?}", file.format),
        });
    }
    // Counts first, so that no per-item work runs on an absurd file.
    limits.check_counts(file.tensors.len(), file.ops.len())?;
    let tensors = file
        .tensors
        .into_iter()
        .enumerate()
        .map(|(index, t)| tensor_from_json(index, t))
        .collect::<Result<Vec<_>, _>>()?;
    let ops = file
        .ops
        .into_iter()
        .enumerate()
        .map(|(index, o)| op_from_json(index, o, tensors.len()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GraphDraft {
        name: file.name,
        tensors,
        ops,
    })
}

fn tensor_from_json(index: usize, t: TensorJson) -> Result<Tensor, GraphError> {
    let id = u32::try_from(t.id)
        .ok()
        .filter(|&id| id as usize == index)
        .ok_or(GraphError::TensorIdOrder { index, id: t.id })?;
    let what = TensorRef {
        id: t.id,
        name: t.name.clone(),
    };
    let dtype = DType::from_name(&t.dtype).ok_or_else(|| GraphError::Malformed {
        reason: format!(
            "{what}: unknown dtype {:?} (expected one of {})",
            t.dtype,
            names(DType::ALL.map(DType::name))
        ),
    })?;
    let kind = TensorKind::from_name(&t.kind).ok_or_else(|| GraphError::Malformed {
        reason: format!(
            "{what}: unknown kind {:?} (expected one of {})",
            t.kind,
            names(TensorKind::ALL.map(TensorKind::name))
        ),
    })?;
    Ok(Tensor {
        id: TensorId(id),
        name: t.name,
        shape: t.shape,
        dtype,
        bytes: t.bytes,
        kind,
    })
}

fn op_from_json(index: usize, o: OpJson, tensor_count: usize) -> Result<Op, GraphError> {
    let id = u32::try_from(o.id)
        .ok()
        .filter(|&id| id as usize == index)
        .ok_or(GraphError::OpIdOrder { index, id: o.id })?;
    let what = OpRef {
        id: o.id,
        name: o.name.clone(),
    };
    let phase = Phase::from_name(&o.phase).ok_or_else(|| GraphError::Malformed {
        reason: format!(
            "{what}: unknown phase {:?} (expected one of {})",
            o.phase,
            names(Phase::ALL.map(Phase::name))
        ),
    })?;
    let placement = match o.placement.as_deref() {
        None => Placement::Device,
        Some(name) => Placement::from_name(name).ok_or_else(|| GraphError::Malformed {
            reason: format!("{what}: unknown placement {name:?} (expected device or host)"),
        })?,
    };
    let tensor_id = |raw: u64, index: usize, output: bool| {
        u32::try_from(raw)
            .ok()
            .filter(|&t| (t as usize) < tensor_count)
            .map(TensorId)
            .ok_or_else(|| {
                let op = what.clone();
                if output {
                    GraphError::OutputOutOfRange {
                        op,
                        index,
                        tensor: raw,
                        count: tensor_count,
                    }
                } else {
                    GraphError::InputOutOfRange {
                        op,
                        index,
                        tensor: raw,
                        count: tensor_count,
                    }
                }
            })
    };
    let inputs = o
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &t)| tensor_id(t, i, false))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = o
        .outputs
        .iter()
        .enumerate()
        .map(|(i, &t)| tensor_id(t, i, true))
        .collect::<Result<Vec<_>, _>>()?;
    let aliases = o
        .aliases
        .into_iter()
        .map(|a| {
            let kind = AliasKind::from_name(&a.kind).ok_or_else(|| GraphError::Malformed {
                reason: format!(
                    "{what}: unknown alias kind {:?} (expected in_place or view)",
                    a.kind
                ),
            })?;
            Ok(Alias {
                output: a.output,
                input: a.input,
                kind,
            })
        })
        .collect::<Result<Vec<_>, GraphError>>()?;
    let attrs = o
        .attrs
        .into_iter()
        .map(|(k, v)| (k, attr_from_json(v)))
        .collect();
    Ok(Op {
        id: OpId(id),
        name: o.name,
        op_type: o.op_type,
        attrs,
        inputs,
        outputs,
        aliases,
        phase,
        placement,
    })
}

fn attr_from_json(v: AttrJson) -> AttrValue {
    match v {
        AttrJson::Bool(b) => AttrValue::Bool(b),
        AttrJson::Int(i) => AttrValue::Int(i),
        AttrJson::Float(f) => AttrValue::Float(f),
        AttrJson::Str(s) => AttrValue::Str(s),
        AttrJson::Ints(v) => AttrValue::Ints(v),
        AttrJson::Floats(v) => AttrValue::Floats(v),
    }
}

fn attr_to_json(v: &AttrValue) -> AttrJson {
    match v {
        AttrValue::Bool(b) => AttrJson::Bool(*b),
        AttrValue::Int(i) => AttrJson::Int(*i),
        AttrValue::Float(f) => AttrJson::Float(*f),
        AttrValue::Str(s) => AttrJson::Str(s.clone()),
        AttrValue::Ints(v) => AttrJson::Ints(v.clone()),
        AttrValue::Floats(v) => AttrJson::Floats(v.clone()),
    }
}

fn names<const N: usize>(all: [&str; N]) -> String {
    all.join(", ")
}

fn to_file(name: &str, tensors: &[Tensor], ops: &[Op]) -> GraphFile {
    GraphFile {
        format: FORMAT.to_string(),
        name: name.to_string(),
        tensors: tensors
            .iter()
            .map(|t| TensorJson {
                id: u64::from(t.id.0),
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype.name().to_string(),
                bytes: t.bytes,
                kind: t.kind.name().to_string(),
            })
            .collect(),
        ops: ops
            .iter()
            .map(|o| OpJson {
                id: u64::from(o.id.0),
                name: o.name.clone(),
                op_type: o.op_type.clone(),
                phase: o.phase.name().to_string(),
                inputs: o.inputs.iter().map(|t| u64::from(t.0)).collect(),
                outputs: o.outputs.iter().map(|t| u64::from(t.0)).collect(),
                attrs: o
                    .attrs
                    .iter()
                    .map(|(k, v)| (k.clone(), attr_to_json(v)))
                    .collect(),
                aliases: o
                    .aliases
                    .iter()
                    .map(|a| AliasJson {
                        output: a.output,
                        input: a.input,
                        kind: a.kind.name().to_string(),
                    })
                    .collect(),
                placement: o.on_host().then(|| Placement::Host.name().to_string()),
            })
            .collect(),
    }
}

/// Serializes a graph as pretty-printed JSON.
pub fn to_string_pretty(graph: &Graph) -> String {
    render(&to_file(graph.name(), graph.tensors(), graph.ops()), true)
}

/// Serializes a graph as compact JSON.
pub fn to_string(graph: &Graph) -> String {
    render(&to_file(graph.name(), graph.tensors(), graph.ops()), false)
}

/// Serializes an unvalidated draft (test fixtures, corrupted graphs).
pub fn draft_to_string(draft: &GraphDraft) -> String {
    render(&to_file(&draft.name, &draft.tensors, &draft.ops), true)
}

fn render(file: &GraphFile, pretty: bool) -> String {
    // Plain strings, integers, finite floats and maps with string keys
    // always serialize; a failure here would be a bug in this module.
    let out = if pretty {
        serde_json::to_string_pretty(file)
    } else {
        serde_json::to_string(file)
    };
    out.expect("graph JSON serializes")
}
