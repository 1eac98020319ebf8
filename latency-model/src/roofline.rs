//! The roofline cost model: the FLOPs and the device-memory bytes of every
//! op, from its tensors' shapes and its attributes, and their time on a
//! [`DeviceProfile`] as `launch + max(compute, memory)` with per-class
//! efficiencies.
//!
//! Counting conventions: a multiply-add is two FLOPs; transcendental
//! functions count a handful; bytes are what a good kernel reads and writes
//! once (an input read twice by a two-pass kernel, such as batch norm's
//! statistics then normalisation, counts twice; an input only used for its
//! shape, such as a pooling backward's `self`, counts nothing). Views
//! (`view`, `t`, `permute`, ...) change metadata only: no kernel, no cost.
//! An op type this module does not know costs the bytes of its inputs and
//! outputs and no FLOPs.

use tensile_graph::{AliasKind, Graph, Op, TensorId};

use crate::profile::DeviceProfile;

/// The kinds of kernel with their own efficiency in a [`DeviceProfile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpClass {
    /// Convolutions, forward and backward (cuDNN).
    Conv,
    /// Dense matrix products (cuBLAS).
    Matmul,
    /// Batch and layer norm, forward and backward: reductions with an
    /// elementwise pass.
    Normalization,
    /// One output element from a few input elements: activations, adds,
    /// dropout, copies, concatenation, gathers, fills.
    Elementwise,
    /// Sums, means, pooling, softmax, losses, scatter-adds.
    Reduction,
    /// Optimizer updates of parameters and their state.
    Optimizer,
    /// Metadata-only ops: no kernel, zero time.
    View,
}

impl OpClass {
    pub const ALL: [OpClass; 7] = [
        OpClass::Conv,
        OpClass::Matmul,
        OpClass::Normalization,
        OpClass::Elementwise,
        OpClass::Reduction,
        OpClass::Optimizer,
        OpClass::View,
    ];

    /// The name used in profile files (`conv`, `matmul`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Conv => "conv",
            OpClass::Matmul => "matmul",
            OpClass::Normalization => "normalization",
            OpClass::Elementwise => "elementwise",
            OpClass::Reduction => "reduction",
            OpClass::Optimizer => "optimizer",
            OpClass::View => "view",
        }
    }

    /// Whether ops of this class launch a kernel (all but views).
    pub fn is_kernel(self) -> bool {
        self != OpClass::View
    }
}

/// The work of one op.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpCost {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes read from and written to device memory.
    pub bytes: f64,
}

impl OpCost {
    pub const ZERO: OpCost = OpCost {
        flops: 0.0,
        bytes: 0.0,
    };
}

/// ATen ops that only make a new view of their input.
const VIEW_OPS: &[&str] = &[
    "alias",
    "as_strided",
    "detach",
    "expand",
    "expand_as",
    "narrow",
    "permute",
    "select",
    "slice",
    "squeeze",
    "t",
    "transpose",
    "unflatten",
    "unsqueeze",
    "view",
    "view_as",
    "_unsafe_view",
];

/// The ATen name without its `aten::` namespace and in-place `_` suffix
/// (`aten::relu_` is `relu`; `aten::_fused_adam_` is `_fused_adam`).
fn base_name(op_type: &str) -> &str {
    let name = op_type.strip_prefix("aten::").unwrap_or(op_type);
    name.strip_suffix('_').unwrap_or(name)
}

/// The class of an op. An op is a view when its type is a known view op or
/// every output is declared a view of an input.
pub fn op_class(op: &Op) -> OpClass {
    let all_views = !op.outputs.is_empty()
        && (0..op.outputs.len()).all(|i| {
            op.alias_of_output(i)
                .is_some_and(|a| a.kind == AliasKind::View)
        });
    if all_views {
        return OpClass::View;
    }
    op_class_of_type(&op.op_type)
}

