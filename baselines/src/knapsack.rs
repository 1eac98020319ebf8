//! A knapsack recompute plan under an activation budget, after
//! torch.compile's min-cut partitioner with
//! `torch._functorch.config.activation_memory_budget`.
//!
//! # What torch does
//! AOTAutograd traces forward and backward into one joint graph and the
//! partitioner decides which forward values the backward graph gets saved
//! and which it recomputes. At budget 1 it keeps its default min-cut choice
//! (recompute only cheap, fusible ops); at budget 0 it saves only the
//! graph's inputs and recomputes everything else. In between, the budget is
//! a fraction of the way from the inputs-only size to the default choice's
//! size. It first tries ever more aggressive min-cut settings; if none fits,
//! it solves a 0/1 knapsack over the values the aggressive setting still
//! refuses to recompute (compute-intensive ops such as matmuls and
//! convolutions, and random ops), largest first: an item weighs its size
//! as a fraction of that range, is worth its estimated runtime (from FLOPs,
//! or profiled), and the capacity is the budget. The default solver is a
//! dynamic program over memory quantized to 1/10,000 of the range (a greedy
//! by runtime per byte and a MILP are the alternatives). The items the
//! knapsack leaves out may be recomputed, and a final min-cut picks the
//! saved set. In the backward graph a recomputed value is computed once,
//! right before its first user, and lives until its last user.
//!
//! # What we do
//! The same trade on our graphs, without the fusion model: every saved
//! activation (`common::saved_activations`) is an item weighing its bytes
//! and worth the time to recompute it: its producer's predicted latency
//! plus that of the intermediates (forward storages nobody saves) that are
//! gone by then and must be rebuilt on the way. The set to KEEP maximizes
//! the time saved with kept bytes at most `activation_budget` times all
//! saved bytes: a 0/1 knapsack by dynamic programming over bytes quantized
//! to 1/10,000 of the items' total, rounded to nearest as torch does, then
//! repaired on exact bytes (drop the kept items worth least per byte while
//! over the budget, then add left-out ones best per byte while they fit),
//! so the budget always holds exactly. At budget 1 everything fits and the
//! plan is vanilla's; at budget 0 every saved activation that is an item is
//! rebuilt. Not items, kept and counted against the budget: storages never
//! freed in an iteration (the loss), and small side outputs (batch-norm and
//! layer-norm statistics, at most 1/16 of their op's largest output), which
//! the executor could only rebuild by one more run of the whole op (see
//! `checkpoint::is_small_side_output`).
//!
//! The plan releases each dropped activation after its last forward use and
//! rebuilds it right before its first backward use; a rebuilt value stays
//! until its last use, as in torch's backward graph. Where its producer
//! needs something that is gone, that is rebuilt first (producers first):
//! another dropped activation (which then stays for its own backward use) or
//! an intermediate (released after its last reader in the batch). A kept
//! activation or an input of the iteration that a rebuild needs after its
//! own last use is kept alive until then, as torch keeps what recomputation
//! reads. The value of an item assumes the other items are kept; chains
//! through dropped items make the real cost higher, as in torch, whose
//! items are priced one node at a time.
//!
//! Executor limits are those of `checkpoint`: in-place updates of a rebuilt
//! storage are not re-run, and an op with several large outputs that are
//! all dropped (a dropout's output and mask) re-runs once per output; each
//! is an item priced at the op's full latency, so the knapsack pays for it.

use std::collections::{BTreeMap, HashSet};

