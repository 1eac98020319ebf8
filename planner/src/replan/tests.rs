//! The re-planner's unit tests.

#![allow(clippy::unwrap_used)]

use tensile_graph::DType;
use tensile_graph::builder::{Builder, Optimizer};

use super::*;
use crate::CopyModel;

fn mlp() -> Arc<Graph> {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![512, 256], DType::F32);
    let y = b.input("y", vec![512], DType::I64);
    let h = b.linear("fc1", x, 256, false);
    let h = b.relu("act1", h);
    let logits = b.linear("head", h, 10, false);
    let loss = b.cross_entropy("loss", logits, y);
    Arc::new(b.finish(loss, Optimizer::adam()).unwrap())
}

fn replanner() -> (Replanner, Arc<Graph>, Vec<u64>) {
    let g = mlp();
    let lat = vec![10_000; g.ops().len()];
    let mut r = Replanner::new(PlannerConfig::new(CopyModel::duplex(1e9, 1e9, 1_000)));
    r.add_job(JobId(7), g.clone(), &lat, JobSettings::default())
        .unwrap();
    (r, g, lat)
}

fn measured(op_ns: Vec<u64>) -> Measurements {
    Measurements {
        op_ns,
        ..Measurements::default()
    }
}

#[test]
fn jobs_are_added_and_removed_by_id_with_clear_errors() {
    let (mut r, g, lat) = replanner();
    assert_eq!(
        r.add_job(JobId(7), g.clone(), &lat, JobSettings::default()),
        Err(ReplanError::Duplicate(JobId(7)))
    );
    assert_eq!(
        r.add_job(JobId(8), g.clone(), &lat[1..], JobSettings::default()),
        Err(ReplanError::LatencyCount {
            job: JobId(8),
            got: lat.len() - 1,
            ops: lat.len()
        })
    );
    r.add_job(JobId(3), g, &lat, JobSettings::default())
        .unwrap();
    assert_eq!(r.job_ids(), vec![JobId(3), JobId(7)]);
    let plans = r.plan_all().unwrap();
    assert_eq!(plans.plans.len(), 2);
    assert!(plans.plans.iter().all(|p| p.version == 1));
    r.remove_job(JobId(3)).unwrap();
    assert_eq!(
        r.remove_job(JobId(3)),
        Err(ReplanError::UnknownJob(JobId(3)))
    );
    assert_eq!(r.plan_all().unwrap().plans[0].version, 2);
    assert_eq!(
        r.observe(JobId(3), &measured(lat)),
        Err(ReplanError::UnknownJob(JobId(3)))
    );
}

#[test]
fn a_replan_is_due_on_first_measurements_drift_and_late_prefetches() {
    let (mut r, g, lat) = replanner();
    r.plan_all().unwrap();
    let id = JobId(7);
    assert_eq!(
        r.observe(id, &measured(lat.clone())).unwrap(),
        Some(ReplanReason::FirstMeasurements)
    );
    r.plan_all().unwrap();
    assert_eq!(r.observe(id, &measured(lat.clone())).unwrap(), None);
    let slower: Vec<u64> = lat.iter().map(|x| x * 2).collect();
    assert_eq!(
        r.observe(id, &measured(slower.clone())).unwrap(),
        Some(ReplanReason::Drift)
    );
    r.plan_all().unwrap();
    let act = g.tensors().iter().find(|t| t.name == "act1").unwrap().id;
    let late = Measurements {
        late_prefetches: vec![(act, 5_000)],
        ..measured(slower.clone())
    };
    assert_eq!(
        r.observe(id, &late).unwrap(),
        Some(ReplanReason::LatePrefetch)
    );
    // Measurements of the wrong shape are errors, not panics.
    assert!(matches!(
        r.observe(id, &measured(vec![1; 3])),
        Err(ReplanError::LatencyCount { .. })
    ));
    let bad = Measurements {
        late_prefetches: vec![(TensorId(u32::MAX), 1)],
        ..measured(slower)
    };
    assert!(matches!(
        r.observe(id, &bad),
        Err(ReplanError::UnknownTensor { .. })
    ));
}

#[test]
fn late_prefetches_that_replans_do_not_cure_back_off_and_shrinking_ones_do_not() {
    let (mut r, g, lat) = replanner();
    r.plan_all().unwrap();
    let id = JobId(7);
    r.observe(id, &measured(lat.clone())).unwrap();
    r.plan_all().unwrap();
    let act = g.tensors().iter().find(|t| t.name == "act1").unwrap().id;
    let late = |wait: u64| Measurements {
        late_prefetches: vec![(act, wait)],
        ..measured(lat.clone())
    };
    // As late after each re-plan as before it: re-plans at late
    // iterations 1, 2, 4, 8 and 16, then every 16th.
    let asked: Vec<usize> = (1..=40)
        .filter(|_| {
            let due = r.observe(id, &late(5_000_000)).unwrap().is_some();
            if due {
                r.plan_all().unwrap();
            }
            due
        })
        .collect();
    assert_eq!(asked, vec![1, 2, 4, 8, 16, 32]);
    // An iteration on time ends the streak: the next late one asks at
    // once, and so does each that is clearly less late than the last.
    assert_eq!(r.observe(id, &measured(lat.clone())).unwrap(), None);
    for k in 0..5 {
        assert_eq!(
            r.observe(id, &late(5_000_000 >> k)).unwrap(),
            Some(ReplanReason::LatePrefetch),
            "late by {} ns",
            5_000_000 >> k
        );
        r.plan_all().unwrap();
    }
}

