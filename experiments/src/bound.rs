//! An upper bound on what any swap plan can save: for jobs sharing one
//! GPU's host link, the lowest peak of their summed device memory that a
//! swap plan could reach without adding time, from a linear relaxation
//! solved with a real LP solver (`good_lp` on `microlp`).
//!
//! # The model it relaxes
//! Every job repeats its iteration on a common periodic time line (period
//! `C` >= every job's iteration `T_j`; a job whose iteration is shorter
//! waits at its gate, holding its base and persistent storage). Job `j`'s
//! op `k` runs on `[s_k, s_k + latency_k)` of its own time (latencies
//! added up from 0), shifted by its phase, modulo `C`. Memory follows
//! vanilla liveness ([`tensile_graph::Liveness`]): a storage is allocated
//! when its producer starts and released after its last use; persistent
//! storage and inputs are resident from the iteration's start; memory
//! changes at op boundaries only.
//!
//! A swap plan that adds no time keeps every op where it is; what it can do
//! is take idle storages off the device. At a global instant `t` a storage
//! can be absent only if it is not touched by the op running then, a copy
//! to the host ran after its last write before `t` and ended by `t` (one
//! copy made after a write serves every later gap until the next write:
//! the planner reuses host copies so), and a copy back ran from `t` until
//! the start of its next access; for persistent storage these windows wrap
//! around the iteration boundary. An input's data is there from the
//! iteration's start (its copy out may start then); a storage that no op
//! touches again (the loss) needs no copy back, and a persistent one that
//! no op writes needs no copy out (one made once serves every period).
//! Every access counts as needing the data, as in the planner and the
//! executor. The copies of all jobs share each
//! direction's bandwidth (one channel for both with
//! [`CopyModel::half_duplex`]). Relaxed to fractions of storages and
//! preemptive fluid copies, the most bytes absent at `t` is a small linear
//! program (`lp`), and no plan's peak is under
//! `max_t (M(t) - maxabsent(t))`, `M` being the jobs' vanilla memory summed
//! on the time line, bases included. It is evaluated with the program at
//! the instants where `M` is highest (solved only where its cheap bounds
//! leave the maximum undecided), and with an infinitely fast link (all
//! idle storage absent, no program) at every other op boundary.
//!
//! # What it does not cover
//! It bounds swap plans that add no time: recomputation, prefetches the
//! job waits for and every other move that trades time for memory can go
//! lower. It ignores the per-copy latency of the link and lets a copy be
//! split and paused at will, and it does not know that the executor
//! allocates a prefetch's buffer at the op boundary before its copy: all
//! of which only make it lower, never higher, than what plans reach.

mod lp;
mod model;

use std::time::Instant;

use serde::Serialize;
use tensile_graph::Graph;
use tensile_latency_model::{DeviceProfile, true_latencies};
use tensile_planner::CopyModel;

use crate::ExperimentError;
use crate::device::copy_model;
use crate::run::Run;
use lp::Program;
use model::{Candidate, JobModel};

/// One job of the bound.
#[derive(Debug, Clone)]
pub struct BoundJob<'g> {
    pub graph: &'g Graph,
    /// The latency of every op, ns, indexed by op id.
    pub latency_ns: Vec<u64>,
    /// Device memory the job always holds (context, workspaces).
    pub base_bytes: u64,
    /// Where its iteration starts on the common time line, ns (taken
    /// modulo the period).
    pub phase_ns: u64,
}

/// The lowest peak any time-free swap plan can reach (serializes with
/// serde, as the other reports).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoundReport {
    /// The peak of the jobs' summed vanilla memory over a period.
    pub vanilla_peak_bytes: u64,
    /// No swap plan that adds no time goes under this.
    pub lowest_peak_bytes: u64,
    /// The instant of the period where that is forced, ns.
    pub at_ns: u64,
    /// `vanilla_peak_bytes - lowest_peak_bytes`.
    pub max_saving_bytes: u64,
    /// `1 - lowest_peak_bytes / vanilla_peak_bytes`: the most memory saving
    /// ratio a time-free swap plan can reach.
    pub msr_bound: f64,
    /// The common period, ns.
    pub period_ns: u64,
    /// Instants looked at with the linear program (those where vanilla
    /// memory is highest).
    pub instants: usize,
    /// Programs solved among them: at the others, a feasible point found
    /// without solving showed that they could not raise the bound.
    pub lp_solves: usize,
    /// Wall time of the whole computation, ms.
    pub solve_ms: f64,
}

