//! The backward pass and the optimizer step of a built graph.

use std::collections::{BTreeMap, HashMap};

use crate::builder::layers::GradFn;
use crate::builder::{Builder, attrs, ints};
use crate::ir::{Alias, AliasKind, AttrValue, DType, OpId, Phase, Placement, TensorId, TensorKind};

/// The optimizer of the iteration, one fused update op per parameter (the
/// granularity of PyTorch's per-tensor form, `foreach=False`, with the memory
/// of a fused kernel: no temporaries). PyTorch's unfused per-tensor Adam,
/// which the tracer records, also holds one parameter-sized temporary
/// (`sqrt(exp_avg_sq) / bias_correction2_sqrt`) during each update, so where
/// the optimizer step holds the peak its peak is higher by up to the largest
/// parameter (VGG-16 at batch 2: 411 MB, +9.4%).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// `torch.optim.Adam`: two moment buffers per parameter.
    Adam {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    /// `torch.optim.SGD` with momentum: one buffer per parameter.
    Sgd {
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    },
}

/// Where the optimizer's updates run in the iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Step {
    /// After the whole backward pass, in parameter order (`optimizer.step()`
    /// after `loss.backward()`).
    #[default]
    AtEnd,
    /// Each parameter's update as soon as its gradient is final, inside the
    /// backward pass (PyTorch's `register_post_accumulate_grad_hook`
    /// pattern): a gradient is freed by its update instead of living until
    /// the end of the backward pass, and the optimizer's state is touched
    /// spread over the backward pass instead of all at its end. The same
    /// arithmetic per parameter, so the same trained values.
    InBackward,
    /// As [`Step::InBackward`], and each update runs on the host
    /// ([`Placement::Host`]) over host copies of the parameter and its
    /// gradient, with the optimizer's state kept on the host only
    /// (ZeRO-Offload's CPU optimizer): the gradient is copied out as soon
    /// as it is final, and the updated parameter comes back before its
    /// next use. On the device the state takes no memory and crosses no
    /// link; the update's arithmetic is the same CPU kernel's.
    OnHost,
}

impl Step {
    pub const ALL: [Step; 3] = [Step::AtEnd, Step::InBackward, Step::OnHost];

    /// The suffix of the optimizer's name in graph names and on command
    /// lines (`adam`, `adam-in-backward`).
    pub fn suffix(self) -> &'static str {
        match self {
            Step::AtEnd => "",
            Step::InBackward => "-in-backward",
            Step::OnHost => "-on-host",
        }
    }
}

/// A name [`Optimizer::with_step_from_name`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown optimizer {0:?} (expected adam, sgd, adam-in-backward, sgd-in-backward, adam-on-host or sgd-on-host)"
)]
pub struct UnknownOptimizer(pub String);

impl Optimizer {
    /// Adam with PyTorch's defaults (lr 0.001, as in the TENSILE experiments).
    pub fn adam() -> Optimizer {
        Optimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    /// SGD with momentum 0.9, lr 0.01.
    pub fn sgd() -> Optimizer {
        Optimizer::Sgd {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 0.0,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Adam { .. } => "adam",
            Optimizer::Sgd { .. } => "sgd",
        }
    }

    /// `adam` or `sgd`, with default settings.
    pub fn from_name(name: &str) -> Option<Optimizer> {
        match name {
            "adam" => Some(Optimizer::adam()),
            "sgd" => Some(Optimizer::sgd()),
            _ => None,
        }
    }

    /// An optimizer's name with its step's suffix: `adam`, `sgd`,
    /// `adam-in-backward`, `sgd-in-backward`, `adam-on-host` or
    /// `sgd-on-host`.
    pub fn with_step_from_name(name: &str) -> Result<(Optimizer, Step), UnknownOptimizer> {
        [Step::InBackward, Step::OnHost]
            .into_iter()
            .find_map(|step| {
                let base = name.strip_suffix(step.suffix())?;
                Some(Optimizer::from_name(base).map(|o| (o, step)))
            })
            .unwrap_or_else(|| Optimizer::from_name(name).map(|o| (o, Step::AtEnd)))
            .ok_or_else(|| UnknownOptimizer(name.to_string()))
    }
}

impl Builder {
    fn grad_like(&mut self, name: String, like: TensorId) -> TensorId {
        let (shape, dtype) = (self.shape(like).to_vec(), self.dtype(like));
        self.produced(name, shape, dtype)
    }

