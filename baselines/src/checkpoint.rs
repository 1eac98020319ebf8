//! PyTorch's activation checkpointing (`torch.utils.checkpoint`, the
//! non-reentrant form with its default early stop) of every block, as a
//! fixed plan.
//!
//! # What a block is
//! Blocks come from the hierarchical op names (`layer1.0.conv1`), which the
//! zoo and the tracer both give after PyTorch's module names; backward ops
//! carry the name of the forward module they belong to
//! (`layer1.0.conv1.backward`), so a block's backward ops are found the same
//! way. A forward op's group is:
//! - DenseNet: the dense layer or transition it sits in
//!   (`features.denseblock2.denselayer5`, `features.transition1`);
//! - Inception-V3: its top-level `Mixed_*` module (the `Conv2d_*` stem and
//!   the head are not checkpointed);
//! - otherwise (the generic rule): its name up to the first component that
//!   is a number, i.e. the child of an `nn.Sequential` / `nn.ModuleList`,
//!   which is how PyTorch models stack repeated blocks: a ResNet bottleneck
//!   `layer3.4`, a BERT encoder layer `bert.encoder.layer.7`, an
//!   Inception-V4 module `features.12`.
//!
//! Where the numbered children of one container are single layers (one op
//! that is not a view: VGG's `features.N` and `classifier.N`), a block is a
//! layer with weights and the parameter-free layers after it: each conv with
//! its ReLU (and max-pool), each linear with its ReLU and dropout. Ops in no
//! group (stems, heads, the embeddings) run as in vanilla. A graph in which
//! no group is found is refused.
//!
//! # What the plan does
//! In forward a block keeps its inputs (alive until its recomputation, even
//! where vanilla would free them earlier) and whatever a later block or a
//! backward op before its own reads (its output, which the next block
//! holds); every other storage it makes that backward reads is released
//! after its last forward use. Right before the block's first backward op,
//! its forward is re-run in order up to the last op that saves something
//! for the block's backward, an output or an input (the early stop): a
//! `Recompute` for each storage to rebuild, in producer order, with the
//! release of each intermediate that backward does not read right after
//! its last reader. The rebuilt storages are freed at their last backward
//! use, as vanilla frees them.
//!
//! # How faithful the time is
//! The executor re-runs a producer to rebuild one storage that is absent.
//! So every op of the re-run that allocates memory runs once, including
//! those whose outputs backward does not need (their output is rebuilt and
//! released at once), and an op whose output is still there (the block's
//! output, kept for the next block) is re-run by releasing that output
//! right before rebuilding it (the same memory, the op's time). Not modelled:
//! - in-place ops (`ReLU(inplace=True)`, `out += identity`) and views are
//!   not re-run: the executor rebuilds storages, and their storage is back
//!   once its producer has re-run; their (elementwise) time is missing;
//! - an op with several outputs that backward reads is re-run once per
//!   output to rebuild. Small side outputs (at most 1/16 of the op's largest
//!   output: batch-norm and layer-norm statistics) are therefore kept from
//!   forward when another output of the op is rebuilt anyway, so that the op
//!   runs once (memory overstated by a few bytes per channel); large ones (a
//!   dropout's mask next to its needed output) cost one extra run of the op
//!   (time overstated by that op's latency).
//!
//! # Shared with the knapsack policy
//! [`Rebuilder`] turns "release these in forward, rebuild those before that
//! op" into plan events: it follows producer chains through what is absent
//! at the rebuild point, keeps inputs alive where asked, and releases
//! rebuilt intermediates after their last reader.

use std::collections::{BTreeMap, HashMap};

use tensile_graph::{AliasKind, Graph, Liveness, Op, OpId, Phase, StorageId, TensorKind};
use tensile_planner::{Event, EventKind, Plan, Trigger};

use crate::common;
use crate::{BaselineError, BaselineInput};

const POLICY: &str = "checkpoint-blocks";