#[test]
fn disabled_it_folds_measurements_in_but_never_asks_to_replan() {
    let (mut r, _, lat) = replanner();
    r.enabled = false;
    let slower: Vec<u64> = lat.iter().map(|x| x * 3).collect();
    assert_eq!(r.observe(JobId(7), &measured(slower)).unwrap(), None);
    let est = r.estimates(JobId(7)).unwrap();
    assert!(est.iter().zip(&lat).all(|(e, l)| e > l));
}

#[test]
fn a_gated_job_on_pace_takes_a_new_plan_only_if_it_shortens_the_period() {
    let (mut r, id, lat, period) = gated_replanner();
    // Its first iteration is left out. Its first measured one ends on
    // its period with its ops at half their estimates: a re-plan is
    // asked for, but the only plan (one job alone, not gated) has no
    // shorter period.
    let fast = Measurements {
        iteration_ns: period,
        ..measured(lat.iter().map(|x| x / 2).collect())
    };
    let mut asked = Vec::new();
    for _ in 0..2 {
        asked.push(r.observe(id, &fast).unwrap());
    }
    assert_eq!(asked, [None, Some(ReplanReason::FirstMeasurements)]);
    let version = r.next_version();
    assert!(r.plan_due().unwrap().is_none());
    assert_eq!(r.next_version(), version, "the current plan stays");
    assert!(r.jobs[&id].gate.is_some(), "and so does its gate");
    // Through `replan_after`: nothing handed out, nothing counted.
    let (mut r, ..) = gated_replanner();
    let mut handed = Vec::new();
    for _ in 0..2 {
        handed.push(r.replan_after(id, &fast, Replanner::plan_due).unwrap());
    }
    assert!(handed.iter().all(Vec::is_empty), "{handed:?}");
    assert_eq!(r.replans, 0);
    // The same iteration past its period: the new plan is taken.
    let overran = Measurements {
        iteration_ns: period * 11 / 10,
        ..fast.clone()
    };
    let (mut r, ..) = gated_replanner();
    handed.clear();
    for _ in 0..2 {
        handed.push(r.replan_after(id, &overran, Replanner::plan_due).unwrap());
    }
    assert_eq!(handed.last().map(Vec::len), Some(1), "{handed:?}");
    assert_eq!(r.replans, 1);
    assert_eq!(r.next_version(), version + 1);
    // `plan_all` plans whatever was asked.
    let (mut r, ..) = gated_replanner();
    for _ in 0..2 {
        r.observe(id, &fast).unwrap();
    }
    assert_eq!(r.plan_all().unwrap().plans[0].version, version);
}

#[test]
fn a_new_base_is_planned_at_once_inside_the_peak_even_for_a_job_on_pace() {
    // A gated job on its period, ops faster than estimated: a re-plan is
    // asked for only if it shortens the period, and one job alone has no
    // shorter one (as in the test above).
    let (mut r, id, lat, period) = gated_replanner();
    let fast = Measurements {
        iteration_ns: period,
        ..measured(lat.iter().map(|x| x / 2).collect())
    };
    for _ in 0..2 {
        r.observe(id, &fast).unwrap();
    }
    let before = r.propose().unwrap().plans[0].prediction.planned_peak_bytes;
    // Its base measured larger: the next plan is due whatever it is, and
    // its peak holds the new base.
    assert_eq!(r.base_bytes(id), Some(0));
    r.set_base_bytes(id, 900_000_000).unwrap();
    assert_eq!(r.base_bytes(id), Some(900_000_000));
    let next = r.plan_due().unwrap().expect("a plan for the new base");
    assert_eq!(
        next.plans[0].prediction.planned_peak_bytes,
        before + 900_000_000
    );
    // The same base again asks for nothing.
    r.set_base_bytes(id, 900_000_000).unwrap();
    assert_eq!(r.due, Due::Nothing);
    assert_eq!(
        r.set_base_bytes(JobId(99), 1),
        Err(ReplanError::UnknownJob(JobId(99)))
    );
}

/// A gate of `period_ns` with its slots at `phase_ns`, epoch 0.
fn gate_on(period_ns: u64, phase_ns: u64) -> Gate {
    Gate {
        period_ns,
        phase_ns,
        epoch_ns: 0,
    }
}

