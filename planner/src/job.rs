//! One job's planning state: its steps on the predicted time line, the
//! accesses and gaps of every storage, memory per step, and its copy channels.
//!
//! Memory changes only at step boundaries, in the planner and the executor
//! alike: an op's outputs are allocated when it starts; releases happen when
//! their trigger op ends; a swap-in's buffer is allocated when its trigger
//! fires (before the copy starts); a swap-out's buffer is freed at the first
//! boundary after its copy has completed. So the predicted peak is the exact
//! maximum over steps, and a real allocator never needs more than it says.
//!
//! A wait step stands for the time the job waits for prefetches that cannot
//! be hidden behind compute (planned only to meet a memory budget): it lasts
//! until the last swap-in that the next step reads has arrived, which is what
//! the executor does before an op whose input is still being copied. Memory
//! during the wait is what the executor holds then: the previous op's
//! releases done and the swap-ins it triggered allocated, the next step's
//! outputs not yet.

use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};

use crate::align::Curve;
use crate::config::{CopyModel, JobSettings};
use crate::intervals::IntervalSet;
use crate::memtree::MemTree;

/// One entry of the job's execution order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) op: OpId,
    /// `Some(s)`: this step re-runs `op` to rebuild storage `s`.
    pub(crate) rebuilds: Option<StorageId>,
    /// A wait for late prefetches before the next step (`op` is that step's
    /// op; the wait runs no kernel).
    pub(crate) wait: bool,
}

impl Step {
    /// One of the graph's ops in its place, not an inserted step.
    pub(crate) fn is_real(&self) -> bool {
        self.rebuilds.is_none() && !self.wait
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub(crate) step: usize,
    /// The op writes the storage (produces it or updates it in place).
    pub(crate) write: bool,
}

/// A copy anchored to the end of a trigger step (`None`: iteration start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy {
    pub(crate) trigger: Option<usize>,
    pub(crate) delay: u64,
    pub(crate) dur: u64,
}

impl Copy {
    pub(crate) fn start(&self, times: &[u64]) -> u64 {
        self.trigger.map_or(0, |t| times[t + 1]) + self.delay
    }
    pub(crate) fn end(&self, times: &[u64]) -> u64 {
        self.start(times) + self.dur
    }
}

/// A stretch between two accesses during which a storage is off the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gap {
    /// The access before (for `wrap`: the last access of the iteration).
    pub(crate) after: usize,
    /// The access after (for `wrap`: the first access of the iteration; for
    /// a recomputation: the step that rebuilds the storage).
    pub(crate) before: usize,
    /// Spans the iteration boundary.
    pub(crate) wrap: bool,
    /// `None`: released at `after`'s end (a host copy exists, or recompute).
    pub(crate) out: Option<Copy>,
    /// `None`: rebuilt by the recompute step `before` (or, `forced`, gone
    /// for the rest of the iteration: `before` is the iteration's end).
    pub(crate) inn: Option<Copy>,
    /// The program's own copies around a host op, not a plan's choice: a
    /// host op's device input going out (and its buffer with it), or a
    /// storage a host op rewrites coming back before its next use.
    pub(crate) forced: bool,
}

impl Gap {
    /// An across-iteration gap whose swap-in comes at the tail of the
    /// iteration, after its last access (a storage a host op rewrites,
    /// fetched once the host op is done), rather than at the head of the
    /// next: the storage is back on the device when the iteration ends.
    pub(crate) fn tail_in(&self) -> bool {
        self.wrap
            && self
                .inn
                .is_some_and(|c| c.trigger.is_some_and(|t| t >= self.after))
    }

