//! Co-location in the worker: `--memory-mb` under a plan is held by the
//! executor's guard whatever the plan got wrong, and two gated workers run
//! their iterations at their slots, their memory interleaving as planned.

use std::time::Duration;

use tensile_graph::builder::Optimizer;
use tensile_graph::{Graph, Liveness};
use tensile_planner::{CopyModel, JobInput, JobSettings, Plan, PlannerConfig, plan};
use tensile_swap_executor::HostConfig;
use tensile_worker::{IterationReport, Worker, WorkerConfig, WorkerError};

use crate::{Outcome, bytes, latencies, mlp, mock, planned, run, vanilla};

fn run_guarded(
    g: &Graph,
    plan: &Plan,
    budget: u64,
    host: HostConfig,
) -> Result<Outcome, WorkerError> {
    let live = Liveness::analyze(g);
    let config = WorkerConfig {
        iterations: 3,
        memory_budget_bytes: Some(budget),
        host,
        engine: tensile_worker::Engine::Host,
        guard: true,
        ledger: None,
    };
    let kernels = mock::Mock::new(g, Duration::from_micros(300));
    let mut w = Worker::new(g, &live, plan, kernels, mock::initial(g), config)?;
    let reports = w.run(|_| None)?;
    Ok((w.persistent_values()?, reports))
}

/// A plan made for a budget from latencies and a link that are both
/// wrong (it believes ops take a tenth of what they do, and copies run
/// two hundred times faster than the worker's): without the guard the run goes
/// over `--memory-mb` and fails as a GPU would; with it the run holds it in
/// every iteration, the guard having acted, and trains exactly as vanilla.
#[test]
fn a_plan_holds_memory_mb_with_the_guard_whatever_it_got_wrong() {
    let _timing = crate::timing();
    let g = mlp(256, 512, 4, Optimizer::adam());
    let believed: Vec<u64> = latencies(&g).iter().map(|l| l / 10).collect();
    let p = planned(
        &g,
        believed,
        CopyModel::duplex(40e9, 40e9, 1_000),
        JobSettings::default(),
        0.45,
    );
    let budget = p.prediction.planned_peak_bytes;
    assert!(budget < p.prediction.vanilla_peak_bytes);
    // Every copy also waits 20 ms before it moves a byte, so that the copies
    // come late however loaded the machine is (slow kernels give slow
    // copies time to end).
    let slow_link = HostConfig {
        bytes_per_s: Some(0.2e9),
        fault_delay: Duration::from_millis(20),
        ..HostConfig::default()
    };
    let unguarded = {
        let live = Liveness::analyze(&g);
        let config = WorkerConfig {
            iterations: 3,
            memory_budget_bytes: Some(budget),
            host: slow_link,
            engine: tensile_worker::Engine::Host,
            guard: false,
            ledger: None,
        };
        let kernels = mock::Mock::new(&g, Duration::from_micros(300));
        Worker::new(&g, &live, &p, kernels, mock::initial(&g), config)
            .and_then(|mut w| w.run(|_| None))
    };
    assert!(
        matches!(unguarded, Err(WorkerError::OutOfMemory { .. })),
        "the wrong plan should go over the budget without the guard: {:?}",
        unguarded.map(|r| r.iter().map(|x| x.measured_peak_bytes).collect::<Vec<_>>())
    );
    let (got, reports) =
        run_guarded(&g, &p, budget, slow_link).expect("the guard holds the budget");
    for r in &reports {
        assert!(
            r.measured_peak_bytes <= budget,
            "iteration {}: {} over {budget}",
            r.iteration,
            r.measured_peak_bytes
        );
    }
    let acted: usize = reports
        .iter()
        .map(|r| r.guard_evictions + r.held_back + usize::from(r.memory_wait_ns > 0))
        .sum();
    assert!(acted > 0, "the guard did nothing");
    let (want, _) = run(
        &g,
        &vanilla(&g),
        3,
        HostConfig::default(),
        None,
        Duration::ZERO,
    )
    .expect("vanilla");
    assert!(
        bytes(&want) == bytes(&got),
        "the guarded run trained differently"
    );
}