/// [`replanner`] with job 7 gated on a period of its predicted
/// iteration, planned: (the re-planner, the job, its predictions, the
/// period).
fn gated_replanner() -> (Replanner, JobId, Vec<u64>, u64) {
    let (mut r, _, lat) = replanner();
    let id = JobId(7);
    let period: u64 = lat.iter().sum();
    r.jobs.get_mut(&id).unwrap().gate = Some(gate_on(period, 0));
    // As if that gated plan had just been made.
    r.due = Due::Nothing;
    (r, id, lat, period)
}

/// Makes a plan of `r`'s with job `id` on `gate` the gated plans in use,
/// as if just handed out; returns it.
fn gated_plan_in_use(r: &mut Replanner, id: JobId, gate: Gate) -> MultiPlan {
    let mut current = r.plan_all().unwrap();
    current.plans[0].gate = Some(gate);
    current.cycle_ns = gate.period_ns;
    r.plans = Plans::Holding {
        in_use: InUse {
            plans: current.clone(),
            origin_ns: gate.period_ns,
            gates_only: false,
        },
        shorter: true,
    };
    r.jobs.get_mut(&id).unwrap().gate = Some(gate);
    current
}

/// Job `id`'s first iteration on new plans and the settling ones after it,
/// each as `m` with only the first marked switched.
fn settle_on_new_plans(r: &mut Replanner, id: JobId, m: &Measurements) {
    let switched = Measurements {
        switched: true,
        ..m.clone()
    };
    assert!(
        r.replan_after(id, &switched, Replanner::plan_due)
            .unwrap()
            .is_empty()
    );
    // A switch that moved only the gates moves no storage: one fewer.
    let gates_only = r.plans.in_use().is_some_and(|u| u.gates_only);
    let settle = if gates_only { SETTLE_GATES } else { SETTLE };
    for _ in 1..settle {
        assert!(
            r.replan_after(id, m, Replanner::plan_due)
                .unwrap()
                .is_empty()
        );
    }
}

#[test]
fn a_gated_job_learns_its_latencies_and_a_clearly_faster_one_replans() {
    let (mut r, id, lat, period) = gated_replanner();
    // Ops at half their predictions, the iteration held to the period
    // by the pace: the first measurements still come in once settled.
    let half: Vec<u64> = lat.iter().map(|x| x / 2).collect();
    let paced = |op_ns: Vec<u64>| Measurements {
        iteration_ns: period,
        ..measured(op_ns)
    };
    let mut asked = Vec::new();
    for _ in 0..=SETTLE {
        asked.push(r.observe(id, &paced(half.clone())).unwrap());
    }
    assert_eq!(
        asked.iter().flatten().collect::<Vec<_>>(),
        [&ReplanReason::FirstMeasurements],
        "{asked:?}"
    );
    let learned: u64 = r.estimates(id).unwrap().iter().sum();
    assert!(learned * 10 < period * 9, "{learned}");
    // Ops within UNDERRUN of the estimates keep the plan.
    let est: Vec<u64> = r
        .estimates(id)
        .unwrap()
        .iter()
        .map(|&e| e * 9 / 10)
        .collect();
    for _ in 0..2 * OVERRUNS {
        assert_eq!(r.observe(id, &paced(est.clone())).unwrap(), None);
    }
    // Clearly faster, OVERRUNS times in a row: a re-plan.
    let fast: Vec<u64> = est.iter().map(|x| x / 2).collect();
    for _ in 1..OVERRUNS {
        assert_eq!(r.observe(id, &paced(fast.clone())).unwrap(), None);
    }
    assert_eq!(
        r.observe(id, &paced(fast)).unwrap(),
        Some(ReplanReason::Drift)
    );
}

#[test]
fn a_plan_on_trial_keeps_its_fallback_until_it_misses_or_is_replaced() {
    let (mut r, id, _, period) = gated_replanner();
    let before = r.plan_all().unwrap();
    r.jobs.get_mut(&id).unwrap().gate = Some(gate_on(period, 0));
    // As if a shorter plan had been taken over `before`.
    r.plans.shorter_on_trial(Some(before.clone()));
    // A request for a shorter plan that finds none leaves the trial on.
    r.due = Due::Shorter;
    assert!(r.plan_due().unwrap().is_none());
    assert!(
        r.plans.fallback().is_some(),
        "the trial ended without a miss"
    );
    // A miss: `before` comes back under a new version.
    r.due = Due::Revert { stretch_ns: 0 };
    let version = r.next_version();
    let back = r.plan_due().unwrap().unwrap();
    assert_eq!(back.plans[0].version, version);
    assert_eq!(back.plans[0].events, before.plans[0].events);
    assert!(r.plans.fallback().is_none() && !r.plans.shorter());
    // A plan needed for another reason ends the trial too.
    r.plans.shorter_on_trial(Some(before));
    r.due = Due::Needed { stretch_ns: 0 };
    assert!(r.plan_due().unwrap().is_some());
    assert!(r.plans.fallback().is_none());
}

