//! One job's iteration as Capuchin's planner sees it after the passive
//! iteration: ops at their measured latencies, and the memory and copies a
//! set of choices (swaps, recomputations) leads to. The prediction follows
//! the executor's own rules, so that a plan it says fits does fit: outputs
//! are allocated when their op starts, releases happen when their op ends,
//! a swap-out's buffer is freed at the first op boundary after its copy
//! ends, a swap-in's buffer exists from its trigger on, a recomputation
//! allocates its tensor when it starts, and each copy lane is a FIFO queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tensile_graph::{AliasKind, Graph, Liveness, OpId, Phase, StorageId};
use tensile_planner::{CopyModel, IntervalSet};

use crate::common::{self, Saved};

/// Swap `s` out after op `after` (once `out_delay` has passed, when the
/// copy engine is free) and back in after op `in_after`, for op `before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swap {
    pub(crate) s: StorageId,
    pub(crate) after: OpId,
    pub(crate) out_delay: u64,
    pub(crate) in_after: OpId,
    pub(crate) before: OpId,
}

/// Release `s` after op `after` and re-run its producer right before op
/// `before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recompute {
    pub(crate) s: StorageId,
    pub(crate) after: OpId,
    pub(crate) before: OpId,
    pub(crate) producer: OpId,
}

/// Swap `s` out after op `after` (once `out_delay` has passed) with no
/// swap-in planned: op `before` fetches it on demand and waits for it
/// (Capuchin's choice when a swap cannot be hidden and costs less than
/// recomputing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fetch {
    pub(crate) s: StorageId,
    pub(crate) after: OpId,
    pub(crate) out_delay: u64,
    pub(crate) before: OpId,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Choices {
    pub(crate) swaps: Vec<Swap>,
    pub(crate) recomputes: Vec<Recompute>,
    pub(crate) fetches: Vec<Fetch>,
}

impl Choices {
    /// Whether `s` is already swapped or recomputed.
    pub(crate) fn has(&self, s: StorageId) -> bool {
        self.swaps.iter().any(|w| w.s == s)
            || self.recomputes.iter().any(|r| r.s == s)
            || self.fetches.iter().any(|f| f.s == s)
    }

    /// Whether `s` is off the device at the start of op `at` (or of the
    /// recomputations before it) because of a choice.
    pub(crate) fn away(&self, s: StorageId, at: OpId) -> bool {
        let inside = |a: OpId, b: OpId| a < at && at <= b;
        self.swaps
            .iter()
            .any(|w| w.s == s && inside(w.after, w.before))
            || self
                .recomputes
                .iter()
                .any(|r| r.s == s && inside(r.after, r.before))
            || self
                .fetches
                .iter()
                .any(|f| f.s == s && inside(f.after, f.before))
    }
}

/// What the planner knows of one job.
#[derive(Debug)]
pub(crate) struct JobModel<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) live: &'g Liveness,
    /// Measured latency of every op, ns.
    pub(crate) lat: Vec<u64>,
    /// Device memory at iteration start, base included.
    pub(crate) initial_bytes: u64,
    /// Bandwidths of the job's part of the link, bytes per second.
    pub(crate) d2h: f64,
    pub(crate) h2d: f64,
    pub(crate) copy: CopyModel,
    pub(crate) saved: Vec<Saved>,
    /// Ops that overwrite each storage in place, per storage id.
    pub(crate) in_place: Vec<Vec<OpId>>,
}

impl<'g> JobModel<'g> {
    pub(crate) fn new(
        graph: &'g Graph,
        live: &'g Liveness,
        lat: Vec<u64>,
        start_bytes: u64,
        copy: CopyModel,
        share: f64,
    ) -> JobModel<'g> {
        let mut in_place = vec![Vec::new(); live.storages.len()];
        for op in graph.ops() {
            for a in op.aliases.iter().filter(|a| a.kind == AliasKind::InPlace) {
                if let Some(&t) = op.outputs.get(a.output as usize) {
                    in_place[live.storage_of[t.index()].index()].push(op.id);
                }
            }
        }
        // What the passive iteration began with is the base, persistent
        // storage and the inputs; the plans change none of it.
        let at_start: u64 = live
            .storages
            .iter()
            .filter(|st| st.persistent || st.born.is_none())
            .map(|st| st.bytes)
            .sum();
        JobModel {
            graph,
            live,
            lat,
            initial_bytes: start_bytes.max(at_start),
            d2h: copy.d2h_bytes_per_s * share,
            h2d: copy.h2d_bytes_per_s * share,
            copy,
            saved: common::saved_activations(graph, live),
            in_place,
        }
    }

    pub(crate) fn bytes(&self, s: StorageId) -> u64 {
        self.live.storages[s.index()].bytes
    }

    pub(crate) fn out_ns(&self, s: StorageId) -> u64 {
        self.copy.duration_ns(self.bytes(s), self.d2h)
    }

    pub(crate) fn in_ns(&self, s: StorageId) -> u64 {
        self.copy.duration_ns(self.bytes(s), self.h2d)
    }

    pub(crate) fn lanes(&self) -> usize {
        if self.copy.half_duplex { 1 } else { 2 }
    }

    /// The op that rebuilds `s` if re-run, with nothing else changed: its
    /// only output, not a view, deterministic, and nothing overwrites the
    /// storage afterwards.
    pub(crate) fn pure_producer(&self, s: StorageId) -> Option<OpId> {
        let st = &self.live.storages[s.index()];
        let op = self.graph.op(self.graph.producer(st.root)?);
        let pure = !st.persistent
            && op.outputs.len() == 1
            && op.aliases.is_empty()
            && op.phase == Phase::Forward
            && op.op_type != "aten::native_dropout"
            && self.in_place[s.index()].is_empty();
        pure.then_some(op.id)
    }
}