    /// An across-iteration gap whose swap-out comes at the head of the
    /// iteration (before the first access) rather than after the last one.
    pub(crate) fn head_out(&self) -> bool {
        self.wrap
            && self
                .out
                .is_some_and(|c| c.trigger.is_none_or(|t| t < self.after))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct StorageState {
    pub(crate) root: TensorId,
    pub(crate) bytes: u64,
    pub(crate) persistent: bool,
    /// The step allocating it; `None`: resident at iteration start.
    pub(crate) born: Option<usize>,
    /// The last access, after which it is released; `None`: kept to the end.
    pub(crate) last: Option<usize>,
    pub(crate) accesses: Vec<Access>,
    pub(crate) gaps: Vec<Gap>,
    /// Extra residency `[from, to)` for recomputations of dead inputs.
    pub(crate) revivals: Vec<(usize, usize)>,
    /// A swap-in must end this long before the access that needs it.
    pub(crate) lead: u64,
    /// Only host ops touch it: no device memory, never a candidate.
    pub(crate) host_only: bool,
    /// A host op rewrites it: its host copy is always current (so it is
    /// released, never copied out), and after its last device access it
    /// is away until the next iteration fetches it.
    pub(crate) host_master: bool,
}

/// A host op on the job's time line: the step it is at, and what it takes
/// on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostOp {
    pub(crate) op: OpId,
    pub(crate) dur: u64,
    /// The storages of its inputs, and those it writes.
    pub(crate) inputs: Vec<usize>,
    pub(crate) writes: Vec<usize>,
}

/// A copy as the executor's queues see it, for [`Job::rebuild`].
#[derive(Debug, Clone, Copy)]
struct Queued {
    /// The storage and the index of its gap.
    s: usize,
    k: usize,
    /// A prefetch (else a swap-out).
    inn: bool,
    lane: usize,
    trigger: Option<usize>,
    delay: u64,
    dur: u64,
}

impl Queued {
    fn new(s: usize, k: usize, inn: bool, lane: usize, c: Copy) -> Queued {
        Queued {
            s,
            k,
            inn,
            lane,
            trigger: c.trigger,
            delay: c.delay,
            dur: c.dur,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Job<'g> {
    pub(crate) graph: &'g Graph,
    pub(crate) live: &'g Liveness,
    pub(crate) settings: JobSettings,
    pub(crate) op_latency: Vec<u64>,
    pub(crate) steps: Vec<Step>,
    /// Start of each step, then the end of the iteration.
    pub(crate) times: Vec<u64>,
    pub(crate) st: Vec<StorageState>,
    pub(crate) tree: MemTree,
    /// Channel 0 carries swap-outs; swap-ins use channel 1, or 0 when the
    /// link is half duplex.
    pub(crate) chans: Vec<IntervalSet>,
    pub(crate) d2h_bytes_per_s: f64,
    pub(crate) h2d_bytes_per_s: f64,
    pub(crate) copy: CopyModel,
    pub(crate) swap_outs: usize,
    /// The last [`Job::rebuild`] found copies overlapping on a channel: the
    /// change that made it is not possible.
    pub(crate) clash: bool,
    /// Across-iteration gaps may be placed. They are held back until the
    /// within-iteration swaps stall: their windows are long and flexible,
    /// and placed first they would take the channel time that the tightly
    /// bounded swaps of activations need.
    pub(crate) wrap_allowed: bool,
    /// The period of the job's gate when it is coordinated with others (0:
    /// it runs free): its periodic time line repeats every
    /// [`Job::period`], the iteration plus the wait at the gate.
    pub(crate) cycle: u64,
    /// Per channel, the time other coordinated jobs' copies take on the
    /// shared link, on this job's periodic time line: its own copies must
    /// not overlap them.
    pub(crate) foreign: Vec<IntervalSet>,
    /// The job's host ops, in order: they take no time on the device, and
    /// run one after another on the host.
    pub(crate) host_ops: Vec<HostOp>,
    /// How long the iteration runs on after its last op, for its host ops
    /// (and their inputs' copies out) to end: an iteration ends when they
    /// have. Set by [`Job::rebuild`].
    pub(crate) tail: u64,
    /// When each host op ends (as [`Job::host_ops`]). Set by
    /// [`Job::rebuild`].
    pub(crate) host_end: Vec<u64>,
    /// Memos of what is read often and changes seldom, made when first
    /// read and dropped where what they come from changes (see
    /// [`Job::memory_changed`], [`Job::set_foreign`]): per channel, the
    /// job's copies and the other jobs' together (a coordinated job's swap
    /// tries read it every time, and the others' copies change only when
    /// they are refreshed); the job's memory over its iteration (the
    /// aligned peak of coordinated jobs reads every job's).
    merged: Vec<OnceCell<IntervalSet>>,
    curve: OnceCell<Curve>,
    top: OnceCell<Option<(u64, u64)>>,
    /// [`Job::swap_candidates`] at a step, with across-iteration gaps
    /// allowed or not: a coordinated job waiting at its gate is asked for
    /// its step 0 round after round while other jobs change.
    cands: Option<((usize, bool), Vec<SwapCandidate>)>,
}

/// A storage a swap may take off the device at a step: its bytes, the
/// storage, and the access its gap follows.
pub(crate) type SwapCandidate = (u64, StorageId, usize);

pub(crate) const OUT: usize = 0;

impl<'g> Job<'g> {
    pub(crate) fn new(
        graph: &'g Graph,
        live: &'g Liveness,
        op_latency: Vec<u64>,
        settings: JobSettings,
        copy: CopyModel,
        link_share: f64,
    ) -> Job<'g> {
        let steps: Vec<Step> = graph
            .ops()
            .iter()
            .map(|op| Step {
                op: op.id,
                rebuilds: None,
                wait: false,
            })
            .collect();
        let mut st: Vec<StorageState> = live
            .storages
            .iter()
            .map(|s| StorageState {
                root: s.root,
                bytes: s.bytes,
                persistent: s.persistent,
                born: s.born.map(OpId::index),
                last: s.freed_after.map(OpId::index),
                accesses: Vec::new(),
                gaps: Vec::new(),
                revivals: Vec::new(),
                lead: 0,
                host_only: s.host_only,
                host_master: s.host_master,
            })
            .collect();
        for s in st.iter_mut().filter(|s| s.host_only) {
            s.bytes = 0;
        }
        let mut op_latency = op_latency;
        let mut host_ops = Vec::new();
        for op in graph.ops().iter().filter(|o| o.on_host()) {
            op_latency[op.id.index()] = 0;
            let mut inputs: Vec<usize> = op
                .inputs
                .iter()
                .map(|t| live.storage_of[t.index()].index())
                .collect();
            inputs.sort_unstable();
            inputs.dedup();
            let mut writes: Vec<usize> = op
                .outputs
                .iter()
                .map(|t| live.storage_of[t.index()].index())
                .collect();
            writes.sort_unstable();
            writes.dedup();
            host_ops.push(HostOp {
                op: op.id,
                dur: copy.host_ns(graph.host_traffic_bytes(op.id)),
                inputs,
                writes,
            });
        }
        for op in graph.ops().iter().filter(|o| !o.on_host()) {
            let step = op.id.index();
            let mut touch = |t: TensorId, write: bool| {
                let s = &mut st[live.storage_of[t.index()].index()];
                match s.accesses.last_mut() {
                    Some(a) if a.step == step => a.write |= write,
                    _ => s.accesses.push(Access { step, write }),
                }
            };
            for &t in &op.inputs {
                touch(t, false);
            }
            for &t in &op.outputs {
                touch(t, true);
            }
        }
        let chans = if copy.half_duplex { 1 } else { 2 };
        let mut job = Job {
            graph,
            live,
            settings,
            op_latency,
            steps,
            times: Vec::new(),
            st,
            tree: MemTree::new(&[]),
            chans: vec![IntervalSet::new(); chans],
            d2h_bytes_per_s: copy.d2h_bytes_per_s * link_share,
            h2d_bytes_per_s: copy.h2d_bytes_per_s * link_share,
            copy,
            swap_outs: 0,
            clash: false,
            wrap_allowed: false,
            cycle: 0,
            foreign: vec![IntervalSet::new(); chans],
            host_ops,
            tail: 0,
            host_end: Vec::new(),
            merged: vec![OnceCell::new(); chans],
            curve: OnceCell::new(),
            top: OnceCell::new(),
            cands: None,
        };
        job.rebuild();
        job.place_host_copies();
        job
    }

    pub(crate) fn n(&self) -> usize {
        self.steps.len()
    }

    /// The length of the job's periodic time line: its iteration, and the
    /// wait at its gate when it has one.
    pub(crate) fn period(&self) -> u64 {
        self.cycle.max(self.iteration_ns())
    }

    /// Channel `ch` as a new copy must find it: the job's own copies and,
    /// when it is coordinated, the other jobs'.
    pub(crate) fn chan(&self, ch: usize) -> &IntervalSet {
        if self.foreign[ch].busy().is_empty() {
            return &self.chans[ch];
        }
        let merge = || {
            let all = self.chans[ch].busy().iter().chain(self.foreign[ch].busy());
            IntervalSet::from_intervals(all.copied().collect()).0
        };
        let merged = self.merged[ch].get_or_init(merge);
        // Every test plan checks the memo against the merge.
        #[cfg(test)]
        assert_eq!(merged, &merge(), "a stale channel memo");
        merged
    }

    /// Sets what the job sees of the other jobs' copies on channel `ch`.
    pub(crate) fn set_foreign(&mut self, ch: usize, busy: IntervalSet) {
        self.foreign[ch] = busy;
        self.merged[ch] = OnceCell::new();
    }

    /// The job's memory over its iteration as a curve (memoised).
    pub(crate) fn curve(&self) -> &Curve {
        self.curve
            .get_or_init(|| Curve::new(self.timeline(), self.iteration_ns()))
    }

    /// The steps, their times or the memory during them changed: the
    /// curve memo goes.
    fn memory_changed(&mut self) {
        self.curve = OnceCell::new();
        self.top = OnceCell::new();
        self.cands = None;
    }

    /// What a swap at step `p` may take off the device: every storage
    /// resident then and not accessed by the step, with a gap around `p`
    /// for a swap, as (bytes, storage, the access the gap follows), in
    /// storage order (memoised for the last step asked).
    pub(crate) fn swap_candidates(&mut self, p: usize) -> &[SwapCandidate] {
        let key = (p, self.wrap_allowed);
        let fresh = |job: &Job<'_>| -> Vec<SwapCandidate> {
            let mut v = Vec::new();
            for (i, st) in job.st.iter().enumerate() {
                let s = StorageId(i as u32);
                if st.bytes == 0 || !job.resident(s, p) || job.accessed_at(s, p) {
                    continue;
                }
                if let Some((after, _, _)) = crate::swap::gap_around(job, s, p) {
                    v.push((st.bytes, s, after));
                }
            }
            v
        };
        if !matches!(&self.cands, Some((k, _)) if *k == key) {
            self.cands = Some((key, fresh(self)));
        }
        let memo = self.cands.as_ref().map_or(&[][..], |c| c.1.as_slice());
        // Every test plan checks the memo against the storages as they are.
        #[cfg(test)]
        assert_eq!(memo, fresh(self).as_slice(), "stale swap candidates");
        memo
    }

