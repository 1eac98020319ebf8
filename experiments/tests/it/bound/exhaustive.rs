//! Exhaustive: on small random graphs (a few storages), every combination
//! of the swaps a plan can make is built as a real plan and run in the
//! simulator with exact latencies; the lowest measured peak among those
//! that add no time (no stall, no late prefetch, every iteration as long
//! as vanilla's) is never under the swap bound, for one job and for two
//! jobs with phases sharing the link.
//!
//! A gap of a storage (between two accesses; an input's from the
//! iteration's start; a persistent storage's across the iteration's end)
//! is left alone or swapped: out right after the access before it, or
//! (when that access only reads) by a copy that runs during it; or
//! released when an earlier gap left a host copy that no write has made
//! stale; back in by the latest copy that ends when the next access starts
//! (its buffer allocated at the boundary that triggers it).

use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, simulate};
use tensile_experiments::{BoundJob, BoundReport, swap_bound};
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, Event, EventKind, Plan, Trigger};

use super::random::{Rng, random_graph, random_latencies};

/// One way a plan may swap one gap of one storage: off the device after op
/// `after` (`None`: from the iteration start, an input), back for op
/// `before` (of the next iteration when `wrap`).
#[derive(Debug, Clone, Copy)]
struct Choice {
    storage: usize,
    after: Option<usize>,
    before: usize,
    wrap: bool,
    /// The swap-out starts at this boundary plus this delay, so that it
    /// runs during the read `after` (it ends after that op starts, so the
    /// device copy goes at that op's end), instead of right after it.
    early: Option<(usize, u64)>,
}

/// One job and what its plans may do.
struct Job<'g> {
    graph: &'g Graph,
    live: Liveness,
    lat: Vec<u64>,
    /// Start of every op, then the iteration's end.
    starts: Vec<u64>,
    /// The ops writing each storage, in order.
    writes: Vec<Vec<usize>>,
    /// Per gap, the ways to swap it.
    gaps: Vec<Vec<Choice>>,
}