/// One step of the predicted iteration: an op, or a recomputation (the
/// producer of `rebuilds`) right before an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) op: OpId,
    pub(crate) rebuilds: Option<StorageId>,
}

/// The iteration under a set of choices.
#[derive(Debug, Clone)]
pub(crate) struct Prediction {
    pub(crate) steps: Vec<Step>,
    pub(crate) start: Vec<u64>,
    pub(crate) end: Vec<u64>,
    /// The step of every op, indexed by op id.
    pub(crate) op_step: Vec<usize>,
    /// Memory while each step runs (after its allocations).
    pub(crate) mem: Vec<u64>,
    pub(crate) peak: u64,
    /// The first step at the peak; `None` when the peak is the memory the
    /// iteration begins with.
    pub(crate) peak_step: Option<usize>,
    /// When each swap's swap-out ends, in the order of `Choices::swaps`.
    pub(crate) out_end: Vec<u64>,
    /// Every swap-out ends before its swap-in's trigger (else it would
    /// save nothing), and before the op that fetches it.
    pub(crate) valid: bool,
    /// The copy lanes as the FIFO queues will run them: 0 device to host,
    /// the last host to device (the same one when half duplex).
    pub(crate) lanes: Vec<IntervalSet>,
    pub(crate) time_ns: u64,
}

impl Prediction {
    pub(crate) fn end_of(&self, op: OpId) -> u64 {
        self.end[self.op_step[op.index()]]
    }

    pub(crate) fn start_of(&self, op: OpId) -> u64 {
        self.start[self.op_step[op.index()]]
    }

    /// The first step starting at or after `t`: where a swap-out ending at
    /// `t` frees its buffer.
    pub(crate) fn first_step_from(&self, t: u64) -> usize {
        self.start.partition_point(|&s| s < t)
    }
}

