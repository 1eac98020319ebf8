//! Budgets that hold: whatever the plans got wrong, the run never holds
//! more than the budget they were made for. Random mixes of one to three
//! jobs (small zoo models, their updates after the backward pass, inside
//! it, or inside it on the host; each its own seed of per-op latency), planned
//! from latencies that err by up to a factor of two either way per op,
//! coordinated or not, run with kernels that slow each other down under a
//! budget between what no plan goes under and the jobs' vanilla peaks: the
//! simulator's measured peak of all jobs together is within the budget in
//! every case, every job finishes (or, where even evicting everything
//! cannot fit, stops with an error naming the op), and the guard is what
//! kept it there when the plan alone would not have.

use proptest::prelude::*;
use tensile_executor::sim::{FixedPlans, SimConfig, SimJob, simulate};
use tensile_graph::builder::{Optimizer, Step};
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{Graph, Liveness, OpId, TensorId};
use tensile_planner::{
    CopyModel, JobId, JobInput, JobSettings, Measurements, MultiPlan, Plan, RecomputeFirst,
    ReplanReason, Replanner, plan,
};

use crate::latencies;

const BASE: u64 = 64 << 20;

/// The jobs planned together under `budget` from the latencies they
/// believe, each with the base `BASE`.
fn plan_all(
    graphs: &[Graph],
    believed: &[Vec<u64>],
    copy: CopyModel,
    budget: u64,
    coordinate: bool,
) -> MultiPlan {
    let settings = JobSettings {
        base_bytes: BASE,
        ..JobSettings::default()
    };
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .zip(believed)
        .map(|(g, l)| JobInput::new(g, l.clone(), settings))
        .collect();
    let mut cfg = tensile_planner::PlannerConfig::new(copy);
    cfg.budget_bytes = Some(budget);
    cfg.coordinate = coordinate;
    plan(&inputs, &cfg).unwrap()
}

/// The jobs to simulate: each graph under its plan, at its true latencies.
fn sim_jobs<'g>(
    graphs: &'g [Graph],
    lives: &'g [Liveness],
    plans: Vec<Plan>,
    truth: &[Vec<u64>],
) -> Vec<SimJob<'g>> {
    graphs
        .iter()
        .zip(lives)
        .zip(plans)
        .zip(truth)
        .map(|(((g, live), p), t)| SimJob::new(g, live, p, t.clone()))
        .collect()
}

/// A small zoo model: ResNet-50, VGG-16 or BERT-base at a small batch and
/// size, with Adam after the backward pass or inside it.
fn model(which: u8, batch: u64, step: Step) -> Graph {
    let (name, resolution) = match which % 3 {
        0 => ("resnet50", 64),
        1 => ("vgg16", 64),
        _ => ("bert_base", 32),
    };
    let cfg = ZooConfig {
        resolution: Some(resolution),
        optimizer: Optimizer::adam(),
        step,
        ..ZooConfig::new(batch)
    };
    zoo::build(name, &cfg).unwrap()
}

/// A deterministic per-op factor in [1/2, 2] from `seed`.
fn skew(lat: &[u64], seed: u64) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    lat.iter()
        .map(|&l| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = 2f64.powf((x % 2001) as f64 / 1000.0 - 1.0);
            ((l as f64 * f) as u64).max(1)
        })
        .collect()
}

fn vanilla_peak(g: &Graph) -> u64 {
    Liveness::analyze(g).vanilla_footprint().peak + BASE
}

