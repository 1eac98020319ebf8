//! Plan updating (SPEC §4.7): an EWMA of every op's measured latency, and a
//! re-plan of all jobs when a job's total changes by more than a threshold
//! since its last plan, when a job reports its first measurements (the
//! cold-start plan was made from predictions only), or when a planned
//! prefetch arrived late: that tensor's swap-in then gets a lead of the
//! measured lateness plus 5%, growing by 5% at every further miss
//! (Capuchin's feedback). New plans carry a higher version; executors switch
//! at their next iteration boundary.

use std::collections::BTreeMap;
use std::time::Instant;

use tensile_graph::{Graph, TensorId};
use tensile_planner::{JobInput, JobSettings, MultiPlan, Plan, PlanError, PlannerConfig, plan};

use crate::machine::IterationStats;
use crate::sim::Replanner;

#[derive(Debug)]
pub struct EwmaReplanner<'g> {
    graphs: Vec<&'g Graph>,
    settings: Vec<JobSettings>,
    config: PlannerConfig,
    /// Weight of a new measurement.
    pub weight: f64,
    /// Re-plan when |Σ now − Σ at last plan| / Σ at last plan exceeds this.
    pub threshold: f64,
    estimates: Vec<Vec<f64>>,
    at_plan: Vec<f64>,
    /// Whether the job has reported measurements yet.
    measured: Vec<bool>,
    /// Per job, the prefetch lead of tensors whose swap-in came late.
    leads: Vec<BTreeMap<TensorId, u64>>,
    /// Per job, the waits the current plan accepts (to meet a budget), by
    /// storage root of the inputs waited for: such a prefetch is late on
    /// purpose, and only lateness beyond it is fed back.
    planned_late: Vec<BTreeMap<TensorId, u64>>,
    version: u64,
    /// Wall time of every planning run, ns.
    pub plan_ns: Vec<u64>,
    pub replans: usize,
    /// False: measurements are folded in but plans never change.
    pub enabled: bool,
}

impl<'g> EwmaReplanner<'g> {
    /// Starts from `predicted` latencies (ns per op, per job).
    pub fn new(
        graphs: Vec<&'g Graph>,
        predicted: Vec<Vec<u64>>,
        settings: Vec<JobSettings>,
        config: PlannerConfig,
    ) -> EwmaReplanner<'g> {
        let estimates: Vec<Vec<f64>> = predicted
            .iter()
            .map(|p| p.iter().map(|&x| x as f64).collect())
            .collect();
        EwmaReplanner {
            at_plan: estimates.iter().map(|e| e.iter().sum()).collect(),
            measured: vec![false; graphs.len()],
            leads: vec![BTreeMap::new(); graphs.len()],
            planned_late: vec![BTreeMap::new(); graphs.len()],
            graphs,
            settings,
            config,
            weight: 0.9,
            threshold: 0.3,
            estimates,
            version: 0,
            plan_ns: Vec::new(),
            replans: 0,
            enabled: true,
        }
    }

    /// Plans every job from the current estimates.
    pub fn plan_all(&mut self) -> Result<MultiPlan, PlanError> {
        let inputs: Vec<JobInput<'_>> = self
            .graphs
            .iter()
            .zip(&self.estimates)
            .zip(&self.settings)
            .zip(&self.leads)
            .map(|(((g, e), s), leads)| JobInput {
                prefetch_lead_ns: leads.clone(),
                ..JobInput::new(g, e.iter().map(|&x| x.round() as u64).collect(), *s)
            })
            .collect();
        let t = Instant::now();
        let mut out = plan(&inputs, &self.config)?;
        self.plan_ns.push(t.elapsed().as_nanos() as u64);
        self.version += 1;
        for p in &mut out.plans {
            p.version = self.version;
        }
        self.at_plan = self.estimates.iter().map(|e| e.iter().sum()).collect();
        for ((late, p), g) in self
            .planned_late
            .iter_mut()
            .zip(&out.plans)
            .zip(&self.graphs)
        {
            late.clear();
            for w in &p.prediction.waits {
                for &t in &g.op(w.op).inputs {
                    let wait = late.entry(g.storage_root(t)).or_insert(0);
                    *wait = (*wait).max(w.ns);
                }
            }
        }
        Ok(out)
    }
}

impl Replanner for EwmaReplanner<'_> {
    fn after_iteration(&mut self, job: usize, stats: &IterationStats) -> Vec<(usize, Plan)> {
        let w = self.weight;
        for (e, &m) in self.estimates[job].iter_mut().zip(&stats.op_ns) {
            *e = w * m as f64 + (1.0 - w) * *e;
        }
        let now: f64 = self.estimates[job].iter().sum();
        let base = self.at_plan[job].max(1.0);
        let first = !std::mem::replace(&mut self.measured[job], true);
        let mut late = false;
        for &(t, wait) in &stats.late_prefetches {
            // A planned wait is no miss; only what comes on top of it (with
            // 5% slack) moves the prefetch earlier.
            let planned = self.planned_late[job].get(&t).copied().unwrap_or(0);
            let planned = planned + planned / 20;
            if wait <= planned {
                continue;
            }
            late = true;
            let lead = self.leads[job].entry(t).or_insert(0);
            *lead = ((*lead + wait - planned) as f64 * 1.05).ceil() as u64;
        }
        let drift = (now - base).abs() / base > self.threshold;
        if !self.enabled || !(first || drift || late) {
            return Vec::new();
        }
        self.replans += 1;
        match self.plan_all() {
            Ok(mp) => mp.plans.into_iter().enumerate().collect(),
            Err(_) => Vec::new(),
        }
    }
}