#[test]
fn ops_under_underrun_replan_a_gated_job_within_the_drift_threshold() {
    let (mut r, id, _, period) = gated_replanner();
    let paced = |op_ns: Vec<u64>| Measurements {
        iteration_ns: period,
        ..measured(op_ns)
    };
    // Planned from its measurements, still gated.
    for _ in 0..=SETTLE {
        r.observe(id, &paced(r.estimates(id).unwrap())).unwrap();
    }
    r.plan_all().unwrap();
    let gate = gate_on(period, 0);
    r.jobs.get_mut(&id).unwrap().gate = Some(gate);
    r.due = Due::Nothing;
    // Ops at 75% of the estimates: under UNDERRUN, and the drift they
    // make (25%) is within the threshold (30%).
    let est = r.estimates(id).unwrap();
    let fast: Vec<u64> = est.iter().map(|x| x * 3 / 4).collect();
    let asked: Vec<_> = (0..OVERRUNS)
        .map(|_| r.observe(id, &paced(fast.clone())).unwrap())
        .collect();
    assert_eq!(
        asked,
        [None, None, Some(ReplanReason::Drift)],
        "{} of {}",
        fast.iter().sum::<u64>(),
        est.iter().sum::<u64>()
    );
}

#[test]
fn a_gated_job_that_keeps_its_pace_keeps_its_plan_and_learns() {
    let (mut r, id, lat, period) = gated_replanner();
    // Ops at 90% of their predictions, the iteration on its period.
    let near: Vec<u64> = lat.iter().map(|x| x * 9 / 10).collect();
    let paced = |op_ns: Vec<u64>, iteration_ns: u64| Measurements {
        iteration_ns,
        ..measured(op_ns)
    };
    for _ in 0..=SETTLE {
        assert_eq!(r.observe(id, &paced(near.clone(), period)).unwrap(), None);
    }
    let learned: u64 = r.estimates(id).unwrap().iter().sum();
    assert!(learned < period, "{learned} {period}");
    // Prefetches late by a tenth of the period in a first iteration that
    // still ended on its period keep the plan too.
    let (mut late, ..) = gated_replanner();
    let late_on_pace = Measurements {
        late_prefetches: vec![(TensorId(0), period / 10)],
        ..paced(near.clone(), period)
    };
    for _ in 0..=SETTLE {
        assert_eq!(late.observe(id, &late_on_pace).unwrap(), None);
    }
    // The same job overrunning its period keeps asking, as before.
    let mut asked = Vec::new();
    for _ in 0..OVERRUNS {
        asked.push(
            r.observe(id, &paced(near.clone(), period * 11 / 10))
                .unwrap(),
        );
    }
    assert_eq!(asked.last(), Some(&Some(ReplanReason::Drift)), "{asked:?}");
    // Half again past its period: the estimates grow by DRIFT_STEP, not
    // by all of the overrun.
    let before: f64 = r.jobs[&id].estimates.iter().sum();
    for _ in 0..OVERRUNS {
        r.observe(id, &paced(near.clone(), period * 3 / 2)).unwrap();
    }
    let after: f64 = r.jobs[&id].estimates.iter().sum();
    assert!(
        (after / before - DRIFT_STEP).abs() < 1e-9,
        "{before} {after}"
    );
    // A first iteration that overran its period by more than its pace
    // re-plans at once; one within its pace (2%, no prefetch late) asks
    // for its plan on a longer period instead: run on at the old one, it
    // would slide into the other jobs' phases.
    for (overran, reason) in [
        (period * 11 / 10, ReplanReason::FirstMeasurements),
        (period * 102 / 100, ReplanReason::Stretch),
    ] {
        let (mut r, ..) = gated_replanner();
        let asked: Vec<_> = (0..=SETTLE)
            .map(|_| r.observe(id, &paced(near.clone(), overran)).unwrap())
            .collect();
        assert_eq!(
            asked.iter().flatten().collect::<Vec<_>>(),
            [&reason],
            "{overran}: {asked:?}"
        );
    }
}