/// Side outputs at most this fraction of their op's largest output are kept
/// from forward rather than rebuilt by a second run of the op.
const SMALL_SIBLING_DIVISOR: u64 = 16;

pub(crate) fn plan(input: &BaselineInput<'_>) -> Result<Plan, BaselineError> {
    let (graph, live) = (input.graph, input.live);
    let blocks = find_blocks(graph);
    if blocks.is_empty() {
        return Err(BaselineError::Invalid {
            policy: POLICY,
            what: format!(
                "graph {:?} has no block structure in its op names: no numbered module \
                 (`layer1.0.conv1`), `Mixed_*` or DenseNet layer",
                graph.name()
            ),
        });
    }
    let acc = common::accesses(graph, live);
    let mut block_of = vec![None; graph.ops().len()];
    for (b, block) in blocks.iter().enumerate() {
        for &op in &block.forward {
            block_of[op.index()] = Some(b);
        }
    }

    let mut rb = Rebuilder::new(graph, live);
    let mut batches: BTreeMap<OpId, Vec<(usize, Vec<Target>)>> = BTreeMap::new();
    for (b, block) in blocks.iter().enumerate() {
        let Some(work) = block_work(graph, live, &acc, &block_of, b, block) else {
            continue;
        };
        for &(s, last_forward) in &work.drops {
            rb.drop_after(s, last_forward);
        }
        for &u in &work.inputs {
            rb.extend(u, work.at);
        }
        batches.entry(work.at).or_default().push((b, work.targets));
    }
    for (at, group) in batches {
        let born_in: Vec<usize> = group.iter().map(|g| g.0).collect();
        let targets: Vec<Target> = group.into_iter().flat_map(|g| g.1).collect();
        // A storage made outside the re-run blocks is one of their inputs:
        // keep it alive rather than re-running another block's ops.
        let outside = |u: StorageId| {
            live.storages[u.index()]
                .born
                .is_none_or(|op| block_of[op.index()].is_none_or(|b| !born_in.contains(&b)))
        };
        rb.batch(at, &targets, &outside)
            .map_err(|what| BaselineError::Invalid {
                policy: POLICY,
                what,
            })?;
    }
    Ok(rb.finish())
}

/// One checkpointed region: the name prefixes of its ops and its forward
/// ops in order.
#[derive(Debug, Clone)]
struct Block {
    prefixes: Vec<String>,
    forward: Vec<OpId>,
}

