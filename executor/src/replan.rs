//! The simulator's side of re-planning: measurements of a finished
//! iteration in the planner's terms, and our re-planner timed by the wall
//! clock (the planner keeps none), as the CLI and the benchmarks report it.

use std::sync::Arc;
use std::time::Instant;

use tensile_graph::Graph;
use tensile_planner::{
    JobId, JobSettings, Layout, Measurements, MultiPlan, Plan, PlannerConfig, Replan, ReplanError,
    Replanner,
};

use crate::interface::IterationStats;

impl IterationStats {
    /// What the planners need of this iteration.
    pub fn measurements(&self) -> Measurements {
        Measurements {
            op_ns: self.op_ns.clone(),
            late_prefetches: self.late_prefetches.clone(),
            start_bytes: self.start_bytes,
            evictions: self.evictions.clone(),
            switched: self.switched,
            iteration_ns: self.end_ns - self.start_ns,
            plan_version: self.plan_version,
        }
    }
}

/// [`Replanner`] with the wall time of every planning run.
#[derive(Debug)]
pub struct TimedReplanner {
    pub inner: Replanner,
    /// Wall time of every planning run, ns.
    pub plan_ns: Vec<u64>,
    /// The layout of every plan handed out, in order: how the jobs shared
    /// the device as the run went on.
    pub layouts: Vec<Layout>,
}

impl TimedReplanner {
    /// Jobs `0..n` (their index is their [`JobId`]) starting from
    /// `predicted` latencies (ns per op, per job).
    pub fn new(
        graphs: Vec<Arc<Graph>>,
        predicted: &[Vec<u64>],
        settings: &[JobSettings],
        config: PlannerConfig,
    ) -> Result<TimedReplanner, ReplanError> {
        let mut inner = Replanner::new(config);
        for (j, ((g, p), s)) in graphs.into_iter().zip(predicted).zip(settings).enumerate() {
            inner.add_job(JobId(j as u64), g, p, *s)?;
        }
        Ok(TimedReplanner {
            inner,
            plan_ns: Vec::new(),
            layouts: Vec::new(),
        })
    }

    /// Plans every job from the current estimates, timed.
    pub fn plan_all(&mut self) -> Result<MultiPlan, ReplanError> {
        let t = Instant::now();
        let out = self.inner.plan_all();
        self.plan_ns.push(t.elapsed().as_nanos() as u64);
        if let Ok(mp) = &out {
            self.layouts.push(mp.layout);
        }
        out
    }
}

impl Replan for TimedReplanner {
    fn after_iteration(
        &mut self,
        job: JobId,
        measured: &Measurements,
    ) -> Result<Vec<(JobId, Plan)>, ReplanError> {
        let plan_ns = &mut self.plan_ns;
        let layouts = &mut self.layouts;
        self.inner.replan_after(job, measured, |r| {
            let t = Instant::now();
            let out = r.plan_due();
            plan_ns.push(t.elapsed().as_nanos() as u64);
            if let Ok(Some(mp)) = &out {
                layouts.push(mp.layout);
            }
            out
        })
    }

    fn anchor_job(&self) -> Option<JobId> {
        self.inner.anchor_job()
    }
}
