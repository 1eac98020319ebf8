//! Validation: turns a [`GraphDraft`] into a [`Graph`] or names what is wrong.
//!
//! Every error names the op or tensor at fault (id and name), so that a user
//! with a 10,000-op graph file can find it. Nothing here panics on any input:
//! all arithmetic on sizes is checked and every index is range-checked first.

use std::fmt;

use thiserror::Error;

use crate::ir::{AliasKind, AttrValue, Graph, GraphDraft, Op, OpId, TensorId};

/// Upper bounds on what a graph may hold. The defaults are far above any real
/// training graph and far below what would exhaust the scheduler's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_tensors: usize,
    pub max_ops: usize,
    pub max_rank: usize,
    /// Inputs plus outputs of one op.
    pub max_operands: usize,
    pub max_attrs: usize,
    /// Elements of a list attribute, bytes of a string attribute or a name.
    pub max_attr_len: usize,
    pub max_name_len: usize,
    pub max_tensor_bytes: u64,
    /// Sum of the bytes of every distinct storage of the graph.
    pub max_total_bytes: u64,
    /// Size of a graph file or message before it is parsed.
    pub max_input_bytes: u64,
}

impl Limits {
    /// Rejects more tensors or ops than the limits allow. Every reader calls
    /// this on the raw counts before any per-item work (decoding, checks), so
    /// that an absurd file or message is turned away cheaply, and all of them
    /// with the same message.
    pub fn check_counts(&self, tensors: usize, ops: usize) -> Result<(), GraphError> {
        for (what, count, limit) in [
            ("tensors", tensors, self.max_tensors),
            ("ops", ops, self.max_ops),
        ] {
            if count > limit {
                return Err(GraphError::TooMany { what, count, limit });
            }
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tensors: 4_000_000,
            max_ops: 4_000_000,
            max_rank: 8,
            max_operands: 4096,
            max_attrs: 64,
            max_attr_len: 4096,
            max_name_len: 4096,
            max_tensor_bytes: 1 << 40,
            max_total_bytes: 1 << 46,
            max_input_bytes: 256 << 20,
        }
    }
}

/// An op named in an error: its id and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRef {
    pub id: u64,
    pub name: String,
}

/// A tensor named in an error: its id and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    pub id: u64,
    pub name: String,
}

impl fmt::Display for OpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {} {:?}", self.id, self.name)
    }
}

impl fmt::Display for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor {} {:?}", self.id, self.name)
    }
}