impl Block {
    fn owns(&self, name: &str) -> bool {
        self.prefixes.iter().any(|p| {
            name.strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }
}

/// The group of a forward op by its name (see the module docs).
fn group_key(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let numbered = |p: &str, stem: &str| {
        p.strip_prefix(stem)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
    };
    if let Some(i) = parts
        .iter()
        .position(|p| numbered(p, "denselayer") || numbered(p, "transition"))
    {
        return Some(parts[..=i].join("."));
    }
    if parts[0].starts_with("Mixed_") {
        return Some(parts[0].to_string());
    }
    let i = parts
        .iter()
        .position(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))?;
    Some(parts[..=i].join("."))
}

/// An op that only makes views of its inputs (no memory, no kernel).
fn is_view(op: &Op) -> bool {
    !op.aliases.is_empty()
        && op.aliases.len() == op.outputs.len()
        && op.aliases.iter().all(|a| a.kind == AliasKind::View)
}

/// The blocks of `graph`, in forward order.
fn find_blocks(graph: &Graph) -> Vec<Block> {
    // Groups in the order of their first op.
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<(String, Vec<OpId>)> = Vec::new();
    for op in graph.ops().iter().filter(|o| o.phase == Phase::Forward) {
        let Some(key) = group_key(&op.name) else {
            continue;
        };
        let g = *index.entry(key.clone()).or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(op.id);
    }
    let parent = |key: &str| key.rsplit_once('.').map_or("", |p| p.0).to_string();
    let weighted = |op: OpId| {
        graph
            .op(op)
            .inputs
            .iter()
            .any(|&t| graph.tensor(graph.storage_root(t)).kind == TensorKind::Parameter)
    };
    let mut blocks: Vec<Block> = Vec::new();
    // The parent of the single-layer block that is still taking layers.
    let mut open: Option<String> = None;
    for (key, ops) in groups {
        let layers: Vec<OpId> = ops
            .iter()
            .copied()
            .filter(|&o| !is_view(graph.op(o)))
            .collect();
        if layers.len() != 1 {
            open = None;
            blocks.push(Block {
                prefixes: vec![key],
                forward: ops,
            });
            continue;
        }
        let p = parent(&key);
        let joins = open.as_deref() == Some(p.as_str()) && !weighted(layers[0]);
        match blocks.last_mut() {
            Some(last) if joins => {
                last.prefixes.push(key);
                last.forward.extend(ops);
            }
            _ => {
                open = Some(p);
                blocks.push(Block {
                    prefixes: vec![key],
                    forward: ops,
                });
            }
        }
    }
    for b in &mut blocks {
        b.forward.sort_unstable();
    }
    blocks
}

/// What checkpointing one block adds to the plan.
struct BlockWork {
    /// The re-run fires right before this op.
    at: OpId,
    /// Storages released early: (storage, its last forward access).
    drops: Vec<(StorageId, OpId)>,
    /// Storages made outside the block that its forward reads.
    inputs: Vec<StorageId>,
    targets: Vec<Target>,
}

fn block_work(
    graph: &Graph,
    live: &Liveness,
    acc: &[Vec<OpId>],
    block_of: &[Option<usize>],
    b: usize,
    block: &Block,
) -> Option<BlockWork> {
    let phase = |op: OpId| graph.op(op).phase;
    let in_block = |op: OpId| block_of[op.index()] == Some(b);
    let made_here = |s: StorageId| live.storages[s.index()].born.is_some_and(in_block);
    let first_backward = |s: StorageId| {
        acc[s.index()]
            .iter()
            .copied()
            .find(|&o| phase(o) == Phase::Backward)
    };
    let born: Vec<StorageId> = block
        .forward
        .iter()
        .flat_map(|op| live.allocs[op.index()].iter().copied())
        .filter(|s| !live.storages[s.index()].persistent)
        .collect();
    // Right before the block's first backward op; where backward ops are
    // not named after their module, before the first backward read of what
    // the block made.
    let named = graph
        .ops()
        .iter()
        .find(|o| o.phase == Phase::Backward && block.owns(&o.name))
        .map(|o| o.id);
    let at = named.or_else(|| born.iter().filter_map(|&s| first_backward(s)).min())?;
    // Without named backward ops, any backward read counts as the block's.
    let own_backward =
        |o: OpId| phase(o) == Phase::Backward && (named.is_none() || block.owns(&graph.op(o).name));

    // Dropped: made here, read by this block's backward only, touched in
    // forward by no other block and rewritten by no op outside the block.
    let mut dropped: Vec<StorageId> = born
        .iter()
        .copied()
        .filter(|&s| {
            let st = &live.storages[s.index()];
            let ops = &acc[s.index()];
            st.freed_after.is_some()
                && first_backward(s).is_some_and(|f| f >= at)
                && ops.iter().all(|&o| {
                    phase(o) != Phase::Forward
                        || in_block(o)
                        || (block_of[o.index()].is_none() && !writes(graph, live, o, s))
                })
        })
        .collect();
    // One run per op: a small side output stays from forward when another
    // output of the same op is rebuilt anyway.
    let mut keep_small = Vec::new();
    for &op in &block.forward {
        let bytes = |s: StorageId| live.storages[s.index()].bytes;
        let mine: Vec<StorageId> = live.allocs[op.index()]
            .iter()
            .copied()
            .filter(|s| dropped.contains(s))
            .collect();
        let Some(&carrier) = mine
            .iter()
            .max_by_key(|&&s| (bytes(s), std::cmp::Reverse(s)))
        else {
            continue;
        };
        keep_small.extend(
            mine.iter()
                .copied()
                .filter(|&s| s != carrier && is_small_side_output(live, s)),
        );
    }
    dropped.retain(|s| !keep_small.contains(s));

    // Early stop: the re-run ends with the last op that saves something for
    // the block's backward (an input, such as a linear layer's, counts: its
    // unpacking is what triggers the re-run).
    let saved_here = |s: StorageId| {
        !live.storages[s.index()].persistent && acc[s.index()].iter().any(|&o| own_backward(o))
    };
    let saves = |op: OpId| {
        let o = graph.op(op);
        o.inputs
            .iter()
            .chain(&o.outputs)
            .any(|t| saved_here(live.storage_of[t.index()]))
    };
    let end = block.forward.iter().copied().filter(|&o| saves(o)).max()?;
    let mut targets = Vec::new();
    for &op in block.forward.iter().filter(|&&o| o <= end) {
        let outs: Vec<StorageId> = live.allocs[op.index()]
            .iter()
            .copied()
            .filter(|s| !live.storages[s.index()].persistent)
            .collect();
        let mine: Vec<Target> = outs
            .iter()
            .filter(|s| dropped.contains(s))
            .map(|&s| Target::Rebuild(s))
            .collect();
        if !mine.is_empty() {
            targets.extend(mine);
            continue;
        }
        // Nothing of this op is needed later, or what is needed is still
        // there: run it anyway for its time (see the module docs).
        let largest = outs
            .iter()
            .copied()
            .max_by_key(|&s| (live.storages[s.index()].bytes, std::cmp::Reverse(s)));
        if let Some(s) = largest {
            let kept = live.storages[s.index()].freed_after.is_none_or(|f| f >= at);
            targets.push(if kept {
                Target::Refresh(s)
            } else {
                Target::Rebuild(s)
            });
        }
    }
    let mut inputs: Vec<StorageId> = block
        .forward
        .iter()
        .flat_map(|&op| graph.op(op).inputs.iter())
        .map(|t| live.storage_of[t.index()])
        .filter(|&u| !live.storages[u.index()].persistent && !made_here(u))
        .collect();
    inputs.sort_unstable();
    inputs.dedup();
    let drops = dropped
        .iter()
        .filter_map(|&s| {
            let last = acc[s.index()]
                .iter()
                .copied()
                .rfind(|&o| phase(o) == Phase::Forward)?;
            Some((s, last))
        })
        .collect();
    Some(BlockWork {
        at,
        drops,
        inputs,
        targets,
    })
}

/// Whether `s` is a small side output of the op that makes it (at most
/// 1/16 of that op's largest output: batch-norm and layer-norm statistics).
/// The executor re-runs an op once per output it rebuilds, so the
/// recomputation baselines keep these from forward rather than pay a whole
/// extra run of the op for a few bytes.
pub(crate) fn is_small_side_output(live: &Liveness, s: StorageId) -> bool {
    let Some(op) = live.storages[s.index()].born else {
        return false;
    };
    let outs = &live.allocs[op.index()];
    let bytes = |s: StorageId| live.storages[s.index()].bytes;
    let largest = outs.iter().map(|&o| bytes(o)).max().unwrap_or(0);
    outs.len() > 1 && bytes(s) * SMALL_SIBLING_DIVISOR <= largest
}

/// Whether `op` writes storage `s` (an output in it).
fn writes(graph: &Graph, live: &Liveness, op: OpId, s: StorageId) -> bool {
    graph
        .op(op)
        .outputs
        .iter()
        .any(|t| live.storage_of[t.index()] == s)
}

/// What a rebuild batch is asked to bring back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Rebuild the storage if it is absent (with whatever its producer
    /// needs that is absent too).
    Rebuild(StorageId),
    /// Re-run the storage's producer even though it is present: release it
    /// right before and rebuild it, which costs the op's time and no memory.
    Refresh(StorageId),
}