#[test]
fn a_first_iteration_past_its_period_within_its_pace_stretches_the_period() {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, period / 3);
    // As if a gated plan were in use.
    let current = gated_plan_in_use(&mut r, id, gate);
    let version = r.next_version();
    let overran = Measurements {
        iteration_ns: period * 102 / 100,
        ..measured(lat.iter().map(|x| x * 9 / 10).collect())
    };
    let handed: Vec<(JobId, Plan)> = (0..=SETTLE)
        .flat_map(|_| r.replan_after(id, &overran, Replanner::plan_due).unwrap())
        .collect();
    assert_eq!(handed.len(), 1, "{handed:?}");
    let (to, plan) = &handed[0];
    assert_eq!(*to, id);
    assert_eq!(plan.version, version);
    // The same plan, its period the iteration's plus the gates' slack
    // and its phase at the same share of it.
    assert_eq!(plan.events, current.plans[0].events);
    let stretched = (overran.iteration_ns as f64 * (1.0 + r.config.gate_slack)).ceil() as u64;
    let g = plan.gate.unwrap();
    assert!(stretched > period, "{stretched} {period}");
    assert_eq!(g.period_ns, stretched);
    assert_eq!(g.phase_ns, period / 3 * stretched / period);
    assert_eq!(r.jobs[&id].gate, Some(g));
    assert_eq!(r.replans, 1);
    // The new cycle begins where the job that asked stands.
    assert_eq!(r.anchor_job(), Some(id));
    assert_eq!(r.plans.current().unwrap().anchor_job, None);
    // On it, iterations that long keep the plan (ops that fill them: ops
    // with room to spare would compress it).
    let full = Measurements {
        op_ns: lat.clone(),
        ..overran.clone()
    };
    for _ in 0..=SETTLE + OVERRUNS {
        let more = r.replan_after(id, &full, Replanner::plan_due).unwrap();
        assert!(more.is_empty(), "{more:?}");
    }
    // A plan in use that is not gated cannot be stretched: a re-plan.
    let (mut r, ..) = gated_replanner();
    r.plan_all().unwrap();
    r.jobs.get_mut(&id).unwrap().gate = Some(gate);
    let handed: Vec<(JobId, Plan)> = (0..=SETTLE)
        .flat_map(|_| r.replan_after(id, &overran, Replanner::plan_due).unwrap())
        .collect();
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0].1.gate, None, "planned anew: one job is not gated");
    assert_eq!(r.anchor_job(), None);
}

#[test]
fn gated_plans_made_due_by_a_jobs_measurements_begin_their_cycle_where_it_stands() {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, 0);
    let mut gated = r.plan_all().unwrap();
    assert_eq!(gated.anchor_job, None, "not made due by measurements");
    gated.plans[0].gate = Some(gate);
    gated.cycle_ns = period;
    r.jobs.get_mut(&id).unwrap().gate = Some(gate);
    // A first iteration 10% past its period asks for a re-plan.
    let overran = Measurements {
        iteration_ns: period * 11 / 10,
        ..measured(lat.iter().map(|x| x * 9 / 10).collect())
    };
    let asked: Vec<_> = (0..=SETTLE)
        .filter_map(|_| r.observe(id, &overran).unwrap())
        .collect();
    assert_eq!(asked, [ReplanReason::FirstMeasurements]);
    // The gated plans taken for it name it; those kept do not.
    let mut out = gated.clone();
    r.adopt(&mut out);
    assert_eq!(out.anchor_job, Some(0));
    assert_eq!(r.plans.current().unwrap().anchor_job, None);
    // Taken once: plans adopted later that no measurements asked for
    // keep the cycle in use.
    let mut again = gated.clone();
    r.adopt(&mut again);
    assert_eq!(again.anchor_job, None);
    // Plans that are not gated have no cycle to begin.
    r.asked = Some(id);
    let free = r.plan_all().unwrap();
    assert_eq!(free.cycle_ns, 0);
    assert_eq!(free.anchor_job, None);
}

#[test]
fn gated_plans_with_room_to_spare_are_compressed_on_trial_and_stretched_once() {
    let (mut r, id, lat, predicted) = gated_replanner();
    // A period a quarter longer than the ops' estimates.
    let period = predicted * 5 / 4;
    let gate = gate_on(period, period / 3);
    let current = gated_plan_in_use(&mut r, id, gate);
    let job = r.jobs.get_mut(&id).unwrap();
    (job.measured, job.settling) = (true, 0);
    // Ops at 80% of their estimates (no faster than UNDERRUN), 64% of the
    // period, the pace holding the iteration to the period.
    let roomy = Measurements {
        iteration_ns: period,
        ..measured(lat.iter().map(|x| x * 8 / 10).collect())
    };
    for _ in 1..OVERRUNS {
        assert_eq!(r.observe(id, &roomy).unwrap(), None);
    }
    let version = r.next_version();
    let handed = r.replan_after(id, &roomy, Replanner::plan_due).unwrap();
    assert_eq!(handed.len(), 1, "{handed:?}");
    let plan = &handed[0].1;
    assert_eq!(plan.version, version);
    // Half-way from the period to the ops' time (plus the gates' slack),
    // the phase at the same share of it, the same copies.
    let active = (predicted * 8 / 10) as f64 * (1.0 + r.config.gate_slack);
    let short = (period as f64 - (period as f64 - active) * COMPRESS_SHARE).ceil() as u64;
    let g = plan.gate.unwrap();
    assert_eq!(g.period_ns, short);
    assert_eq!(g.phase_ns, period / 3 * short / period);
    assert_eq!(plan.events.len(), current.plans[0].events.len());
    assert_eq!(r.anchor_job(), Some(id));
    assert!(
        r.plans.fallback().is_some(),
        "a compressed plan is on trial"
    );
    // Its first iteration and the settling ones do not count; then one past
    // its pace, nothing evicted, stretches it to hold that iteration, still
    // on trial.
    settle_on_new_plans(&mut r, id, &roomy);
    let over = Measurements {
        iteration_ns: short * 105 / 100,
        ..roomy.clone()
    };
    assert!(
        over.iteration_ns < period,
        "the test's miss beats the old period"
    );
    let handed = r.replan_after(id, &over, Replanner::plan_due).unwrap();
    let g = handed[0].1.gate.unwrap();
    let held = (over.iteration_ns as f64 * (1.0 + r.config.gate_slack)).ceil() as u64;
    assert_eq!(g.period_ns, held);
    assert!(
        r.plans.fallback().is_some(),
        "the stretched plan stays on trial"
    );
    // Missed again: the plans before the compression come back, and no
    // shorter period is tried again.
    settle_on_new_plans(&mut r, id, &roomy);
    let way_over = Measurements {
        iteration_ns: held * 105 / 100,
        ..roomy.clone()
    };
    let back = r.replan_after(id, &way_over, Replanner::plan_due).unwrap();
    assert_eq!(back[0].1.gate.unwrap().period_ns, period);
    assert_eq!(back[0].1.events, current.plans[0].events);
    assert!(r.plans.fallback().is_none() && !r.plans.shorter());
    for _ in 0..SETTLE + 2 * OVERRUNS {
        let more = r.replan_after(id, &roomy, Replanner::plan_due).unwrap();
        assert!(more.is_empty(), "{more:?}");
    }
}