/// The memory of one job's vanilla iteration, step by step: (start ns,
/// bytes, base included). It is what [`swap_bound`] lays on the time line,
/// and what `planner::plan` reports as `vanilla_timeline`.
pub fn vanilla_curve(job: &BoundJob<'_>) -> Result<Vec<(u64, u64)>, ExperimentError> {
    check_latencies(0, job)?;
    Ok(JobModel::new(job.graph, &job.latency_ns, job.base_bytes, 0, None).curve())
}

fn check_latencies(j: usize, job: &BoundJob<'_>) -> Result<(), ExperimentError> {
    let ops = job.graph.ops().len();
    if job.latency_ns.len() != ops {
        return Err(ExperimentError::BoundLatencyCount {
            job: j,
            got: job.latency_ns.len(),
            ops,
        });
    }
    Ok(())
}

/// Keeps the higher bound (at the earlier instant on a tie).
fn raise(best: &mut (u64, u64), here: u64, at: u64) {
    if here > best.0 || (here == best.0 && at < best.1) {
        *best = (here, at);
    }
}

/// A stretch of the period during which no job's memory changes.
#[derive(Debug, Clone, Copy)]
struct Piece {
    at: u64,
    mem: u64,
    /// `mem` less every idle byte: the bound here with an infinite link.
    floor: u64,
}

