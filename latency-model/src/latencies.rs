//! Per-op latencies of a whole graph on a device profile, in ns, indexed by
//! op id, from the roofline model in three flavours:
//!
//! - [`roofline_latencies`]: the roofline with the profile's per-class
//!   efficiencies;
//! - [`true_latencies`]: the simulated device's ground truth, the roofline
//!   times a fixed, seeded per-op bias, standing in for everything the
//!   roofline misses (kernel choice, tile quantisation, caches);
//! - [`estimate_latencies`]: the deliberately imperfect cold-start estimate
//!   the scheduler uses until it plans from the learned predictor
//!   ([`crate::predict`]).
//!
//! Views launch no kernel and take 0 ns in all three; every other op takes
//! at least 1 ns.

use tensile_graph::{AttrValue, Graph, Op};

use crate::profile::DeviceProfile;
use crate::roofline::{OpClass, kernel_ns, op_class, op_cost, roofline_ns};

/// Standard deviation of the natural log of the true latencies' per-op bias.
pub const TRUE_BIAS_SIGMA: f64 = 0.25;

/// The bias never goes beyond this many standard deviations.
const MAX_SIGMAS: f64 = 3.0;

/// The roofline latency of every op on `profile`.
pub fn roofline_latencies(graph: &Graph, profile: &DeviceProfile) -> Vec<u64> {
    graph
        .ops()
        .iter()
        .map(|op| roofline_ns(profile, op, &op_cost(graph, op)))
        .collect()
}

/// The simulated device's true latency of every op: the roofline times a
/// log-normal bias `exp(sigma * z - sigma^2 / 2)` with sigma
/// [`TRUE_BIAS_SIGMA`] and `z` a standard normal clipped to ±3, so the bias
/// averages 1 and stays within about 0.46x to 2.1x.
///
/// The bias is a pure function of `seed` and what the op computes (its type,
/// attributes and operand shapes and dtypes), never of its position or
/// name: like a real kernel, two identical ops, in one graph or in two jobs,
/// take the same time, and a predictor can learn it from measurements. The
/// same seed always gives the same latencies, on every platform; another
/// seed gives another device.
pub fn true_latencies(graph: &Graph, profile: &DeviceProfile, seed: u64) -> Vec<u64> {
    graph
        .ops()
        .iter()
        .map(|op| {
            let t = roofline_ns(profile, op, &op_cost(graph, op));
            if t == 0 {
                return 0;
            }
            let biased = (t as f64 * bias(seed, graph, op)).round();
            biased.clamp(1.0, u64::MAX as f64) as u64
        })
        .collect()
}

/// The crude cold-start estimate of every op: the same FLOPs and bytes, but one
/// flat efficiency ([`DeviceProfile::estimate_efficiency`]) of both peaks for
/// every kernel class, and no bias. Its total over a training iteration is
/// in the right range, but it is wrong per op, by tens of percent and in
/// both directions: too slow for convolutions and matrix products (which
/// reach a larger fraction of the compute peak), too fast for small
/// memory-bound kernels, and blind to the per-op bias.
pub fn estimate_latencies(graph: &Graph, profile: &DeviceProfile) -> Vec<u64> {
    let flat = profile.estimate_efficiency;
    graph
        .ops()
        .iter()
        .map(|op| match op_class(op) {
            OpClass::View => 0,
            _ => kernel_ns(profile, &op_cost(graph, op), flat, flat),
        })
        .collect()
}

/// The true-latency bias of `op` under `seed`; see [`true_latencies`].
fn bias(seed: u64, graph: &Graph, op: &Op) -> f64 {
    let h = signature(seed, graph, op);
    // Box-Muller on two uniforms from the hash; u1 in (0, 1].
    let u1 = ((splitmix64(h) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let u2 = (splitmix64(h ^ 0x5851_f42d_4c95_7f2d) >> 11) as f64 / (1u64 << 53) as f64;
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let z = z.clamp(-MAX_SIGMAS, MAX_SIGMAS);
    (TRUE_BIAS_SIGMA * z - TRUE_BIAS_SIGMA * TRUE_BIAS_SIGMA / 2.0).exp()
}

/// A hash of `seed` and what `op` computes, stable across platforms and
/// Rust versions (no `std::hash`).
fn signature(seed: u64, graph: &Graph, op: &Op) -> u64 {
    let mut h = Hasher(splitmix64(seed));
    h.str(&op.op_type);
    for (key, value) in &op.attrs {
        h.str(key);
        match value {
            AttrValue::Int(v) => h.word(*v as u64),
            AttrValue::Float(v) => h.word(v.to_bits()),
            AttrValue::Bool(v) => h.word(u64::from(*v)),
            AttrValue::Str(v) => h.str(v),
            AttrValue::Ints(v) => v.iter().for_each(|&x| h.word(x as u64)),
            AttrValue::Floats(v) => v.iter().for_each(|x| h.word(x.to_bits())),
        }
    }
    for (side, ids) in [(1, &op.inputs), (2, &op.outputs)] {
        h.word(side);
        for &t in ids {
            let t = graph.tensor(t);
            h.str(t.dtype.name());
            h.word(t.shape.len() as u64);
            t.shape.iter().for_each(|&d| h.word(d));
        }
    }
    h.0
}

/// Folds words into a 64-bit state with splitmix64.
struct Hasher(u64);

impl Hasher {
    fn word(&mut self, w: u64) {
        self.0 = splitmix64(self.0 ^ w);
    }

    fn str(&mut self, s: &str) {
        self.word(s.len() as u64);
        for chunk in s.as_bytes().chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.word(u64::from_le_bytes(b));
        }
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): a fast, well-mixed 64-bit hash step.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