/// The class of an op type by its name alone (an op whose outputs are all
/// declared views is a view whatever its type: see [`op_class`]).
pub fn op_class_of_type(op_type: &str) -> OpClass {
    let name = base_name(op_type);
    if VIEW_OPS.contains(&name) {
        return OpClass::View;
    }
    match name {
        "convolution"
        | "convolution_backward"
        | "_convolution"
        | "conv2d"
        | "conv1d"
        | "conv3d"
        | "cudnn_convolution" => OpClass::Conv,
        "addmm" | "mm" | "bmm" | "baddbmm" | "matmul" | "linear" => OpClass::Matmul,
        "native_batch_norm"
        | "native_batch_norm_backward"
        | "batch_norm"
        | "native_layer_norm"
        | "native_layer_norm_backward"
        | "layer_norm"
        | "native_group_norm"
        | "native_group_norm_backward" => OpClass::Normalization,
        "sum"
        | "mean"
        | "max_pool2d_with_indices"
        | "max_pool2d_with_indices_backward"
        | "avg_pool2d"
        | "avg_pool2d_backward"
        | "_adaptive_avg_pool2d"
        | "_adaptive_avg_pool2d_backward"
        | "_log_softmax"
        | "_log_softmax_backward_data"
        | "_softmax"
        | "_softmax_backward_data"
        | "nll_loss_forward"
        | "nll_loss_backward"
        | "embedding_dense_backward" => OpClass::Reduction,
        "_fused_adam" | "_fused_adamw" | "_fused_sgd" => OpClass::Optimizer,
        _ => OpClass::Elementwise,
    }
}

/// The FLOPs and bytes of `op`, an op of `graph`, read from the graph's
/// tensors and the op's attributes. Lenient: an op with fewer operands or
/// attributes than its type has costs what is there, never a panic.
pub fn op_cost(graph: &Graph, op: &Op) -> OpCost {
    if op_class(op) == OpClass::View {
        return OpCost::ZERO;
    }
    kernel_cost(graph, op)
}