fn join_ops(ops: &[OpRef]) -> String {
    ops.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// What is wrong with a graph. The message is one line.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GraphError {
    #[error("the input is {bytes} bytes, over the limit of {limit} bytes")]
    InputTooLarge { bytes: u64, limit: u64 },
    #[error("not a graph: {reason}")]
    Malformed { reason: String },
    #[error("the graph has {count} {what}, over the limit of {limit}")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    #[error("the graph {graph:?} has no ops: there is nothing to run or plan")]
    NoOps { graph: String },
    #[error("the tensor at index {index} has id {id}; tensor ids must be 0, 1, 2, ... in order")]
    TensorIdOrder { index: usize, id: u64 },
    #[error("the op at index {index} has id {id}; op ids must be 0, 1, 2, ... in order")]
    OpIdOrder { index: usize, id: u64 },
    #[error("{what} has a name of {len} bytes, over the limit of {limit}")]
    NameTooLong {
        what: String,
        len: usize,
        limit: usize,
    },
    #[error("{tensor} has rank {rank}, over the limit of {limit}")]
    RankTooLarge {
        tensor: TensorRef,
        rank: usize,
        limit: usize,
    },
    #[error("{tensor}: shape {shape:?} of {dtype} overflows 64-bit byte counts")]
    SizeOverflow {
        tensor: TensorRef,
        shape: Vec<u64>,
        dtype: &'static str,
    },
    #[error("{tensor}: bytes is {bytes} but shape {shape:?} of {dtype} needs {expected}")]
    BytesMismatch {
        tensor: TensorRef,
        bytes: u64,
        shape: Vec<u64>,
        dtype: &'static str,
        expected: u64,
    },
    #[error("{tensor} is {bytes} bytes, over the per-tensor limit of {limit}")]
    TensorTooLarge {
        tensor: TensorRef,
        bytes: u64,
        limit: u64,
    },
    #[error("the graph's tensors need {bytes} bytes in all, over the limit of {limit}")]
    TotalTooLarge { bytes: u64, limit: u64 },
    #[error("{op} has an empty op type")]
    EmptyOpType { op: OpRef },
    #[error("{op} has {count} inputs and outputs, over the limit of {limit}")]
    TooManyOperands {
        op: OpRef,
        count: usize,
        limit: usize,
    },
    #[error("{op} has {count} attributes, over the limit of {limit}")]
    TooManyAttrs {
        op: OpRef,
        count: usize,
        limit: usize,
    },
    #[error("{op}: attribute {key:?} is {len} long, over the limit of {limit}")]
    AttrTooLong {
        op: OpRef,
        key: String,
        len: usize,
        limit: usize,
    },
    #[error("{op}: attribute {key:?} is not a finite number")]
    NonFiniteAttr { op: OpRef, key: String },
    #[error(
        "{op}: input #{index} is tensor {tensor}, out of range (the graph has {count} tensors)"
    )]
    InputOutOfRange {
        op: OpRef,
        index: usize,
        tensor: u64,
        count: usize,
    },
    #[error(
        "{op}: output #{index} is tensor {tensor}, out of range (the graph has {count} tensors)"
    )]
    OutputOutOfRange {
        op: OpRef,
        index: usize,
        tensor: u64,
        count: usize,
    },
    #[error("{op} lists {tensor} twice among its outputs")]
    DuplicateOutput { op: OpRef, tensor: TensorRef },
    #[error("{tensor} is produced twice: by {first} and by {second}")]
    ProducedTwice {
        tensor: TensorRef,
        first: OpRef,
        second: OpRef,
    },
    #[error(
        "{op}: alias output #{output} -> input #{input} is out of range ({outputs} outputs, {inputs} inputs)"
    )]
    AliasOutOfRange {
        op: OpRef,
        output: u64,
        input: u64,
        outputs: usize,
        inputs: usize,
    },
    #[error("{op}: output #{output} aliases more than one input")]
    AliasedTwice { op: OpRef, output: u64 },
    #[error(
        "{op}: in-place output {output} must have the shape and dtype of the input it overwrites, {input}"
    )]
    InPlaceMismatch {
        op: OpRef,
        output: TensorRef,
        input: TensorRef,
    },
    #[error("{op}: view {output} must have the dtype of {input}")]
    ViewDtypeMismatch {
        op: OpRef,
        output: TensorRef,
        input: TensorRef,
    },
    #[error(
        "{tensor} (kind {kind}) is never produced; only inputs, parameters, buffers and optimizer state may exist at iteration start"
    )]
    NeverProduced {
        tensor: TensorRef,
        kind: &'static str,
    },
    #[error("{tensor} has kind input but is produced by {op}")]
    InputProduced { tensor: TensorRef, op: OpRef },
    #[error("the graph has a cycle: {}", join_ops(.ops))]
    Cycle { ops: Vec<OpRef> },
    #[error(
        "{op} reads {tensor} before {producer} produces it (ops must be listed in execution order)"
    )]
    UsedBeforeProduced {
        op: OpRef,
        tensor: TensorRef,
        producer: OpRef,
    },
    #[error("{op} runs on the host, but {reason}")]
    HostOp { op: OpRef, reason: String },
    #[error("{op} reads {tensor} after {overwriter} overwrote it in place")]
    ReadAfterOverwrite {
        op: OpRef,
        tensor: TensorRef,
        overwriter: OpRef,
    },
}

fn op_ref(op: &Op) -> OpRef {
    OpRef {
        id: u64::from(op.id.0),
        name: op.name.clone(),
    }
}

