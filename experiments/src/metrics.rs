//! What a run measured against vanilla on the same workload: per job and
//! for the system, the memory saving ratio (MSR, against vanilla that frees
//! at last use and against keep-all, the paper's base), the extra overhead
//! ratio (EOR, steady iterations), their ratio (CBR), and the lower bound
//! no plan goes under (the largest working set of one op plus the base)
//! with the saving there (`msr_max`).

use serde::Serialize;
use tensile_baselines::Policy;
use tensile_executor::IterationStats;
use tensile_executor::sim::{JobResult, SimResult};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::DeviceProfile;

use crate::policy::serialize_policy;
use crate::run::{Run, SimOptions};

/// The figures of one job, or of the system (all jobs together).
#[derive(Debug, Serialize, Default, Clone)]
pub struct Metrics {
    pub name: String,
    pub peak_vanilla_bytes: u64,
    pub peak_bytes: u64,
    /// What the planner predicted under its first plan.
    pub predicted_peak_bytes: u64,
    pub msr: f64,
    pub msr_vs_keepall: f64,
    pub time_vanilla_s: f64,
    pub time_s: f64,
    pub eor: f64,
    /// `None` (`null`) stands for infinity (no overhead).
    pub cbr: Option<f64>,
    pub stall_s: f64,
    pub passive_swaps: usize,
    pub swapped_bytes: u64,
    pub recomputed_ops: usize,
    pub plan_ms: f64,
    pub replans: usize,
    /// What no plan can go under: for a job, the largest working set of any
    /// one op plus the base; for the system, the sum over jobs.
    pub lower_bound_bytes: u64,
    /// The saving at the lower bound: how far any plan could go.
    pub msr_max: f64,
    /// How far the job went over its memory budget at most (Capuchin's
    /// passive mode when even evicting everything cannot fit).
    pub over_budget_bytes: u64,
    /// Time the job waited for memory under the budget (part of `stall_s`),
    /// and what the guard did: prefetches held back, storages evicted.
    pub memory_wait_s: f64,
    pub held_back: usize,
    pub guard_evictions: usize,
    /// Planned prefetches that arrived after their op wanted them.
    pub late_prefetches: usize,
}

impl Metrics {
    /// Derives the ratios from the measured figures; `keepall`: the peak
    /// when nothing is freed inside the iteration.
    fn finish(&mut self, keepall: u64) {
        self.msr = 1.0 - self.peak_bytes as f64 / self.peak_vanilla_bytes.max(1) as f64;
        self.msr_max = 1.0 - self.lower_bound_bytes as f64 / self.peak_vanilla_bytes.max(1) as f64;
        self.msr_vs_keepall = 1.0 - self.peak_bytes as f64 / keepall.max(1) as f64;
        self.eor = self.time_s / self.time_vanilla_s.max(1e-12) - 1.0;
        self.cbr = (self.eor > 1e-9).then(|| self.msr / self.eor);
    }
}

/// One run of a policy on a workload, against vanilla (`sim --json`).
#[derive(Debug, Serialize, Clone)]
pub struct SimReport {
    pub device: String,
    #[serde(serialize_with = "serialize_policy")]
    pub policy: Policy,
    pub iterations: usize,
    pub seed: u64,
    pub jobs: Vec<Metrics>,
    pub system: Metrics,
    pub predicted_sum_of_peaks_bytes: u64,
    pub predicted_aligned_peak_bytes: u64,
    /// Wall time of the first (cold-start) plan of all jobs together.
    pub first_plan_ms: f64,
    /// Mean and worst wall time of a re-plan of all jobs.
    pub replan_mean_ms: f64,
    pub replan_max_ms: f64,
    /// Where the cold-start latencies came from, and their error against
    /// the simulated device's true latencies (Σ|p − t| / Σ t).
    pub cold_start_latencies: String,
    pub cold_start_error: f64,
    /// The lowest system peak any swap plan that adds no time could reach
    /// on this link, at the run's phases (a linear relaxation: no plan goes
    /// under it), and the saving it stands for; `None` where it was not
    /// computed (built without the `bound` feature).
    pub bound_peak_bytes: Option<u64>,
    pub msr_bound: Option<f64>,
}

/// Mean iteration time after the first (cold-start) iteration.
fn steady_time_s(r: &JobResult) -> f64 {
    let its = if r.iterations.len() > 1 {
        &r.iterations[1..]
    } else {
        &r.iterations[..]
    };
    let total: u64 = its.iter().map(|i| i.end_ns - i.start_ns).sum();
    total as f64 / its.len().max(1) as f64 / 1e9
}

/// The lower bound of one job: the largest working set of any one op, plus
/// the device's base (`tensile-plan-job`'s).
pub use tensile_plan_job::lower_bound_bytes;