/// Workers of `g` under `plans`, one thread each, all at once (threads of
/// this process share the host's monotonic clock as processes do), on the
/// mock kernels with a `floor`, recording their memory: each one's reports.
fn run_at_once(
    g: &Graph,
    live: &Liveness,
    plans: &[&Plan],
    iterations: usize,
    floor: Duration,
    host: HostConfig,
) -> Vec<Vec<IterationReport>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .iter()
            .map(|&p| {
                s.spawn(move || {
                    let config = WorkerConfig {
                        iterations,
                        memory_budget_bytes: None,
                        host,
                        engine: tensile_worker::Engine::Host,
                        guard: false,
                        ledger: None,
                    };
                    let kernels = mock::Mock::new(g, floor);
                    let mut w =
                        Worker::new(g, live, p, kernels, mock::initial(g), config).expect("worker");
                    w.record_memory();
                    w.run(|_| None).expect("runs")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("joins"))
            .collect()
    })
}

/// How long the slowest op of `g` takes on the mock here when two workers
/// run at once with a `floor` (its median over three iterations after a
/// warm-up).
fn slowest_co_run_op(g: &Graph, live: &Liveness, floor: Duration, host: HostConfig) -> Duration {
    let plan = tensile_worker::vanilla_plan(live);
    let runs = run_at_once(g, live, &[&plan, &plan], 4, floor, host);
    // Each op's median over the samples (a single spike of the machine is
    // jitter the test tolerates), the slowest op's.
    let mut samples = vec![Vec::new(); g.ops().len()];
    for r in runs.iter().flat_map(|r| r.iter().skip(1)) {
        for (s, &t) in samples.iter_mut().zip(&r.op_ns) {
            s.push(t);
        }
    }
    let most = samples
        .iter_mut()
        .map(|s| {
            s.sort_unstable();
            s.get(s.len() / 2).copied().unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    Duration::from_nanos(most)
}

/// Two workers (threads of this process share the host's monotonic clock
/// as processes do) with the gates of one coordinated plan: every
/// iteration starts at its slot, the second job half a cycle or so after
/// the first, as planned; their memory added up over time peaks near the
/// plan's aligned peak and below the sum of their peaks, which is what
/// running them together ungated gives.
#[test]
fn two_gated_workers_interleave_their_memory_as_planned() {
    let _timing = crate::timing();
    let g = mlp(512, 1024, 6, Optimizer::adam());
    let live = Liveness::analyze(&g);
    let vanilla_peak = live.vanilla_footprint().peak;
    // Every op sleeps to a floor and is planned at 1.125 times it, with a
    // 2 GB/s link. Where the mock's work takes longer than a 4 ms floor on
    // this machine, time runs slower for the whole test: the floor, the
    // latencies and the link are scaled alike, so that the plan is the same
    // and every op takes its floor (a period shorter than the iterations it
    // gates could not hold).
    let probe = HostConfig {
        bytes_per_s: Some(2e9),
        ..HostConfig::default()
    };
    let slowest = slowest_co_run_op(&g, &live, Duration::from_millis(4), probe);
    let scale = (slowest.as_secs_f64() / 4e-3).max(1.0) * 1.05;
    let floor = Duration::from_secs_f64(4e-3 * scale);
    eprintln!("slowest op {slowest:?} at a 4 ms floor: time scaled by {scale:.2}");
    let lat = vec![(4.5e6 * scale) as u64; g.ops().len()];
    let gbps = 2e9 / scale;
    let host = HostConfig {
        bytes_per_s: Some(gbps),
        ..HostConfig::default()
    };
    let link = CopyModel::duplex(gbps, gbps, (20_000.0 * scale) as u64);
    let mut cfg = PlannerConfig::new(link);
    cfg.coordinate = true;
    // Threads sleeping and copying on a shared CPU jitter by milliseconds:
    // a period 10% longer than the planned iteration lets the gates hold.
    cfg.gate_slack = 0.1;
    // Below what two copies need ungated, so that the plan gates them.
    cfg.budget_bytes = Some(vanilla_peak * 7 / 10);
    let settings = JobSettings {
        recompute: false,
        ..JobSettings::default()
    };
    let inputs = vec![
        JobInput::new(&g, lat.clone(), settings),
        JobInput::new(&g, lat.clone(), settings),
    ];
    let mp = plan(&inputs, &cfg).expect("plans");
    assert!(
        mp.cycle_ns > 0,
        "the plan is not coordinated: {:?} (sum of peaks {}, vanilla peak {vanilla_peak}, times {:?})",
        mp.diagnostics,
        mp.sum_of_peaks_bytes,
        mp.plans
            .iter()
            .map(|p| (p.prediction.planned_time_ns, p.prediction.vanilla_time_ns))
            .collect::<Vec<_>>()
    );
    let epoch = tensile_proto::clock::monotonic_ns() + 50_000_000;
    let plans: Vec<Plan> = mp
        .plans
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(gate) = &mut p.gate {
                gate.epoch_ns = epoch;
            }
            p
        })
        .collect();
    let runs = run_at_once(&g, &live, &plans.iter().collect::<Vec<_>>(), 5, floor, host);
    let gates: Vec<_> = plans.iter().map(|p| p.gate.expect("gated")).collect();
    let period = gates[0].period_ns;
    // Every iteration starts at its slot (or, late, right after it); the
    // first takes the slot nearest to when the worker came, which may have
    // passed.
    for (j, reports) in runs.iter().enumerate() {
        for r in reports.iter().skip(1) {
            let slot = gates[j].nearest_slot(r.start_monotonic_ns);
            let off = r.start_monotonic_ns.abs_diff(slot);
            assert!(
                off < period / 10,
                "job {j} iteration {} starts {off} ns off its slot (period {period} ns; time, gate wait, stall: {:?})",
                r.iteration,
                reports
                    .iter()
                    .map(|x| (x.time_ns, x.gate_wait_ns, x.stall_ns))
                    .collect::<Vec<_>>()
            );
        }
    }
    // The second job runs the planned phase after the first.
    let phase = (gates[1].phase_ns + period - gates[0].phase_ns) % period;
    for (a, b) in runs[0].iter().zip(&runs[1]).skip(1) {
        let d = (i128::from(b.start_monotonic_ns) - i128::from(a.start_monotonic_ns))
            .rem_euclid(i128::from(period)) as u64;
        let err = d.abs_diff(phase).min(period - d.abs_diff(phase));
        assert!(
            err < period / 8,
            "phase {d} ns, planned {phase} ns (period {period} ns)"
        );
    }
    // Their memory added up over time, after the first iteration.
    let mut changes: Vec<(u64, usize, u64)> = Vec::new();
    for (j, reports) in runs.iter().enumerate() {
        for r in reports.iter().skip(1) {
            changes.extend(r.memory.iter().map(|&(t, m)| (t, j, m)));
        }
    }
    changes.sort();
    let (mut cur, mut best) = ([0u64; 2], 0u64);
    for (_, j, m) in changes {
        cur[j] = m;
        best = best.max(cur[0] + cur[1]);
    }
    let sum_of_peaks: u64 = runs
        .iter()
        .map(|r| r.iter().map(|x| x.measured_peak_bytes).max().unwrap_or(0))
        .sum();
    assert!(
        best < sum_of_peaks,
        "together {best} B, the sum of their peaks {sum_of_peaks} B: no interleaving"
    );
    assert!(
        best as f64 <= mp.aligned_peak_bytes as f64 * 1.1,
        "together {best} B against the planned aligned peak {} B",
        mp.aligned_peak_bytes
    );
}
