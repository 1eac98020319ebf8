//! Real kernels through tch: for one op of a graph, tensors of its inputs'
//! shapes and dtypes, and a closure that runs the op's ATen kernel on them
//! once with the op's attributes.
//!
//! Three kinds of op are not in tch's generated API and are measured by the
//! nearest honest route:
//! - `convolution_backward`, `native_batch_norm_backward` and
//!   `native_layer_norm_backward` (their `bool[3]` mask is not bindable):
//!   the forward op is run once with `requires_grad` on the inputs whose
//!   gradient the mask asks for, then every run is the autograd engine
//!   calling that one backward node (`run_backward` on the forward output),
//!   which is what PyTorch's training loop does. The engine also fills a
//!   gradient of ones: the caller measures that fill apart and subtracts it
//!   ([`Kernel::baseline`]).
//! - `_fused_adam_` and `_fused_sgd_`: the same update written with
//!   unfused in-place ops (PyTorch's single-tensor path); on CPU the fused
//!   kernel is one loop, so these times are an upper bound.

use tch::{Device, Kind, Tensor};
use tensile_graph::{AttrValue, DType, Graph, Op};
use tensile_kernels::kind_of as kind;

/// One prepared kernel: `run` executes it once; `baseline`, when present,
/// is work `run` does that the op does not (to subtract).
pub(crate) struct Kernel {
    pub(crate) run: Box<dyn FnMut() -> Result<(), tch::TchError>>,
    pub(crate) baseline: Option<Box<dyn FnMut() -> Result<(), tch::TchError>>>,
}

/// Why an op cannot be measured.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("op {op} ({op_type}): no kernel runner for this op type")]
    Unsupported { op: String, op_type: String },
    #[error("op {op} ({op_type}): libtorch refused: {source}")]
    Torch {
        op: String,
        op_type: String,
        #[source]
        source: tch::TchError,
    },
    #[error("op {op} ({op_type}): timing its runs failed: {why}")]
    Clock {
        op: String,
        op_type: String,
        why: String,
    },
}

/// Whether `prepare` knows `op_type`.
pub fn is_supported(op_type: &str) -> bool {
    SUPPORTED.contains(&op_type)
}

/// Every op type `prepare` can run.
pub const SUPPORTED: &[&str] = &[
    "aten::convolution",
    "aten::convolution_backward",
    "aten::native_batch_norm",
    "aten::native_batch_norm_backward",
    "aten::native_layer_norm",
    "aten::native_layer_norm_backward",
    "aten::addmm",
    "aten::mm",
    "aten::bmm",
    "aten::relu",
    "aten::relu_",
    "aten::threshold_backward",
    "aten::gelu",
    "aten::gelu_backward",
    "aten::tanh",
    "aten::tanh_backward",
    "aten::add",
    "aten::add_",
    "aten::mul",
    "aten::div",
    "aten::cat",
    "aten::clone",
    "aten::ones_like",
    "aten::max_pool2d_with_indices",
    "aten::max_pool2d_with_indices_backward",
    "aten::avg_pool2d",
    "aten::avg_pool2d_backward",
    "aten::_adaptive_avg_pool2d",
    "aten::_adaptive_avg_pool2d_backward",
    "aten::mean",
    "aten::sum",
    "aten::_log_softmax",
    "aten::_log_softmax_backward_data",
    "aten::_softmax",
    "aten::_softmax_backward_data",
    "aten::nll_loss_forward",
    "aten::nll_loss_backward",
    "aten::native_dropout",
    "aten::native_dropout_backward",
    "aten::embedding",
    "aten::embedding_dense_backward",
    "aten::select_backward",
    "aten::_fused_adam_",
    "aten::_fused_sgd_",
];

/// Tensors for `op`'s inputs on `device` and a runner of its kernel.
pub(crate) fn prepare(graph: &Graph, op: &Op, device: Device) -> Result<Kernel, KernelError> {
    let torch = |source| KernelError::Torch {
        op: op.name.clone(),
        op_type: op.op_type.clone(),
        source,
    };
    build(graph, op, device)
        .map_err(torch)?
        .ok_or_else(|| KernelError::Unsupported {
            op: op.name.clone(),
            op_type: op.op_type.clone(),
        })
}

type Run = Box<dyn FnMut() -> Result<(), tch::TchError>>;

fn run(f: impl FnMut() -> Result<(), tch::TchError> + 'static) -> Option<Kernel> {
    Some(Kernel {
        run: Box::new(f),
        baseline: None,
    })
}

