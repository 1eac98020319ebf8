//! Randomized: valid random DAGs validate and analyse consistently;
//! corrupted ones fail with the error that names the corruption; the JSON
//! reader takes random and mutated bytes with an error, never a panic.

use proptest::prelude::*;
use tensile_graph::{
    AliasKind, GraphDraft, GraphError, Liveness, OpId, Phase, TensorId, TensorKind, json,
};

use crate::util::G;

/// One op of a random graph: which inputs it reads (as random picks among
/// the readable tensors), what it is, and a shape seed.
#[derive(Debug, Clone)]
struct OpRecipe {
    picks: [u32; 3],
    inputs: u8,
    /// 0, 1: a fresh output; 2: overwrite input 0 in place; 3: view input 0.
    kind: u8,
    outputs: u8,
    size: u8,
}

fn recipe() -> impl Strategy<Value = OpRecipe> {
    (any::<[u32; 3]>(), 1u8..=3, 0u8..4, 1u8..=2, 1u8..16).prop_map(
        |(picks, inputs, kind, outputs, size)| OpRecipe {
            picks,
            inputs,
            kind,
            outputs,
            size,
        },
    )
}

/// Builds a valid graph: every op reads tensors that exist and were not
/// overwritten, and in-place outputs keep their input's shape.
fn random_graph(initial: usize, recipes: &[OpRecipe]) -> GraphDraft {
    let mut g = G::new("random");
    let mut readable: Vec<TensorId> = (0..initial)
        .map(|i| {
            let kind = if i % 2 == 0 {
                TensorKind::Input
            } else {
                TensorKind::Parameter
            };
            g.t(&format!("init{i}"), &[i as u64 + 1, 4], kind)
        })
        .collect();
    for (k, r) in recipes.iter().enumerate() {
        let mut inputs: Vec<TensorId> = (0..r.inputs as usize)
            .map(|i| readable[r.picks[i] as usize % readable.len()])
            .collect();
        inputs.dedup();
        let name = format!("op{k}");
        match r.kind {
            2 => {
                let x = inputs[0];
                let shape = g.draft.tensors[x.index()].shape.clone();
                let out = g.t(&format!("{name}.out"), &shape, TensorKind::Activation);
                let op = g.op(&name, "aten::relu_", Phase::Forward, &inputs, &[out]);
                g.alias(op, 0, 0, AliasKind::InPlace);
                readable.retain(|&t| t != x);
                readable.push(out);
            }
            3 => {
                let x = inputs[0];
                let numel = g.draft.tensors[x.index()].shape.iter().product::<u64>();
                let out = g.t(&format!("{name}.view"), &[numel], TensorKind::Activation);
                let op = g.op(&name, "aten::view", Phase::Forward, &inputs[..1], &[out]);
                g.alias(op, 0, 0, AliasKind::View);
                readable.push(out);
            }
            _ => {
                let outs: Vec<TensorId> = (0..r.outputs)
                    .map(|o| {
                        g.t(
                            &format!("{name}.out{o}"),
                            &[u64::from(r.size), u64::from(o) + 1],
                            TensorKind::Activation,
                        )
                    })
                    .collect();
                g.op(&name, "aten::add", Phase::Forward, &inputs, &outs);
                readable.extend(outs);
            }
        }
    }
    g.draft
}