pub(crate) fn predict(m: &JobModel<'_>, c: &Choices) -> Prediction {
    let n = m.graph.ops().len();
    let mut steps = Vec::with_capacity(n + c.recomputes.len());
    let mut op_step = vec![0; n];
    let mut before: Vec<Vec<&Recompute>> = vec![Vec::new(); n];
    for r in &c.recomputes {
        before[r.before.index()].push(r);
    }
    for k in 0..n {
        for r in &before[k] {
            steps.push(Step {
                op: r.producer,
                rebuilds: Some(r.s),
            });
        }
        op_step[k] = steps.len();
        steps.push(Step {
            op: OpId(k as u32),
            rebuilds: None,
        });
    }
    // Copies each op's end sets off, and the storages each op fetches.
    let mut after_op: Vec<Vec<(u64, usize, usize)>> = vec![Vec::new(); n];
    for (i, w) in c.swaps.iter().enumerate() {
        after_op[w.after.index()].push((w.out_delay, OUT, i));
        after_op[w.in_after.index()].push((0, IN, i));
    }
    for (i, f) in c.fetches.iter().enumerate() {
        after_op[f.after.index()].push((f.out_delay, FETCH_OUT, i));
    }
    // The order the plan lists them in (`Capuchin::emit`): swap-outs, then
    // the fetched ones' swap-outs, then swap-ins.
    for list in &mut after_op {
        list.sort_by_key(|&(_, kind, i)| ([0, 2, 1][kind], i));
    }
    let mut fetched: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, f) in c.fetches.iter().enumerate() {
        fetched[f.before.index()].push(i);
    }
    // One pass in time order. Copies queue FIFO per lane in the order they
    // are submitted (timers due by then first, as the executor runs them);
    // an op waits for a late swap-in and for what it fetches.
    let lanes = m.lanes();
    let mut q = Lanes {
        free_at: vec![0; lanes],
        sets: vec![IntervalSet::new(); lanes],
        pending: BinaryHeap::new(),
        seq: 0,
        ends: [
            vec![0; c.swaps.len()],
            vec![0; c.swaps.len()],
            vec![0; c.fetches.len()],
        ],
    };
    let mut waits_for: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, w) in c.swaps.iter().enumerate() {
        waits_for[w.before.index()].push(i);
    }
    let (mut start, mut end) = (
        Vec::with_capacity(steps.len()),
        Vec::with_capacity(steps.len()),
    );
    let mut t = 0u64;
    for st in &steps {
        start.push(t);
        let mut run_at = t;
        let k = st.op.index();
        if st.rebuilds.is_none() {
            q.flush(t);
            for &i in &waits_for[k] {
                run_at = run_at.max(q.ends[IN][i]);
            }
            for &i in &fetched[k] {
                run_at = run_at.max(q.submit(t, lanes - 1, m.in_ns(c.fetches[i].s)));
            }
        }
        t = run_at + m.lat[k];
        end.push(t);
        if st.rebuilds.is_none() {
            for &(delay, kind, i) in &after_op[k] {
                let (lane, dur) = match kind {
                    OUT => (0, m.out_ns(c.swaps[i].s)),
                    IN => (lanes - 1, m.in_ns(c.swaps[i].s)),
                    _ => (0, m.out_ns(c.fetches[i].s)),
                };
                q.later(t + delay, kind, i, lane, dur);
            }
        }
    }
    q.flush(u64::MAX);
    let [out_end, _, fetch_out_end] = std::mem::take(&mut q.ends);
    // Memory: a difference array over the steps.
    let mut diff = vec![0i64; steps.len() + 1];
    let mut add = |at: usize, bytes: u64, sign: i64| diff[at] += sign * bytes as i64;
    for st in &m.live.storages {
        if st.persistent {
            continue;
        }
        if let Some(b) = st.born {
            add(op_step[b.index()], st.bytes, 1);
        }
        if let Some(f) = st.freed_after {
            add(op_step[f.index()] + 1, st.bytes, -1);
        }
    }
    // Frees come at the first op boundary after the copy ends.
    let first_from = |x: u64| start.partition_point(|&s| s < x);
    let mut valid = true;
    for (i, w) in c.swaps.iter().enumerate() {
        let back = op_step[w.in_after.index()] + 1;
        if out_end[i] > end[back - 1] {
            valid = false;
        }
        let freed = first_from(out_end[i]);
        if freed < back {
            add(freed, m.bytes(w.s), -1);
            add(back, m.bytes(w.s), 1);
        }
    }
    for (i, f) in c.fetches.iter().enumerate() {
        let back = op_step[f.before.index()];
        let freed = first_from(fetch_out_end[i]);
        if freed < back {
            add(freed, m.bytes(f.s), -1);
            add(back, m.bytes(f.s), 1);
        } else {
            valid = false;
        }
    }
    for (k, st) in steps.iter().enumerate() {
        if let Some(s) = st.rebuilds {
            add(k, m.bytes(s), 1);
        }
    }
    for r in &c.recomputes {
        add(op_step[r.after.index()] + 1, m.bytes(r.s), -1);
    }
    let mut mem = Vec::with_capacity(steps.len());
    let mut cur = m.initial_bytes as i64;
    let (mut peak, mut peak_step) = (m.initial_bytes, None);
    for (k, d) in diff.iter().take(steps.len()).enumerate() {
        cur += d;
        let v = cur.max(0) as u64;
        mem.push(v);
        if v > peak {
            peak = v;
            peak_step = Some(k);
        }
    }
    let time_ns = q.free_at.iter().copied().fold(t, u64::max);
    Prediction {
        steps,
        start,
        end,
        op_step,
        mem,
        peak,
        peak_step,
        out_end,
        valid,
        lanes: q.sets,
        time_ns,
    }
}

/// The kinds of copy, indexing `Lanes::ends`.
const OUT: usize = 0;
const IN: usize = 1;
const FETCH_OUT: usize = 2;

/// A copy waiting for its timer: (due, order, kind, index, lane, duration).
type Due = (u64, u64, usize, usize, usize, u64);

/// The job's copy lanes as FIFO queues, with the copies due later.
struct Lanes {
    free_at: Vec<u64>,
    sets: Vec<IntervalSet>,
    pending: BinaryHeap<Reverse<Due>>,
    seq: u64,
    /// When each copy ends, per kind, by index in its list of choices.
    ends: [Vec<u64>; 3],
}

impl Lanes {
    fn submit(&mut self, at: u64, lane: usize, dur: u64) -> u64 {
        let s = at.max(self.free_at[lane]);
        self.free_at[lane] = s + dur;
        self.sets[lane].insert(s, s + dur);
        s + dur
    }

    fn later(&mut self, at: u64, kind: usize, index: usize, lane: usize, dur: u64) {
        self.pending
            .push(Reverse((at, self.seq, kind, index, lane, dur)));
        self.seq += 1;
    }

    /// Submits the copies due by `t`, in order.
    fn flush(&mut self, t: u64) {
        while let Some(&Reverse((at, _, kind, index, lane, dur))) = self.pending.peek() {
            if at > t {
                break;
            }
            self.pending.pop();
            self.ends[kind][index] = self.submit(at, lane, dur);
        }
    }
}
