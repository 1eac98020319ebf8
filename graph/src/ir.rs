//! The domain types of a compute graph: tensors, ops, and the validated [`Graph`].
//!
//! A graph is one training iteration of one job, its ops in execution order.
//! Ops use ATen operator names (`aten::convolution`, `aten::addmm`, ...), so
//! zoo graphs, graphs traced from PyTorch and the libtorch-backed executor
//! share one vocabulary. These types carry no serde or prost: the JSON format
//! lives in [`crate::json`], the wire format in the proto crate.

use std::fmt;

use crate::validate::{self, GraphError, Limits};

/// Index of a tensor in [`Graph::tensors`]; ids are dense, `0..n` in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorId(pub u32);

/// Index of an op in [`Graph::ops`]; also its position in execution order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

/// Where an op runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// On the device, on its compute stream (every op but a host update).
    #[default]
    Device,
    /// On the host CPU, over host copies of its inputs (an optimizer update
    /// kept on the host, as ZeRO-Offload's CPU Adam): its device inputs are
    /// copied to the host first, it writes persistent storage in place
    /// there, and a device op that reads that storage later gets it copied
    /// back. It takes no time on the device. The program says where an op
    /// runs, not a plan: a CPU kernel and a device kernel need not agree to
    /// the last bit.
    Host,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Device => "device",
            Placement::Host => "host",
        }
    }

    pub fn from_name(name: &str) -> Option<Placement> {
        [Placement::Device, Placement::Host]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Floating point: the only dtypes gradients flow through.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The lower-case name used in JSON and on the wire (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// What a tensor is for; decides whether it lives across iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// A batch of data or labels, present at iteration start.
    Input,
    /// A trainable parameter (counted in the parameter count).
    Parameter,
    /// A persistent non-trainable tensor (batch-norm running statistics).
    Buffer,
    /// Produced in the forward pass.
    Activation,
    /// A gradient, of an activation or of a parameter.
    Gradient,
    /// Optimizer state (Adam moments, momentum buffers).
    OptimizerState,
    /// Scratch memory of one op, dead when the op ends.
    Workspace,
    /// A result the user reads after the iteration (the loss).
    Output,
}

impl TensorKind {
    pub const ALL: [TensorKind; 8] = [
        TensorKind::Input,
        TensorKind::Parameter,
        TensorKind::Buffer,
        TensorKind::Activation,
        TensorKind::Gradient,
        TensorKind::OptimizerState,
        TensorKind::Workspace,
        TensorKind::Output,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Input => "input",
            TensorKind::Parameter => "parameter",
            TensorKind::Buffer => "buffer",
            TensorKind::Activation => "activation",
            TensorKind::Gradient => "gradient",
            TensorKind::OptimizerState => "optimizer_state",
            TensorKind::Workspace => "workspace",
            TensorKind::Output => "output",
        }
    }

    pub fn from_name(name: &str) -> Option<TensorKind> {
        TensorKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Tensors of these kinds are not produced by any op of the iteration:
    /// they exist when it starts.
    pub fn is_initial(self) -> bool {
        matches!(
            self,
            TensorKind::Input
                | TensorKind::Parameter
                | TensorKind::Buffer
                | TensorKind::OptimizerState
        )
    }

    /// Storage rooted in a tensor of these kinds lives across iterations.
    pub fn is_persistent(self) -> bool {
        matches!(
            self,
            TensorKind::Parameter | TensorKind::Buffer | TensorKind::OptimizerState
        )
    }
}

/// The part of the iteration an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }

    pub fn from_name(name: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One tensor of the iteration. `bytes` always equals `numel(shape) * dtype.size()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub id: TensorId,
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub bytes: u64,
    pub kind: TensorKind,
}

impl Tensor {
    /// Number of elements, `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}

/// An op attribute (stride, padding, eps, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

/// How an op's output shares memory with one of its inputs.
/// An op's attributes by name, kept sorted by name: one allocation of the
/// entries themselves. A `BTreeMap` allocates a node of eleven slots
/// (about 0.6 KB) for an op with a single attribute, which made the
/// attributes most of a graph's memory (a scheduler holds one graph per
/// job).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attrs(Vec<(String, AttrValue)>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&AttrValue> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key`, returning the value it had.
    pub fn insert(&mut self, key: String, value: AttrValue) -> Option<AttrValue> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<AttrValue> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// By name, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &AttrValue)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }
}