fn tensor_ref(draft: &GraphDraft, id: TensorId) -> TensorRef {
    TensorRef {
        id: u64::from(id.0),
        name: draft
            .tensors
            .get(id.index())
            .map(|t| t.name.clone())
            .unwrap_or_default(),
    }
}

/// Validates `draft` under `limits`; see [`Graph`] for the invariants.
pub(crate) fn validate(draft: GraphDraft, limits: &Limits) -> Result<Graph, GraphError> {
    check_counts(&draft, limits)?;
    check_tensors(&draft, limits)?;
    check_ops(&draft, limits)?;
    let producer = check_production(&draft)?;
    check_order(&draft, &producer)?;
    let storage_root = storage_roots(&draft, &producer);
    check_overwrites(&draft)?;
    check_host_ops(&draft, &producer, &storage_root)?;
    check_total_bytes(&draft, &storage_root, limits)?;
    Ok(Graph {
        name: draft.name,
        tensors: draft.tensors,
        ops: draft.ops,
        producer,
        storage_root,
    })
}

fn check_counts(draft: &GraphDraft, limits: &Limits) -> Result<(), GraphError> {
    limits.check_counts(draft.tensors.len(), draft.ops.len())?;
    if draft.name.len() > limits.max_name_len {
        return Err(GraphError::NameTooLong {
            what: "the graph".into(),
            len: draft.name.len(),
            limit: limits.max_name_len,
        });
    }
    // Every consumer (planner, executor, simulator) needs at least one op,
    // and an empty graph is most likely a truncated or mis-exported file.
    // After the name check, so that the message never quotes an oversized
    // name.
    if draft.ops.is_empty() {
        return Err(GraphError::NoOps {
            graph: draft.name.clone(),
        });
    }
    Ok(())
}

fn check_tensors(draft: &GraphDraft, limits: &Limits) -> Result<(), GraphError> {
    for (index, t) in draft.tensors.iter().enumerate() {
        if t.id.index() != index {
            return Err(GraphError::TensorIdOrder {
                index,
                id: u64::from(t.id.0),
            });
        }
        let tref = || tensor_ref(draft, t.id);
        if t.name.len() > limits.max_name_len {
            return Err(GraphError::NameTooLong {
                what: format!("tensor {}", t.id.0),
                len: t.name.len(),
                limit: limits.max_name_len,
            });
        }
        if t.shape.len() > limits.max_rank {
            return Err(GraphError::RankTooLarge {
                tensor: tref(),
                rank: t.shape.len(),
                limit: limits.max_rank,
            });
        }
        let expected = t
            .numel()
            .and_then(|n| n.checked_mul(t.dtype.size()))
            .ok_or_else(|| GraphError::SizeOverflow {
                tensor: tref(),
                shape: t.shape.clone(),
                dtype: t.dtype.name(),
            })?;
        if t.bytes != expected {
            return Err(GraphError::BytesMismatch {
                tensor: tref(),
                bytes: t.bytes,
                shape: t.shape.clone(),
                dtype: t.dtype.name(),
                expected,
            });
        }
        if t.bytes > limits.max_tensor_bytes {
            return Err(GraphError::TensorTooLarge {
                tensor: tref(),
                bytes: t.bytes,
                limit: limits.max_tensor_bytes,
            });
        }
    }
    Ok(())
}

