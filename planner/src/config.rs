//! What the planner is told about the device's copy link and about each job.

/// The host link as the planner models it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyModel {
    /// Host to device, bytes per second (the whole link).
    pub h2d_bytes_per_s: f64,
    /// Device to host, bytes per second (the whole link).
    pub d2h_bytes_per_s: f64,
    /// Fixed cost of every copy.
    pub latency_ns: u64,
    /// One queue for both directions (the TENSILE paper's model) instead of
    /// one copy engine per direction.
    pub half_duplex: bool,
    /// Jobs share the link in equal parts; otherwise every job plans as if it
    /// had the whole link (the paper's model, which ignores contention).
    pub shared_by_jobs: bool,
    /// How fast one job's host ops (optimizer updates on the host CPU)
    /// move host memory, bytes read and written per second: a host op
    /// takes [`tensile_graph::Graph::host_traffic_bytes`] over this, plus
    /// the copy latency. Each job's host ops run one after another, on
    /// the job's own CPU threads.
    pub host_bytes_per_s: f64,
}

impl CopyModel {
    /// Two copy engines at the given bandwidths, shared by all jobs.
    pub fn duplex(h2d_bytes_per_s: f64, d2h_bytes_per_s: f64, latency_ns: u64) -> CopyModel {
        CopyModel {
            h2d_bytes_per_s,
            d2h_bytes_per_s,
            latency_ns,
            half_duplex: false,
            shared_by_jobs: true,
            host_bytes_per_s: CopyModel::DEFAULT_HOST_BYTES_PER_S,
        }
    }

    /// The host update bandwidth of a device that does not say: torch's
    /// CPU `_fused_adam_` measured on the 2 cores of the build machine,
    /// 0.93 G parameters per second (28 bytes each; one core: 0.60 G),
    /// bound by the machine's memory bandwidth.
    pub const DEFAULT_HOST_BYTES_PER_S: f64 = 26e9;

    /// Nanoseconds the host takes for a host op that moves `bytes`.
    pub fn host_ns(&self, bytes: u64) -> u64 {
        self.duration_ns(bytes, self.host_bytes_per_s)
    }

    /// Nanoseconds to move `bytes` at `bytes_per_s`, plus the fixed latency.
    pub fn duration_ns(&self, bytes: u64, bytes_per_s: f64) -> u64 {
        self.latency_ns + (bytes as f64 / bytes_per_s * 1e9).ceil() as u64
    }
}

/// Per-job knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobSettings {
    /// The most this job's swapped tensors may be of all swapped tensors.
    pub max_swap_rate: f64,
    /// Fixed device memory of the job (CUDA context, workspaces).
    pub base_bytes: u64,
    pub swap: bool,
    pub recompute: bool,
    /// Swap optimizer-updated persistent tensors out after their update and
    /// back before their first use in the next iteration.
    pub across_iteration: bool,
}

impl Default for JobSettings {
    fn default() -> JobSettings {
        JobSettings {
            max_swap_rate: 1.0,
            base_bytes: 0,
            swap: true,
            recompute: true,
            across_iteration: true,
        }
    }
}

/// The planner's configuration for all jobs on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannerConfig {
    pub copy: CopyModel,
    /// The most device memory all jobs together may use (the sum of their
    /// peaks). Swaps that add no time come first; while the sum exceeds
    /// this, recomputations and swaps that make the jobs wait follow, the
    /// cheapest per byte first.
    pub budget_bytes: Option<u64>,
    /// Stop planning as soon as the jobs' peaks add up to no more than
    /// `budget_bytes` (Capuchin's goal: just fit), instead of swapping
    /// everything that can be hidden (TENSILE's: save all that is free).
    pub stop_at_budget: bool,
    /// Cap on greedy rounds, so a pathological input cannot run away.
    pub max_rounds: usize,
    /// How many producers deep a recomputation may reach.
    pub max_recompute_depth: usize,
    /// To meet the budget, the planner may make a job's iteration this much
    /// longer than its vanilla iteration (a fraction of it: 1.0 doubles the
    /// time), with prefetches that the job waits for and recomputations
    /// beyond the ones that fit; a move that would go further is not made.
    /// The default, 3.0, is about what PyTorch's synchronous offloading
    /// (`save_on_cpu`) costs on the zoo's CNNs.
    pub max_overhead: f64,
    /// Work bound on one call of [`crate::plan`]: the most moves it may
    /// try (every swap it tries to place, every budget move it tries on a
    /// copy of a job, in every layout it plans; `PlanProfile::moves_tried`
    /// counts them). The search checks it between moves and, once there,
    /// stops and returns what it has: every move made so far, each of which
    /// left every job's plan valid (a plan is built only from placed swaps
    /// and applied moves, never from a half-made one). So a capped plan is
    /// valid and executable; it may save less memory than an uncapped one
    /// (and may then be over the budget, with an `OverBudget` diagnostic);
    /// it carries a `PlanningCapped` diagnostic. Work, not time: the same
    /// inputs give the same plan however busy the machine is. `None`: no
    /// bound.
    pub max_moves: Option<u64>,
    /// Wall-clock cap on one call of [`crate::plan`], checked where
    /// `max_moves` is: a safety net for a machine far slower than the work
    /// bound was sized on (a plan it stops depends on the machine's load;
    /// `PlanProfile::time_capped` says so). `None`: no cap.
    pub time_cap: Option<std::time::Duration>,
    /// Coordinate the jobs (two or more, whose iterations are within 15% of
    /// each other's: they share one period): gate every job's iterations to a
    /// common period with its own phase so that their memory curves
    /// interleave, plan their copies on one common time line over the
    /// whole link, and bound the aligned sum's peak by `budget_bytes`
    /// instead of the sum of the jobs' peaks.
    pub coordinate: bool,
    /// The gates' period is the longest planned iteration times `1 +
    /// gate_slack`, so that gates keep the phases when iterations run a
    /// little longer than predicted (a job that runs late does not wait);
    /// for three jobs or more, at least [`crate::MANY_JOBS_SLACK`].
    pub gate_slack: f64,
    /// Coordinated jobs are planned on their latencies times `1 +
    /// pace_pad`, and their executors keep to that time line (never ahead):
    /// an op that runs a little long is absorbed by the padding of the next
    /// ones instead of moving the job off its phase.
    pub pace_pad: f64,
    /// Coordinated jobs' copies are planned at this share of the link's
    /// bandwidth: they end early, and a copy that starts late (behind
    /// another job's) still ends in time.
    pub coordinated_link: f64,
    /// Coordinated jobs plan for the budget less this share of it, and stop
    /// saving once under it (the rest is headroom for a run that differs
    /// from its plan).
    pub coordinated_margin: f64,
    /// Which coordinated jobs that swaps alone leave over the budget are
    /// planned again recomputing first, then swapping around the
    /// recomputations (see `search_coordinated`), keeping the lower plan.
    pub recompute_first: RecomputeFirst,
    /// How co-running jobs slow each other (the device profile's
    /// `sharing_slowdown`): each of `k` jobs running at once runs at `1 /
    /// (1 + sharing_slowdown * (k - 1))` of its speed alone. The latencies
    /// of jobs that share the device are taken as measured (or predicted)
    /// beside the others; those of jobs taking turns, alone
    /// (`JobInput::turns`). 0: sharing costs nothing.
    pub sharing_slowdown: f64,
    /// When budgeted, coordinated jobs take turns ([`Turns`]).
    pub turns: Turns,
}