    fn grad_name(&self, t: TensorId) -> String {
        format!("grad:{}", self.tensors[t.index()].name)
    }

    /// One backward op with one output shaped like `like`; returns the output.
    fn grad_op(
        &mut self,
        name: &str,
        op_type: &str,
        inputs: Vec<TensorId>,
        like: TensorId,
        a: crate::Attrs,
    ) -> TensorId {
        let g = self.grad_like(self.grad_name(like), like);
        self.op(name, op_type, inputs, vec![g], a, vec![]);
        g
    }

    /// A view of gradient `g` with `shape`.
    fn grad_view(
        &mut self,
        name: &str,
        op_type: &str,
        g: TensorId,
        shape: Vec<u64>,
        a: crate::Attrs,
    ) -> TensorId {
        self.view_as(name, op_type, g, shape, a)
    }

    /// `g` summed down to `target`'s (broadcast) shape, or `g` itself.
    fn sum_to(&mut self, name: &str, g: TensorId, target: TensorId) -> TensorId {
        let (gs, ts) = (self.shape(g).to_vec(), self.shape(target).to_vec());
        if gs == ts {
            return g;
        }
        let lead = gs.len() - ts.len();
        let dims: Vec<u64> = (0..gs.len())
            .filter(|&i| i < lead || ts[i - lead] == 1 && gs[i] != 1)
            .map(|i| i as u64)
            .collect();
        self.grad_op(
            name,
            "aten::sum",
            vec![g],
            target,
            attrs([("dim", ints(dims)), ("keepdim", AttrValue::Bool(true))]),
        )
    }
}

/// Emits the backward of one forward op; returns `(tensor, its gradient)` pairs.
fn emit(
    b: &mut Builder,
    name: &str,
    grad: &GradFn,
    gouts: &[Option<TensorId>],
) -> Vec<(TensorId, TensorId)> {
    let Some(g) = gouts.first().copied().flatten() else {
        return Vec::new();
    };
    let bw = format!("{name}.backward");
    let rg = |b: &Builder, t: TensorId| b.requires_grad(t);
    match grad {
        GradFn::Convolution {
            x,
            w,
            b: bias,
            attrs: a,
        } => {
            let mask = [rg(b, *x), rg(b, *w), bias.is_some_and(|t| rg(b, t))];
            let mut targets = vec![*x, *w];
            targets.extend(bias);
            let mut outs = Vec::new();
            let mut pairs = Vec::new();
            for (t, &on) in targets.iter().zip(&mask) {
                if on {
                    let gt = b.grad_like(b.grad_name(*t), *t);
                    outs.push(gt);
                    pairs.push((*t, gt));
                }
            }
            let mut a = a.clone();
            a.insert("output_mask".into(), ints(mask.map(u64::from)));
            b.op(
                bw,
                "aten::convolution_backward",
                vec![g, *x, *w],
                outs,
                a,
                vec![],
            );
            pairs
        }
        GradFn::BatchNorm {
            x,
            w,
            b: bias,
            mean,
            invstd,
            eps,
        } => {
            let mask = [rg(b, *x), rg(b, *w), rg(b, *bias)];
            let mut outs = Vec::new();
            let mut pairs = Vec::new();
            for (t, &on) in [*x, *w, *bias].iter().zip(&mask) {
                if on {
                    let gt = b.grad_like(b.grad_name(*t), *t);
                    outs.push(gt);
                    pairs.push((*t, gt));
                }
            }
            let a = attrs([
                ("training", AttrValue::Bool(true)),
                ("eps", AttrValue::Float(*eps)),
                ("output_mask", ints(mask.map(u64::from))),
            ]);
            b.op(
                bw,
                "aten::native_batch_norm_backward",
                vec![g, *x, *w, *mean, *invstd],
                outs,
                a,
                vec![],
            );
            pairs
        }
        GradFn::LayerNorm {
            x,
            w,
            b: bias,
            mean,
            rstd,
        } => {
            let mask = [rg(b, *x), rg(b, *w), rg(b, *bias)];
            let mut outs = Vec::new();
            let mut pairs = Vec::new();
            for (t, &on) in [*x, *w, *bias].iter().zip(&mask) {
                if on {
                    let gt = b.grad_like(b.grad_name(*t), *t);
                    outs.push(gt);
                    pairs.push((*t, gt));
                }
            }
            let d = b.shape(*x).last().copied().unwrap_or(1);
            let a = attrs([
                ("normalized_shape", ints([d])),
                ("output_mask", ints(mask.map(u64::from))),
            ]);
            b.op(
                bw,
                "aten::native_layer_norm_backward",
                vec![g, *x, *mean, *rstd, *w, *bias],
                outs,
                a,
                vec![],
            );
            pairs
        }
        GradFn::Threshold { x, out } => {
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::threshold_backward",
                    vec![g, *out],
                    *x,
                    attrs([("threshold", AttrValue::Float(0.0))]),
                ),
            )]
        }
        GradFn::MaxPool {
            x,
            indices,
            attrs: a,
        } => {
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::max_pool2d_with_indices_backward",
                    vec![g, *x, *indices],
                    *x,
                    a.clone(),
                ),
            )]
        }
        GradFn::AvgPool { x, attrs: a } => vec![(
            *x,
            b.grad_op(&bw, "aten::avg_pool2d_backward", vec![g, *x], *x, a.clone()),
        )],
        GradFn::AdaptiveAvgPool { x } => vec![(
            *x,
            b.grad_op(
                &bw,
                "aten::_adaptive_avg_pool2d_backward",
                vec![g, *x],
                *x,
                attrs([]),
            ),
        )],
        GradFn::Mean { x, count } => {
            let shape = b.shape(*x).to_vec();
            let e = b.grad_view(
                &format!("{bw}.expand"),
                "aten::expand",
                g,
                shape.clone(),
                attrs([("size", ints(shape))]),
            );
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::div",
                    vec![e],
                    *x,
                    attrs([("other", AttrValue::Float(*count as f64))]),
                ),
            )]
        }
        GradFn::View { x, grad_copies } => {
            let shape = b.shape(*x).to_vec();
            let g = if *grad_copies {
                let name = format!("{bw}.clone");
                let c = b.grad_like(name.clone(), g);
                let a = attrs([("memory_format", AttrValue::Str("contiguous".into()))]);
                b.op(&name, "aten::clone", vec![g], vec![c], a, vec![]);
                c
            } else {
                g
            };
            vec![(
                *x,
                b.grad_view(
                    &bw,
                    "aten::view",
                    g,
                    shape.clone(),
                    attrs([("size", ints(shape))]),
                ),
            )]
        }
        GradFn::Permute { x, dims } => {
            let mut inverse = vec![0; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                inverse[d] = i;
            }
            let shape = b.shape(*x).to_vec();
            vec![(
                *x,
                b.grad_view(
                    &bw,
                    "aten::permute",
                    g,
                    shape,
                    attrs([("dims", ints(inverse.iter().map(|&d| d as u64)))]),
                ),
            )]
        }
        GradFn::Addmm { x, w, b: bias } => {
            let mut pairs = Vec::new();
            if rg(b, *x) {
                pairs.push((
                    *x,
                    b.grad_op(
                        &format!("{bw}.input"),
                        "aten::mm",
                        vec![g, *w],
                        *x,
                        attrs([]),
                    ),
                ));
            }
            if rg(b, *w) {
                let gs = b.shape(g).to_vec();
                let gt = b.grad_view(
                    &format!("{bw}.grad_t"),
                    "aten::t",
                    g,
                    vec![gs[1], gs[0]],
                    attrs([]),
                );
                pairs.push((
                    *w,
                    b.grad_op(
                        &format!("{bw}.weight"),
                        "aten::mm",
                        vec![gt, *x],
                        *w,
                        attrs([]),
                    ),
                ));
            }
            if let Some(bias) = bias.filter(|&t| rg(b, t)) {
                pairs.push((
                    bias,
                    b.grad_op(
                        &format!("{bw}.bias"),
                        "aten::sum",
                        vec![g],
                        bias,
                        attrs([("dim", ints([0])), ("keepdim", AttrValue::Bool(false))]),
                    ),
                ));
            }
            pairs
        }
        GradFn::Add { a, b: other } => {
            let mut pairs = Vec::new();
            for (i, &t) in [*a, *other].iter().enumerate() {
                if rg(b, t) {
                    pairs.push((t, b.sum_to(&format!("{bw}.sum{i}"), g, t)));
                }
            }
            pairs
        }
        GradFn::Scale { x, factor } => vec![(
            *x,
            b.grad_op(
                &bw,
                "aten::mul",
                vec![g],
                *x,
                attrs([("other", AttrValue::Float(*factor))]),
            ),
        )],
        GradFn::Dropout { x, mask, scale } => {
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::native_dropout_backward",
                    vec![g, *mask],
                    *x,
                    attrs([("scale", AttrValue::Float(*scale))]),
                ),
            )]
        }
        GradFn::Cat { dim, parts } => {
            let mut pairs = Vec::new();
            for (i, &(t, start, len)) in parts.iter().enumerate() {
                if rg(b, t) {
                    let shape = b.shape(t).to_vec();
                    let a = attrs([
                        ("dim", AttrValue::Int(*dim as i64)),
                        ("start", AttrValue::Int(start as i64)),
                        ("end", AttrValue::Int((start + len) as i64)),
                    ]);
                    pairs.push((
                        t,
                        b.grad_view(&format!("{bw}.slice{i}"), "aten::slice", g, shape, a),
                    ));
                }
            }
            pairs
        }
        GradFn::LogSoftmax { x, out, dim } => {
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::_log_softmax_backward_data",
                    vec![g, *out],
                    *x,
                    attrs([("dim", AttrValue::Int(*dim))]),
                ),
            )]
        }
        GradFn::NllLoss {
            logp,
            target,
            total_weight,
        } => {
            let a = attrs([
                ("reduction", AttrValue::Int(1)),
                ("ignore_index", AttrValue::Int(-100)),
            ]);
            vec![(
                *logp,
                b.grad_op(
                    &bw,
                    "aten::nll_loss_backward",
                    vec![g, *logp, *target, *total_weight],
                    *logp,
                    a,
                ),
            )]
        }
        GradFn::Embedding { w, ids } => {
            let num = b.shape(*w)[0];
            let a = attrs([
                ("num_weights", AttrValue::Int(num as i64)),
                ("padding_idx", AttrValue::Int(-1)),
                ("scale_grad_by_freq", AttrValue::Bool(false)),
            ]);
            vec![(
                *w,
                b.grad_op(&bw, "aten::embedding_dense_backward", vec![g, *ids], *w, a),
            )]
        }
        GradFn::Gelu { x } => vec![(
            *x,
            b.grad_op(
                &bw,
                "aten::gelu_backward",
                vec![g, *x],
                *x,
                attrs([("approximate", AttrValue::Str("none".into()))]),
            ),
        )],
        GradFn::Softmax { x, out, dim } => {
            vec![(
                *x,
                b.grad_op(
                    &bw,
                    "aten::_softmax_backward_data",
                    vec![g, *out],
                    *x,
                    attrs([("dim", AttrValue::Int(*dim))]),
                ),
            )]
        }
        GradFn::Tanh { x, out } => vec![(
            *x,
            b.grad_op(&bw, "aten::tanh_backward", vec![g, *out], *x, attrs([])),
        )],
        GradFn::Bmm { a, b: other } => {
            let mut pairs = Vec::new();
            let swap = |s: &[u64]| vec![s[0], s[2], s[1]];
            let tr = attrs([("dim0", AttrValue::Int(1)), ("dim1", AttrValue::Int(2))]);
            if rg(b, *a) {
                let shape = swap(b.shape(*other));
                let bt = b.grad_view(
                    &format!("{bw}.mat2_t"),
                    "aten::transpose",
                    *other,
                    shape,
                    tr.clone(),
                );
                pairs.push((
                    *a,
                    b.grad_op(
                        &format!("{bw}.mat1"),
                        "aten::bmm",
                        vec![g, bt],
                        *a,
                        attrs([]),
                    ),
                ));
            }
            if rg(b, *other) {
                let shape = swap(b.shape(*a));
                let at = b.grad_view(&format!("{bw}.mat1_t"), "aten::transpose", *a, shape, tr);
                pairs.push((
                    *other,
                    b.grad_op(
                        &format!("{bw}.mat2"),
                        "aten::bmm",
                        vec![at, g],
                        *other,
                        attrs([]),
                    ),
                ));
            }
            pairs
        }
        GradFn::Identity { x } => vec![(*x, g)],
        GradFn::Select { x, dim, index } => {
            let shape = b.shape(*x).to_vec();
            let a = attrs([
                ("input_sizes", ints(shape)),
                ("dim", AttrValue::Int(*dim)),
                ("index", AttrValue::Int(*index)),
            ]);
            vec![(*x, b.grad_op(&bw, "aten::select_backward", vec![g], *x, a))]
        }
    }
}