/// Turns "release these storages in forward, bring those back before that
/// op" into plan events, checking at every rebuild what is on the device.
///
/// A storage is present before op `at` when it is persistent, when it was
/// rebuilt and has not passed its last access, or when it is kept and its
/// life (vanilla's, or extended with [`Rebuilder::extend`]) reaches `at`.
/// Batches must come in increasing `at`, as the executor meets them.
#[derive(Debug)]
pub(crate) struct Rebuilder<'a> {
    graph: &'a Graph,
    live: &'a Liveness,
    dropped: Vec<bool>,
    /// Kept alive until right before this op (after that op's rebuilds).
    ext_end: Vec<Option<OpId>>,
    /// The latest batch that rebuilt each storage.
    rebuilt_at: Vec<Option<OpId>>,
    last_batch: Option<OpId>,
    drops: Vec<Event>,
    batches: Vec<Event>,
}

impl<'a> Rebuilder<'a> {
    pub(crate) fn new(graph: &'a Graph, live: &'a Liveness) -> Rebuilder<'a> {
        let n = live.storages.len();
        Rebuilder {
            graph,
            live,
            dropped: vec![false; n],
            ext_end: vec![None; n],
            rebuilt_at: vec![None; n],
            last_batch: None,
            drops: Vec::new(),
            batches: Vec::new(),
        }
    }

    /// Releases `s` after `op` (its last forward access); it stays absent
    /// until a batch rebuilds it.
    pub(crate) fn drop_after(&mut self, s: StorageId, op: OpId) {
        self.dropped[s.index()] = true;
        self.drops.push(Event {
            trigger: Trigger::After(op),
            delay_ns: 0,
            kind: EventKind::Release,
            tensor: self.live.storages[s.index()].root,
        });
    }

    /// Keeps `s` on the device at least until the rebuilds before `to`.
    pub(crate) fn extend(&mut self, s: StorageId, to: OpId) {
        let e = &mut self.ext_end[s.index()];
        *e = Some(e.map_or(to, |x| x.max(to)));
    }

    /// Whether the plan still needs `s` at or after `at` (so a rebuild
    /// there must not release it).
    fn needed_from(&self, s: StorageId, at: OpId) -> bool {
        let i = s.index();
        self.live.storages[i].freed_after.is_none_or(|f| f >= at)
            || self.ext_end[i].is_some_and(|e| e >= at)
    }

    pub(crate) fn present(&self, s: StorageId, at: OpId) -> bool {
        let i = s.index();
        let st = &self.live.storages[i];
        if st.persistent || self.rebuilt_at[i] == Some(at) {
            return true;
        }
        if st.born.is_some_and(|b| b >= at) {
            return false;
        }
        if self.dropped[i] {
            return self.rebuilt_at[i].is_some() && st.freed_after.is_none_or(|f| f >= at);
        }
        self.needed_from(s, at)
    }

    /// The forward op that rebuilds `s`.
    fn producer(&self, s: StorageId) -> Result<OpId, String> {
        let st = &self.live.storages[s.index()];
        let name = &self.graph.tensor(st.root).name;
        let op = st
            .born
            .filter(|_| !st.persistent)
            .ok_or_else(|| format!("{name} has no producer to re-run"))?;
        if self.graph.op(op).phase != Phase::Forward {
            return Err(format!(
                "{name} is made by {} in the {} pass, which is not re-run",
                self.graph.op(op).name,
                self.graph.op(op).phase.name()
            ));
        }
        Ok(op)
    }

    /// Brings `targets` back right before `at`, producers first; an absent
    /// input of a producer is rebuilt too, unless `keep` says to keep it
    /// alive instead (inputs of the iteration are always kept alive).
    /// Returns how many recomputations the batch holds.
    pub(crate) fn batch(
        &mut self,
        at: OpId,
        targets: &[Target],
        keep: &dyn Fn(StorageId) -> bool,
    ) -> Result<usize, String> {
        if self.last_batch.is_some_and(|l| l >= at) {
            return Err(format!(
                "rebuilds before op {at} come after later ones; batches must be in op order"
            ));
        }
        self.last_batch = Some(at);
        let mut order: Vec<(StorageId, bool)> = Vec::new();
        for &t in targets {
            let (s, refresh) = match t {
                Target::Rebuild(s) => (s, false),
                Target::Refresh(s) => (s, true),
            };
            self.resolve(s, refresh, at, keep, &mut order)?;
        }
        // Where each rebuilt storage is read last within the batch.
        let mut last_reader: HashMap<StorageId, usize> = HashMap::new();
        for (j, &(s, _)) in order.iter().enumerate() {
            let op = self.producer(s)?;
            for &t in &self.graph.op(op).inputs {
                last_reader.insert(self.live.storage_of[t.index()], j);
            }
        }
        let mut release_after: Vec<Vec<StorageId>> = vec![Vec::new(); order.len()];
        for (i, &(s, _)) in order.iter().enumerate() {
            if !self.needed_from(s, at) {
                let last = last_reader.get(&s).map_or(i, |&j| j.max(i));
                release_after[last].push(s);
            }
        }
        let event = |kind, s: StorageId| Event {
            trigger: Trigger::Before(at),
            delay_ns: 0,
            kind,
            tensor: self.live.storages[s.index()].root,
        };
        let mut events = Vec::new();
        for (i, &(s, refresh)) in order.iter().enumerate() {
            if refresh {
                events.push(event(EventKind::Release, s));
            }
            events.push(event(EventKind::Recompute, s));
            for &r in &release_after[i] {
                events.push(event(EventKind::Release, r));
            }
        }
        self.batches.extend(events);
        Ok(order.len())
    }

    /// Depth-first, producers first, without recursion (chains can be as
    /// long as the forward pass).
    fn resolve(
        &mut self,
        target: StorageId,
        refresh: bool,
        at: OpId,
        keep: &dyn Fn(StorageId) -> bool,
        order: &mut Vec<(StorageId, bool)>,
    ) -> Result<(), String> {
        let mut stack = vec![(target, false, refresh)];
        while let Some((s, expanded, forced)) = stack.pop() {
            let done = if forced {
                self.rebuilt_at[s.index()] == Some(at)
            } else {
                self.present(s, at)
            };
            if done {
                continue;
            }
            let op = self.producer(s)?;
            if expanded {
                self.rebuilt_at[s.index()] = Some(at);
                order.push((s, forced));
                continue;
            }
            stack.push((s, true, forced));
            for &t in &self.graph.op(op).inputs {
                let u = self.live.storage_of[t.index()];
                if u == s || self.present(u, at) {
                    continue;
                }
                if keep(u) || self.live.storages[u.index()].born.is_none() {
                    self.extend(u, at);
                    continue;
                }
                stack.push((u, false, false));
            }
        }
        Ok(())
    }

    /// The plan: vanilla's releases (moved where a life was extended), the
    /// forward releases, and the batches.
    pub(crate) fn finish(self) -> Plan {
        let mut events = Vec::new();
        let mut extended = Vec::new();
        for (i, st) in self.live.storages.iter().enumerate() {
            let Some(f) = st.freed_after else { continue };
            match self.ext_end[i] {
                Some(e) if e > f => extended.push(Event {
                    trigger: Trigger::Before(e),
                    delay_ns: 0,
                    kind: EventKind::Release,
                    tensor: st.root,
                }),
                _ => events.push(Event {
                    trigger: Trigger::After(f),
                    delay_ns: 0,
                    kind: EventKind::Release,
                    tensor: st.root,
                }),
            }
        }
        events.extend(self.drops);
        // `assemble` keeps the order of events before one op: the batch's
        // rebuilds, then the inputs it was the last to need.
        events.extend(self.batches);
        events.extend(extended);
        common::assemble(events)
    }
}
