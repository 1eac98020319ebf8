//! One job as the swap bound sees it: its steps on its own time line, its
//! device memory per step under vanilla liveness (what `planner::plan`
//! reports as `vanilla_timeline`), and, at an instant, the copy windows of
//! every storage that is resident but idle then. Host ops (updates kept on
//! the host) take no device time and touch nothing on the device; what
//! only they touch takes no device memory, and what they rewrite has a
//! current host copy, so it needs no copy out.

use tensile_graph::{Graph, Liveness};
use tensile_planner::CopyModel;

/// A storage that could be off the device at the instant looked at: the
/// room its copies have. `None`: no copy is needed that way (a persistent
/// storage that no op writes is copied to the host once and for all; one
/// that nothing reads again need not come back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    pub(super) bytes: u64,
    /// Its swap-out must run within this long before the instant: since
    /// the end of the last write of it (a host copy made after the last
    /// write serves every later gap, as the planner's reuse of host copies
    /// does).
    pub(super) out_ns: Option<u64>,
    /// Its swap-in must run within this long after the instant: until the
    /// start of the next op that touches it.
    pub(super) in_ns: Option<u64>,
}

/// Where a job is at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Running the step of this index.
    Step(usize),
    /// Done with its iteration, waiting at its gate for the next period.
    Gate,
}

#[derive(Debug, Clone)]
struct Store {
    bytes: u64,
    persistent: bool,
    /// Resident at iteration start without being persistent (an input):
    /// its data arrives when the iteration starts.
    input: bool,
    /// A host op keeps it current on the host: never copied out.
    host_master: bool,
    /// Steps `[from, to)` during which vanilla holds it.
    life: (usize, usize),
    /// The ops that touch it, and those that write it, in order.
    accesses: Vec<usize>,
    writes: Vec<usize>,
}

#[derive(Debug, Clone)]
pub(super) struct JobModel {
    /// Start of every step, then the end of the iteration.
    starts: Vec<u64>,
    /// Memory during every step, base included.
    mem: Vec<u64>,
    /// Bytes of the storages each step touches.
    touched: Vec<u64>,
    /// The storages each step touches, sorted.
    accessed: Vec<Vec<u32>>,
    stores: Vec<Store>,
    base: u64,
    persistent_bytes: u64,
    pub(super) phase_ns: u64,
}

impl JobModel {
    /// `latency_ns` must have one entry per op (the caller checks). With
    /// `link`, an iteration with host ops lasts as long as vanilla's does
    /// on it ([`host_tail_end`]).
    pub(super) fn new(
        graph: &Graph,
        latency_ns: &[u64],
        base: u64,
        phase_ns: u64,
        link: Option<&CopyModel>,
    ) -> JobModel {
        let live = Liveness::analyze(graph);
        let n = graph.ops().len();
        let mut starts = Vec::with_capacity(n + 1);
        let mut t = 0u64;
        for (op, &l) in graph.ops().iter().zip(latency_ns) {
            starts.push(t);
            if !op.on_host() {
                t += l;
            }
        }
        if let Some(link) = link.filter(|_| graph.has_host_ops()) {
            t = t.max(host_tail_end(graph, &live, &starts, link));
        }
        starts.push(t);
        let mut stores: Vec<Store> = live
            .storages
            .iter()
            .map(|s| Store {
                bytes: if s.host_only { 0 } else { s.bytes },
                persistent: s.persistent,
                input: !s.persistent && s.born.is_none(),
                host_master: s.host_master,
                life: if s.persistent {
                    (0, n)
                } else {
                    (
                        s.born.map_or(0, |b| b.index()),
                        s.freed_after.map_or(n, |l| l.index() + 1),
                    )
                },
                accesses: Vec::new(),
                writes: Vec::new(),
            })
            .collect();
        let mut accessed = Vec::with_capacity(n);
        for (k, op) in graph.ops().iter().enumerate() {
            let mut here: Vec<u32> = Vec::new();
            if op.on_host() {
                accessed.push(here);
                continue;
            }
            for (&t, write) in op
                .inputs
                .iter()
                .map(|t| (t, false))
                .chain(op.outputs.iter().map(|t| (t, true)))
            {
                let s = live.storage_of[t.index()];
                here.push(s.0);
                let st = &mut stores[s.index()];
                if st.accesses.last() != Some(&k) {
                    st.accesses.push(k);
                }
                if write && st.writes.last() != Some(&k) {
                    st.writes.push(k);
                }
            }
            here.sort_unstable();
            here.dedup();
            accessed.push(here);
        }
        let mut diff = vec![0i64; n + 1];
        for s in &stores {
            diff[s.life.0] += s.bytes as i64;
            diff[s.life.1] -= s.bytes as i64;
        }
        let mut cur = base as i64;
        let mem: Vec<u64> = diff[..n]
            .iter()
            .map(|d| {
                cur += d;
                cur.max(0) as u64
            })
            .collect();
        let touched = accessed
            .iter()
            .map(|h| h.iter().map(|&s| stores[s as usize].bytes).sum())
            .collect();
        JobModel {
            starts,
            mem,
            touched,
            accessed,
            persistent_bytes: live.persistent_bytes(),
            stores,
            base,
            phase_ns,
        }
    }