/// Appends the backward pass from `loss`, in PyTorch's engine order.
pub(crate) fn backward(
    b: &mut Builder,
    loss: TensorId,
    step_in_backward: Option<(Optimizer, Placement)>,
) {
    b.phase = Phase::Backward;
    let seed = b.grad_like(b.grad_name(loss), loss);
    b.op(
        "loss.backward",
        "aten::ones_like",
        vec![loss],
        vec![seed],
        attrs([]),
        vec![],
    );
    let mut grads: HashMap<TensorId, TensorId> = HashMap::from([(loss, seed)]);
    let tape = std::mem::take(&mut b.tape);
    // For a step in the backward pass: the parameters whose gradient is
    // final once the tape entry at each index has been differentiated (the
    // first entry that reads them, the last the reverse walk reaches).
    let mut final_at: BTreeMap<usize, Vec<TensorId>> = BTreeMap::new();
    if step_in_backward.is_some() {
        let mut first: BTreeMap<TensorId, usize> = BTreeMap::new();
        for (i, entry) in tape.iter().enumerate() {
            for t in entry.grad.sources() {
                if b.tensors[t.index()].kind == TensorKind::Parameter {
                    first.entry(t).or_insert(i);
                }
            }
        }
        for (p, i) in first {
            final_at.entry(i).or_default().push(p);
        }
    }
    for (i, entry) in tape.iter().enumerate().rev() {
        let gouts: Vec<Option<TensorId>> = entry.outputs.iter().map(|o| grads.remove(o)).collect();
        if gouts.iter().any(Option::is_some) {
            let name = b.ops[entry.op.index()].name.clone();
            for (target, g) in emit(b, &name, &entry.grad, &gouts) {
                accumulate(b, &mut grads, target, g);
            }
        }
        if let (Some((optimizer, placement)), Some(params)) = (step_in_backward, final_at.get(&i)) {
            for &p in params {
                if let Some(&g) = grads.get(&p) {
                    b.phase = Phase::Optimizer;
                    let op = update(b, optimizer, p, g);
                    b.ops[op.index()].placement = placement;
                    b.phase = Phase::Backward;
                }
            }
        }
    }
    b.param_grads = grads
        .into_iter()
        .filter(|(t, _)| b.tensors[t.index()].kind == TensorKind::Parameter)
        .collect();
}