use tensile_graph::{Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::Plan;

use crate::checkpoint::{Rebuilder, Target, is_small_side_output};
use crate::common::{self, Saved};
use crate::{BaselineError, BaselineInput};

const POLICY: &str = "knapsack";

/// The knapsack's memory resolution: bytes are counted in units of this
/// fraction of all items' bytes (torch quantizes its budget range the same).
const RESOLUTION: u64 = 10_000;

/// At most this many cells in the program's decision table (32 MiB of
/// bits): graphs with very many items get a coarser resolution instead of
/// more memory and time; the exact-byte repair keeps the budget either way.
const MAX_CELLS: usize = 1 << 28;

pub(crate) fn plan(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    let budget = input.activation_budget;
    if !(0.0..=1.0).contains(&budget) {
        return Err(BaselineError::Invalid {
            policy: POLICY,
            what: format!("activation budget {budget} is not a fraction in [0, 1]"),
        });
    }
    let (graph, live) = (input.graph, input.live);
    let saved = common::saved_activations(graph, live);
    let bytes = |s: StorageId| live.storages[s.index()].bytes;
    let total: u64 = saved.iter().map(|x| bytes(x.storage)).sum();
    // Never freed (the loss), or a small side output whose op would re-run
    // once more to rebuild it: kept, and counted against the budget.
    let (items, fixed): (Vec<Saved>, Vec<Saved>) = saved.iter().partition(|x| {
        live.storages[x.storage.index()].freed_after.is_some()
            && !is_small_side_output(live, x.storage)
    });
    let fixed_bytes: u64 = fixed.iter().map(|x| bytes(x.storage)).sum();
    let cap = ((budget * total as f64).floor() as u64).saturating_sub(fixed_bytes);

    let mut is_saved = vec![false; live.storages.len()];
    for x in &saved {
        is_saved[x.storage.index()] = true;
    }
    let weights: Vec<u64> = items.iter().map(|x| bytes(x.storage)).collect();
    let values: Vec<u64> = items
        .iter()
        .map(|x| recompute_ns(graph, live, input.latency_ns, &is_saved, x))
        .collect();
    let keep = choose(&weights, &values, cap);
    let dropped: Vec<&Saved> = items
        .iter()
        .zip(&keep)
        .filter(|(_, k)| !**k)
        .map(|(x, _)| x)
        .collect();
    if dropped.is_empty() {
        return Ok(common::vanilla(live));
    }

    let mut rb = Rebuilder::new(graph, live);
    let mut is_dropped = vec![false; live.storages.len()];
    let mut by_use: BTreeMap<OpId, Vec<StorageId>> = BTreeMap::new();
    for x in &dropped {
        rb.drop_after(x.storage, x.last_forward);
        is_dropped[x.storage.index()] = true;
        by_use.entry(x.first_backward).or_default().push(x.storage);
    }
    let keep_alive = |u: StorageId| is_saved[u.index()] && !is_dropped[u.index()];
    for (at, mut targets) in by_use {
        targets.sort_by_key(|s| (live.storages[s.index()].born, *s));
        let targets: Vec<Target> = targets.into_iter().map(Target::Rebuild).collect();
        rb.batch(at, &targets, &keep_alive)
            .map_err(|what| BaselineError::Invalid {
                policy: POLICY,
                what,
            })?;
    }
    Ok(rb.finish())
}

/// Predicted time to rebuild `x` right before its first backward use with
/// every other saved activation kept: its producer, and the producers of
/// the unsaved intermediates it needs that are gone by then.
fn recompute_ns(
    graph: &Graph,
    live: &Liveness,
    latency_ns: &[u64],
    is_saved: &[bool],
    x: &Saved,
) -> u64 {
    let at = x.first_backward;
    let mut total = 0u64;
    let mut seen: HashSet<StorageId> = HashSet::new();
    let mut stack = vec![x.storage];
    while let Some(s) = stack.pop() {
        let Some(op) = live.storages[s.index()].born else {
            continue;
        };
        total = total.saturating_add(latency_ns[op.index()]);
        for &t in &graph.op(op).inputs {
            let u = live.storage_of[t.index()];
            let st = &live.storages[u.index()];
            let gone = st.freed_after.is_some_and(|f| f < at);
            let rebuilt = !st.persistent
                && !is_saved[u.index()]
                && st.born.is_some_and(|b| graph.op(b).phase == Phase::Forward);
            if u != s && gone && rebuilt && seen.insert(u) {
                stack.push(u);
            }
        }
    }
    total
}

/// Which items to keep: the most value within `cap` bytes (0/1 knapsack).
fn choose(weights: &[u64], values: &[u64], cap: u64) -> Vec<bool> {
    let n = weights.len();
    let sum: u64 = weights.iter().sum();
    if sum <= cap {
        return vec![true; n];
    }
    let resolution = RESOLUTION.min((MAX_CELLS / n.max(1)) as u64).max(1);
    let unit = sum.div_ceil(resolution).max(1);
    let q: Vec<usize> = weights
        .iter()
        .map(|&w| ((w + unit / 2) / unit) as usize)
        .collect();
    let width = (cap / unit) as usize + 1;
    // best[j]: the most value within j units; took: whether item i was
    // taken at j, to trace the choice back.
    let mut best = vec![0u64; width];
    let mut took = vec![0u64; (n * width).div_ceil(64)];
    for i in 0..n {
        let (w, v) = (q[i], values[i]);
        if w >= width {
            continue;
        }
        for j in (w..width).rev() {
            let with = best[j - w].saturating_add(v);
            if with > best[j] {
                best[j] = with;
                let bit = i * width + j;
                took[bit / 64] |= 1 << (bit % 64);
            }
        }
    }
    let mut keep = vec![false; n];
    let mut j = width - 1;
    for i in (0..n).rev() {
        let bit = i * width + j;
        if (took[bit / 64] >> (bit % 64)) & 1 == 1 {
            keep[i] = true;
            j -= q[i];
        }
    }
    // Rounding may have overshot the budget or left room: fix on exact bytes.
    let density = |i: usize| values[i] as f64 / weights[i].max(1) as f64;
    let mut kept_bytes: u64 = (0..n).filter(|&i| keep[i]).map(|i| weights[i]).sum();
    let mut kept: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
    kept.sort_by(|&a, &b| density(a).total_cmp(&density(b)).then(a.cmp(&b)));
    for i in kept {
        if kept_bytes <= cap {
            break;
        }
        keep[i] = false;
        kept_bytes -= weights[i];
    }
    let mut rest: Vec<usize> = (0..n).filter(|&i| !keep[i] && values[i] > 0).collect();
    rest.sort_by(|&a, &b| density(b).total_cmp(&density(a)).then(a.cmp(&b)));
    for i in rest {
        if kept_bytes + weights[i] <= cap {
            keep[i] = true;
            kept_bytes += weights[i];
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn everything_fits_keeps_everything() {
        assert_eq!(choose(&[3, 4], &[1, 1], 7), vec![true, true]);
    }

    #[test]
    fn picks_the_best_set_not_the_greedy_one() {
        // Greedy by value per byte takes item 0 (2.0/B) and then nothing
        // fits; the optimum is items 1 and 2.
        let keep = choose(&[6, 5, 5], &[12, 9, 9], 10);
        assert_eq!(keep, vec![false, true, true]);
    }

    #[test]
    fn zero_capacity_keeps_nothing_even_tiny_items() {
        assert_eq!(choose(&[1, 1_000_000], &[5, 5], 0), vec![false, false]);
    }

    #[test]
    fn rounding_never_breaks_the_budget_nor_wastes_it() {
        // Items of uneven sizes that round differently at 1/10,000 of
        // their total: on exact bytes the budget holds and nothing left
        // out would still fit.
        let weights: Vec<u64> = (0..3000).map(|i| 7 + (i * 7919) % 1013).collect();
        let values: Vec<u64> = (0..3000).map(|i| 1 + (i * 104_729) % 997).collect();
        let cap = weights.iter().sum::<u64>() / 3;
        let keep = choose(&weights, &values, cap);
        let kept: u64 = weights
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(w, _)| w)
            .sum();
        assert!(kept <= cap);
        for (w, k) in weights.iter().zip(&keep) {
            assert!(*k || kept + w > cap, "an item of {w} B still fits");
        }
    }
}
