//! A graph builder with a small autograd: models describe their forward pass
//! as PyTorch modules would, and [`Builder::finish`] appends the backward pass
//! and the optimizer, at tensor granularity and in the order PyTorch runs them.
//!
//! Each forward layer ([`layers`]) emits its ATen op and records on a tape
//! what its backward op needs — exactly the tensors PyTorch's autograd saves
//! for it (a convolution saves its input and weight, a ReLU its result, a
//! max-pool its input and indices, ...). The backward pass ([`autograd`])
//! walks the tape in reverse creation order, which is the order PyTorch's
//! engine runs backward nodes (the ready node with the highest sequence
//! number first), and sums gradients that arrive from several consumers.
//!
//! Shape errors (a resolution too small for a model, say) do not panic: the
//! first one is kept, later layers keep going on placeholder shapes, and
//! `finish` returns it.

mod autograd;
pub mod layers;

use crate::ir::{
    Alias, AliasKind, AttrValue, DType, Graph, GraphDraft, Op, OpId, Phase, Placement, Tensor,
    TensorId, TensorKind,
};
use crate::validate::{GraphError, Limits};

pub use autograd::{Optimizer, Step, UnknownOptimizer};

/// What a backward op needs from the forward pass; one per forward op.
#[derive(Debug, Clone)]
pub(crate) struct TapeEntry {
    pub(crate) op: OpId,
    pub(crate) outputs: Vec<TensorId>,
    pub(crate) grad: layers::GradFn,
}

/// Builds one training iteration; see the module docs.
#[derive(Debug)]
pub struct Builder {
    name: String,
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
    requires_grad: Vec<bool>,
    tape: Vec<TapeEntry>,
    /// The final gradient of each parameter, once the backward pass is built.
    param_grads: std::collections::HashMap<TensorId, TensorId>,
    phase: Phase,
    error: Option<String>,
}

/// Attributes from `(key, value)` pairs.
pub fn attrs<const N: usize>(pairs: [(&str, AttrValue); N]) -> crate::Attrs {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// `AttrValue::Ints` from anything that converts to i64.
pub fn ints<I: IntoIterator<Item = u64>>(v: I) -> AttrValue {
    AttrValue::Ints(v.into_iter().map(|x| x as i64).collect())
}

/// A small MLP training iteration: a `batch` x `width` input, `depth`
/// hidden linear layers of `width` (with a bias or not) each followed by a
/// ReLU, a 10-class head and a cross-entropy loss. The tiny model of many
/// tests: its ops run in microseconds on a CPU.
pub fn mlp(
    batch: u64,
    width: u64,
    depth: usize,
    bias: bool,
    optimizer: Optimizer,
) -> Result<Graph, GraphError> {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![batch, width], DType::F32);
    let y = b.input("y", vec![batch], DType::I64);
    let mut h = x;
    for i in 1..=depth {
        h = b.linear(&format!("fc{i}"), h, width, bias);
        h = b.relu(&format!("act{i}"), h);
    }
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    b.finish(loss, optimizer)
}

impl Builder {
    pub fn new(name: impl Into<String>) -> Builder {
        Builder {
            name: name.into(),
            tensors: Vec::new(),
            ops: Vec::new(),
            requires_grad: Vec::new(),
            tape: Vec::new(),
            param_grads: Default::default(),
            phase: Phase::Forward,
            error: None,
        }
    }