    /// [`crate::align::top`] of the job's curve (memoised).
    pub(crate) fn curve_top(&self) -> Option<(u64, u64)> {
        *self.top.get_or_init(|| crate::align::top(self.curve()))
    }

    pub(crate) fn in_chan(&self) -> usize {
        self.chans.len() - 1
    }

    pub(crate) fn out_dur(&self, bytes: u64) -> u64 {
        self.copy.duration_ns(bytes, self.d2h_bytes_per_s)
    }

    pub(crate) fn in_dur(&self, bytes: u64) -> u64 {
        self.copy.duration_ns(bytes, self.h2d_bytes_per_s)
    }

    /// The first boundary at or after time `t`.
    pub(crate) fn boundary_at_or_after(&self, t: u64) -> usize {
        self.times.partition_point(|&x| x < t)
    }

    /// The last boundary at or before time `t`.
    pub(crate) fn boundary_at_or_before(&self, t: u64) -> usize {
        self.times.partition_point(|&x| x <= t).saturating_sub(1)
    }

    /// Steps `[from, to)` (twice for a wrapping gap) during which the storage
    /// of `gap` is absent. An across-iteration swap-out may run past the
    /// iteration's end: its buffer is then held into the next iteration, up
    /// to the first boundary after the copy (on the periodic time line).
    pub(crate) fn absent(&self, gap: &Gap) -> [(usize, usize); 2] {
        let n = self.n();
        let to = match gap.inn {
            Some(c) => c.trigger.map_or(0, |t| t + 1),
            None => gap.before,
        };
        let end = gap.out.map(|c| c.end(&self.times));
        if gap.wrap
            && let Some(out) = gap.out
        {
            let end = out.end(&self.times);
            let from = if gap.head_out() {
                self.boundary_at_or_after(end)
            } else if end > self.period() {
                self.boundary_at_or_after(end - self.period())
            } else {
                let from = self.boundary_at_or_after(end).max(gap.after + 1);
                return [(from.min(n), n), (0, to)];
            };
            return [(n, n), (from, to.max(from))];
        }
        let from = match end {
            Some(end) => self.boundary_at_or_after(end).max(gap.after + 1),
            None => gap.after + 1,
        };
        if gap.wrap && !gap.tail_in() {
            [(from.min(n), n), (0, to)]
        } else {
            [(from, to.max(from)), (0, 0)]
        }
    }

