//! Small random training-like graphs and latencies, from a seeded stream,
//! for the exhaustive checks of the swap bound.

use tensile_graph::{
    Alias, AliasKind, DType, Graph, GraphDraft, Limits, Op, OpId, Phase, Placement, Tensor,
    TensorId, TensorKind,
};

/// splitmix64: a seeded stream, the same on every platform.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// A small training-like graph: an input and one or two parameters, a
/// chain of ops that each read one or two earlier tensors and produce one,
/// the last producing the loss (kept to the end), and an in-place update
/// of every parameter at the end. Sizes 4 to 256 KiB.
pub(crate) fn random_graph(rng: &mut Rng, name: &str) -> Graph {
    let mut d = GraphDraft {
        name: name.into(),
        ..GraphDraft::default()
    };
    let tensor = |d: &mut GraphDraft, name: String, numel: u64, kind| {
        let id = TensorId(d.tensors.len() as u32);
        d.tensors.push(Tensor {
            id,
            name,
            shape: vec![numel],
            dtype: DType::F32,
            bytes: numel * 4,
            kind,
        });
        id
    };
    let op = |d: &mut GraphDraft, ins: Vec<TensorId>, outs: Vec<TensorId>, aliases, phase| {
        let id = OpId(d.ops.len() as u32);
        d.ops.push(Op {
            id,
            name: format!("op{}", id.0),
            op_type: "aten::add".into(),
            attrs: Default::default(),
            inputs: ins,
            outputs: outs,
            aliases,
            phase,
            placement: Placement::Device,
        });
    };
    let size = |rng: &mut Rng| 1024 * rng.range(1, 65);
    let x = tensor(&mut d, "x".into(), size(rng), TensorKind::Input);
    let params: Vec<TensorId> = (0..rng.range(1, 3))
        .map(|i| tensor(&mut d, format!("w{i}"), size(rng), TensorKind::Parameter))
        .collect();
    let mut readable = vec![x];
    readable.extend(&params);
    let steps = rng.range(2, 5);
    for k in 0..steps {
        let a = readable[rng.range(0, readable.len() as u64) as usize];
        let b = readable[rng.range(0, readable.len() as u64) as usize];
        let mut ins = vec![a];
        if b != a {
            ins.push(b);
        }
        let last = k + 1 == steps;
        let (kind, numel) = if last {
            (TensorKind::Output, 1)
        } else {
            (TensorKind::Activation, size(rng))
        };
        let out = tensor(&mut d, format!("h{k}"), numel, kind);
        op(&mut d, ins, vec![out], Vec::new(), Phase::Forward);
        readable.push(out);
    }
    for &w in &params {
        let h = readable[rng.range(params.len() as u64 + 1, readable.len() as u64) as usize];
        let numel = d.tensors[w.index()].shape[0];
        let name = format!("{}'", d.tensors[w.index()].name);
        let new = tensor(&mut d, name, numel, TensorKind::Parameter);
        let alias = vec![Alias {
            output: 0,
            input: 0,
            kind: AliasKind::InPlace,
        }];
        op(&mut d, vec![w, h], vec![new], alias, Phase::Optimizer);
    }
    Graph::new(d, &Limits::default()).expect("random graphs are valid")
}

/// Latencies of 5 to 100 µs.
pub(crate) fn random_latencies(rng: &mut Rng, g: &Graph) -> Vec<u64> {
    g.ops().iter().map(|_| rng.range(5_000, 100_000)).collect()
}
