//! Forward layers, as PyTorch modules call ATen: each emits its forward ops
//! and records a [`GradFn`] holding what its backward op needs (what
//! PyTorch's autograd saves for it).
//!
//! Parameter names follow torchvision / Hugging Face `named_parameters()`:
//! a layer called `"layer1.0.conv1"` owns `"layer1.0.conv1.weight"`.

use crate::builder::{Builder, attrs, ints};
use crate::ir::{Alias, AliasKind, AttrValue, DType, TensorId};

/// What the backward of one forward op needs. `sources()` are the tensors it
/// sends gradients to.
#[derive(Debug, Clone)]
pub(crate) enum GradFn {
    Convolution {
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        attrs: crate::Attrs,
    },
    BatchNorm {
        x: TensorId,
        w: TensorId,
        b: TensorId,
        mean: TensorId,
        invstd: TensorId,
        eps: f64,
    },
    /// ReLU: `threshold_backward(grad, result)`.
    Threshold {
        x: TensorId,
        out: TensorId,
    },
    MaxPool {
        x: TensorId,
        indices: TensorId,
        attrs: crate::Attrs,
    },
    AvgPool {
        x: TensorId,
        attrs: crate::Attrs,
    },
    AdaptiveAvgPool {
        x: TensorId,
    },
    /// `mean` over some dims: the gradient is expanded back and divided.
    Mean {
        x: TensorId,
        count: u64,
    },
    /// A view with another shape: the gradient is viewed back, copied
    /// first when `grad_copies` (autograd reshapes it, and the gradient
    /// that arrives has strides no view can merge).
    View {
        x: TensorId,
        grad_copies: bool,
    },
    /// A permutation of dims: the gradient is permuted back.
    Permute {
        x: TensorId,
        dims: Vec<usize>,
    },
    /// `addmm(b, x, w.t())`, i.e. a linear layer.
    Addmm {
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
    },
    /// `a + b` (in place or not, `b` possibly broadcast).
    Add {
        a: TensorId,
        b: TensorId,
    },
    /// Multiplication by a constant.
    Scale {
        x: TensorId,
        factor: f64,
    },
    Dropout {
        x: TensorId,
        mask: TensorId,
        scale: f64,
    },
    /// `cat` along `dim`; each part with its offset and length there.
    Cat {
        dim: usize,
        parts: Vec<(TensorId, u64, u64)>,
    },
    LogSoftmax {
        x: TensorId,
        out: TensorId,
        dim: i64,
    },
    NllLoss {
        logp: TensorId,
        target: TensorId,
        total_weight: TensorId,
    },
    Embedding {
        w: TensorId,
        ids: TensorId,
    },
    LayerNorm {
        x: TensorId,
        w: TensorId,
        b: TensorId,
        mean: TensorId,
        rstd: TensorId,
    },
    Gelu {
        x: TensorId,
    },
    Softmax {
        x: TensorId,
        out: TensorId,
        dim: i64,
    },
    Tanh {
        x: TensorId,
        out: TensorId,
    },
    Bmm {
        a: TensorId,
        b: TensorId,
    },
    /// A copy (`clone`, `contiguous`): the gradient passes through.
    Identity {
        x: TensorId,
    },
    /// `x.select(dim, index)`: the gradient is scattered into zeros.
    Select {
        x: TensorId,
        dim: i64,
        index: i64,
    },
}

impl GradFn {
    /// The tensors this backward sends gradients to.
    pub(crate) fn sources(&self) -> Vec<TensorId> {
        use GradFn::*;
        match self {
            Convolution { x, w, b, .. } | Addmm { x, w, b } => {
                let mut v = vec![*x, *w];
                v.extend(b);
                v
            }
            BatchNorm { x, w, b, .. } | LayerNorm { x, w, b, .. } => vec![*x, *w, *b],
            Add { a, b } => vec![*a, *b],
            Cat { parts, .. } => parts.iter().map(|p| p.0).collect(),
            Embedding { w, .. } => vec![*w],
            Bmm { a, b } => vec![*a, *b],
            NllLoss { logp, .. } => vec![*logp],
            Threshold { x, .. }
            | MaxPool { x, .. }
            | AvgPool { x, .. }
            | AdaptiveAvgPool { x }
            | Mean { x, .. }
            | View { x, .. }
            | Permute { x, .. }
            | Scale { x, .. }
            | Dropout { x, .. }
            | LogSoftmax { x, .. }
            | Gelu { x }
            | Softmax { x, .. }
            | Tanh { x, .. }
            | Identity { x }
            | Select { x, .. } => vec![*x],
        }
    }
}

