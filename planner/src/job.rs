//! One job's planning state: its steps on the predicted time line, the
//! accesses and gaps of every storage, memory per step, and its copy channels.
//!
//! Memory changes only at step boundaries, in the planner and the executor
//! alike: an op's outputs are allocated when it starts; releases happen when
//! their trigger op ends; a swap-in's buffer is allocated when its trigger
//! fires (before the copy starts); a swap-out's buffer is freed at the first
//! boundary after its copy has completed. So the predicted peak is the exact
//! maximum over steps, and a real allocator never needs more than it says.

use tensile_graph::{Graph, Liveness, OpId, StorageId, TensorId};

use crate::config::{CopyModel, JobSettings};
use crate::intervals::IntervalSet;
use crate::memtree::MemTree;

/// One entry of the job's execution order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) op: OpId,
    /// `Some(s)`: this step re-runs `op` to rebuild storage `s`.
    pub(crate) rebuilds: Option<StorageId>,
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
    /// `None`: rebuilt by the recompute step `before`.
    pub(crate) inn: Option<Copy>,
}

impl Gap {
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
    /// Across-iteration gaps may be placed. They are held back until the
    /// within-iteration swaps stall: their windows are long and flexible,
    /// and placed first they would take the channel time that the tightly
    /// bounded swaps of activations need.
    pub(crate) wrap_allowed: bool,
}

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
            })
            .collect();
        for op in graph.ops() {
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
            wrap_allowed: false,
        };
        job.rebuild();
        job
    }

    pub(crate) fn n(&self) -> usize {
        self.steps.len()
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
            } else if end > self.iteration_ns() {
                self.boundary_at_or_after(end - self.iteration_ns())
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
        if gap.wrap {
            [(from.min(n), n), (0, to)]
        } else {
            [(from, to.max(from)), (0, 0)]
        }
    }

    /// A copy's busy time on its channel, on the periodic time line: a copy
    /// running past the iteration's end wraps to its start.
    pub(crate) fn spans(&self, c: &Copy) -> [(u64, u64); 2] {
        let (a, b) = (c.start(&self.times), c.end(&self.times));
        let period = self.iteration_ns();
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
        spans.iter().all(|&(a, b)| self.chans[ch].insert(a, b))
    }

    /// Steps `[from, to)` of the storage's life without any plan.
    pub(crate) fn life(&self, s: &StorageState) -> (usize, usize) {
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

    /// Recomputes times, memory and channels from the steps and gaps.
    pub(crate) fn rebuild(&mut self) {
        let n = self.n();
        self.times = Vec::with_capacity(n + 1);
        let mut t = 0u64;
        for step in &self.steps {
            self.times.push(t);
            t += self.op_latency[step.op.index()];
        }
        self.times.push(t);
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
        for c in &mut self.chans {
            *c = IntervalSet::new();
        }
        let in_chan = self.in_chan();
        let mut copies = Vec::new();
        for s in &self.st {
            for g in &s.gaps {
                if let Some(c) = g.out {
                    copies.push((OUT, c));
                }
                if let Some(c) = g.inn {
                    copies.push((in_chan, c));
                }
            }
        }
        for (ch, c) in copies {
            // Shifting anchors by inserted steps never creates an overlap
            // (see `insert_step`); a failure here is a planner bug.
            let ok = self.occupy(ch, &c);
            debug_assert!(ok, "copy channel overlap after rebuild");
        }
    }

    /// Applies a placed gap to memory and channels.
    pub(crate) fn apply_gap(&mut self, s: StorageId, gap: Gap) {
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

    /// Adds an access (keeping the list sorted).
    pub(crate) fn add_access(&mut self, s: StorageId, access: Access) {
        let acc = &mut self.st[s.index()].accesses;
        let at = acc.partition_point(|a| a.step < access.step);
        acc.insert(at, access);
    }

    pub(crate) fn peak(&self) -> (u64, usize) {
        let (m, step) = self.tree.peak();
        (m.max(0) as u64, step)
    }

    pub(crate) fn iteration_ns(&self) -> u64 {
        self.times[self.n()]
    }

    /// Memory during each step: (start ns, bytes).
    pub(crate) fn timeline(&self) -> Vec<(u64, u64)> {
        (0..self.n())
            .map(|k| (self.times[k], self.tree.at(k).max(0) as u64))
            .collect()
    }
}
