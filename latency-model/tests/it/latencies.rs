//! Whole-graph latencies: the truth, the estimate, and the zoo.

use tensile_graph::Graph;
use tensile_latency_model::{
    DeviceProfile, estimate_latencies, op_class, roofline_latencies, true_latencies,
};

use crate::util::{zoo_graph, zoo_graphs};

fn profiles() -> Vec<DeviceProfile> {
    DeviceProfile::builtin_names()
        .into_iter()
        .map(|n| DeviceProfile::builtin(n).unwrap())
        .collect()
}

/// Every kernel op positive, every view zero.
fn assert_kernels_positive(g: &Graph, lat: &[u64], what: &str) {
    assert_eq!(lat.len(), g.ops().len());
    for (op, &t) in g.ops().iter().zip(lat) {
        if op_class(op).is_kernel() {
            assert!(t > 0, "{what}: {} {} has latency 0", g.name(), op.name);
        } else {
            assert_eq!(t, 0, "{what}: view {} {}", g.name(), op.name);
        }
    }
}

#[test]
fn every_zoo_model_gets_positive_latencies_on_every_profile() {
    for g in zoo_graphs(2) {
        for p in profiles() {
            assert_kernels_positive(&g, &roofline_latencies(&g, &p), "roofline");
            assert_kernels_positive(&g, &true_latencies(&g, &p, 7), "truth");
            assert_kernels_positive(&g, &estimate_latencies(&g, &p), "estimate");
        }
    }
}

#[test]
fn truth_is_deterministic_per_seed_and_differs_between_seeds() {
    let p = DeviceProfile::builtin("a6000").unwrap();
    for g in zoo_graphs(2) {
        let a = true_latencies(&g, &p, 1);
        assert_eq!(a, true_latencies(&g, &p, 1), "{}", g.name());
        let b = true_latencies(&g, &p, 2);
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        let kernels = g.ops().iter().filter(|o| op_class(o).is_kernel()).count();
        assert!(
            differ * 10 > kernels * 9,
            "{}: {differ} of {kernels}",
            g.name()
        );
    }
}

#[test]
fn truth_scatters_around_the_roofline() {
    let p = DeviceProfile::builtin("h100").unwrap();
    let g = &zoo_graph("resnet50", 4);
    let roof = roofline_latencies(g, &p);
    let truth = true_latencies(g, &p, 42);
    let logs: Vec<f64> = roof
        .iter()
        .zip(&truth)
        .filter(|(r, _)| **r > 0)
        .map(|(&r, &t)| (t as f64 / r as f64).ln())
        .collect();
    let n = logs.len() as f64;
    let mean = logs.iter().sum::<f64>() / n;
    let sd = (logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    // Clipped log-normal, sigma 0.25, mean factor 1.
    assert!((0.15..0.35).contains(&sd), "sd {sd}");
    assert!(logs.iter().all(|x| x.abs() < 0.25 * 3.0 + 0.05));
    let total = |v: &[u64]| v.iter().sum::<u64>() as f64;
    let ratio = total(&truth) / total(&roof);
    assert!((0.9..1.1).contains(&ratio), "truth / roofline {ratio}");
}

#[test]
fn identical_ops_share_their_bias() {
    // BERT's twelve layers repeat the same ops on the same shapes.
    let p = DeviceProfile::builtin("a6000").unwrap();
    let g = &zoo_graph("bert_base", 2);
    let truth = true_latencies(g, &p, 3);
    let times = |prefix: &str| -> Vec<u64> {
        g.ops()
            .iter()
            .filter(|o| o.name.starts_with(prefix) && o.phase == tensile_graph::Phase::Forward)
            .map(|o| truth[o.id.index()])
            .collect()
    };
    let first = times("bert.encoder.layer.0.");
    assert!(!first.is_empty());
    assert_eq!(first, times("bert.encoder.layer.7."));
}

#[test]
fn the_estimate_is_wrong_per_op_but_close_in_total() {
    for p in profiles() {
        for g in zoo_graphs(16) {
            let truth = true_latencies(&g, &p, 0);
            let est = estimate_latencies(&g, &p);
            assert_ne!(truth, est);
            let errors: Vec<f64> = truth
                .iter()
                .zip(&est)
                .filter(|(t, _)| **t > 0)
                .map(|(&t, &e)| (e as f64 / t as f64 - 1.0).abs())
                .collect();
            let mape = errors.iter().sum::<f64>() / errors.len() as f64;
            assert!(mape > 0.1, "{} on {}: mape {mape}", g.name(), p.name);
            let total = |v: &[u64]| v.iter().sum::<u64>() as f64;
            let ratio = total(&est) / total(&truth);
            assert!(
                (0.6..1.7).contains(&ratio),
                "{} on {}: estimate / truth {ratio}",
                g.name(),
                p.name
            );
        }
    }
}

#[test]
fn resnet50_at_batch_32_takes_a_realistic_time_on_the_a6000() {
    let p = DeviceProfile::builtin("a6000").unwrap();
    let g = zoo_graph("resnet50", 32);
    let ms = true_latencies(&g, &p, 0).iter().sum::<u64>() as f64 / 1e6;
    assert!((90.0..200.0).contains(&ms), "{ms} ms");
}