fn check_ops(draft: &GraphDraft, limits: &Limits) -> Result<(), GraphError> {
    let count = draft.tensors.len();
    for (index, op) in draft.ops.iter().enumerate() {
        if op.id.index() != index {
            return Err(GraphError::OpIdOrder {
                index,
                id: u64::from(op.id.0),
            });
        }
        if op.name.len() > limits.max_name_len || op.op_type.len() > limits.max_name_len {
            return Err(GraphError::NameTooLong {
                what: format!("op {}", op.id.0),
                len: op.name.len().max(op.op_type.len()),
                limit: limits.max_name_len,
            });
        }
        if op.op_type.trim().is_empty() {
            return Err(GraphError::EmptyOpType { op: op_ref(op) });
        }
        let operands = op.inputs.len() + op.outputs.len();
        if operands > limits.max_operands {
            return Err(GraphError::TooManyOperands {
                op: op_ref(op),
                count: operands,
                limit: limits.max_operands,
            });
        }
        check_attrs(op, limits)?;
        for (i, t) in op.inputs.iter().enumerate() {
            if t.index() >= count {
                return Err(GraphError::InputOutOfRange {
                    op: op_ref(op),
                    index: i,
                    tensor: u64::from(t.0),
                    count,
                });
            }
        }
        for (i, t) in op.outputs.iter().enumerate() {
            if t.index() >= count {
                return Err(GraphError::OutputOutOfRange {
                    op: op_ref(op),
                    index: i,
                    tensor: u64::from(t.0),
                    count,
                });
            }
            if op.outputs[..i].contains(t) {
                return Err(GraphError::DuplicateOutput {
                    op: op_ref(op),
                    tensor: tensor_ref(draft, *t),
                });
            }
        }
        check_aliases(draft, op)?;
    }
    Ok(())
}

fn check_attrs(op: &Op, limits: &Limits) -> Result<(), GraphError> {
    if op.attrs.len() > limits.max_attrs {
        return Err(GraphError::TooManyAttrs {
            op: op_ref(op),
            count: op.attrs.len(),
            limit: limits.max_attrs,
        });
    }
    for (key, value) in &op.attrs {
        let len = match value {
            AttrValue::Str(s) => s.len(),
            AttrValue::Ints(v) => v.len(),
            AttrValue::Floats(v) => v.len(),
            AttrValue::Int(_) | AttrValue::Float(_) | AttrValue::Bool(_) => 0,
        }
        .max(key.len());
        if len > limits.max_attr_len {
            return Err(GraphError::AttrTooLong {
                op: op_ref(op),
                key: key.clone(),
                len,
                limit: limits.max_attr_len,
            });
        }
        let finite = match value {
            AttrValue::Float(v) => v.is_finite(),
            AttrValue::Floats(v) => v.iter().all(|x| x.is_finite()),
            _ => true,
        };
        if !finite {
            return Err(GraphError::NonFiniteAttr {
                op: op_ref(op),
                key: key.clone(),
            });
        }
    }
    Ok(())
}