impl<'g> Job<'g> {
    fn new(graph: &'g Graph, lat: Vec<u64>, copy: &CopyModel, share: f64) -> Job<'g> {
        let live = Liveness::analyze(graph);
        let mut starts = vec![0u64];
        for &l in &lat {
            starts.push(starts.last().unwrap() + l);
        }
        let n = live.storages.len();
        let (mut accesses, mut writes) = (vec![Vec::new(); n], vec![Vec::new(); n]);
        for (k, op) in graph.ops().iter().enumerate() {
            let ins = op.inputs.iter().map(|t| (t, false));
            for (t, w) in ins.chain(op.outputs.iter().map(|t| (t, true))) {
                let s = live.storage_of[t.index()].index();
                if accesses[s].last() != Some(&k) {
                    accesses[s].push(k);
                }
                if w && writes[s].last() != Some(&k) {
                    writes[s].push(k);
                }
            }
        }
        let mut job = Job {
            graph,
            live,
            lat,
            starts,
            writes,
            gaps: Vec::new(),
        };
        for (s, acc) in accesses.iter().enumerate() {
            let st = &job.live.storages[s];
            let gap = |after, before, wrap| Choice {
                storage: s,
                after,
                before,
                wrap,
                early: None,
            };
            let mut gaps: Vec<Choice> = acc
                .windows(2)
                .map(|w| gap(Some(w[0]), w[1], false))
                .collect();
            if let Some(&first) = acc.first().filter(|_| st.born.is_none() && !st.persistent) {
                gaps.push(gap(None, first, false));
            }
            if let (true, Some(&first), Some(&last)) = (st.persistent, acc.first(), acc.last()) {
                gaps.push(gap(Some(last), first, true));
            }
            for g in gaps {
                if job.swap_in(&g, copy, share).is_none() {
                    continue;
                }
                let mut ways = vec![g];
                ways.extend(job.early(&g, copy, share).map(|e| Choice {
                    early: Some(e),
                    ..g
                }));
                job.gaps.push(ways);
            }
        }
        job
    }

    /// The earliest swap-out of a gap within the iteration that still
    /// frees the device copy only once the read before the gap has ended:
    /// it starts after the last write and ends after the read starts.
    fn early(&self, c: &Choice, copy: &CopyModel, share: f64) -> Option<(usize, u64)> {
        let a = c.after.filter(|_| !c.wrap)?;
        let writes = &self.writes[c.storage];
        if writes.contains(&a) {
            return None;
        }
        let written = writes
            .iter()
            .rev()
            .find(|&&w| w < a)
            .map_or(0, |&w| self.starts[w + 1]);
        let dur = copy.duration_ns(
            self.live.storages[c.storage].bytes,
            copy.d2h_bytes_per_s * share,
        );
        let from = written.max((self.starts[a] + 1).saturating_sub(dur));
        let k = self.starts.partition_point(|&x| x <= from) - 1;
        (k <= a).then(|| (k, from - self.starts[k]))
    }

    /// The latest swap-in of a gap that ends by its next access: the
    /// boundary whose end triggers it (0: the iteration start) and its
    /// delay; `None` if none fits after the storage has left.
    fn swap_in(&self, c: &Choice, copy: &CopyModel, share: f64) -> Option<(usize, u64)> {
        let bytes = self.live.storages[c.storage].bytes;
        let dur = copy.duration_ns(bytes, copy.h2d_bytes_per_s * share);
        let by = self.starts[c.before];
        // A boundary after the one where the swap-out fires.
        let lowest = match (c.wrap, c.after) {
            (true, _) => 0,
            (false, Some(a)) => a + 2,
            (false, None) => 1,
        };
        (lowest..=c.before)
            .rev()
            .find(|&k| self.starts[k] + dur <= by)
            .map(|k| (k, by - dur - self.starts[k]))
    }

    /// The trigger of boundary `k` (0: the iteration start).
    fn at(&self, k: usize) -> Trigger {
        match k {
            0 => Trigger::IterationStart,
            _ => Trigger::After(self.graph.ops()[k - 1].id),
        }
    }

    /// The plan making the swaps `chosen`: vanilla's releases after last
    /// use, then per gap its swap-out (or a release, when an earlier gap
    /// left a host copy that no write has made stale) and the latest
    /// swap-in that ends by the access after it.
    fn plan(&self, chosen: &[Choice], copy: &CopyModel, share: f64) -> Plan {
        let mut events = Event::releases_after_last_use(&self.live);
        let mut start_on_host = Vec::new();
        for s in 0..self.live.storages.len() {
            // The gaps in time order: an input's from the start first, the
            // one across the iteration's end (its swap-out) last.
            let pos = |c: &Choice| c.after.map_or(-1, |a| a as i64);
            let mut mine: Vec<&Choice> = chosen.iter().filter(|c| c.storage == s).collect();
            mine.sort_by_key(|c| (c.wrap, pos(c)));
            let tensor = self.live.storages[s].root;
            // The host's copy, as of the end of this op (-1: of the
            // previous iteration, or of the start).
            let mut host: Option<i64> = mine.iter().any(|c| c.wrap).then_some(-1);
            for c in mine {
                let a = pos(c);
                let fresh = host.is_some_and(|x| {
                    !self.writes[s]
                        .iter()
                        .any(|&w| (w as i64) > x && (w as i64) <= a)
                });
                let (trigger, delay_ns, kind) = match (fresh, c.early) {
                    (true, _) => (self.at(c.after.map_or(0, |a| a + 1)), 0, EventKind::Release),
                    (false, Some((k, delay))) => (self.at(k), delay, EventKind::SwapOut),
                    (false, None) => (self.at(c.after.map_or(0, |a| a + 1)), 0, EventKind::SwapOut),
                };
                if !fresh {
                    host = Some(a);
                }
                events.push(Event {
                    trigger,
                    delay_ns,
                    kind,
                    tensor,
                });
                if c.wrap {
                    start_on_host.push(tensor);
                }
                let (k, delay) = self.swap_in(c, copy, share).expect("only gaps that fit");
                events.push(Event {
                    trigger: self.at(k),
                    delay_ns: delay,
                    kind: EventKind::SwapIn,
                    tensor,
                });
            }
        }
        events.sort();
        Plan {
            version: 1,
            events,
            start_on_host,
            ..Plan::default()
        }
    }
}

/// The peak of running every job's plan (job `j` starting at `phases[j]`)
/// for four iterations, if no job took longer than vanilla: none if one
/// stalled, waited for a prefetch or failed.
fn run(
    jobs: &[Job<'_>],
    plans: Vec<Plan>,
    phases: &[u64],
    copy: &CopyModel,
    base: u64,
) -> Option<u64> {
    const ITERATIONS: usize = 4;
    let sim: Vec<SimJob<'_>> = jobs
        .iter()
        .zip(plans)
        .zip(phases)
        .map(|((j, p), &phase)| {
            let mut s = SimJob::new(j.graph, &j.live, p, j.lat.clone());
            s.start_ns = phase;
            s
        })
        .collect();
    let config = SimConfig {
        base_bytes: base,
        ..SimConfig::new(ITERATIONS, *copy)
    };
    let r = simulate(sim, &config, &mut FixedPlans);
    for (j, res) in jobs.iter().zip(&r.jobs) {
        let t = j.starts[j.lat.len()];
        let late = res
            .iterations
            .iter()
            .any(|i| i.stall_ns > 0 || !i.late_prefetches.is_empty() || i.end_ns - i.start_ns != t);
        if res.error.is_some() || res.iterations.len() != ITERATIONS || late {
            return None;
        }
    }
    Some(r.peak_bytes)
}

/// What the search found: the measured peak of vanilla (no swap), the
/// lowest measured peak of a plan that adds no time, and how many plans
/// added none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Search {
    pub(super) vanilla: u64,
    pub(super) best: u64,
    pub(super) time_free: usize,
}

/// Every combination of all jobs' gaps (each left alone or swapped one of
/// its ways), run.
fn search(jobs: &[Job<'_>], phases: &[u64], copy: &CopyModel, base: u64, share: f64) -> Search {
    let gaps: Vec<(usize, &[Choice])> = jobs
        .iter()
        .enumerate()
        .flat_map(|(j, job)| job.gaps.iter().map(move |g| (j, g.as_slice())))
        .collect();
    let plans: usize = gaps.iter().map(|g| g.1.len() + 1).product();
    let mut out = Search {
        vanilla: 0,
        best: u64::MAX,
        time_free: 0,
    };
    for code in 0..plans {
        // Digit i of `code` in the mixed radix: 0 leaves gap i alone.
        let mut rest = code;
        let mut chosen: Vec<Vec<Choice>> = vec![Vec::new(); jobs.len()];
        for &(j, ways) in &gaps {
            let digit = rest % (ways.len() + 1);
            rest /= ways.len() + 1;
            if digit > 0 {
                chosen[j].push(ways[digit - 1]);
            }
        }
        let built: Vec<Plan> = jobs
            .iter()
            .zip(&chosen)
            .map(|(job, c)| job.plan(c, copy, share))
            .collect();
        let Some(peak) = run(jobs, built, phases, copy, base) else {
            assert_ne!(code, 0, "vanilla adds no time");
            continue;
        };
        if code == 0 {
            out.vanilla = peak;
        }
        out.time_free += 1;
        out.best = out.best.min(peak);
    }
    out
}

/// One case: `jobs` random graphs from `seed` (equal iterations, the
/// second at a random phase) on `copy`; `None` when the graphs offer too
/// few or too many plans for an exhaustive search. Returns the search and
/// the bound's report.
pub(super) fn case(seed: u64, jobs: usize, copy: CopyModel) -> Option<(Search, BoundReport)> {
    let mut rng = Rng::new(seed);
    let graphs: Vec<Graph> = (0..jobs)
        .map(|j| random_graph(&mut rng, &format!("g{j}")))
        .collect();
    let mut lats: Vec<Vec<u64>> = graphs
        .iter()
        .map(|g| random_latencies(&mut rng, g))
        .collect();
    // Equal iterations: the simulator runs every job back to back.
    let longest = lats
        .iter()
        .map(|l| l.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    for l in &mut lats {
        let short = longest - l.iter().sum::<u64>();
        *l.last_mut().unwrap() += short;
    }
    let phases: Vec<u64> = (0..jobs)
        .map(|j| if j == 0 { 0 } else { rng.range(0, longest) })
        .collect();
    let share = if copy.shared_by_jobs {
        1.0 / jobs as f64
    } else {
        1.0
    };
    let js: Vec<Job<'_>> = graphs
        .iter()
        .zip(&lats)
        .map(|(g, l)| Job::new(g, l.clone(), &copy, share))
        .collect();
    let plans: usize = js
        .iter()
        .flat_map(|j| &j.gaps)
        .map(|g| g.len() + 1)
        .product();
    if !(4..=4096).contains(&plans) {
        return None;
    }
    let base = 1 << 20;
    let found = search(&js, &phases, &copy, base, share);
    let bound_jobs: Vec<BoundJob<'_>> = graphs
        .iter()
        .zip(&lats)
        .zip(&phases)
        .map(|((g, l), &phase_ns)| BoundJob {
            graph: g,
            latency_ns: l.clone(),
            base_bytes: base,
            phase_ns,
        })
        .collect();
    let r = swap_bound(&bound_jobs, None, &copy, 64).unwrap();
    Some((found, r))
}