impl PlannerConfig {
    pub fn new(copy: CopyModel) -> PlannerConfig {
        PlannerConfig {
            copy,
            budget_bytes: None,
            stop_at_budget: false,
            max_rounds: 1_000_000,
            max_recompute_depth: 3,
            max_overhead: 3.0,
            max_moves: None,
            time_cap: None,
            coordinate: false,
            gate_slack: 0.005,
            pace_pad: 0.03,
            coordinated_link: 0.95,
            coordinated_margin: 0.03,
            recompute_first: RecomputeFirst::default(),
            sharing_slowdown: 0.0,
            turns: Turns::default(),
        }
    }
}

/// When coordinated jobs that swaps alone leave over the budget are
/// planned again recomputing first (`PlannerConfig::recompute_first`).
/// Recomputing first fits gated jobs at a shorter cycle where their swaps
/// fill the link, at several times the planning time. For two jobs it
/// rarely pays: their phases are half a period apart and a longer cycle
/// costs them little, and on a fast link the gated plans it makes look
/// cheaper than the free ones but run worse (two ResNet-50 b24 on the h100,
/// seed 1: EOR 0.51 against 0.08 free). For three jobs or more, whose swaps
/// crowd the link, it fits more runs (three ResNet-50 copies as processes,
/// simulated a6000, seeds 1 to 16, fractions 0.5 to 1: 18 of 80 runs at
/// EOR <= 0.05 against 10, mean EOR 0.157 against 0.279).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecomputeFirst {
    /// Never: swaps alone, then a longer cycle.
    Never,
    /// For three coordinated jobs or more (the default).
    #[default]
    ManyJobs,
    /// For any number of coordinated jobs.
    Always,
}

impl RecomputeFirst {
    /// Whether `jobs` coordinated jobs are planned recomputing first.
    pub fn applies(self, jobs: usize) -> bool {
        match self {
            RecomputeFirst::Never => false,
            RecomputeFirst::ManyJobs => jobs >= crate::MANY_JOBS,
            RecomputeFirst::Always => true,
        }
    }

    /// `never`, `many-jobs` or `always`.
    pub fn parse(s: &str) -> Result<RecomputeFirst, String> {
        match s {
            "never" => Ok(RecomputeFirst::Never),
            "many-jobs" => Ok(RecomputeFirst::ManyJobs),
            "always" => Ok(RecomputeFirst::Always),
            _ => Err(format!(
                "recompute-first: expected never, many-jobs or always, got {s:?}"
            )),
        }
    }
}

/// When jobs under a budget (`PlannerConfig::coordinate`, two jobs or
/// more) take turns on the device instead of sharing it
/// (`PlannerConfig::turns`): one job's iterations at a time, on gates whose
/// period is the sum of the jobs' iterations alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Turns {
    /// Never: the jobs share the device, free or gated.
    Never,
    /// When the turns fit the budget and their predicted throughput beats
    /// sharing's (or sharing does not fit and turns do): never slower, by
    /// the planner's prediction, than the jobs one after another.
    #[default]
    WhenFaster,
    /// Always (what taking turns costs, for benches).
    Always,
}

impl Turns {
    /// `never`, `when-faster` or `always`.
    pub fn parse(s: &str) -> Result<Turns, String> {
        match s {
            "never" => Ok(Turns::Never),
            "when-faster" => Ok(Turns::WhenFaster),
            "always" => Ok(Turns::Always),
            _ => Err(format!(
                "turns: expected never, when-faster or always, got {s:?}"
            )),
        }
    }
}