fn lower_bound(g: &Graph) -> u64 {
    Liveness::analyze(g).largest_working_set(g) + BASE
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn the_measured_peak_never_exceeds_the_budget(
        mix in proptest::collection::vec((0u8..3, 1u64..4, 0usize..3), 1..4),
        seed in 0u64..1000,
        tightness in 0.0f64..1.0,
        coordinate in any::<bool>(),
        sharing in prop_oneof![Just(0.0), Just(0.9)],
    ) {
        let graphs: Vec<Graph> = mix
            .iter()
            .map(|&(m, b, step)| model(m, b, Step::ALL[step]))
            .collect();
        let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
        let truth: Vec<Vec<u64>> = graphs
            .iter()
            .enumerate()
            .map(|(j, g)| skew(&latencies(g), seed + 7 * j as u64))
            .collect();
        // The plans believe other latencies: off by up to 2x per op.
        let believed: Vec<Vec<u64>> = truth
            .iter()
            .enumerate()
            .map(|(j, t)| skew(t, seed.wrapping_mul(31) + j as u64))
            .collect();
        let floor: u64 = graphs.iter().map(lower_bound).sum();
        let top: u64 = graphs.iter().map(vanilla_peak).sum();
        let budget = floor + ((top - floor) as f64 * tightness) as u64;
        let copy = CopyModel::duplex(4e9, 4e9, 5_000);
        let mp = plan_all(&graphs, &believed, copy, budget, coordinate);
        let jobs = sim_jobs(&graphs, &lives, mp.plans, &truth);
        let config = SimConfig {
            sharing_slowdown: sharing,
            base_bytes: BASE,
            budget_bytes: Some(budget),
            shared_link: mp.cycle_ns > 0,
            ..SimConfig::new(3, copy)
        };
        let r = simulate(jobs, &config, &mut FixedPlans);
        prop_assert!(
            r.peak_bytes <= budget,
            "measured {} over the budget {} (floor {floor}, vanilla {top})",
            r.peak_bytes,
            budget
        );
        for (j, res) in r.jobs.iter().enumerate() {
            match &res.error {
                None => prop_assert_eq!(res.iterations.len(), 3, "job {} stopped early", j),
                Some(e) => prop_assert!(
                    e.to_string().contains("more bytes of device memory"),
                    "job {}: {}",
                    j,
                    e
                ),
            }
        }
    }
}

/// A re-planner coordinating `graphs` under `budget`, job `j` registered
/// with the latencies `believed[j]`.
fn coordinated_replanner(
    graphs: &[Graph],
    believed: &[Vec<u64>],
    copy: CopyModel,
    budget: u64,
) -> Replanner {
    let mut cfg = tensile_planner::PlannerConfig::new(copy);
    cfg.budget_bytes = Some(budget);
    cfg.coordinate = true;
    let mut replanner = Replanner::new(cfg);
    let settings = JobSettings {
        base_bytes: BASE,
        ..JobSettings::default()
    };
    for (j, g) in graphs.iter().enumerate() {
        replanner
            .add_job(JobId(j as u64), g.clone().into(), &believed[j], settings)
            .unwrap();
    }
    replanner
}

/// Two copies of one small model, a budget halfway between what no plan
/// goes under and their vanilla peaks together, and a link of 4 GB/s each
/// way.
fn two_copies_halfway() -> (Vec<Graph>, u64, CopyModel) {
    let graphs: Vec<Graph> = (0..2).map(|_| model(0, 3, Step::AtEnd)).collect();
    let floor: u64 = graphs.iter().map(lower_bound).sum();
    let top: u64 = graphs.iter().map(vanilla_peak).sum();
    let budget = (floor + top) / 2;
    (graphs, budget, CopyModel::duplex(4e9, 4e9, 5_000))
}

/// The same with the re-planner in the loop: plans replaced between
/// iterations (gates moved, persistent storage moved) never take the run
/// over the budget either.
#[test]
fn replanned_coordinated_jobs_stay_within_the_budget() {
    let (graphs, budget, copy) = two_copies_halfway();
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let truth: Vec<Vec<u64>> = graphs
        .iter()
        .enumerate()
        .map(|(j, g)| skew(&latencies(g), 11 + j as u64))
        .collect();
    let believed: Vec<Vec<u64>> = (0..graphs.len())
        .map(|j| skew(&truth[j], 99 + j as u64))
        .collect();
    let mut replanner = coordinated_replanner(&graphs, &believed, copy, budget);
    let first = replanner.plan_all().unwrap();
    let jobs = sim_jobs(&graphs, &lives, first.plans, &truth);
    let config = SimConfig {
        sharing_slowdown: 0.9,
        base_bytes: BASE,
        budget_bytes: Some(budget),
        shared_link: first.cycle_ns > 0,
        ..SimConfig::new(8, copy)
    };
    let r = simulate(jobs, &config, &mut replanner);
    assert!(r.peak_bytes <= budget, "{} over {budget}", r.peak_bytes);
    assert!(
        r.jobs
            .iter()
            .all(|j| j.error.is_none() && j.iterations.len() == 8)
    );
}