    pub(super) fn iteration_ns(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Memory during each step: (start ns, bytes).
    pub(super) fn curve(&self) -> Vec<(u64, u64)> {
        self.starts
            .iter()
            .copied()
            .zip(self.mem.iter().copied())
            .collect()
    }

    /// Where the job's memory may change, in its own time: the start of
    /// every step that takes time, and its gate when the period is longer
    /// than its iteration.
    pub(super) fn changes(&self, period_ns: u64) -> impl Iterator<Item = u64> + '_ {
        let gate = (self.iteration_ns() < period_ns).then_some(self.iteration_ns());
        self.starts
            .windows(2)
            .filter(|w| w[1] > w[0])
            .map(|w| w[0])
            .chain(gate)
    }

    /// The state at `tau` ns into its period (`tau` < the period).
    pub(super) fn state_at(&self, tau: u64) -> State {
        if tau >= self.iteration_ns() {
            return State::Gate;
        }
        State::Step(self.starts.partition_point(|&s| s <= tau) - 1)
    }

    /// Vanilla memory in `state`. At its gate a job holds its base and its
    /// persistent storage only (no less than that, whatever else it keeps).
    pub(super) fn memory(&self, state: State) -> u64 {
        match state {
            State::Step(k) => self.mem[k],
            State::Gate => self.base + self.persistent_bytes,
        }
    }

    /// Bytes that could be off the device in `state` with an infinitely
    /// fast link: all that is resident but not touched by the running op.
    pub(super) fn idle_bytes(&self, state: State) -> u64 {
        match state {
            State::Step(k) => self.mem[k].saturating_sub(self.base + self.touched[k]),
            State::Gate => self.persistent_bytes,
        }
    }

    /// The idle storages in `state` at `tau` ns into a period of
    /// `period_ns`, with their copy windows, appended to `out`.
    pub(super) fn candidates(&self, tau: u64, period_ns: u64, out: &mut Vec<Candidate>) {
        let state = self.state_at(tau);
        // End of op `w`, and start of op `a`, in the job's time.
        let end = |w: usize| self.starts[w + 1];
        let start = |a: usize| self.starts[a];
        for (i, s) in self.stores.iter().enumerate() {
            if s.bytes == 0 {
                continue;
            }
            let (out_ns, in_ns) = match state {
                State::Step(k) => {
                    if !(s.life.0..s.life.1).contains(&k)
                        || self.accessed[k].binary_search(&(i as u32)).is_ok()
                    {
                        continue;
                    }
                    let w = s.writes.partition_point(|&w| w < k);
                    let out_ns = if s.host_master {
                        None
                    } else if w > 0 {
                        Some(tau - end(s.writes[w - 1]))
                    } else if s.persistent {
                        // Last written in the previous iteration.
                        s.writes.last().map(|&w| tau + period_ns - end(w))
                    } else {
                        // An input: its data is there from the start.
                        debug_assert!(s.input, "a produced storage is written before it idles");
                        Some(tau)
                    };
                    let a = s.accesses.partition_point(|&a| a <= k);
                    let in_ns = match s.accesses.get(a) {
                        Some(&a) => Some(start(a) - tau),
                        // Next touched in the next iteration.
                        None if s.persistent => {
                            s.accesses.first().map(|&a| start(a) + period_ns - tau)
                        }
                        None => None,
                    };
                    (out_ns, in_ns)
                }
                State::Gate => {
                    if !s.persistent {
                        continue;
                    }
                    (
                        s.writes
                            .last()
                            .filter(|_| !s.host_master)
                            .map(|&w| tau - end(w)),
                        s.accesses.first().map(|&a| start(a) + period_ns - tau),
                    )
                }
            };
            out.push(Candidate {
                bytes: s.bytes,
                out_ns,
                in_ns,
            });
        }
    }
}

/// When a vanilla iteration with host ops ends on `link` (`starts`: when
/// each op starts): each host op's device inputs go out as it is reached,
/// one after another on the link; the host ops run one after another, each
/// once its inputs are out; what each rewrites comes back as it ends. A
/// plan that adds no time ends no later, so the bound gives its copies no
/// less time than this.
fn host_tail_end(graph: &Graph, live: &Liveness, starts: &[u64], link: &CopyModel) -> u64 {
    let (mut out_free, mut in_free, mut host_free) = (0u64, 0u64, 0u64);
    let mut end = 0;
    for op in graph.ops().iter().filter(|o| o.on_host()) {
        let mut ready = starts[op.id.index()];
        for &t in &op.inputs {
            let s = &live.storages[live.storage_of[t.index()].index()];
            if !s.persistent && !s.host_master {
                out_free = out_free.max(starts[op.id.index()])
                    + link.duration_ns(s.bytes, link.d2h_bytes_per_s);
                ready = ready.max(out_free);
            }
        }
        host_free = host_free.max(ready) + link.host_ns(graph.host_traffic_bytes(op.id));
        end = end.max(host_free);
        for &t in &op.outputs {
            let s = &live.storages[live.storage_of[t.index()].index()];
            if !s.host_only {
                in_free = in_free.max(host_free) + link.duration_ns(s.bytes, link.h2d_bytes_per_s);
                end = end.max(in_free);
            }
        }
    }
    end
}
