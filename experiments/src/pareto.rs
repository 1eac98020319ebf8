//! Where ours does not Pareto-dominate a baseline: neither ours on its own
//! nor ours at the baseline's peak (`tensile@B`) has at least the
//! baseline's MSR at no more EOR, with a slack of [`EPS`] on both.

use serde::Serialize;
use tensile_baselines::Policy;

use crate::bench::{PolicyOutcome, WorkloadOutcome};
use crate::policy::{RunPolicy, serialize_policy};

/// Two policies are compared with this slack on MSR and EOR.
pub const EPS: f64 = 1e-3;

/// A (workload, baseline) pair where ours does not dominate.
#[derive(Debug, Clone, Serialize)]
pub struct Loss {
    pub workload: String,
    #[serde(serialize_with = "serialize_policy")]
    pub baseline: Policy,
    /// Ours (at the baseline's peak where it ran) minus the baseline.
    pub d_msr: f64,
    pub d_eor: f64,
}

/// The Pareto summary over some workloads.
#[derive(Debug, Clone, Default)]
pub struct Dominance {
    /// Pairs where ours dominates, out of all pairs where both ran.
    pub dominated: usize,
    pub compared: usize,
    pub losses: Vec<Loss>,
}

/// Compares ours with every baseline that ran, on every workload.
pub fn dominance(workloads: &[WorkloadOutcome]) -> Dominance {
    let mut out = Dominance::default();
    let system = |p: &PolicyOutcome| p.report.as_ref().map(|r| (r.system.msr, r.system.eor));
    for w in workloads {
        let find = |policy: RunPolicy| w.policies.iter().find(|p| p.policy == policy);
        let Some(ours) = find(RunPolicy::Plain(Policy::Tensile)).and_then(system) else {
            continue;
        };
        for p in &w.policies {
            let RunPolicy::Plain(baseline) = p.policy else {
                continue;
            };
            if matches!(baseline, Policy::Tensile | Policy::Vanilla) {
                continue;
            }
            let Some(theirs) = system(p) else { continue };
            out.compared += 1;
            let at_budget = find(RunPolicy::OursAtBudgetOf(baseline)).and_then(system);
            let dominates = |o: (f64, f64)| o.0 >= theirs.0 - EPS && o.1 <= theirs.1 + EPS;
            if dominates(ours) || at_budget.is_some_and(dominates) {
                out.dominated += 1;
            } else {
                let ours = at_budget.unwrap_or(ours);
                out.losses.push(Loss {
                    workload: w.workload.clone(),
                    baseline,
                    d_msr: ours.0 - theirs.0,
                    d_eor: ours.1 - theirs.1,
                });
            }
        }
    }
    out
}