/// The guard is what holds the budget: among plans made from wrong
/// latencies, some take the run over the budget without it, and every one
/// of those stays within it with it (evicting or waiting, counted).
#[test]
fn without_the_guard_wrong_plans_go_over_and_with_it_they_do_not() {
    let copy = CopyModel::duplex(4e9, 4e9, 5_000);
    let mut caught = 0;
    for seed in 0..12u64 {
        let graphs: Vec<Graph> = (0..2u64).map(|j| model(0, 2 + j, Step::AtEnd)).collect();
        let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
        let truth: Vec<Vec<u64>> = graphs
            .iter()
            .enumerate()
            .map(|(j, g)| skew(&latencies(g), seed * 13 + j as u64))
            .collect();
        let believed: Vec<Vec<u64>> = truth
            .iter()
            .enumerate()
            .map(|(j, t)| skew(t, seed * 101 + 7 + j as u64))
            .collect();
        let floor: u64 = graphs.iter().map(lower_bound).sum();
        let top: u64 = graphs.iter().map(vanilla_peak).sum();
        let budget = floor + (top - floor) / 3;
        let mp = plan_all(&graphs, &believed, copy, budget, true);
        let run = |guard: Option<u64>| {
            let jobs = sim_jobs(&graphs, &lives, mp.plans.clone(), &truth);
            let config = SimConfig {
                sharing_slowdown: 0.9,
                base_bytes: BASE,
                budget_bytes: guard,
                shared_link: mp.cycle_ns > 0,
                ..SimConfig::new(3, copy)
            };
            simulate(jobs, &config, &mut FixedPlans)
        };
        if run(None).peak_bytes <= budget {
            continue;
        }
        let held = run(Some(budget));
        assert!(
            held.peak_bytes <= budget,
            "seed {seed}: {} over {budget}",
            held.peak_bytes
        );
        if held.jobs.iter().any(|j| j.error.is_some()) {
            // Even evicting everything cannot fit (a job's state alone is
            // over what the others leave): refused, named, never over.
            continue;
        }
        caught += 1;
        let acted: u64 = held
            .jobs
            .iter()
            .flat_map(|j| &j.iterations)
            .map(|i| i.memory_wait_ns + i.guard_evictions as u64 + i.held_back as u64)
            .sum();
        assert!(acted > 0, "seed {seed}: the guard did nothing");
    }
    assert!(
        caught >= 3,
        "only {caught} of 12 wrong plans went over the budget without the guard"
    );
}

/// Jobs that run gated stay gated when re-planned from latencies that now
/// look too far apart to share one period (one job measured while gated,
/// its ops faster than its cold-start estimate while the other's are
/// still estimated): a free plan made from those latencies would promise
/// more than running free gives. The same latencies from jobs without
/// gates plan them ungated sharing: free, or taking turns where those are
/// predicted faster.
#[test]
fn gated_jobs_stay_gated_when_their_latencies_drift_apart() {
    let (graphs, budget, copy) = two_copies_halfway();
    let lat = latencies(&graphs[0]);
    let first = plan_all(&graphs, &[lat.clone(), lat.clone()], copy, budget, true);
    assert!(first.cycle_ns > 0, "the first plan is not gated");
    let faster: Vec<u64> = lat.iter().map(|x| x * 7 / 10).collect();
    let settings = JobSettings {
        base_bytes: BASE,
        ..JobSettings::default()
    };
    let mut cfg = tensile_planner::PlannerConfig::new(copy);
    cfg.budget_bytes = Some(budget);
    cfg.coordinate = true;
    let replan = |gated: bool| {
        let inputs: Vec<JobInput<'_>> = graphs
            .iter()
            .zip([&faster, &lat])
            .zip(&first.plans)
            .map(|((g, l), p)| JobInput {
                gate: p.gate.filter(|_| gated),
                ..JobInput::new(g, l.clone(), settings)
            })
            .collect();
        plan(&inputs, &cfg).unwrap()
    };
    let kept = replan(true);
    assert!(kept.cycle_ns > 0, "re-planned free: {:?}", kept.diagnostics);
    let free = replan(false);
    assert_ne!(
        free.layout,
        tensile_planner::Layout::Gated,
        "jobs that ran free re-planned as gated sharing: {}",
        free.layout_note
    );
    assert!(
        free.layout == tensile_planner::Layout::Turns || free.cycle_ns == 0,
        "a free plan with a cycle"
    );
}

