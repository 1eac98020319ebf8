//! The swap bound ([`swap_bound`]): its memory curve is the planner's
//! vanilla curve; no plan that adds no time goes under it (every plan of
//! small random graphs, run in the simulator; ours on ResNet-50); a faster
//! link never raises it and an infinitely fast one leaves the largest
//! working set; bad input is an error that names what is wrong.

mod exhaustive;
mod random;

use tensile_baselines::Policy;
use tensile_experiments::bound::vanilla_curve;
use tensile_experiments::device::{copy_model, job_settings, planner_config};
use tensile_experiments::{BoundJob, BoundReport, bound_period, device_profile, swap_bound};
use tensile_graph::builder::Step;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness};
use tensile_latency_model::{DeviceProfile, true_latencies};
use tensile_planner::{CopyModel, JobInput, plan};

use crate::util::resnet50;

fn link(gbps: f64, half_duplex: bool, latency_ns: u64) -> CopyModel {
    let mut c = CopyModel::duplex(gbps * 1e9, gbps * 1e9, latency_ns);
    c.half_duplex = half_duplex;
    c
}

fn job<'g>(g: &'g Graph, p: &DeviceProfile, phase_ns: u64) -> BoundJob<'g> {
    BoundJob {
        graph: g,
        latency_ns: true_latencies(g, p, 1),
        base_bytes: p.base_bytes,
        phase_ns,
    }
}

/// The links of the exhaustive cases: GB/s each way, half duplex, latency.
const LINKS: [(f64, bool, u64); 4] = [
    (2.0, false, 0),
    (4.0, true, 2_000),
    (16.0, false, 1_000),
    (1e6, false, 0),
];

/// Every small random case with `jobs` jobs on a few links: the bound is
/// never over the best time-free plan; returns how many cases, how many of
/// them the bound meets exactly, and how many needed a program solved.
fn exhaustive_cases(jobs: usize) -> (usize, usize, usize) {
    let (mut cases, mut tight, mut solved) = (0, 0, 0);
    for seed in 0..60u64 {
        for (gbps, half, latency) in LINKS {
            let l = link(gbps, half, latency);
            let Some((found, r)) = exhaustive::case(seed, jobs, l) else {
                continue;
            };
            let (lowest, vanilla) = (r.lowest_peak_bytes, r.vanilla_peak_bytes);
            let what = format!("seed {seed}, {jobs} job(s), {l:?}: {found:?}");
            assert_eq!(found.vanilla, vanilla, "{what}: vanilla as measured");
            assert!(found.time_free > 1, "{what}: some swap adds no time");
            assert!(
                lowest <= found.best,
                "{what}: the bound {lowest} is over the best time-free plan"
            );
            cases += 1;
            tight += usize::from(lowest == found.best);
            solved += usize::from(r.lp_solves > 0);
        }
    }
    (cases, tight, solved)
}

#[test]
fn no_time_free_plan_of_one_small_job_goes_under_the_bound() {
    let (cases, tight, solved) = exhaustive_cases(1);
    assert!(cases >= 50, "{cases} cases");
    // Not trivially loose: some plans reach it exactly.
    assert!(tight >= 10, "{tight} of {cases} tight");
    // The link binds in some: the program is checked too.
    assert!(solved >= 4, "{solved} of {cases} solved a program");
}

#[test]
fn no_time_free_plan_of_two_small_jobs_with_phases_goes_under_the_bound() {
    let (cases, tight, solved) = exhaustive_cases(2);
    assert!(cases >= 100, "{cases} cases");
    assert!(tight >= 1, "{tight} of {cases} tight");
    assert!(solved >= 20, "{solved} of {cases} solved a program");
}

#[test]
fn the_curve_is_the_planners_vanilla_curve() {
    let g = resnet50(4);
    let p = device_profile("a6000").unwrap();
    let j = job(&g, &p, 0);
    let input = JobInput::new(&g, j.latency_ns.clone(), job_settings(Policy::Vanilla, &p));
    let mp = plan(&[input], &planner_config(&p, None, false)).unwrap();
    let curve = vanilla_curve(&j).unwrap();
    assert_eq!(curve, mp.plans[0].prediction.vanilla_timeline);
    let r = swap_bound(&[j], None, &copy_model(&p), 64).unwrap();
    assert_eq!(
        r.vanilla_peak_bytes,
        mp.plans[0].prediction.vanilla_peak_bytes
    );
}