    /// A copy's busy time on its channel, on the periodic time line: a copy
    /// running past the iteration's end wraps to its start.
    pub(crate) fn spans(&self, c: &Copy) -> [(u64, u64); 2] {
        let (a, b) = (c.start(&self.times), c.end(&self.times));
        let period = self.period();
        if b > period && a < period {
            [(a, period), (0, b - period)]
        } else {
            [(a, b), (0, 0)]
        }
    }

    /// Marks a copy busy on channel `ch`; false if it overlaps another.
    pub(crate) fn occupy(&mut self, ch: usize, c: &Copy) -> bool {
        let spans = self.spans(c);
        if !spans.iter().all(|&(a, b)| self.chans[ch].is_free(a, b)) {
            return false;
        }
        self.merged[ch] = OnceCell::new();
        spans.iter().all(|&(a, b)| self.chans[ch].insert(a, b))
    }

    /// Steps `[from, to)` of the storage's life without any plan.
    pub(crate) fn life(&self, s: &StorageState) -> (usize, usize) {
        if s.host_only {
            return (0, 0);
        }
        if s.persistent {
            return (0, self.n());
        }
        (s.born.unwrap_or(0), s.last.map_or(self.n(), |l| l + 1))
    }

    pub(crate) fn resident(&self, s: StorageId, step: usize) -> bool {
        let st = &self.st[s.index()];
        if st.revivals.iter().any(|&(a, b)| (a..b).contains(&step)) {
            return true;
        }
        let (a, b) = self.life(st);
        (a..b).contains(&step)
            && !st
                .gaps
                .iter()
                .any(|g| self.absent(g).iter().any(|&(x, y)| (x..y).contains(&step)))
    }