/// The planner's choice for three copies at `budget`, as jobs that run free
/// now (`runs_free`) and whose runs did or did not contradict their free
/// plans (`free_missed`) would get it.
fn choice(
    graphs: &[Graph],
    lat: &[u64],
    copy: CopyModel,
    budget: u64,
    runs_free: bool,
    missed: bool,
) -> MultiPlan {
    let settings = JobSettings {
        base_bytes: BASE,
        ..JobSettings::default()
    };
    let mut cfg = tensile_planner::PlannerConfig::new(copy);
    cfg.budget_bytes = Some(budget);
    cfg.coordinate = true;
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .map(|g| JobInput {
            runs_free,
            free_missed: missed,
            ..JobInput::new(g, lat.to_vec(), settings)
        })
        .collect();
    plan(&inputs, &cfg).unwrap()
}

/// Jobs that run free keep running free while a free plan fits, even where
/// the planner would gate the same jobs starting afresh (a switch costs
/// every job a realignment, and during it both plans' copies share the
/// link), and take the gates once a run contradicted the free plan (the
/// guard evicted for it).
#[test]
fn jobs_that_run_free_stay_free_until_a_run_contradicts_their_plan() {
    let graphs: Vec<Graph> = (0..3).map(|_| model(0, 3, Step::AtEnd)).collect();
    let lat = latencies(&graphs[0]);
    let floor: u64 = graphs.iter().map(lower_bound).sum();
    let top: u64 = graphs.iter().map(vanilla_peak).sum();
    let copy = CopyModel::duplex(32e9, 32e9, 5_000);
    // Budgets at which fresh jobs are gated although a free plan fits,
    // since the free plan costs more time.
    for sixteenths in [13, 14] {
        let budget = floor + (top - floor) * sixteenths / 16;
        let free = plan_all(&graphs, &vec![lat.clone(); 3], copy, budget, false);
        assert!(
            free.sum_of_peaks_bytes <= budget,
            "budget {budget}: no free plan fits"
        );
        let fresh = choice(&graphs, &lat, copy, budget, false, false);
        assert!(fresh.cycle_ns > 0, "budget {budget}: fresh jobs run free");
        let staying = choice(&graphs, &lat, copy, budget, true, false);
        assert_eq!(
            staying.cycle_ns, 0,
            "budget {budget}: jobs running free were gated"
        );
        assert!(staying.sum_of_peaks_bytes <= budget);
        let missed = choice(&graphs, &lat, copy, budget, true, true);
        assert!(
            missed.cycle_ns > 0,
            "budget {budget}: a missed free plan was kept"
        );
        assert!(missed.aligned_peak_bytes <= budget);
    }
}