#[test]
fn a_stretch_the_jobs_no_longer_need_is_undone_as_far_as_their_iterations_allow() {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, period / 3);
    let current = gated_plan_in_use(&mut r, id, gate);
    // A first measured iteration 2% past the period, within the pace (its
    // ops as estimated): the period is stretched to hold it.
    let overran = Measurements {
        iteration_ns: period * 102 / 100,
        ..measured(lat.clone())
    };
    let handed: Vec<(JobId, Plan)> = (0..=SETTLE)
        .flat_map(|_| r.replan_after(id, &overran, Replanner::plan_due).unwrap())
        .collect();
    let long = handed[0].1.gate.unwrap().period_ns;
    assert!(long > period * 102 / 100, "{long} {period}");
    // Then, settled on it (one iteration: only the gates moved), an
    // iteration of the planned period with ops at 80% of it: room to
    // spare, which undoes the stretch at once.
    let settled = Measurements {
        iteration_ns: period,
        ..measured(lat.iter().map(|x| x * 8 / 10).collect())
    };
    // One as roomy that began on the plans before the stretch and ended
    // after it tells nothing of the stretch's room: it undoes nothing.
    let stale = Measurements {
        plan_version: handed[0].1.version - 1,
        ..settled.clone()
    };
    let none = r.replan_after(id, &stale, Replanner::plan_due).unwrap();
    assert!(none.is_empty(), "{none:?}");
    let switched = Measurements {
        switched: true,
        plan_version: handed[0].1.version,
        ..settled.clone()
    };
    let none = r.replan_after(id, &switched, Replanner::plan_due).unwrap();
    assert!(none.is_empty(), "{none:?}");
    let version = r.next_version();
    let handed = r.replan_after(id, &settled, Replanner::plan_due).unwrap();
    assert_eq!(handed.len(), 1, "{handed:?}");
    let plan = &handed[0].1;
    assert_eq!(plan.version, version);
    // Back on the period that holds those iterations (plus the gates'
    // slack), not a quarter of the way as a compression goes, the phase at
    // the same share of it, the same events.
    let slack = r.config.gate_slack;
    let held = (settled.iteration_ns as f64 * (1.0 + slack)).ceil() as u64;
    assert!(held < long && held > period);
    let g = plan.gate.unwrap();
    assert_eq!(g.period_ns, held);
    assert_eq!(g.phase_ns, period / 3 * held / period);
    assert_eq!(plan.events, current.plans[0].events);
    // The cycle in use is kept: no job's slot jumps to now.
    assert_eq!(r.anchor_job(), None);
    assert!(
        r.plans.fallback().is_some(),
        "an undone stretch is on trial"
    );
    // Never below the period the plans were handed out on: iterations
    // at 90% of it undo the whole stretch and no more.
    let (mut r, id, lat, period) = gated_replanner();
    gated_plan_in_use(&mut r, id, gate);
    for _ in 0..=SETTLE {
        r.replan_after(id, &overran, Replanner::plan_due).unwrap();
    }
    let short = Measurements {
        iteration_ns: period * 9 / 10,
        ..measured(lat.iter().map(|x| x * 8 / 10).collect())
    };
    settle_on_new_plans(&mut r, id, &short);
    let handed = r.replan_after(id, &short, Replanner::plan_due).unwrap();
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert_eq!(handed[0].1.gate.unwrap().period_ns, period);
    // On the planned period itself, room to spare compresses as before,
    // after OVERRUNS iterations of it, a quarter of the way to the ops'
    // time: nothing is left to undo.
    settle_on_new_plans(&mut r, id, &short);
    for _ in 1..OVERRUNS {
        let none = r.replan_after(id, &short, Replanner::plan_due).unwrap();
        assert!(none.is_empty(), "{none:?}");
    }
    let handed = r.replan_after(id, &short, Replanner::plan_due).unwrap();
    let active = (lat.iter().sum::<u64>() * 8 / 10) as f64 * (1.0 + slack);
    let compressed = (period as f64 - (period as f64 - active) * COMPRESS_SHARE).ceil() as u64;
    assert_eq!(handed[0].1.gate.unwrap().period_ns, compressed);
}