/// [`op_cost`] of an op already known not to be a view (the features,
/// which have checked, skip a second look at its class).
pub(crate) fn kernel_cost(graph: &Graph, op: &Op) -> OpCost {
    let c = Operands { graph, op };
    let io = c.in_bytes() + c.out_bytes();
    // FLOPs per output element of simple elementwise kernels.
    let per_out = |flops: f64| OpCost {
        flops: flops * c.out_numel(),
        bytes: io,
    };
    match base_name(&op.op_type) {
        "convolution" => conv(&c),
        "convolution_backward" => conv_backward(&c),
        "addmm" | "mm" | "bmm" | "baddbmm" => matmul(&c),
        // Statistics pass, then a normalising pass over the input.
        "native_batch_norm" => OpCost {
            flops: 7.0 * c.in_numel(0),
            bytes: io + c.in_bytes_at(0),
        },
        // A reduction pass over grad and input, then the elementwise pass.
        "native_batch_norm_backward" => OpCost {
            flops: 10.0 * c.in_numel(0),
            bytes: io + c.in_bytes_at(0) + c.in_bytes_at(1),
        },
        // Rows fit on chip: one pass.
        "native_layer_norm" => OpCost {
            flops: 8.0 * c.in_numel(0),
            bytes: io,
        },
        // The weight and bias gradients reduce over rows: a second pass.
        "native_layer_norm_backward" => OpCost {
            flops: 10.0 * c.in_numel(0),
            bytes: io + c.in_bytes_at(0) + c.in_bytes_at(1),
        },
        "max_pool2d_with_indices" | "avg_pool2d" => OpCost {
            flops: c.out_numel() * window(op),
            bytes: io,
        },
        // `self` (the forward input) is read for its shape only.
        "max_pool2d_with_indices_backward" => OpCost {
            flops: c.in_numel(0) * window(op),
            bytes: c.in_bytes_at(0) + c.in_bytes_at(2) + c.out_bytes(),
        },
        "avg_pool2d_backward" => OpCost {
            flops: c.in_numel(0) * window(op),
            bytes: c.in_bytes_at(0) + c.out_bytes(),
        },
        "_adaptive_avg_pool2d" | "mean" | "sum" => OpCost {
            flops: c.in_numel(0),
            bytes: io,
        },
        "_adaptive_avg_pool2d_backward" => OpCost {
            flops: c.out_numel(),
            bytes: c.in_bytes_at(0) + c.out_bytes(),
        },
        "_log_softmax" | "_softmax" => per_out(5.0),
        "_log_softmax_backward_data" | "_softmax_backward_data" => per_out(4.0),
        // Reads one log-probability per row.
        "nll_loss_forward" => {
            let rows = c.in_numel(1);
            OpCost {
                flops: rows,
                bytes: c.in_bytes_at(1) + rows * c.elem_bytes(0) + c.out_bytes(),
            }
        }
        // Fills the gradient with zeros and scatters one value per row.
        "nll_loss_backward" => OpCost {
            flops: c.in_numel(2),
            bytes: c.out_bytes() + c.in_bytes_at(2),
        },
        // Gathers one row per index: reads as much of the table as it writes.
        "embedding" => OpCost {
            flops: 0.0,
            bytes: 2.0 * c.out_bytes() + c.in_bytes_at(1),
        },
        // Zero-fills the table gradient, sorts the indices, scatter-adds rows.
        "embedding_dense_backward" => OpCost {
            flops: c.in_numel(0),
            bytes: c.out_bytes() + c.in_bytes_at(0) + 4.0 * c.in_bytes_at(1),
        },
        // Fills: the input is read for its shape only.
        "ones_like" | "zeros_like" | "empty_like" | "fill" | "zero" => OpCost {
            flops: 0.0,
            bytes: c.out_bytes(),
        },
        // Zero-fills the input's gradient and copies one slice into it.
        "select_backward" | "slice_backward" => OpCost {
            flops: 0.0,
            bytes: c.out_bytes() + c.in_bytes_at(0),
        },
        "relu" | "threshold_backward" | "add" | "sub" | "mul" | "div" => per_out(1.0),
        "native_dropout" => per_out(4.0),
        "native_dropout_backward" => per_out(2.0),
        "gelu" => per_out(20.0),
        "gelu_backward" => per_out(25.0),
        "tanh" => per_out(10.0),
        "tanh_backward" => per_out(3.0),
        "_fused_adam" | "_fused_adamw" => OpCost {
            flops: 16.0 * c.in_numel(0),
            bytes: io,
        },
        "_fused_sgd" => OpCost {
            flops: 4.0 * c.in_numel(0),
            bytes: io,
        },
        // cat, clone, copies and every op type not known here.
        _ => OpCost {
            flops: 0.0,
            bytes: io,
        },
    }
}

/// Nanoseconds `op` takes on `profile`: the kernel launch plus the longer of
/// its compute time and its memory time, each at its class's efficiency.
/// Zero for views; at least 1 ns for every kernel.
pub fn roofline_ns(profile: &DeviceProfile, op: &Op, cost: &OpCost) -> u64 {
    match profile.efficiency.of(op_class(op)) {
        None => 0,
        Some(e) => kernel_ns(profile, cost, e.compute, e.memory),
    }
}

/// `launch + max(flops / (peak * compute), bytes / (bandwidth * memory))`,
/// rounded up, at least 1.
pub(crate) fn kernel_ns(p: &DeviceProfile, cost: &OpCost, compute: f64, memory: f64) -> u64 {
    let compute_ns = cost.flops / (p.peak_flops * compute) * 1e9;
    let memory_ns = cost.bytes / (p.mem_bytes_per_s * memory) * 1e9;
    let busy = compute_ns.max(memory_ns);
    let busy = if busy.is_finite() { busy.ceil() } else { 0.0 };
    (p.kernel_launch_ns as f64 + busy)
        .min(u64::MAX as f64)
        .max(1.0) as u64
}

/// `2 * output elements * (input channels / groups) * kernel area`, plus the
/// bias; the weight's shape `[out, in / groups, kh, kw]` gives the last two.
fn conv(c: &Operands<'_>) -> OpCost {
    let per_output = c.per_output_channel(1);
    let bias = if c.op.inputs.len() > 2 {
        c.out_numel()
    } else {
        0.0
    };
    OpCost {
        flops: 2.0 * c.out_numel() * per_output + bias,
        bytes: c.in_bytes() + c.out_bytes(),
    }
}