/// A free job whose guard evicted to hold the budget asks for a re-plan
/// (`FreeMissed`), and the re-plan gates the jobs; iterations that kept
/// their plan ask for nothing.
#[test]
fn a_free_run_the_guard_evicted_for_is_replanned_gated() {
    let graphs: Vec<Graph> = (0..3).map(|_| model(0, 3, Step::AtEnd)).collect();
    let lat = latencies(&graphs[0]);
    let floor: u64 = graphs.iter().map(lower_bound).sum();
    let top: u64 = graphs.iter().map(vanilla_peak).sum();
    // Free plans fit it at no cost in time.
    let budget = top - (top - floor) / 64;
    let copy = CopyModel::duplex(32e9, 32e9, 5_000);
    let mut replanner = coordinated_replanner(&graphs, &vec![lat.clone(); 3], copy, budget);
    let first = replanner.plan_all().unwrap();
    assert_eq!(first.cycle_ns, 0, "the first plan is gated");
    let kept = Measurements {
        op_ns: lat.clone(),
        iteration_ns: lat.iter().sum(),
        ..Measurements::default()
    };
    for j in 0..3 {
        let reason = replanner.observe(JobId(j), &kept).unwrap();
        assert_eq!(reason, Some(ReplanReason::FirstMeasurements));
    }
    let second = replanner.plan_due().unwrap().unwrap();
    assert_eq!(
        second.cycle_ns, 0,
        "measurements as predicted gated the jobs"
    );
    assert_eq!(replanner.observe(JobId(1), &kept).unwrap(), None);
    let evicted = Measurements {
        evictions: vec![(TensorId(0), OpId(0))],
        ..kept.clone()
    };
    let reason = replanner.observe(JobId(1), &evicted).unwrap();
    assert_eq!(reason, Some(ReplanReason::FreeMissed));
    let third = replanner.plan_due().unwrap().unwrap();
    assert!(third.cycle_ns > 0, "the jobs still run free");
    assert!(third.aligned_peak_bytes <= budget);
    // Once is enough: it does not ask again for the same jobs.
    assert_eq!(replanner.observe(JobId(2), &kept).unwrap(), None);
}

/// Recomputing first (`recompute_first`): on a link that the coordinated
/// jobs' swaps fill, a recomputation added after the swaps moves their
/// copies into the other jobs' and is refused, so swaps alone fit only on
/// a longer cycle; recomputing first, the swaps are placed around the
/// recomputations and the jobs fit on a shorter one. Run from latencies
/// that err, the plan holds the budget too.
#[test]
fn recomputing_first_fits_coordinated_jobs_on_a_shorter_cycle() {
    let graphs: Vec<Graph> = (0..3).map(|_| model(0, 3, Step::AtEnd)).collect();
    let lives: Vec<Liveness> = graphs.iter().map(Liveness::analyze).collect();
    let lat = latencies(&graphs[0]);
    let floor: u64 = graphs.iter().map(lower_bound).sum();
    let top: u64 = graphs.iter().map(vanilla_peak).sum();
    let budget = floor + (top - floor) * 12 / 16;
    let copy = CopyModel::duplex(32e9, 32e9, 5_000);
    let settings = JobSettings {
        base_bytes: BASE,
        ..JobSettings::default()
    };
    // Jobs that run gated now: the planner keeps them gated.
    let gate = tensile_planner::Gate {
        period_ns: 1,
        phase_ns: 0,
        epoch_ns: 0,
    };
    let inputs: Vec<JobInput<'_>> = graphs
        .iter()
        .map(|g| JobInput {
            gate: Some(gate),
            ..JobInput::new(g, lat.clone(), settings)
        })
        .collect();
    let at = |recompute_first: RecomputeFirst| {
        let mut cfg = tensile_planner::PlannerConfig::new(copy);
        cfg.budget_bytes = Some(budget);
        cfg.coordinate = true;
        cfg.recompute_first = recompute_first;
        plan(&inputs, &cfg).unwrap()
    };
    let recomputed =
        |mp: &MultiPlan| -> usize { mp.plans.iter().map(|p| p.prediction.recomputed_ops).sum() };
    let swaps = at(RecomputeFirst::Never);
    // Three jobs are many: the default recomputes first.
    let first = at(RecomputeFirst::default());
    assert_eq!(first.cycle_ns, at(RecomputeFirst::Always).cycle_ns);
    assert!(swaps.cycle_ns > 0 && first.cycle_ns > 0);
    assert!(swaps.aligned_peak_bytes <= budget && first.aligned_peak_bytes <= budget);
    assert!(
        first.cycle_ns < swaps.cycle_ns,
        "recomputing first: cycle {} ns, swaps alone {} ns",
        first.cycle_ns,
        swaps.cycle_ns
    );
    assert!(recomputed(&first) > recomputed(&swaps));
    let truth: Vec<Vec<u64>> = (0..3).map(|j| skew(&lat, 7 + j)).collect();
    let jobs = sim_jobs(&graphs, &lives, first.plans, &truth);
    let config = SimConfig {
        sharing_slowdown: 0.9,
        base_bytes: BASE,
        budget_bytes: Some(budget),
        shared_link: true,
        ..SimConfig::new(4, copy)
    };
    let r = simulate(jobs, &config, &mut FixedPlans);
    assert!(r.peak_bytes <= budget, "{} over {budget}", r.peak_bytes);
    assert!(
        r.jobs
            .iter()
            .all(|j| j.error.is_none() && j.iterations.len() == 4)
    );
}