/// The lowest peak of the jobs' summed memory that any swap plan reaches
/// without adding time, over a period of `period_ns` (`None`: the longest
/// iteration), with `link`'s bandwidths shared by all jobs. The linear
/// program runs at the `instants` op boundaries where vanilla memory is
/// highest (instants that cannot raise the bound are skipped); every other
/// boundary counts with an infinitely fast link.
pub fn swap_bound(
    jobs: &[BoundJob<'_>],
    period_ns: Option<u64>,
    link: &CopyModel,
    instants: usize,
) -> Result<BoundReport, ExperimentError> {
    let started = Instant::now();
    let (h2d, d2h) = (link.h2d_bytes_per_s, link.d2h_bytes_per_s);
    if !(h2d > 0.0 && d2h > 0.0) {
        return Err(ExperimentError::BoundBandwidth { h2d, d2h });
    }
    for (j, job) in jobs.iter().enumerate() {
        check_latencies(j, job)?;
    }
    let mut models: Vec<JobModel> = jobs
        .iter()
        .map(|j| JobModel::new(j.graph, &j.latency_ns, j.base_bytes, j.phase_ns, Some(link)))
        .collect();
    let longest = models.iter().map(JobModel::iteration_ns).max().unwrap_or(0);
    let period = period_ns.unwrap_or(longest);
    if let Some((j, m)) = models
        .iter()
        .enumerate()
        .find(|(_, m)| m.iteration_ns() > period)
    {
        return Err(ExperimentError::BoundPeriod {
            job: j,
            period_ns: period,
            iteration_ns: m.iteration_ns(),
        });
    }
    if period == 0 {
        return Err(ExperimentError::BoundEmptyPeriod);
    }
    for m in &mut models {
        m.phase_ns %= period;
    }
    // Where each job is at global time `t`: `t - phase` into its period.
    let tau = |m: &JobModel, t: u64| (t + period - m.phase_ns) % period;
    let mut times: Vec<u64> = models
        .iter()
        .flat_map(|m| m.changes(period).map(|x| (x + m.phase_ns) % period))
        .collect();
    times.sort_unstable();
    times.dedup();
    let pieces: Vec<Piece> = times
        .iter()
        .map(|&at| {
            let (mut mem, mut idle) = (0, 0);
            for m in &models {
                let s = m.state_at(tau(m, at));
                mem += m.memory(s);
                idle += m.idle_bytes(s);
            }
            Piece {
                at,
                mem,
                floor: mem - idle,
            }
        })
        .collect();
    let vanilla_peak = pieces.iter().map(|p| p.mem).max().unwrap_or(0);
    // The bound with an infinite link at every boundary (the first instant
    // of the highest), then the program where memory is highest.
    let (lowest, at_ns) = pieces
        .iter()
        .map(|p| (p.floor, p.at))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .unwrap_or((0, 0));
    let mut best = (lowest, at_ns);
    let mut order: Vec<&Piece> = pieces.iter().collect();
    order.sort_by(|a, b| b.mem.cmp(&a.mem).then(a.at.cmp(&b.at)));
    order.truncate(instants);
    // Each instant's program, and what it gives at least and at most
    // without solving it; the bound rises with the former, and instants
    // whose latter cannot raise it further are not solved.
    let mut looks: Vec<(&Piece, Program, u64)> = Vec::with_capacity(order.len());
    let mut cands: Vec<Candidate> = Vec::new();
    for p in order {
        cands.clear();
        for m in &models {
            m.candidates(tau(m, p.at), period, &mut cands);
        }
        debug_assert_eq!(cands.iter().map(|c| c.bytes).sum::<u64>(), p.mem - p.floor);
        let prog = Program::new(&cands, link, period);
        raise(&mut best, p.mem - prog.most(), p.at);
        let ceiling = p.mem - prog.greedy();
        looks.push((p, prog, ceiling));
    }
    looks.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.at.cmp(&b.0.at)));
    let mut lp_solves = 0;
    for (p, prog, ceiling) in &looks {
        if *ceiling <= best.0 {
            break;
        }
        let absent = prog.solve().map_err(|source| ExperimentError::BoundLp {
            at_ns: p.at,
            candidates: prog.storages(),
            source,
        })?;
        lp_solves += 1;
        raise(&mut best, p.mem - absent, p.at);
    }
    let (lowest, at_ns) = best;
    Ok(BoundReport {
        vanilla_peak_bytes: vanilla_peak,
        lowest_peak_bytes: lowest,
        at_ns,
        max_saving_bytes: vanilla_peak - lowest,
        msr_bound: if vanilla_peak == 0 {
            0.0
        } else {
            1.0 - lowest as f64 / vanilla_peak as f64
        },
        period_ns: period,
        instants: looks.len(),
        lp_solves,
        solve_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// The jobs of `graphs` as they run side by side on `device`, all at
/// phase 0: job `j` at its true latencies (seed `seed + j`, as the
/// simulator draws them) slowed by the device's sharing slowdown for that
/// many jobs, holding the device's base.
pub fn sharing_jobs<'g>(
    graphs: impl ExactSizeIterator<Item = &'g Graph>,
    device: &DeviceProfile,
    seed: u64,
) -> Vec<BoundJob<'g>> {
    let slow = 1.0 + device.sharing_slowdown * graphs.len().saturating_sub(1) as f64;
    graphs
        .enumerate()
        .map(|(j, g)| BoundJob {
            graph: g,
            latency_ns: true_latencies(g, device, seed.wrapping_add(j as u64))
                .iter()
                .map(|&x| (x as f64 * slow).round() as u64)
                .collect(),
            base_bytes: device.base_bytes,
            phase_ns: 0,
        })
        .collect()
}