/// The metrics of `run` against `vanilla`, per job and for the system.
pub fn report(
    graphs: &[Graph],
    lives: &[Liveness],
    profile: &DeviceProfile,
    opts: &SimOptions,
    policy: Policy,
    vanilla: &Run,
    run: &Run,
) -> SimReport {
    let mut jobs = Vec::new();
    for (j, g) in graphs.iter().enumerate() {
        let (v, r) = (&vanilla.result.jobs[j], &run.result.jobs[j]);
        let last = r.iterations.last();
        let mut m = Metrics {
            name: g.name().to_string(),
            peak_vanilla_bytes: v.peak_bytes(),
            peak_bytes: r.peak_bytes(),
            predicted_peak_bytes: run.predicted_peaks[j],
            time_vanilla_s: steady_time_s(v),
            time_s: steady_time_s(r),
            stall_s: r.iterations.iter().map(|i| i.stall_ns).sum::<u64>() as f64 / 1e9,
            passive_swaps: r.iterations.iter().map(|i| i.passive_swaps).sum(),
            swapped_bytes: last.map_or(0, |i| i.swapped_bytes),
            recomputed_ops: last.map_or(0, |i| i.recomputed_ops),
            lower_bound_bytes: lower_bound_bytes(g, &lives[j], profile),
            over_budget_bytes: r
                .iterations
                .iter()
                .map(|i| i.over_budget_bytes)
                .max()
                .unwrap_or(0),
            memory_wait_s: r.iterations.iter().map(|i| i.memory_wait_ns).sum::<u64>() as f64 / 1e9,
            held_back: r.iterations.iter().map(|i| i.held_back).sum(),
            guard_evictions: r.iterations.iter().map(|i| i.guard_evictions).sum(),
            late_prefetches: r.iterations.iter().map(|i| i.late_prefetches.len()).sum(),
            ..Metrics::default()
        };
        m.finish(lives[j].keep_all_footprint().peak + profile.base_bytes);
        jobs.push(m);
    }
    let keepall: u64 = lives
        .iter()
        .map(|l| l.keep_all_footprint().peak + profile.base_bytes)
        .sum();
    let mut system = Metrics {
        name: "system".into(),
        peak_vanilla_bytes: vanilla.result.peak_bytes,
        peak_bytes: run.result.peak_bytes,
        time_vanilla_s: vanilla.result.makespan_ns as f64 / 1e9,
        time_s: run.result.makespan_ns as f64 / 1e9,
        stall_s: jobs.iter().map(|m| m.stall_s).sum(),
        passive_swaps: jobs.iter().map(|m| m.passive_swaps).sum(),
        swapped_bytes: jobs.iter().map(|m| m.swapped_bytes).sum(),
        recomputed_ops: jobs.iter().map(|m| m.recomputed_ops).sum(),
        plan_ms: run.plan_ms,
        replans: run.replans,
        lower_bound_bytes: jobs.iter().map(|m| m.lower_bound_bytes).sum(),
        over_budget_bytes: jobs.iter().map(|m| m.over_budget_bytes).max().unwrap_or(0),
        memory_wait_s: jobs.iter().map(|m| m.memory_wait_s).sum(),
        held_back: jobs.iter().map(|m| m.held_back).sum(),
        guard_evictions: jobs.iter().map(|m| m.guard_evictions).sum(),
        late_prefetches: jobs.iter().map(|m| m.late_prefetches).sum(),
        ..Metrics::default()
    };
    system.finish(keepall);
    let replans = run.plan_runs_ms.get(1..).unwrap_or_default();
    SimReport {
        device: profile.name.clone(),
        policy,
        iterations: opts.iterations,
        seed: opts.seed,
        jobs,
        system,
        predicted_sum_of_peaks_bytes: run.predicted.0,
        predicted_aligned_peak_bytes: run.predicted.1,
        first_plan_ms: run.plan_runs_ms.first().copied().unwrap_or(0.0),
        replan_mean_ms: replans.iter().fold(0.0, |s, x| s + x) / replans.len().max(1) as f64,
        replan_max_ms: replans.iter().copied().fold(0.0, f64::max),
        cold_start_latencies: run.predicted_from.clone(),
        cold_start_error: run.cold_start_error,
        bound_peak_bytes: None,
        msr_bound: None,
    }
}

/// (MSR, EOR) of one iteration range against vanilla's steady iteration,
/// over the jobs: the lowest saving and the highest overhead. `first`: the
/// cold-start iteration alone, else the iterations after it (Table I).
pub fn phase_metrics(vanilla: &Run, run: &Run, first: bool) -> Option<(f64, f64)> {
    let mut msr = f64::INFINITY;
    let mut eor = f64::NEG_INFINITY;
    for (v, r) in vanilla.result.jobs.iter().zip(&run.result.jobs) {
        let its = if first {
            r.iterations.get(..1)?
        } else {
            r.iterations.get(1..).filter(|i| !i.is_empty())?
        };
        let vits = v.iterations.get(1..).filter(|i| !i.is_empty())?;
        let mean = |x: &[IterationStats]| -> f64 {
            x.iter()
                .map(|i| (i.end_ns - i.start_ns) as f64)
                .sum::<f64>()
                / x.len() as f64
        };
        let peak = its.iter().map(|i| i.peak_bytes).max()? as f64;
        msr = msr.min(1.0 - peak / v.peak_bytes().max(1) as f64);
        eor = eor.max(mean(its) / mean(vits).max(1.0) - 1.0);
    }
    Some((msr, eor))
}

/// The jobs' memory added up over time: (ns, bytes) at every instant at
/// which any job's memory changes.
pub fn total_trace(result: &SimResult) -> Vec<(u64, u64)> {
    let traces: Vec<&[(u64, u64)]> = result.jobs.iter().map(|j| j.trace.as_slice()).collect();
    tensile_executor::trace::summed(&traces)
}