    /// Records a shape error (the first one wins) with the layer it came from.
    pub fn fail(&mut self, layer: &str, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(format!("{layer}: {}", message.into()));
        }
    }

    pub fn shape(&self, t: TensorId) -> &[u64] {
        &self.tensors[t.index()].shape
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.tensors[t.index()].dtype
    }

    pub fn requires_grad(&self, t: TensorId) -> bool {
        self.requires_grad[t.index()]
    }

    /// A new tensor. Sizes saturate instead of overflowing: validation
    /// rejects them later with the tensor's name.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        shape: Vec<u64>,
        dtype: DType,
        kind: TensorKind,
    ) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        let bytes = shape
            .iter()
            .fold(dtype.size(), |acc, &d| acc.saturating_mul(d));
        self.tensors.push(Tensor {
            id,
            name: name.into(),
            shape,
            dtype,
            bytes,
            kind,
        });
        self.requires_grad.push(false);
        id
    }

    /// A batch of data (no gradient).
    pub fn input(&mut self, name: &str, shape: Vec<u64>, dtype: DType) -> TensorId {
        self.tensor(name, shape, dtype, TensorKind::Input)
    }

    /// A trainable f32 parameter.
    pub fn parameter(&mut self, name: &str, shape: Vec<u64>) -> TensorId {
        let t = self.tensor(name, shape, DType::F32, TensorKind::Parameter);
        self.requires_grad[t.index()] = true;
        t
    }

    /// A persistent non-trainable tensor.
    pub fn buffer(&mut self, name: &str, shape: Vec<u64>, dtype: DType) -> TensorId {
        self.tensor(name, shape, dtype, TensorKind::Buffer)
    }

    /// Appends an op in the current phase.
    pub fn op(
        &mut self,
        name: impl Into<String>,
        op_type: &str,
        inputs: Vec<TensorId>,
        outputs: Vec<TensorId>,
        attrs: crate::Attrs,
        aliases: Vec<Alias>,
    ) -> OpId {
        let id = OpId(self.ops.len() as u32);
        self.ops.push(Op {
            id,
            name: name.into(),
            op_type: op_type.to_string(),
            attrs,
            inputs,
            outputs,
            aliases,
            phase: self.phase,
            placement: Placement::Device,
        });
        id
    }

    /// A new tensor of the kind this phase produces (activations forward,
    /// gradients backward).
    pub(crate) fn produced(
        &mut self,
        name: impl Into<String>,
        shape: Vec<u64>,
        dtype: DType,
    ) -> TensorId {
        let kind = match self.phase {
            Phase::Forward => TensorKind::Activation,
            Phase::Backward | Phase::Optimizer => TensorKind::Gradient,
        };
        self.tensor(name, shape, dtype, kind)
    }

    /// A view of `x` with a new shape: no memory of its own.
    pub fn view_as(
        &mut self,
        name: &str,
        op_type: &str,
        x: TensorId,
        shape: Vec<u64>,
        attrs: crate::Attrs,
    ) -> TensorId {
        let dtype = self.dtype(x);
        let out = self.produced(name, shape, dtype);
        self.op(
            name,
            op_type,
            vec![x],
            vec![out],
            attrs,
            vec![Alias {
                output: 0,
                input: 0,
                kind: AliasKind::View,
            }],
        );
        out
    }

    /// Records the forward op just emitted for the backward pass. Its float
    /// outputs require a gradient when any tensor its backward feeds does.
    pub(crate) fn record(&mut self, op: OpId, grad: layers::GradFn) {
        if !grad.sources().iter().any(|&t| self.requires_grad(t)) {
            return;
        }
        let outputs = self.ops[op.index()].outputs.clone();
        for &t in &outputs {
            self.requires_grad[t.index()] = self.tensors[t.index()].dtype.is_float();
        }
        self.tape.push(TapeEntry { op, outputs, grad });
    }

    /// Appends the backward pass from `loss` and the optimizer, and validates.
    pub fn finish(self, loss: TensorId, optimizer: Optimizer) -> Result<Graph, GraphError> {
        self.finish_stepping(loss, optimizer, Step::AtEnd)
    }

    /// [`Builder::finish`], with the optimizer's updates where `step` says.
    pub fn finish_stepping(
        mut self,
        loss: TensorId,
        optimizer: Optimizer,
        step: Step,
    ) -> Result<Graph, GraphError> {
        if let Some(reason) = self.error.take() {
            return Err(GraphError::Malformed { reason });
        }
        self.tensors[loss.index()].kind = TensorKind::Output;
        match step {
            Step::AtEnd => {
                autograd::backward(&mut self, loss, None);
                autograd::optimizer_step(&mut self, optimizer);
            }
            Step::InBackward => {
                autograd::backward(&mut self, loss, Some((optimizer, Placement::Device)));
            }
            Step::OnHost => autograd::backward(&mut self, loss, Some((optimizer, Placement::Host))),
        }
        if let Some(reason) = self.error.take() {
            return Err(GraphError::Malformed { reason });
        }
        Graph::new(
            GraphDraft {
                name: self.name,
                tensors: self.tensors,
                ops: self.ops,
            },
            &Limits::default(),
        )
    }
}