impl FromIterator<(String, AttrValue)> for Attrs {
    /// The last value of a name given twice wins, as a map's would.
    fn from_iter<I: IntoIterator<Item = (String, AttrValue)>>(iter: I) -> Attrs {
        let mut v: Vec<(String, AttrValue)> = iter.into_iter().collect();
        // Stable: of equal names the last stays last, and is kept.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, AttrValue)> = Vec::with_capacity(v.len());
        for (k, val) in v {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = val,
                _ => out.push((k, val)),
            }
        }
        out.shrink_to_fit();
        Attrs(out)
    }
}

impl<'a> IntoIterator for &'a Attrs {
    type Item = (&'a String, &'a AttrValue);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, AttrValue)>,
        fn(&'a (String, AttrValue)) -> (&'a String, &'a AttrValue),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AliasKind {
    /// The op overwrote the input (`relu_`, an optimizer update): the output
    /// is the input's next version, and the old version may not be read again.
    InPlace,
    /// The output is a view of the input (`view`, `t`, `slice`): both stay readable.
    View,
}

impl AliasKind {
    pub fn name(self) -> &'static str {
        match self {
            AliasKind::InPlace => "in_place",
            AliasKind::View => "view",
        }
    }

    pub fn from_name(name: &str) -> Option<AliasKind> {
        [AliasKind::InPlace, AliasKind::View]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// `outputs[output]` shares the memory of `inputs[input]` of the same op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Alias {
    pub output: u32,
    pub input: u32,
    pub kind: AliasKind,
}

/// One op of the iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub id: OpId,
    pub name: String,
    /// ATen operator name, e.g. `aten::convolution_backward`.
    pub op_type: String,
    pub attrs: Attrs,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    pub aliases: Vec<Alias>,
    pub phase: Phase,
    pub placement: Placement,
}

impl Op {
    /// Runs on the host ([`Placement::Host`]).
    pub fn on_host(&self) -> bool {
        self.placement == Placement::Host
    }

    /// The alias of output `index`, if it shares an input's memory.
    pub fn alias_of_output(&self, index: usize) -> Option<&Alias> {
        self.aliases.iter().find(|a| a.output as usize == index)
    }

    pub fn int_attr(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key)? {
            AttrValue::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn ints_attr(&self, key: &str) -> Option<&[i64]> {
        match self.attrs.get(key)? {
            AttrValue::Ints(v) => Some(v),
            _ => None,
        }
    }

    pub fn float_attr(&self, key: &str) -> Option<f64> {
        match self.attrs.get(key)? {
            AttrValue::Float(v) => Some(*v),
            AttrValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
}

/// An unvalidated graph: what a file, a tracer or a builder hands in.
/// [`Graph::new`] turns it into a [`Graph`] or says what is wrong with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GraphDraft {
    pub name: String,
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
}

/// A validated graph.
///
/// **Invariants** (checked by [`Graph::new`]): there is at least one op; ids
/// are dense and in order;
/// every tensor is produced at most once, by an op listed before every op
/// that reads it, or is an initial tensor (input, parameter, buffer,
/// optimizer state) that no op produces; bytes equal shape times dtype; every
/// alias points at an input of its own op; an input overwritten in place is
/// never read again; sizes and counts are under the [`Limits`].
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    pub(crate) name: String,
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) ops: Vec<Op>,
    /// The op producing each tensor; `None` for initial tensors.
    pub(crate) producer: Vec<Option<OpId>>,
    /// The tensor whose memory each tensor uses: itself, or the root of its alias chain.
    pub(crate) storage_root: Vec<TensorId>,
}