#[test]
fn ours_never_goes_under_the_bound() {
    let g = resnet50(16);
    for device in ["a6000", "paper"] {
        let p = device_profile(device).unwrap();
        let config = planner_config(&p, None, false);
        let count = if device == "a6000" { 2 } else { 1 };
        for k in 1..=count {
            let jobs: Vec<BoundJob<'_>> = (0..k).map(|_| job(&g, &p, 0)).collect();
            let inputs: Vec<JobInput<'_>> = jobs
                .iter()
                .map(|j| JobInput::new(&g, j.latency_ns.clone(), job_settings(Policy::Tensile, &p)))
                .collect();
            let mp = plan(&inputs, &config).unwrap();
            let r = swap_bound(&jobs, None, &config.copy, 64).unwrap();
            let what = format!("{k} x resnet50 b16 on {device}: {r:?}");
            for pl in &mp.plans {
                assert_eq!(
                    pl.prediction.planned_time_ns, pl.prediction.vanilla_time_ns,
                    "{what}"
                );
            }
            assert!(
                mp.aligned_peak_bytes >= r.lowest_peak_bytes,
                "{what}: ours {}",
                mp.aligned_peak_bytes
            );
            assert!(mp.sum_of_peaks_bytes >= r.lowest_peak_bytes, "{what}");
            assert!(r.lowest_peak_bytes < r.vanilla_peak_bytes, "{what}");
            assert_eq!(
                r.vanilla_peak_bytes, mp.vanilla_sum_of_peaks_bytes,
                "{what}"
            );
        }
    }
}

/// With the updates on the host the bound knows what the planner does:
/// host ops take no device time, the state takes no device memory, and
/// the parameters need no copy out; ours, one job or two sharing the
/// link, is never under it.
#[test]
fn ours_never_goes_under_the_bound_with_updates_on_the_host() {
    let p = device_profile("a6000").unwrap();
    let config = planner_config(&p, None, false);
    for model in ["resnet50", "bert_base"] {
        let g = zoo::build(
            model,
            &ZooConfig {
                step: Step::OnHost,
                ..ZooConfig::new(4)
            },
        )
        .unwrap();
        for k in 1..=2 {
            let jobs: Vec<BoundJob<'_>> = (0..k).map(|_| job(&g, &p, 0)).collect();
            let inputs: Vec<JobInput<'_>> = jobs
                .iter()
                .map(|j| JobInput::new(&g, j.latency_ns.clone(), job_settings(Policy::Tensile, &p)))
                .collect();
            let mp = plan(&inputs, &config).unwrap();
            let r = swap_bound(&jobs, None, &config.copy, 64).unwrap();
            let what = format!("{k} x {model} b4 adam-on-host: {r:?}");
            assert!(mp.sum_of_peaks_bytes >= r.lowest_peak_bytes, "{what}");
            assert!(mp.aligned_peak_bytes >= r.lowest_peak_bytes, "{what}");
            assert!(r.lowest_peak_bytes < r.vanilla_peak_bytes, "{what}");
        }
    }
}

/// A gate's period can be shorter than a job's iteration as the bound
/// models it when host ops leave a tail after its last op (the last
/// updates, the fetches after them): the gated jobs are then bounded over
/// their iteration, not refused.
#[test]
fn gated_jobs_with_a_host_tail_are_bounded_over_their_iteration() {
    let p = device_profile("h100").unwrap();
    let link = copy_model(&p);
    let g = zoo::build(
        "bert_base",
        &ZooConfig {
            step: Step::OnHost,
            ..ZooConfig::new(8)
        },
    )
    .unwrap();
    let jobs = [job(&g, &p, 0), job(&g, &p, 0)];
    let ops: u64 = jobs[0].latency_ns.iter().sum();
    let err = swap_bound(&jobs, Some(ops), &link, 16).expect_err("the host tail is longer");
    assert!(
        err.to_string()
            .contains("is shorter than job 0's iteration"),
        "{err}"
    );
    let period = bound_period(&jobs, Some(ops), &link).unwrap();
    assert!(period > ops, "{period} over {ops}");
    let r = swap_bound(&jobs, Some(period), &link, 16).unwrap();
    assert!(r.lowest_peak_bytes < r.vanilla_peak_bytes, "{r:?}");
    assert_eq!(bound_period(&jobs, None, &link), None);
}