/// Sums a second gradient for the same tensor into the first (`aten::add`).
fn accumulate(
    b: &mut Builder,
    grads: &mut HashMap<TensorId, TensorId>,
    target: TensorId,
    g: TensorId,
) {
    let g = match grads.get(&target) {
        None => g,
        Some(&old) => {
            let sum = b.grad_like(format!("{}.acc", b.grad_name(target)), target);
            let name = format!("{}.accumulate", b.grad_name(target));
            b.op(
                name,
                "aten::add",
                vec![old, g],
                vec![sum],
                attrs([("alpha", AttrValue::Int(1))]),
                vec![],
            );
            sum
        }
    };
    grads.insert(target, g);
}

/// Appends one optimizer update per parameter that has a gradient, in
/// parameter order, each overwriting the parameter and its state in place.
pub(crate) fn optimizer_step(b: &mut Builder, optimizer: Optimizer) {
    b.phase = Phase::Optimizer;
    let params: Vec<TensorId> = b
        .tensors
        .iter()
        .filter(|t| t.kind == TensorKind::Parameter)
        .map(|t| t.id)
        .collect();
    for p in params {
        if let Some(&g) = b.param_grads.get(&p) {
            update(b, optimizer, p, g);
        }
    }
}

/// Appends the update of parameter `p` from its final gradient `g`.
fn update(b: &mut Builder, optimizer: Optimizer, p: TensorId, g: TensorId) -> OpId {
    let (name, shape) = (b.tensors[p.index()].name.clone(), b.shape(p).to_vec());
    let state = |b: &mut Builder, suffix: &str| {
        b.tensor(
            format!("{name}.{suffix}"),
            shape.clone(),
            DType::F32,
            TensorKind::OptimizerState,
        )
    };
    let next = |b: &mut Builder, t: TensorId| {
        let kind = b.tensors[t.index()].kind;
        b.tensor(
            format!("{}'", b.tensors[t.index()].name),
            shape.clone(),
            DType::F32,
            kind,
        )
    };
    let in_place = |pairs: &[(u32, u32)]| {
        pairs
            .iter()
            .map(|&(output, input)| Alias {
                output,
                input,
                kind: AliasKind::InPlace,
            })
            .collect()
    };
    match optimizer {
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let m = state(b, "exp_avg");
            let v = state(b, "exp_avg_sq");
            let outs = vec![next(b, p), next(b, m), next(b, v)];
            let a = attrs([
                ("lr", AttrValue::Float(lr)),
                ("beta1", AttrValue::Float(beta1)),
                ("beta2", AttrValue::Float(beta2)),
                ("eps", AttrValue::Float(eps)),
                ("weight_decay", AttrValue::Float(weight_decay)),
            ]);
            b.op(
                format!("{name}.adam"),
                "aten::_fused_adam_",
                vec![p, g, m, v],
                outs,
                a,
                in_place(&[(0, 0), (1, 2), (2, 3)]),
            )
        }
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            let buf = state(b, "momentum_buffer");
            let outs = vec![next(b, p), next(b, buf)];
            let a = attrs([
                ("lr", AttrValue::Float(lr)),
                ("momentum", AttrValue::Float(momentum)),
                ("weight_decay", AttrValue::Float(weight_decay)),
            ]);
            b.op(
                format!("{name}.sgd"),
                "aten::_fused_sgd_",
                vec![p, g, buf],
                outs,
                a,
                in_place(&[(0, 0), (1, 2)]),
            )
        }
    }
}