/// The period to bound gated jobs over: the gates' (`gate_period_ns`),
/// stretched to the longest job's iteration as the bound models it (its
/// ops, and the tail its host ops leave: their last updates and the
/// fetches after them), which the gates' cycle may undercut; `None` for
/// free jobs (the bound then takes the longest iteration itself).
pub fn bound_period(
    jobs: &[BoundJob<'_>],
    gate_period_ns: Option<u64>,
    link: &CopyModel,
) -> Option<u64> {
    // Latencies that do not fit their graph: the bound names them.
    if (jobs.iter().enumerate()).any(|(j, job)| check_latencies(j, job).is_err()) {
        return gate_period_ns;
    }
    let longest = jobs
        .iter()
        .map(|j| JobModel::new(j.graph, &j.latency_ns, j.base_bytes, 0, Some(link)).iteration_ns())
        .max()?;
    gate_period_ns.map(|p| p.max(longest))
}

/// The lowest peak a time-free swap plan could reach for these jobs on the
/// device, at the phases of ours' first plan (all at 0 when it runs them
/// free), from the jobs' true latencies slowed by their sharing the GPU.
pub fn bound_peak(
    graphs: &[Graph],
    device: &DeviceProfile,
    seed: u64,
    ours: Option<&Run>,
) -> Result<u64, ExperimentError> {
    let mut jobs = sharing_jobs(graphs.iter(), device, seed);
    for (j, job) in jobs.iter_mut().enumerate() {
        job.phase_ns = ours
            .and_then(|r| r.gates.get(j).copied().flatten())
            .map_or(0, |g| g.phase_ns);
    }
    let link = copy_model(device);
    let gate = ours.and_then(|r| r.gates.iter().flatten().next().copied());
    let period = bound_period(&jobs, gate.map(|g| g.period_ns), &link);
    Ok(swap_bound(&jobs, period, &link, 64)?.lowest_peak_bytes)
}

/// The lowest of [`swap_bound`] over the jobs' phases: what the bound
/// allows whatever phases a scheduler picks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseBound {
    /// The lowest peak found (the first under `stop_below`, when given).
    pub lowest_peak_bytes: u64,
    /// The phases where it was found, ns (job 0 at 0).
    pub phases_ns: Vec<u64>,
    /// The common period: the longest iteration times the stretch.
    pub period_ns: u64,
    /// Phase choices evaluated.
    pub tried: usize,
}

/// The lowest peak any swap plan can reach on `jobs` that adds no time
/// beyond a common period `stretch` times their longest iteration (1.05:
/// the 5% a gate may add within an EOR of 0.05), over their phases: evenly
/// spread first, then, job 0 at 0, job 1 at each of `grid` steps of the
/// period (with job 2, if any, where the even spread puts it), then for
/// three jobs job 2 at each step with job 1 at its best (a search by
/// coordinates, not every pair); more jobs are only spread evenly. Stops
/// at the first choice whose bound is at most `stop_below` (the question
/// then is only whether some phases fit a budget). Each job's `phase_ns`
/// is ignored.
pub fn phase_bound(
    jobs: &[BoundJob<'_>],
    link: &CopyModel,
    stretch: f64,
    grid: u64,
    stop_below: Option<u64>,
) -> Result<PhaseBound, ExperimentError> {
    if !(stretch.is_finite() && stretch >= 1.0) {
        return Err(ExperimentError::Colocate(format!(
            "the bound's period stretch must be at least 1, got {stretch}"
        )));
    }
    for (j, job) in jobs.iter().enumerate() {
        check_latencies(j, job)?;
    }
    let longest = bound_period(jobs, Some(0), link).unwrap_or(0);
    let period = (longest as f64 * stretch).round() as u64;
    let n = jobs.len() as u64;
    let spread: Vec<u64> = (0..n).map(|j| period * j / n.max(1)).collect();
    let steps: Vec<u64> = (0..grid.max(1)).map(|i| period * i / grid.max(1)).collect();
    let mut tried = 0;
    let mut eval = |phases: &[u64]| -> Result<u64, ExperimentError> {
        let at: Vec<BoundJob<'_>> = jobs
            .iter()
            .zip(phases)
            .map(|(job, &phase_ns)| BoundJob {
                phase_ns,
                ..job.clone()
            })
            .collect();
        tried += 1;
        Ok(swap_bound(&at, Some(period), link, 64)?.lowest_peak_bytes)
    };
    let done = |b: &(u64, Vec<u64>)| stop_below.is_some_and(|s| b.0 <= s);
    let mut best = (eval(&spread)?, spread.clone());
    // Job 1, then job 2, over the steps, the others where the best is.
    for moving in 1..jobs.len().min(3) {
        for &p in &steps {
            if done(&best) {
                break;
            }
            let mut phases = best.1.clone();
            phases[moving] = p;
            if phases == best.1 {
                continue;
            }
            let peak = eval(&phases)?;
            if peak < best.0 {
                best = (peak, phases);
            }
        }
    }
    let (lowest_peak_bytes, phases_ns) = best;
    Ok(PhaseBound {
        lowest_peak_bytes,
        phases_ns,
        period_ns: period,
        tried,
    })
}