#[test]
fn a_compressed_plan_that_evicts_brings_the_plans_before_it_back() {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, 0);
    gated_plan_in_use(&mut r, id, gate);
    let job = r.jobs.get_mut(&id).unwrap();
    (job.measured, job.settling) = (true, 0);
    let roomy = Measurements {
        iteration_ns: period,
        ..measured(lat.iter().map(|x| x * 8 / 10).collect())
    };
    let handed: Vec<_> = (0..OVERRUNS)
        .flat_map(|_| r.replan_after(id, &roomy, Replanner::plan_due).unwrap())
        .collect();
    assert!(handed[0].1.gate.unwrap().period_ns < period);
    settle_on_new_plans(&mut r, id, &roomy);
    // On its pace but evicting: no stretch, the plans before come back.
    let evicted = Measurements {
        evictions: vec![(TensorId(0), OpId(0))],
        ..roomy
    };
    assert_eq!(
        r.observe(id, &evicted).unwrap(),
        Some(ReplanReason::ShorterMissed)
    );
    let back = r.plan_due().unwrap().unwrap();
    assert_eq!(back.plans[0].gate.unwrap().period_ns, period);
}

/// `plans` on a gated cycle of `cycle` ns, every gate on it: a proposal
/// as the planner would hand it out.
fn proposal(plans: &MultiPlan, cycle: u64) -> MultiPlan {
    let mut out = plans.clone();
    for g in out.plans.iter_mut().filter_map(|p| p.gate.as_mut()) {
        g.period_ns = cycle;
    }
    out.cycle_ns = cycle;
    out
}

#[test]
fn a_first_iteration_past_its_pace_that_held_its_memory_is_stretched_for_unless_a_replan_is_shorter()
 {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, period / 3);
    let current = gated_plan_in_use(&mut r, id, gate);
    // A new job's first iteration only settles.
    let on = Measurements {
        iteration_ns: period,
        ..measured(lat.clone())
    };
    assert_eq!(r.observe(id, &on).unwrap(), None);
    // 6% past its period: beyond the pace, so a re-plan is due.
    let overran = Measurements {
        iteration_ns: period * 106 / 100,
        ..measured(lat.clone())
    };
    assert_eq!(
        r.observe(id, &overran).unwrap(),
        Some(ReplanReason::FirstMeasurements)
    );
    assert_eq!(r.held, Held::Ran(overran.iteration_ns));
    let stretched = (overran.iteration_ns as f64 * (1.0 + r.config.gate_slack)).ceil() as u64;
    // A re-plan on twice the period loses to the plans in use stretched.
    let out = r.held_or(proposal(&current, 2 * period));
    assert_eq!(out.cycle_ns, stretched);
    assert_eq!(out.plans[0].events, current.plans[0].events);
    let g = out.plans[0].gate.unwrap();
    assert_eq!(g.period_ns, stretched);
    assert_eq!(g.phase_ns, period / 3 * stretched / period);
    // One shorter than the stretch is taken, and so is a free one.
    let shorter = proposal(&current, stretched - 1);
    assert_eq!(r.held_or(shorter.clone()), shorter);
    let free = proposal(&current, 0);
    assert_eq!(r.held_or(free.clone()), free);
    // A job added meanwhile voids it: the plans in use do not cover it.
    let mut added = r.clone();
    added
        .add_job(JobId(8), mlp(), &lat, JobSettings::default())
        .unwrap();
    let long = proposal(&current, 2 * period);
    assert_eq!(added.held_or(long.clone()), long);
    // The whole way: the stretch is handed out, and the next plan
    // compares afresh.
    r.due = Due::Nothing;
    r.held = Held::Nothing;
    r.jobs.get_mut(&id).unwrap().measured = false;
    let handed = r.replan_after(id, &overran, Replanner::plan_due).unwrap();
    assert_eq!(handed.len(), 1);
    assert_eq!(r.held, Held::Nothing);

    // An iteration that evicted did not hold its memory: no stretch.
    let (mut r, id, _, period) = gated_replanner();
    let current = gated_plan_in_use(&mut r, id, gate);
    assert_eq!(r.observe(id, &on).unwrap(), None);
    let evicted = Measurements {
        evictions: vec![(TensorId(0), OpId(0))],
        ..overran.clone()
    };
    assert_eq!(
        r.observe(id, &evicted).unwrap(),
        Some(ReplanReason::FirstMeasurements)
    );
    assert!(!matches!(r.held, Held::Ran(_)), "{:?}", r.held);
    let long = proposal(&current, 2 * period);
    assert_eq!(r.held_or(long.clone()), long);
}

