//! Turns in the simulator: two ResNet-50 copies at batch 32 under one
//! copy's peak on the h100 (`bench colocate`'s row where sharing ran 2.6
//! times slower than vanilla co-located) made to take turns hold the
//! budget with no job's iteration running beside another's, and ours
//! takes the turns there by itself.

use tensile_baselines::Policy;
use tensile_executor::sim::SimResult;
use tensile_experiments::colocate::{self, ColocateCase};
use tensile_experiments::{device_profile, run_policy};
use tensile_graph::Liveness;
use tensile_planner::{Layout, RecomputeFirst, Turns};

/// Pairs of iterations of different jobs that ran at the same time.
fn overlaps(r: &SimResult) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    for (a, ja) in r.jobs.iter().enumerate() {
        for (b, jb) in r.jobs.iter().enumerate().skip(a + 1) {
            for (i, x) in ja.iterations.iter().enumerate() {
                for (k, y) in jb.iterations.iter().enumerate() {
                    if x.start_ns < y.end_ns && y.start_ns < x.end_ns {
                        out.push((a, i, b, k));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn jobs_taking_turns_hold_the_budget_one_at_a_time() {
    let device = device_profile("h100").unwrap();
    let case = ColocateCase::new("resnet50", 32, 2);
    let budget = colocate::one_copy_peak(&case, &device).unwrap();
    let graphs = colocate::graphs(&case, 32).unwrap();
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let run = |turns| {
        let opts = colocate::options(6, 1, Some(budget), RecomputeFirst::Never, turns);
        run_policy(&graphs, &lives, Policy::Tensile, &device, &opts, None).unwrap()
    };
    let turns = run(Turns::Always);
    assert_eq!(turns.layouts, vec![Layout::Turns; turns.layouts.len()]);
    let r = &turns.result;
    assert!(r.peak_bytes <= budget, "{} over {budget}", r.peak_bytes);
    assert!(r.jobs.iter().all(|j| j.iterations.len() == 6));
    assert_eq!(overlaps(r), Vec::new());
    // Each job's gate: one period, the other's phase past its iteration.
    let gates: Vec<_> = turns.gates.iter().map(|g| g.unwrap()).collect();
    assert_eq!(gates[0].period_ns, gates[1].period_ns);
    assert!(turns.turns_cycle_ns == gates[0].period_ns);
    // Ours, free to choose, takes the turns here: sharing predicts a
    // cycle no shorter than the turns' by its margin.
    let ours = run(Turns::WhenFaster);
    assert_eq!(
        ours.layouts.first(),
        Some(&Layout::Turns),
        "{}",
        ours.layout_note
    );
    assert!(ours.result.peak_bytes <= budget);
}