#[test]
fn a_faster_link_never_raises_the_bound() {
    let g = resnet50(8);
    let p = device_profile("a6000").unwrap();
    let live = Liveness::analyze(&g);
    let floor = live.largest_working_set(&g) + p.base_bytes;
    for half in [false, true] {
        for jobs in [vec![job(&g, &p, 0)], vec![job(&g, &p, 0), job(&g, &p, 0)]] {
            let mut last: Option<BoundReport> = None;
            for gbps in [0.5, 2.0, 8.0, 32.0, 128.0, f64::INFINITY] {
                let r = swap_bound(&jobs, None, &link(gbps, half, 0), 64).unwrap();
                if let Some(l) = &last {
                    assert!(
                        r.lowest_peak_bytes <= l.lowest_peak_bytes,
                        "{gbps} GB/s: {r:?} after {l:?}"
                    );
                }
                last = Some(r);
            }
            // An infinite link takes off all that is idle: what is left is
            // the largest working set of one op (and the base), per job.
            let inf = last.unwrap();
            assert_eq!(inf.lowest_peak_bytes, floor * jobs.len() as u64);
            assert_eq!(inf.lp_solves, 0);
            // A real link binds: the program raises the bound above that.
            let slow = swap_bound(&jobs, None, &link(8.0, half, 0), 64).unwrap();
            assert!(slow.lowest_peak_bytes > inf.lowest_peak_bytes, "{slow:?}");
            // A longer period leaves every window as long or longer.
            let t: u64 = jobs[0].latency_ns.iter().sum();
            let long = swap_bound(&jobs, Some(2 * t), &link(8.0, half, 0), 64).unwrap();
            assert!(
                long.lowest_peak_bytes <= slow.lowest_peak_bytes,
                "{long:?} {slow:?}"
            );
        }
    }
}

#[test]
fn two_jobs_apart_in_phase_are_bounded_on_one_time_line() {
    let g = resnet50(8);
    let p = device_profile("a6000").unwrap();
    let l = copy_model(&p);
    let t: u64 = true_latencies(&g, &p, 1).iter().sum();
    let one = swap_bound(&[job(&g, &p, 0)], None, &l, 64).unwrap();
    let apart = |a: u64, b: u64| {
        // Every instant, so that which ones are looked at cannot differ.
        swap_bound(&[job(&g, &p, a), job(&g, &p, b)], None, &l, usize::MAX).unwrap()
    };
    let r = apart(0, t / 2);
    assert_eq!(r.period_ns, t);
    // Their peaks no longer meet.
    assert!(r.vanilla_peak_bytes < 2 * one.vanilla_peak_bytes, "{r:?}");
    assert!(
        r.lowest_peak_bytes < r.vanilla_peak_bytes && r.at_ns < t,
        "{r:?}"
    );
    // Only where the jobs are relative to each other counts.
    let shifted = apart(t / 4, 3 * t / 4);
    assert_eq!(
        (shifted.vanilla_peak_bytes, shifted.lowest_peak_bytes),
        (r.vanilla_peak_bytes, r.lowest_peak_bytes)
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["lowest_peak_bytes"], r.lowest_peak_bytes);
    assert!(json["msr_bound"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_input_is_named() {
    let g = resnet50(1);
    let p = device_profile("a6000").unwrap();
    let l = copy_model(&p);
    let mut short = job(&g, &p, 0);
    short.latency_ns.pop();
    let ops = g.ops().len();
    let err = swap_bound(&[job(&g, &p, 0), short], None, &l, 8)
        .unwrap_err()
        .to_string();
    let want = format!("job 1 has {} latencies for a graph of {ops} ops", ops - 1);
    assert!(err.contains(&want), "{err}");
    let t: u64 = job(&g, &p, 0).latency_ns.iter().sum();
    let err = swap_bound(&[job(&g, &p, 0)], Some(t - 1), &l, 8)
        .unwrap_err()
        .to_string();
    let want = format!(
        "the period of {} ns is shorter than job 0's iteration of {t} ns",
        t - 1
    );
    assert!(err.contains(&want), "{err}");
    let err = swap_bound(&[job(&g, &p, 0)], None, &link(0.0, false, 0), 8).unwrap_err();
    assert!(
        err.to_string().contains("bandwidths must be positive"),
        "{err}"
    );
    let err = swap_bound(&[], None, &l, 8).unwrap_err().to_string();
    assert!(err.contains("period is 0 ns"), "{err}");
}