    /// Resident at the start of `step` with its data there (no swap-in copy
    /// still in flight).
    pub(crate) fn present(&self, s: StorageId, step: usize) -> bool {
        self.resident(s, step)
            && self.st[s.index()].gaps.iter().all(|g| match g.inn {
                Some(c) => {
                    let alloc = c.trigger.map_or(0, |t| t + 1);
                    alloc > step || c.end(&self.times) <= self.times[step]
                }
                None => true,
            })
    }

    pub(crate) fn accessed_at(&self, s: StorageId, step: usize) -> bool {
        self.st[s.index()]
            .accesses
            .binary_search_by_key(&step, |a| a.step)
            .is_ok()
    }

    /// Whether step `k` reads storage `s` (for a recompute step: whether its
    /// producer does), so that the executor waits for its data before it.
    pub(crate) fn reads(&self, k: usize, s: StorageId) -> bool {
        let step = &self.steps[k];
        !step.wait
            && self
                .graph
                .op(step.op)
                .inputs
                .iter()
                .any(|&t| self.live.storage_of[t.index()] == s)
    }

    /// The step that needs the data a gap of `s` took away: its first
    /// access after the gap's `after` (before the gap's `before` when a
    /// recomputation reads it there after its prefetch).
    pub(crate) fn needed_by(&self, s: StorageId, g: &Gap) -> usize {
        if g.wrap {
            return g.before;
        }
        let acc = &self.st[s.index()].accesses;
        let i = acc.partition_point(|a| a.step <= g.after);
        acc.get(i).map_or(g.before, |a| a.step.min(g.before))
    }