fn build(graph: &Graph, op: &Op, dev: Device) -> Result<Option<Kernel>, tch::TchError> {
    let shape = |i: usize| -> Vec<i64> {
        op.inputs
            .get(i)
            .map(|&t| graph.tensor(t).shape.iter().map(|&d| d as i64).collect())
            .unwrap_or_default()
    };
    let out_shape = |i: usize| -> Vec<i64> {
        op.outputs
            .get(i)
            .map(|&t| graph.tensor(t).shape.iter().map(|&d| d as i64).collect())
            .unwrap_or_default()
    };
    // Float inputs are random normal; integer inputs are zeros, or get their
    // own ranges below where they index something.
    let float = |i: usize| -> Result<Tensor, tch::TchError> {
        let dtype = op
            .inputs
            .get(i)
            .map_or(DType::F32, |&t| graph.tensor(t).dtype);
        let kind = kind(dtype);
        if dtype.is_float() {
            Tensor::f_randn(shape(i), (kind, dev))
        } else {
            Tensor::f_zeros(shape(i), (kind, dev))
        }
    };
    let ints = |key: &str, default: &[i64]| -> Vec<i64> {
        op.ints_attr(key)
            .map_or_else(|| default.to_vec(), <[i64]>::to_vec)
    };
    let int = |key: &str, default: i64| op.int_attr(key).unwrap_or(default);
    let flt = |key: &str, default: f64| op.float_attr(key).unwrap_or(default);
    let boolean = |key: &str, default: bool| match op.attrs.get(key) {
        Some(AttrValue::Bool(b)) => *b,
        Some(AttrValue::Int(i)) => *i != 0,
        _ => default,
    };
    let mask = || -> [bool; 3] {
        let m = ints("output_mask", &[1, 1, 1]);
        [0, 1, 2].map(|i| m.get(i).is_some_and(|&b| b != 0))
    };
    let name = op.op_type.as_str();
    let kernel = match name {
        "aten::convolution" | "aten::convolution_backward" => {
            let (stride, padding, dilation) = (
                ints("stride", &[1, 1]),
                ints("padding", &[0, 0]),
                ints("dilation", &[1, 1]),
            );
            let (transposed, output_padding, groups) = (
                boolean("transposed", false),
                ints("output_padding", &[0, 0]),
                int("groups", 1),
            );
            if name == "aten::convolution" {
                let (x, w) = (float(0)?, float(1)?);
                let b = if op.inputs.len() > 2 {
                    Some(float(2)?)
                } else {
                    None
                };
                run(move || {
                    x.f_convolution(
                        &w,
                        b.as_ref(),
                        &stride,
                        &padding,
                        &dilation,
                        transposed,
                        &output_padding,
                        groups,
                    )
                    .map(drop)
                })
            } else {
                let m = mask();
                let x = float(1)?.f_set_requires_grad(m[0])?;
                let w = float(2)?.f_set_requires_grad(m[1])?;
                let out_channels = shape(2).first().copied().unwrap_or(1);
                let b = if m[2] {
                    Some(
                        Tensor::f_zeros([out_channels], (Kind::Float, dev))?
                            .f_set_requires_grad(true)?,
                    )
                } else {
                    None
                };
                let y = x.f_convolution(
                    &w,
                    b.as_ref(),
                    &stride,
                    &padding,
                    &dilation,
                    transposed,
                    &output_padding,
                    groups,
                )?;
                let wrt: Vec<Tensor> = [(m[0], &x), (m[1], &w)]
                    .into_iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, t)| t.shallow_clone())
                    .chain(b.iter().map(Tensor::shallow_clone))
                    .collect();
                backward(y, wrt)
            }
        }
        "aten::native_batch_norm" => {
            let x = float(0)?;
            let w = float(1)?;
            let b = float(2)?;
            let rm = Tensor::f_zeros(shape(3), (Kind::Float, dev))?;
            let rv = Tensor::f_ones(shape(4), (Kind::Float, dev))?;
            let (training, momentum, eps) = (
                boolean("training", true),
                flt("momentum", 0.1),
                flt("eps", 1e-5),
            );
            run(move || {
                x.f_native_batch_norm(
                    Some(&w),
                    Some(&b),
                    Some(&rm),
                    Some(&rv),
                    training,
                    momentum,
                    eps,
                )
                .map(drop)
            })
        }
        "aten::native_batch_norm_backward" => {
            let m = mask();
            let x = float(1)?.f_set_requires_grad(m[0])?;
            let c = shape(2);
            let w = Tensor::f_ones(&c, (Kind::Float, dev))?.f_set_requires_grad(m[1])?;
            let b = Tensor::f_zeros(&c, (Kind::Float, dev))?.f_set_requires_grad(m[2])?;
            let (y, _, _) = x.f_native_batch_norm(
                Some(&w),
                Some(&b),
                None::<&Tensor>,
                None::<&Tensor>,
                true,
                0.1,
                flt("eps", 1e-5),
            )?;
            backward(y, masked(m, [&x, &w, &b]))
        }
        "aten::native_layer_norm" => {
            let (x, w, b) = (float(0)?, float(1)?, float(2)?);
            let normalized = ints("normalized_shape", &[*shape(0).last().unwrap_or(&1)]);
            let eps = flt("eps", 1e-5);
            run(move || {
                x.f_native_layer_norm(&normalized, Some(&w), Some(&b), eps)
                    .map(drop)
            })
        }
        "aten::native_layer_norm_backward" => {
            let m = mask();
            let x = float(1)?.f_set_requires_grad(m[0])?;
            let normalized = ints("normalized_shape", &[*shape(1).last().unwrap_or(&1)]);
            let w = Tensor::f_ones(&normalized, (Kind::Float, dev))?.f_set_requires_grad(m[1])?;
            let b = Tensor::f_zeros(&normalized, (Kind::Float, dev))?.f_set_requires_grad(m[2])?;
            let (y, _, _) = x.f_native_layer_norm(&normalized, Some(&w), Some(&b), 1e-12)?;
            backward(y, masked(m, [&x, &w, &b]))
        }
        "aten::addmm" => {
            let (bias, a, b) = (float(0)?, float(1)?, float(2)?);
            run(move || bias.f_addmm(&a, &b).map(drop))
        }
        "aten::mm" => {
            let (a, b) = (float(0)?, float(1)?);
            run(move || a.f_mm(&b).map(drop))
        }
        "aten::bmm" => {
            let (a, b) = (float(0)?, float(1)?);
            run(move || a.f_bmm(&b).map(drop))
        }
        "aten::relu" => {
            let x = float(0)?;
            run(move || x.f_relu().map(drop))
        }
        "aten::relu_" => {
            let mut x = float(0)?;
            run(move || x.f_relu_().map(drop))
        }
        "aten::threshold_backward" => {
            let (g, x) = (float(0)?, float(1)?);
            let t = flt("threshold", 0.0);
            run(move || g.f_threshold_backward(&x, t).map(drop))
        }
        "aten::gelu" => {
            let x = float(0)?;
            run(move || x.f_gelu("none").map(drop))
        }
        "aten::gelu_backward" => {
            let (g, x) = (float(0)?, float(1)?);
            run(move || x.f_gelu_backward(&g, "none").map(drop))
        }
        "aten::tanh" => {
            let x = float(0)?;
            run(move || x.f_tanh().map(drop))
        }
        "aten::tanh_backward" => {
            let (g, y) = (float(0)?, float(1)?);
            run(move || Tensor::f_tanh_backward(&g, &y).map(drop))
        }
        "aten::add" | "aten::add_" if op.inputs.len() >= 2 => {
            let (a, b) = (float(0)?, float(1)?);
            run(move || a.f_add(&b).map(drop))
        }
        "aten::add" | "aten::add_" | "aten::mul" | "aten::div" => {
            let mut x = float(0)?;
            let integer = op
                .inputs
                .first()
                .is_some_and(|&t| !graph.tensor(t).dtype.is_float());
            let v = flt("other", 1.0);
            // An integer tensor takes an integer scalar (the batch-norm counter).
            let s = move || {
                if integer {
                    tch::Scalar::int(v as i64)
                } else {
                    tch::Scalar::float(v)
                }
            };
            let in_place = name == "aten::add_";
            let name = name.to_owned();
            run(move || match name.as_str() {
                "aten::mul" => x.f_mul_scalar(s()).map(drop),
                "aten::div" => x.f_div_scalar(s()).map(drop),
                _ if in_place => x.f_add_scalar_(s()).map(drop),
                _ => x.f_add_scalar(s()).map(drop),
            })
        }
        "aten::cat" => {
            let xs = (0..op.inputs.len())
                .map(float)
                .collect::<Result<Vec<_>, _>>()?;
            let dim = int("dim", 0);
            run(move || Tensor::f_cat(&xs, dim).map(drop))
        }
        "aten::clone" => {
            let x = float(0)?;
            run(move || {
                let mut y = x.f_empty_like()?;
                y.f_copy_(&x)
            })
        }
        "aten::ones_like" => {
            let x = float(0)?;
            run(move || x.f_ones_like().map(drop))
        }
        "aten::max_pool2d_with_indices" | "aten::max_pool2d_with_indices_backward" => {
            let (k, s, p, d) = (
                ints("kernel_size", &[2, 2]),
                ints("stride", &[2, 2]),
                ints("padding", &[0, 0]),
                ints("dilation", &[1, 1]),
            );
            let ceil = boolean("ceil_mode", false);
            if name == "aten::max_pool2d_with_indices" {
                let x = float(0)?;
                run(move || x.f_max_pool2d_with_indices(&k, &s, &p, &d, ceil).map(drop))
            } else {
                let (g, x) = (float(0)?, float(1)?);
                let (_, idx) = x.f_max_pool2d_with_indices(&k, &s, &p, &d, ceil)?;
                run(move || {
                    x.f_max_pool2d_with_indices_backward(&g, &k, &s, &p, &d, ceil, &idx)
                        .map(drop)
                })
            }
        }
        "aten::avg_pool2d" | "aten::avg_pool2d_backward" => {
            let (k, s, p) = (
                ints("kernel_size", &[2, 2]),
                ints("stride", &[2, 2]),
                ints("padding", &[0, 0]),
            );
            let (ceil, cip) = (
                boolean("ceil_mode", false),
                boolean("count_include_pad", true),
            );
            if name == "aten::avg_pool2d" {
                let x = float(0)?;
                run(move || x.f_avg_pool2d(&k, &s, &p, ceil, cip, None).map(drop))
            } else {
                let (g, x) = (float(0)?, float(1)?);
                run(move || {
                    x.f_avg_pool2d_backward(&g, &k, &s, &p, ceil, cip, None)
                        .map(drop)
                })
            }
        }
        "aten::_adaptive_avg_pool2d" => {
            let x = float(0)?;
            let out = ints("output_size", &[1, 1]);
            run(move || x.f_internal_adaptive_avg_pool2d(&out).map(drop))
        }
        "aten::_adaptive_avg_pool2d_backward" => {
            let (g, x) = (float(0)?, float(1)?);
            run(move || g.f_internal_adaptive_avg_pool2d_backward(&x).map(drop))
        }
        "aten::mean" | "aten::sum" => {
            let x = float(0)?;
            let dims = match op.attrs.get("dim") {
                Some(AttrValue::Ints(d)) => d.clone(),
                Some(AttrValue::Int(d)) => vec![*d],
                _ => vec![0],
            };
            let keep = boolean("keepdim", false);
            let mean = name == "aten::mean";
            run(move || {
                if mean {
                    x.f_mean_dim(Some(dims.as_slice()), keep, None).map(drop)
                } else {
                    x.f_sum_dim_intlist(Some(dims.as_slice()), keep, None)
                        .map(drop)
                }
            })
        }
        "aten::_log_softmax" | "aten::_softmax" => {
            let x = float(0)?;
            let dim = int("dim", -1);
            let log = name == "aten::_log_softmax";
            run(move || {
                if log {
                    x.f_internal_log_softmax(dim, false).map(drop)
                } else {
                    x.f_internal_softmax(dim, false).map(drop)
                }
            })
        }
        "aten::_log_softmax_backward_data" | "aten::_softmax_backward_data" => {
            let (g, y) = (float(0)?, float(1)?);
            let dim = int("dim", -1);
            let log = name == "aten::_log_softmax_backward_data";
            run(move || {
                if log {
                    Tensor::f_internal_log_softmax_backward_data(&g, &y, dim, Kind::Float).map(drop)
                } else {
                    Tensor::f_internal_softmax_backward_data(&g, &y, dim, Kind::Float).map(drop)
                }
            })
        }
        "aten::nll_loss_forward" => {
            let x = float(0)?;
            let classes = shape(0).last().copied().unwrap_or(1).max(1);
            let target = Tensor::f_randint(classes, shape(1), (Kind::Int64, dev))?;
            run(move || {
                x.f_nll_loss(&target, None::<&Tensor>, tch::Reduction::Mean, -100)
                    .map(drop)
            })
        }
        "aten::nll_loss_backward" => {
            let g = float(0)?;
            let x = float(1)?;
            let classes = shape(1).last().copied().unwrap_or(1).max(1);
            let target = Tensor::f_randint(classes, shape(2), (Kind::Int64, dev))?;
            let total = Tensor::f_ones(shape(3), (Kind::Float, dev))?;
            run(move || {
                x.f_nll_loss_backward(
                    &g,
                    &target,
                    None::<&Tensor>,
                    tch::Reduction::Mean,
                    -100,
                    &total,
                )
                .map(drop)
            })
        }
        "aten::native_dropout" => {
            let x = float(0)?;
            let p = flt("p", 0.5);
            run(move || x.f_native_dropout(p, true).map(drop))
        }
        "aten::native_dropout_backward" => {
            let g = float(0)?;
            let mask = Tensor::f_rand(shape(1), (Kind::Float, dev))?.f_gt(0.5)?;
            let scale = flt("scale", 2.0);
            run(move || Tensor::f_native_dropout_backward(&g, &mask, scale).map(drop))
        }
        "aten::embedding" => {
            let w = float(0)?;
            let rows = shape(0).first().copied().unwrap_or(1).max(1);
            let idx = Tensor::f_randint(rows, shape(1), (Kind::Int64, dev))?;
            run(move || Tensor::f_embedding(&w, &idx, -1, false, false).map(drop))
        }
        "aten::embedding_dense_backward" => {
            let g = float(0)?;
            let rows = int("num_weights", 1).max(1);
            let idx = Tensor::f_randint(rows, shape(1), (Kind::Int64, dev))?;
            let (pad, freq) = (int("padding_idx", -1), boolean("scale_grad_by_freq", false));
            run(move || Tensor::f_embedding_dense_backward(&g, &idx, rows, pad, freq).map(drop))
        }
        "aten::select_backward" => {
            let g = float(0)?;
            let sizes = ints("input_sizes", &out_shape(0));
            let (dim, index) = (int("dim", 0), int("index", 0));
            run(move || Tensor::f_select_backward(&g, &sizes, dim, index).map(drop))
        }
        "aten::_fused_adam_" => {
            let (mut p, g, mut m, mut v) = (float(0)?, float(1)?, float(2)?, float(3)?.f_abs()?);
            let (lr, b1, b2, eps) = (
                flt("lr", 1e-3),
                flt("beta1", 0.9),
                flt("beta2", 0.999),
                flt("eps", 1e-8),
            );
            run(move || {
                drop(m.f_mul_scalar_(b1)?);
                drop(m.f_add_(&g.f_mul_scalar(1.0 - b1)?)?);
                drop(v.f_mul_scalar_(b2)?);
                drop(v.f_addcmul_(&g, &g.f_mul_scalar(1.0 - b2)?)?);
                let denom = v.f_sqrt()?.f_add_scalar(eps)?;
                p.f_addcdiv_(&m.f_mul_scalar(-lr)?, &denom).map(drop)
            })
        }
        "aten::_fused_sgd_" => {
            let (mut p, g, mut buf) = (float(0)?, float(1)?, float(2)?);
            let (lr, momentum) = (flt("lr", 1e-2), flt("momentum", 0.9));
            run(move || {
                drop(buf.f_mul_scalar_(momentum)?);
                drop(buf.f_add_(&g)?);
                p.f_add_(&buf.f_mul_scalar(-lr)?).map(drop)
            })
        }
        _ => None,
    };
    Ok(kernel)
}

/// The tensors of `ts` whose mask bit is set.
fn masked(m: [bool; 3], ts: [&Tensor; 3]) -> Vec<Tensor> {
    ts.into_iter()
        .zip(m)
        .filter(|(_, on)| *on)
        .map(|(t, _)| t.shallow_clone())
        .collect()
}

/// Runs the backward node of `y` for the gradients of `wrt`; the gradient
/// of ones the engine creates is the baseline.
fn backward(y: Tensor, wrt: Vec<Tensor>) -> Option<Kernel> {
    let y2 = y.shallow_clone();
    let run: Run = Box::new(move || Tensor::f_run_backward(&[&y], &wrt, true, false).map(drop));
    let baseline: Run = Box::new(move || y2.f_ones_like().map(drop));
    Some(Kernel {
        run,
        baseline: Some(baseline),
    })
}