#[test]
fn overruns_that_held_their_memory_leave_the_longest_for_a_stretch() {
    let (mut r, id, lat, period) = gated_replanner();
    let gate = gate_on(period, 0);
    gated_plan_in_use(&mut r, id, gate);
    let on = Measurements {
        iteration_ns: period,
        ..measured(lat.clone())
    };
    // Settling, then its first measured iteration, on its period.
    assert_eq!(r.observe(id, &on).unwrap(), None);
    assert_eq!(r.observe(id, &on).unwrap(), None);
    let over = |pct: u64, evict: bool| Measurements {
        iteration_ns: period * pct / 100,
        evictions: if evict {
            vec![(TensorId(0), OpId(0))]
        } else {
            Vec::new()
        },
        ..measured(lat.clone())
    };
    // Three overruns in a row, none evicting: the longest is held.
    assert_eq!(r.observe(id, &over(105, false)).unwrap(), None);
    assert_eq!(r.observe(id, &over(108, false)).unwrap(), None);
    assert_eq!(
        r.observe(id, &over(106, false)).unwrap(),
        Some(ReplanReason::Drift)
    );
    assert_eq!(r.held, Held::Ran(period * 108 / 100));
    // A streak with an eviction in it leaves nothing.
    r.held = Held::Nothing;
    r.due = Due::Nothing;
    assert_eq!(r.observe(id, &over(105, false)).unwrap(), None);
    assert_eq!(r.observe(id, &over(108, true)).unwrap(), None);
    assert_eq!(
        r.observe(id, &over(106, false)).unwrap(),
        Some(ReplanReason::Drift)
    );
    assert_eq!(
        r.held,
        Held::Void,
        "a re-plan that evictions asked for is taken"
    );
    r.held = Held::Nothing;
    // A streak broken by an iteration on pace starts afresh.
    assert_eq!(r.observe(id, &over(120, false)).unwrap(), None);
    assert_eq!(r.observe(id, &on).unwrap(), None);
    assert_eq!(r.observe(id, &over(104, false)).unwrap(), None);
    assert_eq!(r.observe(id, &over(105, false)).unwrap(), None);
    assert_eq!(
        r.observe(id, &over(104, false)).unwrap(),
        Some(ReplanReason::Drift)
    );
    assert_eq!(r.held, Held::Ran(period * 105 / 100));
}

/// A re-plan in another layout than the plans in use (turns for gated
/// sharing plans) beats their stretch only by the margin a switch of
/// layout needs: both cycles are predictions across layouts, and turns
/// entered mid-run from plans that held ran far slower than predicted
/// (two ResNet-50 b32 on the a6000, seed 8: turns predicted 1.8% shorter
/// than the stretch ran at EOR 0.59, where forced turns ran at 0.06).
#[test]
fn turns_beat_a_stretch_of_the_sharing_plans_in_use_only_by_the_switch_margin() {
    use crate::Layout;
    let (mut r, id, lat, period) = gated_replanner();
    let mut current = gated_plan_in_use(&mut r, id, gate_on(period, period / 3));
    // Gates that share the device.
    current.layout = Layout::Gated;
    r.plans = Plans::Holding {
        in_use: InUse {
            plans: current.clone(),
            origin_ns: period,
            gates_only: false,
        },
        shorter: true,
    };
    let on = Measurements {
        iteration_ns: period,
        ..measured(lat.clone())
    };
    assert_eq!(r.observe(id, &on).unwrap(), None);
    let overran = Measurements {
        iteration_ns: period * 106 / 100,
        ..measured(lat.clone())
    };
    r.observe(id, &overran).unwrap();
    assert_eq!(r.held, Held::Ran(overran.iteration_ns));
    let stretched = (overran.iteration_ns as f64 * (1.0 + r.config.gate_slack)).ceil() as u64;
    let turns = |cycle: u64| MultiPlan {
        layout: Layout::Turns,
        ..proposal(&current, cycle)
    };
    // 1% shorter than the stretch: the gated plans, stretched, stay.
    let near = turns(stretched * 99 / 100);
    let out = r.held_or(near);
    assert_eq!(out.layout, Layout::Gated);
    assert_eq!(out.cycle_ns, stretched);
    // Shorter by more than the margin: the turns are taken.
    let clear = turns(stretched * 95 / 100);
    assert_eq!(r.held_or(clear.clone()), clear);
    // In the same layout any shorter cycle is taken, as before.
    let gated = proposal(&current, stretched * 99 / 100);
    assert_eq!(r.held_or(gated.clone()), gated);
}