fn check_aliases(draft: &GraphDraft, op: &Op) -> Result<(), GraphError> {
    for (i, alias) in op.aliases.iter().enumerate() {
        let (Some(&out), Some(&inp)) = (
            op.outputs.get(alias.output as usize),
            op.inputs.get(alias.input as usize),
        ) else {
            return Err(GraphError::AliasOutOfRange {
                op: op_ref(op),
                output: u64::from(alias.output),
                input: u64::from(alias.input),
                outputs: op.outputs.len(),
                inputs: op.inputs.len(),
            });
        };
        if op.aliases[..i].iter().any(|a| a.output == alias.output) {
            return Err(GraphError::AliasedTwice {
                op: op_ref(op),
                output: u64::from(alias.output),
            });
        }
        let (o, n) = (&draft.tensors[out.index()], &draft.tensors[inp.index()]);
        match alias.kind {
            AliasKind::InPlace if o.shape != n.shape || o.dtype != n.dtype => {
                return Err(GraphError::InPlaceMismatch {
                    op: op_ref(op),
                    output: tensor_ref(draft, out),
                    input: tensor_ref(draft, inp),
                });
            }
            AliasKind::View if o.dtype != n.dtype => {
                return Err(GraphError::ViewDtypeMismatch {
                    op: op_ref(op),
                    output: tensor_ref(draft, out),
                    input: tensor_ref(draft, inp),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// A host op updates persistent storage in place on the host, and that
/// storage is the host's: every output of a host op overwrites one of its
/// persistent inputs, no device op writes a storage a host op writes, and
/// none reads it after the host op in the iteration (its device copy is
/// stale from then on, until the next iteration fetches it).
fn check_host_ops(
    draft: &GraphDraft,
    producer: &[Option<OpId>],
    storage_root: &[TensorId],
) -> Result<(), GraphError> {
    if !draft.ops.iter().any(Op::on_host) {
        return Ok(());
    }
    let persistent = |t: TensorId| {
        let root = storage_root[t.index()];
        producer[root.index()].is_none() && draft.tensors[root.index()].kind.is_persistent()
    };
    // The op writing each storage on the host.
    let mut host_writer: Vec<Option<OpId>> = vec![None; draft.tensors.len()];
    for op in draft.ops.iter().filter(|o| o.on_host()) {
        let bad = |reason: String| GraphError::HostOp {
            op: op_ref(op),
            reason,
        };
        for (i, &out) in op.outputs.iter().enumerate() {
            let alias = op
                .alias_of_output(i)
                .filter(|a| a.kind == AliasKind::InPlace)
                .ok_or_else(|| {
                    bad(format!(
                        "its output {} is not an in-place update of one of its inputs",
                        tensor_ref(draft, out)
                    ))
                })?;
            let input = op.inputs[alias.input as usize];
            if !persistent(input) {
                return Err(bad(format!(
                    "it updates {}, which is not persistent (a parameter, buffer or optimizer state)",
                    tensor_ref(draft, input)
                )));
            }
            host_writer[storage_root[out.index()].index()] = Some(op.id);
        }
    }
    for op in draft.ops.iter().filter(|o| !o.on_host()) {
        // A view writes nothing.
        let writes = op.outputs.iter().enumerate().filter(|&(i, _)| {
            op.alias_of_output(i)
                .is_none_or(|a| a.kind == AliasKind::InPlace)
        });
        for (_, &t) in writes {
            if let Some(h) = host_writer[storage_root[t.index()].index()] {
                return Err(GraphError::HostOp {
                    op: op_ref(&draft.ops[h.index()]),
                    reason: format!(
                        "{} (a device op) also writes the storage of {}, which the host op updates",
                        op_ref(op),
                        tensor_ref(draft, t)
                    ),
                });
            }
        }
        for &t in &op.inputs {
            if let Some(h) = host_writer[storage_root[t.index()].index()]
                && h < op.id
            {
                return Err(GraphError::HostOp {
                    op: op_ref(&draft.ops[h.index()]),
                    reason: format!(
                        "{} reads {} on the device after the host op updated its storage",
                        op_ref(op),
                        tensor_ref(draft, t)
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Maps every tensor to the op that produces it; rejects double production,
/// produced inputs and non-initial tensors nobody produces.
fn check_production(draft: &GraphDraft) -> Result<Vec<Option<OpId>>, GraphError> {
    let mut producer: Vec<Option<OpId>> = vec![None; draft.tensors.len()];
    for op in &draft.ops {
        for &t in &op.outputs {
            if let Some(first) = producer[t.index()] {
                return Err(GraphError::ProducedTwice {
                    tensor: tensor_ref(draft, t),
                    first: op_ref(&draft.ops[first.index()]),
                    second: op_ref(op),
                });
            }
            producer[t.index()] = Some(op.id);
        }
    }
    for t in &draft.tensors {
        match producer[t.id.index()] {
            None if !t.kind.is_initial() => {
                return Err(GraphError::NeverProduced {
                    tensor: tensor_ref(draft, t.id),
                    kind: t.kind.name(),
                });
            }
            Some(op) if t.kind == crate::ir::TensorKind::Input => {
                return Err(GraphError::InputProduced {
                    tensor: tensor_ref(draft, t.id),
                    op: op_ref(&draft.ops[op.index()]),
                });
            }
            _ => {}
        }
    }
    Ok(producer)
}

/// Every input must be produced by an earlier op. When one is not, tell a
/// cycle apart from a mere ordering mistake.
fn check_order(draft: &GraphDraft, producer: &[Option<OpId>]) -> Result<(), GraphError> {
    for op in &draft.ops {
        for &t in &op.inputs {
            if let Some(p) = producer[t.index()]
                && p >= op.id
            {
                if let Some(cycle) = find_cycle(draft, producer) {
                    return Err(GraphError::Cycle { ops: cycle });
                }
                return Err(GraphError::UsedBeforeProduced {
                    op: op_ref(op),
                    tensor: tensor_ref(draft, t),
                    producer: op_ref(&draft.ops[p.index()]),
                });
            }
        }
    }
    Ok(())
}

/// An iterative DFS over op -> consumer edges; returns the ops of one cycle
/// (at most 16 of them, the first named twice to close it), if any.
fn find_cycle(draft: &GraphDraft, producer: &[Option<OpId>]) -> Option<Vec<OpRef>> {
    let n = draft.ops.len();
    // Edges producer -> consumer, as adjacency lists.
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for op in &draft.ops {
        for &t in &op.inputs {
            if let Some(p) = producer[t.index()] {
                succ[p.index()].push(op.id.index());
            }
        }
    }
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark = vec![Mark::New; n];
    let mut parent = vec![usize::MAX; n];
    for start in 0..n {
        if mark[start] != Mark::New {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        mark[start] = Mark::Open;
        while let Some(&mut (v, ref mut next)) = stack.last_mut() {
            if let Some(&w) = succ[v].get(*next) {
                *next += 1;
                match mark[w] {
                    Mark::New => {
                        mark[w] = Mark::Open;
                        parent[w] = v;
                        stack.push((w, 0));
                    }
                    Mark::Open => {
                        // Back edge v -> w: the cycle is w -> ... -> v -> w.
                        let mut path = vec![v];
                        let mut u = v;
                        while u != w && path.len() < 16 {
                            u = parent[u];
                            path.push(u);
                        }
                        path.reverse();
                        path.push(w);
                        return Some(path.into_iter().map(|i| op_ref(&draft.ops[i])).collect());
                    }
                    Mark::Done => {}
                }
            } else {
                mark[v] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

/// The storage each tensor uses: follows alias chains back to their root.
/// Producers come before consumers (checked), so one forward pass suffices.
fn storage_roots(draft: &GraphDraft, producer: &[Option<OpId>]) -> Vec<TensorId> {
    let mut root: Vec<TensorId> = draft.tensors.iter().map(|t| t.id).collect();
    for op in &draft.ops {
        for alias in &op.aliases {
            let out = op.outputs[alias.output as usize];
            let inp = op.inputs[alias.input as usize];
            debug_assert!(producer[inp.index()].is_none_or(|p| p < op.id));
            root[out.index()] = root[inp.index()];
        }
    }
    root
}

/// No op reads a tensor version after an in-place op overwrote it.
fn check_overwrites(draft: &GraphDraft) -> Result<(), GraphError> {
    let mut overwritten_by: Vec<Option<OpId>> = vec![None; draft.tensors.len()];
    for op in &draft.ops {
        for &t in &op.inputs {
            if let Some(w) = overwritten_by[t.index()] {
                return Err(GraphError::ReadAfterOverwrite {
                    op: op_ref(op),
                    tensor: tensor_ref(draft, t),
                    overwriter: op_ref(&draft.ops[w.index()]),
                });
            }
        }
        for alias in op.aliases.iter().filter(|a| a.kind == AliasKind::InPlace) {
            let inp = op.inputs[alias.input as usize];
            overwritten_by[inp.index()] = Some(op.id);
        }
    }
    Ok(())
}

fn check_total_bytes(
    draft: &GraphDraft,
    storage_root: &[TensorId],
    limits: &Limits,
) -> Result<(), GraphError> {
    let mut total: u64 = 0;
    for t in &draft.tensors {
        if storage_root[t.id.index()] == t.id {
            total = total.saturating_add(t.bytes);
        }
    }
    if total > limits.max_total_bytes {
        return Err(GraphError::TotalTooLarge {
            bytes: total,
            limit: limits.max_total_bytes,
        });
    }
    Ok(())
}