/// Inputs `(grad_output, input, weight)`; `output_mask` says which of the
/// input, weight and bias gradients it computes (the outputs, in that order).
/// The input and weight gradients each cost what the forward does; the
/// input is read only for the weight gradient, the weight only for the
/// input gradient.
fn conv_backward(c: &Operands<'_>) -> OpCost {
    let mask = match c.op.ints_attr("output_mask") {
        Some(m) if m.len() == 3 => [m[0] != 0, m[1] != 0, m[2] != 0],
        // Without a mask, the outputs are the first gradients in order.
        _ => [0, 1, 2].map(|i| i < c.op.outputs.len()),
    };
    let grad_out = c.in_numel(0);
    let one = 2.0 * grad_out * c.per_output_channel(2);
    let flops = one * (f64::from(u8::from(mask[0])) + f64::from(u8::from(mask[1])))
        + if mask[2] { grad_out } else { 0.0 };
    let mut bytes = c.in_bytes_at(0) + c.out_bytes();
    if mask[0] {
        bytes += c.in_bytes_at(2);
    }
    if mask[1] {
        bytes += c.in_bytes_at(1);
    }
    OpCost { flops, bytes }
}

/// `2 * output elements * shared dimension`, plus the bias of `addmm` and
/// `baddbmm`; the shared dimension is the last of the first matrix operand.
fn matmul(c: &Operands<'_>) -> OpCost {
    let n = c.op.inputs.len();
    let (a, bias) = if n >= 3 {
        (n - 2, c.out_numel())
    } else {
        (0, 0.0)
    };
    let k = c.shape(a).and_then(|s| s.last().copied()).unwrap_or(0) as f64;
    OpCost {
        flops: 2.0 * c.out_numel() * k + bias,
        bytes: c.in_bytes() + c.out_bytes(),
    }
}

/// Elements of a pooling window (`kernel_size`), 1 when not given.
fn window(op: &Op) -> f64 {
    op.ints_attr("kernel_size")
        .map_or(1.0, |k| k.iter().map(|&x| x.max(1) as f64).product())
}

/// An op's operands, read leniently: a missing operand counts as empty.
struct Operands<'a> {
    graph: &'a Graph,
    op: &'a Op,
}

impl Operands<'_> {
    fn input(&self, i: usize) -> Option<TensorId> {
        self.op.inputs.get(i).copied()
    }

    fn shape(&self, i: usize) -> Option<&[u64]> {
        self.input(i).map(|t| self.graph.tensor(t).shape.as_slice())
    }

    fn numel(&self, t: TensorId) -> f64 {
        self.graph
            .tensor(t)
            .shape
            .iter()
            .map(|&d| d as f64)
            .product()
    }

    fn in_numel(&self, i: usize) -> f64 {
        self.input(i).map_or(0.0, |t| self.numel(t))
    }

    fn in_bytes_at(&self, i: usize) -> f64 {
        self.input(i)
            .map_or(0.0, |t| self.graph.tensor(t).bytes as f64)
    }

    fn elem_bytes(&self, i: usize) -> f64 {
        self.input(i)
            .map_or(0.0, |t| self.graph.tensor(t).dtype.size() as f64)
    }

    fn in_bytes(&self) -> f64 {
        (0..self.op.inputs.len()).map(|i| self.in_bytes_at(i)).sum()
    }

    fn out_bytes(&self) -> f64 {
        let g = self.graph;
        self.op
            .outputs
            .iter()
            .map(|&t| g.tensor(t).bytes as f64)
            .sum()
    }

    /// Elements of the first output.
    fn out_numel(&self) -> f64 {
        self.op.outputs.first().map_or(0.0, |&t| self.numel(t))
    }

    /// Multiply-adds per output element of a convolution whose weight is
    /// input `w`: `in / groups * kh * kw`, all of the weight's dims but the first.
    fn per_output_channel(&self, w: usize) -> f64 {
        self.shape(w)
            .map_or(0.0, |s| s.iter().skip(1).map(|&d| d as f64).product())
    }
}
