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

use std::sync::OnceLock;

use tensile_graph::{AttrValue, Graph, Op};

use crate::roofline::{OpClass, kernel_cost, op_class};

/// Length of every feature vector.
pub const FEATURE_LEN: usize = 32;

/// Dims kept per tensor.
const DIMS: usize = 4;

/// The features of `op`, an op of `graph`, under `utilization` (clamped to
/// `[0, 1]`); `None` for views, which launch no kernel and need no model.
///
/// The predictor calls this for every op of a graph on each prediction, so
/// it reads each part of the op once (the attributes in one pass, no
/// allocation).
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
    let a = Attrs::of(op);
    for (i, v) in a.windows.iter().enumerate() {
        for (j, &x) in v.iter().take(2).enumerate() {
            f[19 + 2 * i + j] = log2p_whole(x.max(0) as u64);
        }
    }
    f[25] = a.groups.map_or(0.0, |g| log2p_whole(g.max(0) as u64));
    f[26] = a.dim;
    f[27] = a.output_mask.map_or(0.0, |m| {
        m.iter()
            .take(3)
            .enumerate()
            .map(|(i, &b)| if b != 0 { (1 << i) as f32 } else { 0.0 })
            .sum()
    });
    f[28] = a.float.iter().find_map(|&x| x).map_or(0.0, |v| v as f32);
    let cost = kernel_cost(graph, op);
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

/// [`log2p`] of a whole number: dims and window sizes are mostly small and
/// repeat, so those below [`SMALL`] come from a table that [`log2p`] filled
/// (the same bits, without a libm call each: `log2` was a third of the
/// instructions of the features).
fn log2p_whole(x: u64) -> f32 {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    let table = TABLE.get_or_init(|| (0..SMALL).map(|i| log2p(i as f64)).collect());
    match usize::try_from(x).ok().and_then(|i| table.get(i)) {
        Some(&v) => v,
        None => log2p(x as f64),
    }
}

/// Whole numbers below this have their [`log2p`] in a table (16 KiB).
const SMALL: u64 = 4096;

/// The float attributes of slot 28, the first present wins.
const FLOAT_KEYS: [&str; 5] = ["p", "scale", "other", "threshold", "lr"];

/// The attributes the features read, found in one pass over the op's.
#[derive(Default)]
struct Attrs<'a> {
    /// `stride`, `padding`, `kernel_size` (empty when absent).
    windows: [&'a [i64]; 3],
    groups: Option<i64>,
    /// `dim`, or the first of a list of them.
    dim: f32,
    output_mask: Option<&'a [i64]>,
    /// [`FLOAT_KEYS`], in order (an int attribute counts as a float).
    float: [Option<f64>; FLOAT_KEYS.len()],
}

impl<'a> Attrs<'a> {
    fn of(op: &'a Op) -> Attrs<'a> {
        let mut a = Attrs::default();
        for (key, value) in &op.attrs {
            match (key.as_str(), value) {
                ("stride", AttrValue::Ints(v)) => a.windows[0] = v,
                ("padding", AttrValue::Ints(v)) => a.windows[1] = v,
                ("kernel_size", AttrValue::Ints(v)) => a.windows[2] = v,
                ("groups", AttrValue::Int(g)) => a.groups = Some(*g),
                ("dim", AttrValue::Int(d)) => a.dim = *d as f32,
                ("dim", AttrValue::Ints(d)) => a.dim = d.first().map_or(0.0, |&d| d as f32),
                ("output_mask", AttrValue::Ints(m)) => a.output_mask = Some(m),
                (k, AttrValue::Float(x)) => a.set_float(k, *x),
                (k, AttrValue::Int(x)) => a.set_float(k, *x as f64),
                _ => {}
            }
        }
        a
    }

    fn set_float(&mut self, key: &str, x: f64) {
        if let Some(i) = FLOAT_KEYS.iter().position(|&k| k == key) {
            self.float[i] = Some(x);
        }
    }
}

/// Writes `dims` right-aligned into `out` (length [`DIMS`]), folding leading
/// dims beyond [`DIMS`] into the first slot.
fn put_dims(out: &mut [f32], dims: &[u64]) {
    if dims.len() > DIMS {
        let split = dims.len() - DIMS + 1;
        out[0] = log2p(dims[..split].iter().map(|&d| d as f64).product());
        for (slot, &d) in out[1..].iter_mut().zip(&dims[split..]) {
            *slot = log2p_whole(d);
        }
    } else {
        let start = DIMS - dims.len();
        for (slot, &d) in out[start..].iter_mut().zip(dims) {
            *slot = log2p_whole(d);
        }
    }
}