/// `floor((size + 2 pad - dilation (k - 1) - 1) / stride) + 1`, or with
/// `ceil_mode` rounded up (never starting a window in the right padding).
fn pooled(size: u64, k: u64, stride: u64, pad: u64, dilation: u64, ceil: bool) -> Option<u64> {
    let span = dilation.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let room = size.checked_add(2 * pad)?.checked_sub(span)?;
    if stride == 0 {
        return None;
    }
    let mut out = if ceil {
        room.div_ceil(stride) + 1
    } else {
        room / stride + 1
    };
    if ceil && (out - 1) * stride >= size + pad {
        out -= 1;
    }
    Some(out)
}

impl Builder {
    fn single(
        &mut self,
        name: &str,
        op_type: &str,
        inputs: Vec<TensorId>,
        shape: Vec<u64>,
        attrs: crate::Attrs,
        grad: impl FnOnce(TensorId) -> GradFn,
    ) -> TensorId {
        let dtype = self.dtype(inputs[0]);
        let out = self.produced(name, shape, dtype);
        let op = self.op(name, op_type, inputs, vec![out], attrs, vec![]);
        self.record(op, grad(out));
        out
    }

    /// Spatial output size of a 4-D input through a window; records an error
    /// (and returns 1) when the input is too small.
    fn window(
        &mut self,
        name: &str,
        x: TensorId,
        k: [u64; 2],
        s: [u64; 2],
        p: [u64; 2],
        ceil: bool,
    ) -> [u64; 2] {
        let shape = self.shape(x).to_vec();
        if shape.len() != 4 {
            self.fail(name, format!("expected a 4-D input, got shape {shape:?}"));
            return [1, 1];
        }
        let mut out = [1, 1];
        for i in 0..2 {
            match pooled(shape[2 + i], k[i], s[i], p[i], 1, ceil) {
                Some(o) if o > 0 => out[i] = o,
                _ => self.fail(
                    name,
                    format!(
                        "input {shape:?} is too small for a {}x{} window with padding {p:?}",
                        k[0], k[1]
                    ),
                ),
            }
        }
        out
    }