impl Graph {
    /// Validates a draft under the given limits.
    pub fn new(draft: GraphDraft, limits: &Limits) -> Result<Graph, GraphError> {
        validate::validate(draft, limits)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.index()]
    }

    /// The op that produces `id`, or `None` when it exists at iteration start.
    pub fn producer(&self, id: TensorId) -> Option<OpId> {
        self.producer[id.index()]
    }

    /// The tensor whose memory `id` occupies (the root of its alias chain).
    pub fn storage_root(&self, id: TensorId) -> TensorId {
        self.storage_root[id.index()]
    }

    /// Whether `id`'s memory lives across iterations (parameters, buffers,
    /// optimizer state, and every in-place version or view of them).
    pub fn is_persistent(&self, id: TensorId) -> bool {
        let root = self.storage_root(id);
        self.producer(root).is_none() && self.tensor(root).kind.is_persistent()
    }

    /// Trainable parameters as they are at iteration start, in graph order.
    pub fn parameters(&self) -> impl Iterator<Item = &Tensor> + '_ {
        self.tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Parameter && self.producer(t.id).is_none())
    }

    /// Number of trainable parameter elements.
    pub fn param_count(&self) -> u64 {
        self.parameters().map(|t| t.numel().unwrap_or(0)).sum()
    }

    /// Bytes of trainable parameters.
    pub fn param_bytes(&self) -> u64 {
        self.parameters().map(|t| t.bytes).sum()
    }

    /// The bytes a host op moves through host memory: each tensor it reads
    /// and each it writes (an update in place counts its storage twice).
    /// Host updates are elementwise and bound by memory bandwidth, so this
    /// over the host's bandwidth is their time.
    pub fn host_traffic_bytes(&self, op: OpId) -> u64 {
        let op = self.op(op);
        op.inputs
            .iter()
            .chain(&op.outputs)
            .map(|&t| self.tensor(t).bytes)
            .sum()
    }

    /// Whether any op runs on the host.
    pub fn has_host_ops(&self) -> bool {
        self.ops.iter().any(Op::on_host)
    }

    pub fn into_draft(self) -> GraphDraft {
        GraphDraft {
            name: self.name,
            tensors: self.tensors,
            ops: self.ops,
        }
    }

    pub fn to_draft(&self) -> GraphDraft {
        GraphDraft {
            name: self.name.clone(),
            tensors: self.tensors.clone(),
            ops: self.ops.clone(),
        }
    }
}

#[cfg(test)]
mod attrs_tests {
    use super::{AttrValue, Attrs};

    #[test]
    fn attrs_are_kept_by_name_as_a_map_would() {
        let mut a: Attrs = [
            ("stride".to_string(), AttrValue::Int(2)),
            ("groups".to_string(), AttrValue::Int(1)),
            ("stride".to_string(), AttrValue::Int(3)),
        ]
        .into_iter()
        .collect();
        // The last of a name given twice wins; names come in order.
        assert_eq!(a.len(), 2);
        assert_eq!(a.get("stride"), Some(&AttrValue::Int(3)));
        assert_eq!(a.keys().collect::<Vec<_>>(), ["groups", "stride"]);
        assert_eq!(a.insert("bias".into(), AttrValue::Bool(true)), None);
        assert_eq!(
            a.insert("groups".into(), AttrValue::Int(4)),
            Some(AttrValue::Int(1))
        );
        assert_eq!(a.keys().collect::<Vec<_>>(), ["bias", "groups", "stride"]);
        assert_eq!(a.remove("bias"), Some(AttrValue::Bool(true)));
        assert!(!a.contains_key("bias") && a.contains_key("groups"));
        let pairs: Vec<(&String, &AttrValue)> = (&a).into_iter().collect();
        assert_eq!(pairs.len(), 2);
        assert!(!a.is_empty() && Attrs::new().is_empty());
    }
}