fn graphs() -> impl Strategy<Value = GraphDraft> {
    (1usize..5, prop::collection::vec(recipe(), 1..40)).prop_map(|(n, r)| random_graph(n, &r))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn valid_random_graphs_validate_and_analyse(draft in graphs()) {
        let g = tensile_graph::Graph::new(draft, &tensile_graph::Limits::default()).unwrap();
        let live = Liveness::analyze(&g);
        let v = live.vanilla_footprint();
        prop_assert!(v.peak <= live.keep_all_footprint().peak);
        prop_assert_eq!(v.during.len(), g.ops().len());
        // Resident bytes never drop below what is persistent.
        prop_assert!(v.during.iter().all(|&d| d >= live.persistent_bytes()));
        // Every non-persistent storage an op touches is freed, after its birth.
        let mut touched = vec![false; live.storages.len()];
        for op in g.ops() {
            for t in op.inputs.iter().chain(&op.outputs) {
                touched[live.storage_of[t.index()].index()] = true;
            }
        }
        for (s, touched) in live.storages.iter().zip(touched) {
            if !s.persistent && touched {
                prop_assert!(s.freed_after.is_some());
                prop_assert!(s.born <= s.freed_after);
            }
        }
        let back = json::parse(json::to_string(&g).as_bytes(), &tensile_graph::Limits::default()).unwrap();
        prop_assert_eq!(back, g);
    }

    #[test]
    fn corrupted_random_graphs_fail_with_the_right_error(draft in graphs(), which in 0u8..7, pick in any::<u32>()) {
        let mut d = draft;
        let n_ops = d.ops.len();
        let k = pick as usize % n_ops;
        let expect: fn(&GraphError) -> bool = match which {
            0 => {
                d.ops[k].inputs[0] = TensorId(d.tensors.len() as u32 + pick % 100);
                |e| matches!(e, GraphError::InputOutOfRange { .. })
            }
            1 => {
                let t = pick as usize % d.tensors.len();
                d.tensors[t].bytes += 1;
                |e| matches!(e, GraphError::BytesMismatch { .. })
            }
            2 => {
                prop_assume!(n_ops > 1);
                let m = (k + 1 + (pick as usize / 7) % (n_ops - 1)) % n_ops;
                let t = d.ops[k].outputs[0];
                d.ops[m].outputs.push(t);
                |e| matches!(e, GraphError::ProducedTwice { .. })
            }
            3 => {
                // A later reader of op k's output feeds back into op k.
                let outs = d.ops[k].outputs.clone();
                let reader = (k + 1..n_ops).find(|&m| d.ops[m].inputs.iter().any(|t| outs.contains(t)));
                prop_assume!(reader.is_some());
                let m = reader.unwrap_or_default();
                let back = d.ops[m].outputs[0];
                d.ops[k].inputs.push(back);
                // Feeding back an in-place version is also a read-after-overwrite;
                // the cycle is what must be reported first.
                |e| matches!(e, GraphError::Cycle { .. })
            }
            4 => {
                d.ops[k].outputs.clear();
                d.ops[k].aliases.clear();
                |e| matches!(e, GraphError::NeverProduced { .. })
            }
            5 => {
                let inplace = (0..n_ops).find(|&m| d.ops[m].aliases.iter().any(|a| a.kind == AliasKind::InPlace) && m + 1 < n_ops);
                prop_assume!(inplace.is_some());
                let m = inplace.unwrap_or_default();
                let overwritten = d.ops[m].inputs[0];
                d.ops[m + 1].inputs.push(overwritten);
                |e| matches!(e, GraphError::ReadAfterOverwrite { .. })
            }
            _ => {
                // Move a reader of op k's output before op k (renumbering).
                let outs = d.ops[k].outputs.clone();
                let reader = (k + 1..n_ops).find(|&m| d.ops[m].inputs.iter().any(|t| outs.contains(t)));
                prop_assume!(reader.is_some());
                let m = reader.unwrap_or_default();
                let op = d.ops.remove(m);
                d.ops.insert(k, op);
                for (i, op) in d.ops.iter_mut().enumerate() {
                    op.id = OpId(i as u32);
                }
                |e| matches!(e, GraphError::UsedBeforeProduced { .. })
            }
        };
        let err = tensile_graph::Graph::new(d, &tensile_graph::Limits::default()).unwrap_err();
        prop_assert!(expect(&err), "corruption {} gave: {}", which, err);
    }
}

/// Proptest cases for the fuzzers: `default` in CI, `TENSILE_FUZZ_CASES`
/// for a longer run by hand.
fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TENSILE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(256)))]

    /// The graph JSON reader on random bytes: an error, never a panic.
    #[test]
    fn random_bytes_are_not_a_graph(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(json::parse(&bytes, &tensile_graph::Limits::default()).is_err());
    }

    /// A valid graph's JSON with bytes changed or cut short: a graph that
    /// validates (a change that kept it well formed) or an error, never a
    /// panic; what parses writes back to JSON that parses to it again.
    #[test]
    fn mutated_graph_json_never_panics(
        draft in graphs(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let limits = tensile_graph::Limits::default();
        let g = tensile_graph::Graph::new(draft, &limits).unwrap();
        let mut bytes = json::to_string(&g).into_bytes();
        for (at, x) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(back) = json::parse(&bytes, &limits) {
            let again = json::parse(json::to_string(&back).as_bytes(), &limits).unwrap();
            prop_assert_eq!(again, back);
        }
    }
}
