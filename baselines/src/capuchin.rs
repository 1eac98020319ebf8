//! Capuchin. Not built yet: every iteration runs the vanilla plan.

use tensile_executor::sim::Replanner;
use tensile_executor::{ExecOptions, IterationStats};
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, Plan};

use crate::common;

/// Capuchin's planner over the simulator's iterations: one per run, for
/// all jobs, each job with its own memory budget.
#[derive(Debug)]
pub struct Capuchin<'g> {
    lives: Vec<&'g Liveness>,
    budgets: Vec<u64>,
}

impl<'g> Capuchin<'g> {
    /// `budgets`: each job's memory budget, bytes (base included).
    pub fn new(
        graphs: Vec<&'g Graph>,
        lives: Vec<&'g Liveness>,
        budgets: Vec<u64>,
        copy: CopyModel,
    ) -> Capuchin<'g> {
        let _ = (graphs, copy);
        Capuchin { lives, budgets }
    }

    /// The plans of the first (passive) iteration.
    pub fn initial_plans(&self) -> Vec<Plan> {
        self.lives.iter().map(|l| common::vanilla(l)).collect()
    }

    /// How job `job`'s executor runs.
    pub fn exec_options(&self, job: usize) -> ExecOptions {
        ExecOptions {
            evict_budget_bytes: self.budgets.get(job).copied(),
            ..ExecOptions::default()
        }
    }
}

impl Replanner for Capuchin<'_> {
    fn after_iteration(&mut self, _: usize, _: &IterationStats) -> Vec<(usize, Plan)> {
        Vec::new()
    }
}