/// A plan taken only to shorten the period (the gated jobs kept their pace
/// and their ops ran faster than planned) is tried: when a job then misses
/// its pace on it, the plans before it, which held, come back, and no
/// shorter period is tried again for the same jobs.
#[test]
fn a_shorter_plan_that_does_not_hold_gives_way_to_the_one_before() {
    let (graphs, budget, copy) = two_copies_halfway();
    let lat = latencies(&graphs[0]);
    let mut replanner = coordinated_replanner(&graphs, &[lat.clone(), lat.clone()], copy, budget);
    let first = replanner.plan_all().unwrap();
    let period = first.cycle_ns;
    assert!(period > 0, "the first plan is gated");
    // Ops at 70% of their estimates, each iteration held to the period by
    // the pace: the measurements ask for a plan only if it is shorter.
    let fast: Vec<u64> = lat.iter().map(|x| x * 7 / 10).collect();
    let iteration = |ns: u64, switched: bool| Measurements {
        op_ns: fast.clone(),
        iteration_ns: ns,
        switched,
        ..Measurements::default()
    };
    for j in 0..2 {
        // The first iteration is left out.
        assert_eq!(
            replanner
                .observe(JobId(j), &iteration(period, false))
                .unwrap(),
            None
        );
        assert_eq!(
            replanner
                .observe(JobId(j), &iteration(period, false))
                .unwrap(),
            Some(ReplanReason::FirstMeasurements)
        );
    }
    let shorter = replanner.plan_due().unwrap().expect("a shorter plan");
    assert!(
        shorter.cycle_ns < period,
        "{} not under {period}",
        shorter.cycle_ns
    );
    // Job 1 reports an iteration that began on the plans before: it says
    // nothing about the shorter ones.
    let long = period * 11 / 10;
    assert_eq!(
        replanner
            .observe(JobId(1), &iteration(long, false))
            .unwrap(),
        None
    );
    // Job 0 switches, settles, and runs past the shorter period.
    assert_eq!(
        replanner.observe(JobId(0), &iteration(long, true)).unwrap(),
        None
    );
    assert_eq!(
        replanner
            .observe(JobId(0), &iteration(long, false))
            .unwrap(),
        None
    );
    assert_eq!(
        replanner
            .observe(JobId(0), &iteration(long, false))
            .unwrap(),
        Some(ReplanReason::ShorterMissed)
    );
    let back = replanner.plan_due().unwrap().expect("the plans before");
    assert_eq!(back.cycle_ns, period);
    assert_eq!(back.plans.len(), first.plans.len());
    for (b, f) in back.plans.iter().zip(&first.plans) {
        assert_eq!(b.version, shorter.plans[0].version + 1, "a new version");
        assert_eq!((&b.events, b.gate), (&f.events, f.gate), "the same plan");
    }
    // On them, ops even faster, iteration after iteration on the period:
    // they ask for a re-plan, but no shorter period is tried again.
    let faster: Vec<u64> = lat.iter().map(|x| x * 4 / 10).collect();
    let on_period = |switched: bool| Measurements {
        op_ns: faster.clone(),
        ..iteration(period, switched)
    };
    let version = replanner.next_version();
    let mut asked = 0;
    for j in 0..2 {
        assert_eq!(replanner.observe(JobId(j), &on_period(true)).unwrap(), None);
        for _ in 0..6 {
            if replanner
                .observe(JobId(j), &on_period(false))
                .unwrap()
                .is_some()
            {
                asked += 1;
                assert!(replanner.plan_due().unwrap().is_none(), "a new plan");
            }
        }
    }
    assert!(asked > 0, "the faster ops never asked for a re-plan");
    assert_eq!(replanner.next_version(), version);
}
