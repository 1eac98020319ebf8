//! The co-location bench's steady-state EOR: measured over the window in
//! which every job runs beside the others, so that jobs that ran one after
//! another cannot look faster than jobs that shared the GPU.

use tensile_executor::IterationStats;
use tensile_executor::sim::{JobResult, SimResult};
use tensile_experiments::colocate::steady_eor;

/// A run whose job `j` starts its iterations at `starts[j]` (ms).
fn run(starts: &[Vec<u64>]) -> SimResult {
    SimResult {
        jobs: starts
            .iter()
            .map(|s| JobResult {
                iterations: s
                    .iter()
                    .map(|&ms| IterationStats {
                        start_ns: ms * 1_000_000,
                        ..IterationStats::default()
                    })
                    .collect(),
                ..JobResult::default()
            })
            .collect(),
        peak_bytes: 0,
        makespan_ns: 0,
        replan_errors: Vec::new(),
    }
}

fn every(period: u64, from: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| from + i * period).collect()
}

#[test]
fn side_by_side_runs_compare_by_their_throughput() {
    // Two jobs at 100 ms side by side, against the same at 110 ms, and at
    // 100 and 125 ms (one job slower): 8/9 and (1/100+1/100)/(1/100+1/125).
    let vanilla = run(&[every(100, 0, 12), every(100, 50, 12)]);
    let slower = run(&[every(110, 0, 12), every(110, 55, 12)]);
    let eor = steady_eor(&vanilla, &slower, 4);
    assert!((eor - 0.1).abs() < 1e-9, "{eor}");
    let one_slow = run(&[every(100, 0, 12), every(125, 30, 12)]);
    let eor = steady_eor(&vanilla, &one_slow, 4);
    assert!((eor - (0.02 / 0.018 - 1.0)).abs() < 1e-3, "{eor}");
    assert!(steady_eor(&vanilla, &vanilla, 4).abs() < 1e-12);
}

#[test]
fn jobs_that_ran_one_after_another_do_not_count_as_sharing() {
    // Vanilla shares the GPU at 180 ms an iteration each; ours ran the
    // second job only after the first was done, each at 100 ms alone.
    let vanilla = run(&[every(180, 0, 12), every(180, 90, 12)]);
    let serial = run(&[every(100, 0, 12), every(100, 1200, 12)]);
    assert_eq!(steady_eor(&vanilla, &serial, 4), f64::INFINITY);
    // A job without its warm-up iterations has no steady state either.
    let short = run(&[every(100, 0, 12), every(100, 50, 3)]);
    assert_eq!(steady_eor(&vanilla, &short, 4), f64::INFINITY);
}
