//! The features of one op that the learned predictor reads: a fixed-length
//! vector of `f32`, the same layout for every op type (each op type has its
//! own model, so a slot an op type never uses is a constant the model
//! ignores).
//!
//! Layout ([`FEATURE_LEN`] slots; sizes are `log2(1 + x)` so they span a few
//! units rather than decades):
//!
//! | slots | what |
//! | --- | --- |
//! | 0 | utilization of the device by other work, in `[0, 1]` |
//! | 1 | bytes per element of the first input |
//! | 2..6, 6..10, 10..14 | dims of inputs 0, 1, 2, right-aligned and padded to 4 (a missing dim is 0, leading dims beyond 4 are multiplied into the first) |
//! | 14..18 | dims of output 0, the same way |
//! | 18 | number of inputs |
//! | 19..21, 21..23, 23..25 | `stride`, `padding`, `kernel_size` (two each) |
//! | 25 | `groups` |
//! | 26 | `dim` (first of a list; negative counts from the end, as given) |
//! | 27 | `output_mask` as a 3-bit number |
//! | 28 | a float attribute: `p`, `scale`, `other`, `threshold` or `lr` |
//! | 29, 30 | the roofline FLOPs and bytes ([`crate::op_cost`]) |
//! | 31 | elements of all inputs together |
//!
//! Input dims, attributes and dtype as the paper, plus the roofline's work
//! counts, which carry the shape information the MLP would otherwise have to
//! learn (the product of many dims) from few samples.

use tensile_graph::{AttrValue, Graph, Op};

use crate::roofline::{OpClass, op_class, op_cost};

/// Length of every feature vector.
pub const FEATURE_LEN: usize = 32;

/// Dims kept per tensor.
const DIMS: usize = 4;

/// The features of `op`, an op of `graph`, under `utilization` (clamped to
/// `[0, 1]`); `None` for views, which launch no kernel and need no model.
pub fn op_features(graph: &Graph, op: &Op, utilization: f32) -> Option<[f32; FEATURE_LEN]> {
    if op_class(op) == OpClass::View {
        return None;
    }
    let mut f = [0f32; FEATURE_LEN];
    f[0] = if utilization.is_finite() {
        utilization.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let shape = |t: tensile_graph::TensorId| graph.tensor(t).shape.as_slice();
    f[1] = op
        .inputs
        .first()
        .map_or(0.0, |&t| graph.tensor(t).dtype.size() as f32);
    for (slot, &t) in op.inputs.iter().take(3).enumerate() {
        put_dims(&mut f[2 + DIMS * slot..2 + DIMS * (slot + 1)], shape(t));
    }
    if let Some(&t) = op.outputs.first() {
        put_dims(&mut f[14..18], shape(t));
    }
    f[18] = op.inputs.len() as f32;
    for (i, key) in ["stride", "padding", "kernel_size"].into_iter().enumerate() {
        if let Some(v) = op.ints_attr(key) {
            for (j, &x) in v.iter().take(2).enumerate() {
                f[19 + 2 * i + j] = log2p(x.max(0) as f64);
            }
        }
    }
    f[25] = op
        .int_attr("groups")
        .map_or(0.0, |g| log2p(g.max(0) as f64));
    f[26] = match op.attrs.get("dim") {
        Some(AttrValue::Int(d)) => *d as f32,
        Some(AttrValue::Ints(d)) => d.first().map_or(0.0, |&d| d as f32),
        _ => 0.0,
    };
    f[27] = op.ints_attr("output_mask").map_or(0.0, |m| {
        m.iter()
            .take(3)
            .enumerate()
            .map(|(i, &b)| if b != 0 { (1 << i) as f32 } else { 0.0 })
            .sum()
    });
    f[28] = ["p", "scale", "other", "threshold", "lr"]
        .into_iter()
        .find_map(|k| op.float_attr(k))
        .map_or(0.0, |v| v as f32);
    let cost = op_cost(graph, op);
    f[29] = log2p(cost.flops);
    f[30] = log2p(cost.bytes);
    let numel: f64 = op
        .inputs
        .iter()
        .map(|&t| shape(t).iter().map(|&d| d as f64).product::<f64>())
        .sum();
    f[31] = log2p(numel);
    Some(f)
}

/// The shape part of a feature vector (everything but the utilization), as a
/// string: two ops with the same key are the same kernel on the same shapes.
pub fn shape_key(op_type: &str, features: &[f32]) -> String {
    let mut key = op_type.to_owned();
    for x in features.iter().skip(1) {
        key.push(' ');
        key.push_str(&format!("{x}"));
    }
    key
}

/// `log2(1 + x)`, 0 for anything not positive and finite.
fn log2p(x: f64) -> f32 {
    if x.is_finite() && x > 0.0 {
        (1.0 + x).log2() as f32
    } else {
        0.0
    }
}

/// Writes `dims` right-aligned into `out` (length [`DIMS`]), folding leading
/// dims beyond [`DIMS`] into the first slot.
fn put_dims(out: &mut [f32], dims: &[u64]) {
    let folded: Vec<f64> = if dims.len() > DIMS {
        let split = dims.len() - DIMS + 1;
        std::iter::once(dims[..split].iter().map(|&d| d as f64).product())
            .chain(dims[split..].iter().map(|&d| d as f64))
            .collect()
    } else {
        dims.iter().map(|&d| d as f64).collect()
    };
    let start = DIMS - folded.len();
    for (slot, d) in out[start..].iter_mut().zip(folded) {
        *slot = log2p(d);
    }
}