    /// `nn.Conv2d`: `aten::convolution`; saves input and weight.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d(
        &mut self,
        name: &str,
        x: TensorId,
        out_channels: u64,
        kernel: [u64; 2],
        stride: [u64; 2],
        padding: [u64; 2],
        groups: u64,
        bias: bool,
    ) -> TensorId {
        let shape = self.shape(x).to_vec();
        let in_channels = shape.get(1).copied().unwrap_or(0);
        if groups == 0
            || !in_channels.is_multiple_of(groups)
            || !out_channels.is_multiple_of(groups)
        {
            self.fail(name, format!("{in_channels} input and {out_channels} output channels do not split into {groups} groups"));
        }
        let w = self.parameter(
            &format!("{name}.weight"),
            vec![
                out_channels,
                in_channels / groups.max(1),
                kernel[0],
                kernel[1],
            ],
        );
        let b = bias.then(|| self.parameter(&format!("{name}.bias"), vec![out_channels]));
        let [h, wd] = self.window(name, x, kernel, stride, padding, false);
        let a = attrs([
            ("stride", ints(stride)),
            ("padding", ints(padding)),
            ("dilation", ints([1, 1])),
            ("groups", AttrValue::Int(groups as i64)),
            ("transposed", AttrValue::Bool(false)),
            ("output_padding", ints([0, 0])),
        ]);
        let mut inputs = vec![x, w];
        inputs.extend(b);
        let batch = shape.first().copied().unwrap_or(1);
        let ga = a.clone();
        self.single(
            name,
            "aten::convolution",
            inputs,
            vec![batch, out_channels, h, wd],
            a,
            move |_| GradFn::Convolution { x, w, b, attrs: ga },
        )
    }

    /// `nn.BatchNorm2d` in training mode: bumps `num_batches_tracked`, then
    /// `aten::native_batch_norm`, which also updates the running statistics
    /// in place; saves input, weight and the batch statistics.
    pub fn batch_norm(&mut self, name: &str, x: TensorId, eps: f64) -> TensorId {
        let shape = self.shape(x).to_vec();
        let c = shape.get(1).copied().unwrap_or(1);
        // PyTorch refuses training-mode batch norm over a single value per channel.
        if shape.iter().product::<u64>() == c {
            self.fail(name, format!("input {shape:?} has one value per channel; training-mode batch norm needs more (a larger batch or resolution)"));
        }
        let w = self.parameter(&format!("{name}.weight"), vec![c]);
        let b = self.parameter(&format!("{name}.bias"), vec![c]);
        let rm = self.buffer(&format!("{name}.running_mean"), vec![c], DType::F32);
        let rv = self.buffer(&format!("{name}.running_var"), vec![c], DType::F32);
        let nbt = self.buffer(&format!("{name}.num_batches_tracked"), vec![], DType::I64);
        let nbt2 = self.tensor(
            format!("{name}.num_batches_tracked'"),
            vec![],
            DType::I64,
            crate::ir::TensorKind::Buffer,
        );
        self.op(
            format!("{name}.num_batches_tracked.add_"),
            "aten::add_",
            vec![nbt],
            vec![nbt2],
            attrs([("other", AttrValue::Int(1))]),
            vec![Alias {
                output: 0,
                input: 0,
                kind: AliasKind::InPlace,
            }],
        );
        let dtype = self.dtype(x);
        let y = self.produced(name, shape, dtype);
        let mean = self.produced(format!("{name}.save_mean"), vec![c], DType::F32);
        let invstd = self.produced(format!("{name}.save_invstd"), vec![c], DType::F32);
        let rm2 = self.tensor(
            format!("{name}.running_mean'"),
            vec![c],
            DType::F32,
            crate::ir::TensorKind::Buffer,
        );
        let rv2 = self.tensor(
            format!("{name}.running_var'"),
            vec![c],
            DType::F32,
            crate::ir::TensorKind::Buffer,
        );
        let op = self.op(
            name,
            "aten::native_batch_norm",
            vec![x, w, b, rm, rv],
            vec![y, mean, invstd, rm2, rv2],
            attrs([
                ("training", AttrValue::Bool(true)),
                ("momentum", AttrValue::Float(0.1)),
                ("eps", AttrValue::Float(eps)),
            ]),
            vec![
                Alias {
                    output: 3,
                    input: 3,
                    kind: AliasKind::InPlace,
                },
                Alias {
                    output: 4,
                    input: 4,
                    kind: AliasKind::InPlace,
                },
            ],
        );
        self.record(
            op,
            GradFn::BatchNorm {
                x,
                w,
                b,
                mean,
                invstd,
                eps,
            },
        );
        y
    }

    /// `nn.ReLU(inplace=True)`: `aten::relu_` overwrites its input.
    pub fn relu_(&mut self, name: &str, x: TensorId) -> TensorId {
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.produced(name, shape, dtype);
        let op = self.op(
            name,
            "aten::relu_",
            vec![x],
            vec![out],
            attrs([]),
            vec![Alias {
                output: 0,
                input: 0,
                kind: AliasKind::InPlace,
            }],
        );
        self.record(op, GradFn::Threshold { x, out });
        out
    }

    /// `nn.ReLU()`: a new tensor.
    pub fn relu(&mut self, name: &str, x: TensorId) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(name, "aten::relu", vec![x], shape, attrs([]), |out| {
            GradFn::Threshold { x, out }
        })
    }

    /// `nn.MaxPool2d`: `aten::max_pool2d_with_indices`; saves input and indices.
    pub fn max_pool2d(
        &mut self,
        name: &str,
        x: TensorId,
        kernel: u64,
        stride: u64,
        padding: u64,
        ceil_mode: bool,
    ) -> TensorId {
        let [h, w] = self.window(name, x, [kernel; 2], [stride; 2], [padding; 2], ceil_mode);
        let shape = self.shape(x).to_vec();
        let out_shape = vec![shape[0], shape[1], h, w];
        let dtype = self.dtype(x);
        let out = self.produced(name, out_shape.clone(), dtype);
        let indices = self.produced(format!("{name}.indices"), out_shape, DType::I64);
        let a = attrs([
            ("kernel_size", ints([kernel; 2])),
            ("stride", ints([stride; 2])),
            ("padding", ints([padding; 2])),
            ("dilation", ints([1, 1])),
            ("ceil_mode", AttrValue::Bool(ceil_mode)),
        ]);
        let op = self.op(
            name,
            "aten::max_pool2d_with_indices",
            vec![x],
            vec![out, indices],
            a.clone(),
            vec![],
        );
        self.record(
            op,
            GradFn::MaxPool {
                x,
                indices,
                attrs: a,
            },
        );
        out
    }

    /// `nn.AvgPool2d` / `F.avg_pool2d`: saves its input.
    pub fn avg_pool2d(
        &mut self,
        name: &str,
        x: TensorId,
        kernel: u64,
        stride: u64,
        padding: u64,
        count_include_pad: bool,
    ) -> TensorId {
        let [h, w] = self.window(name, x, [kernel; 2], [stride; 2], [padding; 2], false);
        let shape = self.shape(x).to_vec();
        let a = attrs([
            ("kernel_size", ints([kernel; 2])),
            ("stride", ints([stride; 2])),
            ("padding", ints([padding; 2])),
            ("ceil_mode", AttrValue::Bool(false)),
            ("count_include_pad", AttrValue::Bool(count_include_pad)),
        ]);
        let ga = a.clone();
        self.single(
            name,
            "aten::avg_pool2d",
            vec![x],
            vec![shape[0], shape[1], h, w],
            a,
            move |_| GradFn::AvgPool { x, attrs: ga },
        )
    }

    /// `nn.AdaptiveAvgPool2d`. To 1x1 ATen computes a `mean` over H and W
    /// (nothing saved); to other sizes `_adaptive_avg_pool2d` (saves its input).
    pub fn adaptive_avg_pool2d(&mut self, name: &str, x: TensorId, out: [u64; 2]) -> TensorId {
        let shape = self.shape(x).to_vec();
        if shape.len() != 4 {
            self.fail(name, format!("expected a 4-D input, got shape {shape:?}"));
            return x;
        }
        let out_shape = vec![shape[0], shape[1], out[0], out[1]];
        if out == [1, 1] {
            let count = shape[2] * shape[3];
            self.single(
                name,
                "aten::mean",
                vec![x],
                out_shape,
                attrs([
                    ("dim", AttrValue::Ints(vec![-1, -2])),
                    ("keepdim", AttrValue::Bool(true)),
                ]),
                move |_| GradFn::Mean { x, count },
            )
        } else {
            self.single(
                name,
                "aten::_adaptive_avg_pool2d",
                vec![x],
                out_shape,
                attrs([("output_size", ints(out))]),
                move |_| GradFn::AdaptiveAvgPool { x },
            )
        }
    }

    /// A view with a new shape (`view`, `flatten`, `reshape` of a contiguous tensor).
    pub fn view(&mut self, name: &str, x: TensorId, shape: Vec<u64>) -> TensorId {
        self.view_grad_copies(name, x, shape, false)
    }

    /// A view whose backward copies the gradient first when `grad_copies`:
    /// autograd's `grad.reshape(sizes)` on a gradient that arrives
    /// permuted, so that no view of it has `x`'s shape (ATen's batched
    /// `matmul` ends with such a view, and attention permutes what comes
    /// out of it).
    pub fn view_grad_copies(
        &mut self,
        name: &str,
        x: TensorId,
        shape: Vec<u64>,
        grad_copies: bool,
    ) -> TensorId {
        let numel = |s: &[u64]| s.iter().product::<u64>();
        if numel(&shape) != numel(self.shape(x)) {
            self.fail(
                name,
                format!("cannot view {:?} as {shape:?}", self.shape(x)),
            );
        }
        let a = attrs([("size", ints(shape.clone()))]);
        let out = self.view_as(name, "aten::view", x, shape, a);
        let op = self.producer_of_last();
        self.record(op, GradFn::View { x, grad_copies });
        out
    }

    /// `torch.flatten(x, 1)`.
    pub fn flatten(&mut self, name: &str, x: TensorId) -> TensorId {
        let shape = self.shape(x).to_vec();
        let rest = shape.iter().skip(1).product();
        self.view(name, x, vec![shape.first().copied().unwrap_or(1), rest])
    }

    /// `x.permute(dims)`: a strided view.
    pub fn permute(&mut self, name: &str, x: TensorId, dims: Vec<usize>) -> TensorId {
        let shape = self.shape(x).to_vec();
        let mut sorted = dims.clone();
        sorted.sort_unstable();
        if sorted != (0..shape.len()).collect::<Vec<_>>() {
            self.fail(
                name,
                format!("{dims:?} is not a permutation of {} dims", shape.len()),
            );
            return x;
        }
        let out_shape = dims.iter().map(|&d| shape[d]).collect();
        let a = attrs([("dims", ints(dims.iter().map(|&d| d as u64)))]);
        let out = self.view_as(name, "aten::permute", x, out_shape, a);
        let op = self.producer_of_last();
        self.record(op, GradFn::Permute { x, dims });
        out
    }

    /// `x.contiguous()` of a strided view: `aten::clone` copies it.
    pub fn contiguous(&mut self, name: &str, x: TensorId) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(
            name,
            "aten::clone",
            vec![x],
            shape,
            attrs([("memory_format", AttrValue::Str("contiguous".into()))]),
            move |_| GradFn::Identity { x },
        )
    }

    /// `x.select(dim, index)`: a view that drops `dim`.
    pub fn select(&mut self, name: &str, x: TensorId, dim: usize, index: u64) -> TensorId {
        let mut shape = self.shape(x).to_vec();
        if dim >= shape.len() || index >= shape[dim] {
            self.fail(
                name,
                format!("cannot select index {index} of dim {dim} in {shape:?}"),
            );
            return x;
        }
        shape.remove(dim);
        let a = attrs([
            ("dim", AttrValue::Int(dim as i64)),
            ("index", AttrValue::Int(index as i64)),
        ]);
        let out = self.view_as(name, "aten::select", x, shape, a);
        let op = self.producer_of_last();
        self.record(
            op,
            GradFn::Select {
                x,
                dim: dim as i64,
                index: index as i64,
            },
        );
        out
    }

    fn producer_of_last(&self) -> crate::ir::OpId {
        crate::ir::OpId(self.ops.len() as u32 - 1)
    }

    /// `nn.Linear`: `addmm(bias, x, weight.t())` on 2-D inputs; inputs of more
    /// dims are viewed as 2-D around it, as `aten::linear` does.
    pub fn linear(&mut self, name: &str, x: TensorId, out_features: u64, bias: bool) -> TensorId {
        let shape = self.shape(x).to_vec();
        let Some(&in_features) = shape.last() else {
            self.fail(name, "linear of a 0-D tensor");
            return x;
        };
        let w = self.parameter(&format!("{name}.weight"), vec![out_features, in_features]);
        let b = bias.then(|| self.parameter(&format!("{name}.bias"), vec![out_features]));
        let rows: u64 = shape[..shape.len() - 1].iter().product();
        let x2 = if shape.len() == 2 {
            x
        } else {
            self.view(&format!("{name}.flat_input"), x, vec![rows, in_features])
        };
        let wt = self.view_as(
            &format!("{name}.weight.t"),
            "aten::t",
            w,
            vec![in_features, out_features],
            attrs([]),
        );
        let mut inputs = vec![];
        inputs.extend(b);
        inputs.extend([x2, wt]);
        let op_type = if bias { "aten::addmm" } else { "aten::mm" };
        let y = self.single(
            name,
            op_type,
            inputs,
            vec![rows, out_features],
            attrs([]),
            move |_| GradFn::Addmm { x: x2, w, b },
        );
        if shape.len() == 2 {
            y
        } else {
            let mut out_shape = shape.clone();
            *out_shape.last_mut().expect("rank >= 1") = out_features;
            self.view(&format!("{name}.unflat"), y, out_shape)
        }
    }

    /// `nn.Dropout` in training mode: `aten::native_dropout`; saves its mask.
    pub fn dropout(&mut self, name: &str, x: TensorId, p: f64) -> TensorId {
        let (shape, dtype) = (self.shape(x).to_vec(), self.dtype(x));
        let out = self.produced(name, shape.clone(), dtype);
        let mask = self.produced(format!("{name}.mask"), shape, DType::Bool);
        let op = self.op(
            name,
            "aten::native_dropout",
            vec![x],
            vec![out, mask],
            attrs([("p", AttrValue::Float(p)), ("train", AttrValue::Bool(true))]),
            vec![],
        );
        self.record(
            op,
            GradFn::Dropout {
                x,
                mask,
                scale: 1.0 / (1.0 - p),
            },
        );
        out
    }

    /// `torch.cat(xs, dim)`: saves nothing but sizes.
    pub fn cat(&mut self, name: &str, xs: &[TensorId], dim: usize) -> TensorId {
        let Some(&first) = xs.first() else {
            self.fail(name, "cat of no tensors");
            return TensorId(0);
        };
        let mut shape = self.shape(first).to_vec();
        let mut parts = Vec::new();
        let mut offset = 0;
        for &x in xs {
            let s = self.shape(x);
            let fits = s.len() == shape.len()
                && dim < s.len()
                && s.iter()
                    .enumerate()
                    .all(|(i, &d)| i == dim || d == shape[i]);
            if !fits {
                let s = s.to_vec();
                self.fail(
                    name,
                    format!("cannot cat {s:?} to {shape:?} along dim {dim}"),
                );
                return first;
            }
            parts.push((x, offset, s[dim]));
            offset += s[dim];
        }
        shape[dim] = offset;
        self.single(
            name,
            "aten::cat",
            xs.to_vec(),
            shape,
            attrs([("dim", AttrValue::Int(dim as i64))]),
            move |_| GradFn::Cat { dim, parts },
        )
    }

    /// `a + b`, `b` broadcast to `a`'s shape if needed.
    pub fn add(&mut self, name: &str, a: TensorId, b: TensorId) -> TensorId {
        let shape = self.broadcast(name, a, b);
        self.single(
            name,
            "aten::add",
            vec![a, b],
            shape,
            attrs([("alpha", AttrValue::Int(1))]),
            move |_| GradFn::Add { a, b },
        )
    }

    /// `a += b`: overwrites `a`.
    pub fn add_(&mut self, name: &str, a: TensorId, b: TensorId) -> TensorId {
        let shape = self.broadcast(name, a, b);
        let dtype = self.dtype(a);
        let out = self.produced(name, shape, dtype);
        let op = self.op(
            name,
            "aten::add_",
            vec![a, b],
            vec![out],
            attrs([("alpha", AttrValue::Int(1))]),
            vec![Alias {
                output: 0,
                input: 0,
                kind: AliasKind::InPlace,
            }],
        );
        self.record(op, GradFn::Add { a, b });
        out
    }

    fn broadcast(&mut self, name: &str, a: TensorId, b: TensorId) -> Vec<u64> {
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        let ok = sb.len() <= sa.len()
            && sb
                .iter()
                .rev()
                .zip(sa.iter().rev())
                .all(|(&y, &x)| y == x || y == 1);
        if !ok {
            self.fail(name, format!("cannot broadcast {sb:?} to {sa:?}"));
        }
        sa
    }

    /// `x * factor` (`aten::mul` with a scalar; `aten::div` for `x / divisor`).
    pub fn scale(&mut self, name: &str, x: TensorId, factor: f64) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(
            name,
            "aten::mul",
            vec![x],
            shape,
            attrs([("other", AttrValue::Float(factor))]),
            move |_| GradFn::Scale { x, factor },
        )
    }

    /// `F.cross_entropy(logits, target)`: `_log_softmax` then `nll_loss_forward`
    /// (mean reduction); returns the scalar loss.
    pub fn cross_entropy(&mut self, name: &str, logits: TensorId, target: TensorId) -> TensorId {
        let shape = self.shape(logits).to_vec();
        let logp = self.single(
            &format!("{name}.log_softmax"),
            "aten::_log_softmax",
            vec![logits],
            shape,
            attrs([
                ("dim", AttrValue::Int(1)),
                ("half_to_float", AttrValue::Bool(false)),
            ]),
            move |out| GradFn::LogSoftmax {
                x: logits,
                out,
                dim: 1,
            },
        );
        let dtype = self.dtype(logits);
        let loss = self.produced(name, vec![], dtype);
        let total_weight = self.produced(format!("{name}.total_weight"), vec![], dtype);
        let op = self.op(
            name,
            "aten::nll_loss_forward",
            vec![logp, target],
            vec![loss, total_weight],
            attrs([
                ("reduction", AttrValue::Int(1)),
                ("ignore_index", AttrValue::Int(-100)),
            ]),
            vec![],
        );
        self.record(
            op,
            GradFn::NllLoss {
                logp,
                target,
                total_weight,
            },
        );
        loss
    }

    /// `nn.Embedding`: `aten::embedding`; saves the indices.
    pub fn embedding(&mut self, name: &str, ids: TensorId, num: u64, dim: u64) -> TensorId {
        let w = self.parameter(&format!("{name}.weight"), vec![num, dim]);
        let mut shape = self.shape(ids).to_vec();
        shape.push(dim);
        let out = self.produced(name, shape, DType::F32);
        let op = self.op(
            name,
            "aten::embedding",
            vec![w, ids],
            vec![out],
            attrs([("padding_idx", AttrValue::Int(-1))]),
            vec![],
        );
        self.record(op, GradFn::Embedding { w, ids });
        out
    }

    /// `nn.LayerNorm` over the last dim: `aten::native_layer_norm`; saves
    /// input, weight, bias and the statistics.
    pub fn layer_norm(&mut self, name: &str, x: TensorId, eps: f64) -> TensorId {
        let shape = self.shape(x).to_vec();
        let d = shape.last().copied().unwrap_or(1);
        let w = self.parameter(&format!("{name}.weight"), vec![d]);
        let b = self.parameter(&format!("{name}.bias"), vec![d]);
        let mut stat = shape.clone();
        if let Some(last) = stat.last_mut() {
            *last = 1;
        }
        let dtype = self.dtype(x);
        let y = self.produced(name, shape, dtype);
        let mean = self.produced(format!("{name}.mean"), stat.clone(), DType::F32);
        let rstd = self.produced(format!("{name}.rstd"), stat, DType::F32);
        let op = self.op(
            name,
            "aten::native_layer_norm",
            vec![x, w, b],
            vec![y, mean, rstd],
            attrs([
                ("normalized_shape", ints([d])),
                ("eps", AttrValue::Float(eps)),
            ]),
            vec![],
        );
        self.record(
            op,
            GradFn::LayerNorm {
                x,
                w,
                b,
                mean,
                rstd,
            },
        );
        y
    }

    /// `F.gelu` (exact): saves its input.
    pub fn gelu(&mut self, name: &str, x: TensorId) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(
            name,
            "aten::gelu",
            vec![x],
            shape,
            attrs([("approximate", AttrValue::Str("none".into()))]),
            move |_| GradFn::Gelu { x },
        )
    }

    /// `softmax(x, dim)`: `aten::_softmax`; saves its result.
    pub fn softmax(&mut self, name: &str, x: TensorId, dim: i64) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(
            name,
            "aten::_softmax",
            vec![x],
            shape,
            attrs([
                ("dim", AttrValue::Int(dim)),
                ("half_to_float", AttrValue::Bool(false)),
            ]),
            move |out| GradFn::Softmax { x, out, dim },
        )
    }

    /// `tanh(x)`: saves its result.
    pub fn tanh(&mut self, name: &str, x: TensorId) -> TensorId {
        let shape = self.shape(x).to_vec();
        self.single(name, "aten::tanh", vec![x], shape, attrs([]), move |out| {
            GradFn::Tanh { x, out }
        })
    }

    /// Batched matrix product of `[b, n, k]` and `[b, k, m]`: saves both.
    pub fn bmm(&mut self, name: &str, a: TensorId, b: TensorId) -> TensorId {
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa.len() != 3 || sb.len() != 3 || sa[0] != sb[0] || sa[2] != sb[1] {
            self.fail(name, format!("cannot bmm {sa:?} by {sb:?}"));
            return a;
        }
        self.single(
            name,
            "aten::bmm",
            vec![a, b],
            vec![sa[0], sa[1], sb[2]],
            attrs([]),
            move |_| GradFn::Bmm { a, b },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::pooled;

    #[test]
    fn window_arithmetic_matches_pytorch() {
        // conv 7x7 s2 p3 on 224 -> 112; maxpool 3 s2 p1 on 112 -> 56.
        assert_eq!(pooled(224, 7, 2, 3, 1, false), Some(112));
        assert_eq!(pooled(112, 3, 2, 1, 1, false), Some(56));
        // Inception-V3 stem: 299 -> 149 (3x3 s2), 147 (3x3), maxpool 3 s2 -> 73.
        assert_eq!(pooled(299, 3, 2, 0, 1, false), Some(149));
        assert_eq!(pooled(147, 3, 2, 0, 1, false), Some(73));
        // ceil_mode: 112 with 3x3 s2 p0 -> ceil(109/2)+1 = 56.
        assert_eq!(pooled(112, 3, 2, 0, 1, true), Some(56));
        // Too small: no window fits.
        assert_eq!(pooled(2, 3, 1, 0, 1, false), None);
        assert_eq!(pooled(5, 3, 0, 0, 1, false), None);
    }
}