    /// Recomputes times, memory and channels from the steps and gaps, the
    /// way the executor runs them: each copy channel is a FIFO queue, a copy
    /// starts when it fires (its trigger's end plus its delay) or when the
    /// channel is free if that is later, and a wait step lasts until the
    /// prefetches that the next step reads have arrived. Copies that the
    /// queue holds back get the delay that they will have; `clash` says that
    /// the result is not a plan the executor runs as predicted (a prefetch
    /// that arrives after its consumer starts with no wait for it, a
    /// prefetch waited for whose swap-out is not over when its buffer is
    /// allocated, a copy that runs past the iteration's end).
    pub(crate) fn rebuild(&mut self) {
        let n = self.n();
        let in_chan = self.in_chan();
        // Every copy: its storage and gap, its lane, and the copy.
        let mut items: Vec<Queued> = Vec::new();
        for (i, st) in self.st.iter().enumerate() {
            for (k, g) in st.gaps.iter().enumerate() {
                if let Some(c) = g.out {
                    items.push(Queued::new(i, k, false, OUT, c));
                }
                if let Some(c) = g.inn {
                    items.push(Queued::new(i, k, true, in_chan, c));
                }
            }
        }
        // Copies by the step whose end triggers them (0: iteration start).
        let mut fired_at: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
        for (x, it) in items.iter().enumerate() {
            fired_at[it.trigger.map_or(0, |t| t + 1)].push(x);
        }
        // The prefetches each wait step waits for: those of what the step
        // after it reads.
        let mut awaited: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (x, it) in items.iter().enumerate() {
            let g = &self.st[it.s].gaps[it.k];
            // A fetch at the tail is for the next iteration's first access.
            if it.inn
                && !g.tail_in()
                && g.before > 0
                && self.steps[g.before - 1].wait
                && self.reads(g.before, StorageId(it.s as u32))
            {
                awaited[g.before - 1].push(x);
            }
        }
        // A copy of the previous iteration that runs on into this one may
        // meet one at the head; the channels' periodic check below says so.
        let mut free = vec![0u64; self.chans.len()];
        let order = |x: usize, fire: u64| {
            let it = &items[x];
            let root = self.st[it.s].root.0;
            (fire, it.trigger.map_or(0, |t| t + 1), it.inn, root, x)
        };
        type Queue = BinaryHeap<Reverse<(u64, usize, bool, u32, usize)>>;
        let mut queue: Queue = BinaryHeap::new();
        let mut start: Vec<u64> = vec![0; items.len()];
        let mut submit = |queue: &mut Queue, until: u64, start: &mut Vec<u64>| {
            while let Some(&Reverse((fire, _, _, _, x))) = queue.peek() {
                if fire > until {
                    break;
                }
                queue.pop();
                let lane = items[x].lane;
                let s = fire.max(free[lane]);
                free[lane] = s + items[x].dur;
                start[x] = s;
            }
        };
        self.times = Vec::with_capacity(n + 1);
        let mut t = 0u64;
        for k in 0..=n {
            for &x in &fired_at[k] {
                queue.push(Reverse(order(x, t + items[x].delay)));
            }
            if k == n {
                break;
            }
            self.times.push(t);
            if self.steps[k].wait {
                let last = awaited[k]
                    .iter()
                    .map(|&x| {
                        let it = &items[x];
                        it.trigger.map_or(0, |tr| self.times[tr + 1]) + it.delay
                    })
                    .max()
                    .unwrap_or(0);
                submit(&mut queue, last, &mut start);
                t = awaited[k]
                    .iter()
                    .map(|&x| start[x] + items[x].dur)
                    .fold(t, u64::max);
            } else {
                t += self.op_latency[self.steps[k].op.index()];
            }
        }
        self.times.push(t);
        submit(&mut queue, u64::MAX, &mut start);
        self.clash = false;
        // The host ops, one after another, each once its inputs are out.
        let mut end_all = t;
        self.host_end.clear();
        if !self.host_ops.is_empty() {
            let mut out_end: Vec<u64> = vec![0; self.st.len()];
            for (x, it) in items.iter().enumerate() {
                if !it.inn && self.st[it.s].gaps[it.k].forced {
                    out_end[it.s] = out_end[it.s].max(start[x] + it.dur);
                }
            }
            let mut step_of = vec![usize::MAX; self.graph.ops().len()];
            for (k, st) in self.steps.iter().enumerate() {
                if st.is_real() {
                    step_of[st.op.index()] = k;
                }
            }
            let mut host_free = 0u64;
            for h in &self.host_ops {
                let k = step_of[h.op.index()];
                let ready = h
                    .inputs
                    .iter()
                    .map(|&s| out_end[s])
                    .fold(self.times[k], u64::max);
                host_free = ready.max(host_free) + h.dur;
                end_all = end_all.max(host_free);
                self.host_end.push(host_free);
            }
            // Fetches after the last op of what host ops rewrote.
            for (x, it) in items.iter().enumerate() {
                let g = &self.st[it.s].gaps[it.k];
                if it.inn && g.forced && g.tail_in() {
                    end_all = end_all.max(start[x] + it.dur);
                }
            }
        }
        self.tail = end_all - t;
        let t = end_all;
        for (x, it) in items.iter().enumerate() {
            let fire = it.trigger.map_or(0, |tr| self.times[tr + 1]) + it.delay;
            let g = &mut self.st[it.s].gaps[it.k];
            let c = if it.inn { &mut g.inn } else { &mut g.out };
            if let Some(c) = c {
                c.delay += start[x] - fire;
            }
        }
        let mut awaited_copy = vec![false; items.len()];
        for &x in awaited.iter().flatten() {
            awaited_copy[x] = true;
        }
        for (x, it) in items.iter().enumerate() {
            let s = StorageId(it.s as u32);
            let g = self.st[it.s].gaps[it.k];
            let st = &self.st[it.s];
            let end = start[x] + it.dur;
            if it.inn {
                let by = self.needed_by(s, &g);
                if !g.tail_in() && end > self.times[by] && self.reads(by, s) {
                    self.clash = true;
                }
                if awaited_copy[x]
                    && let Some(out) = g.out
                {
                    let mut free_at = out.end(&self.times);
                    if g.wrap && !g.head_out() {
                        free_at = free_at.saturating_sub(t.max(self.cycle));
                    }
                    if free_at > it.trigger.map_or(0, |tr| self.times[tr + 1]) {
                        self.clash = true;
                    }
                }
            }
            if end > t && (it.inn || !st.persistent) {
                self.clash = true;
            }
        }
        let mut diff = vec![0i64; n + 1];
        for s in &self.st {
            let bytes = s.bytes as i64;
            let (a, b) = self.life(s);
            diff[a] += bytes;
            diff[b] -= bytes;
            for &(a, b) in &s.revivals {
                diff[a] += bytes;
                diff[b] -= bytes;
            }
            for g in &s.gaps {
                for (a, b) in self.absent(g) {
                    if a < b {
                        diff[a] -= bytes;
                        diff[b] += bytes;
                    }
                }
            }
        }
        let mut mem = Vec::with_capacity(n);
        let mut cur = self.settings.base_bytes as i64;
        for d in &diff[..n] {
            cur += d;
            mem.push(cur);
        }
        self.tree = MemTree::new(&mem);
        let mut spans: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.chans.len()];
        // A host op's inputs go out when the op is reached, wherever the
        // other jobs' copies are: the shared queue puts one behind another.
        let mut fifo: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.chans.len()];
        for s in &self.st {
            for g in &s.gaps {
                for (ch, c, fixed) in [(OUT, g.out, g.forced), (in_chan, g.inn, false)] {
                    if let Some(c) = c {
                        let to = if fixed { &mut fifo[ch] } else { &mut spans[ch] };
                        to.extend(self.spans(&c));
                    }
                }
            }
        }
        for (ch, (v, fixed)) in spans.into_iter().zip(fifo).enumerate() {
            // The queue keeps copies on one channel apart; the part of a
            // copy that runs on into the next iteration may still meet one
            // at the head, and other coordinated jobs' copies may meet any.
            let foreign = self.foreign[ch].busy();
            let (_, overlap) =
                IntervalSet::from_intervals(v.iter().chain(foreign).copied().collect());
            let own: Vec<(u64, u64)> = v.into_iter().chain(fixed).collect();
            let (set, own_overlap) = IntervalSet::from_intervals(own);
            self.chans[ch] = set;
            self.clash |= overlap || own_overlap;
        }
        self.memory_changed();
        for m in &mut self.merged {
            *m = OnceCell::new();
        }
    }

    /// Applies a placed gap to memory and channels.
    pub(crate) fn apply_gap(&mut self, s: StorageId, gap: Gap) {
        self.memory_changed();
        let bytes = self.st[s.index()].bytes as i64;
        for (a, b) in self.absent(&gap) {
            self.tree.add(a, b, -bytes);
        }
        let in_chan = self.in_chan();
        if let Some(c) = gap.out {
            self.occupy(OUT, &c);
            self.swap_outs += 1;
        }
        if let Some(c) = gap.inn {
            self.occupy(in_chan, &c);
        }
        self.st[s.index()].gaps.push(gap);
    }

    /// Inserts `step` at index `at`; every stored index at or after `at`
    /// moves one on. Copies anchored after `at` shift later with their
    /// trigger, copies anchored before keep their times, so channel
    /// intervals stay disjoint (the wrapped tail of a copy running past the
    /// iteration's end keeps its length or shrinks, as the end moves on).
    pub(crate) fn insert_step(&mut self, at: usize, step: Step) {
        self.memory_changed();
        let bump = |i: &mut usize| {
            if *i >= at {
                *i += 1;
            }
        };
        for s in &mut self.st {
            if let Some(b) = &mut s.born {
                bump(b);
            }
            if let Some(l) = &mut s.last {
                bump(l);
            }
            for a in &mut s.accesses {
                bump(&mut a.step);
            }
            for g in &mut s.gaps {
                bump(&mut g.after);
                bump(&mut g.before);
                for c in [&mut g.out, &mut g.inn].into_iter().flatten() {
                    if let Some(t) = &mut c.trigger {
                        bump(t);
                    }
                }
            }
            for (a, b) in &mut s.revivals {
                bump(a);
                if *b > at {
                    *b += 1;
                }
            }
        }
        self.steps.insert(at, step);
    }

    /// The wait step right before step `c`, inserted (empty until a late
    /// prefetch for `c` makes it last) when there is none; `c` then moves
    /// one on. Call [`Job::rebuild`] afterwards.
    pub(crate) fn wait_before(&mut self, c: usize) -> usize {
        if c > 0 && self.steps[c - 1].wait {
            return c - 1;
        }
        let op = self.steps[c].op;
        self.insert_step(
            c,
            Step {
                op,
                rebuilds: None,
                wait: true,
            },
        );
        c
    }

    /// Where steps inserted to run right before step `c` go: before the wait
    /// for `c`'s late prefetches, as the executor runs the recomputations
    /// before an op first and then waits for the op's inputs.
    pub(crate) fn insertion_point(&self, c: usize) -> usize {
        if c > 0 && self.steps[c - 1].wait {
            c - 1
        } else {
            c
        }
    }

    /// What no plan can go under: the largest working set of one op (its
    /// inputs' and outputs' storages) plus the base.
    pub(crate) fn lower_bound(&self) -> u64 {
        let mut seen: Vec<StorageId> = Vec::new();
        let most = self
            .graph
            .ops()
            .iter()
            .filter(|op| !op.on_host())
            .map(|op| {
                seen.clear();
                seen.extend(
                    op.inputs
                        .iter()
                        .chain(&op.outputs)
                        .map(|t| self.live.storage_of[t.index()]),
                );
                seen.sort_unstable();
                seen.dedup();
                seen.iter().map(|s| self.st[s.index()].bytes).sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        most + self.settings.base_bytes
    }

    /// Adds an access (keeping the list sorted).
    pub(crate) fn add_access(&mut self, s: StorageId, access: Access) {
        self.cands = None;
        let acc = &mut self.st[s.index()].accesses;
        let at = acc.partition_point(|a| a.step < access.step);
        acc.insert(at, access);
    }

    pub(crate) fn peak(&self) -> (u64, usize) {
        let (m, step) = self.tree.peak();
        (m.max(0) as u64, step)
    }

    /// The iteration's length: its last op's end, and its host ops'.
    pub(crate) fn iteration_ns(&self) -> u64 {
        self.times[self.n()] + self.tail
    }

    /// Memory during each step: (start ns, bytes).
    pub(crate) fn timeline(&self) -> Vec<(u64, u64)> {
        (0..self.n())
            .map(|k| (self.times[k], self.tree.at(k).max(0) as u64))
            .collect()
    }
}
