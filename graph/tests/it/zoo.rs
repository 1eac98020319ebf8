//! The model zoo: reference parameter counts, validity, and errors on bad sizes.

use tensile_graph::builder::{Optimizer, Step, UnknownOptimizer};
use tensile_graph::zoo::{self, ZooConfig, ZooError};
use tensile_graph::{Graph, Liveness, Phase, TensorKind};

/// Parameter counts of the reference implementations: torchvision for VGG-16,
/// ResNet-50, DenseNet-121 and Inception-V3 (with its auxiliary head), timm
/// for Inception-V4, transformers' BertForSequenceClassification (2 labels).
const REFERENCE: [(&str, u64); 6] = [
    ("vgg16", 138_357_544),
    ("resnet50", 25_557_032),
    ("densenet121", 7_978_856),
    ("inception_v3", 27_161_264),
    ("inception_v4", 42_679_816),
    ("bert_base", 109_483_778),
];

#[test]
fn parameter_counts_match_the_references() {
    for (name, params) in REFERENCE {
        for optimizer in [Optimizer::adam(), Optimizer::sgd()] {
            let config = ZooConfig {
                optimizer,
                ..ZooConfig::new(2)
            };
            let g = zoo::build(name, &config).unwrap();
            assert_eq!(g.param_count(), params, "{name}");
            assert_eq!(g.param_bytes(), params * 4, "{name}");
        }
        assert_eq!(zoo::model(name).unwrap().params, params);
    }
    assert_eq!(zoo::MODELS.len(), REFERENCE.len());
}

#[test]
fn every_model_has_all_three_phases_and_one_update_per_parameter() {
    for m in &zoo::MODELS {
        let g = m.build(&ZooConfig::new(2)).unwrap();
        let count = |p| g.ops().iter().filter(|o| o.phase == p).count();
        assert!(
            count(Phase::Forward) > 0 && count(Phase::Backward) > 0,
            "{}",
            m.name
        );
        assert_eq!(
            count(Phase::Optimizer),
            g.parameters().count(),
            "{}",
            m.name
        );
        // Adam keeps two moments per parameter: persistent = params x 3 + buffers.
        let live = Liveness::analyze(&g);
        assert!(live.persistent_bytes() >= 3 * g.param_bytes(), "{}", m.name);
        assert!(
            live.persistent_bytes() < 3 * g.param_bytes() + g.param_bytes() / 50,
            "{}",
            m.name
        );
    }
}

#[test]
fn sgd_keeps_one_buffer_per_parameter() {
    let g = zoo::build(
        "resnet50",
        &ZooConfig {
            optimizer: Optimizer::sgd(),
            ..ZooConfig::new(2)
        },
    )
    .unwrap();
    let live = Liveness::analyze(&g);
    assert!(live.persistent_bytes() >= 2 * g.param_bytes());
    assert!(live.persistent_bytes() < 3 * g.param_bytes());
}

#[test]
fn the_vanilla_peak_grows_with_the_batch() {
    for m in &zoo::MODELS {
        let peak = |batch| {
            let g = m.build(&ZooConfig::new(batch)).unwrap();
            Liveness::analyze(&g).vanilla_footprint().peak
        };
        let (p2, p8) = (peak(2), peak(8));
        assert!(p8 > p2, "{}: {p8} <= {p2}", m.name);
    }
}

#[test]
fn building_is_deterministic() {
    for m in &zoo::MODELS {
        let a = m.build(&ZooConfig::new(2)).unwrap();
        let b = m.build(&ZooConfig::new(2)).unwrap();
        assert_eq!(a, b, "{}", m.name);
    }
}

#[test]
fn bad_sizes_are_errors_not_panics() {
    let err = |name: &str, config: ZooConfig| zoo::build(name, &config).unwrap_err().to_string();
    assert_eq!(
        err("resnet50", ZooConfig::new(0)),
        "resnet50: batch size 0 is out of range (1 to 65536)"
    );
    assert_eq!(
        err(
            "vgg16",
            ZooConfig {
                resolution: Some(8),
                ..ZooConfig::new(2)
            }
        ),
        "vgg16: resolution 8 is out of range (32 to 4096)"
    );
    assert_eq!(
        err(
            "bert_base",
            ZooConfig {
                resolution: Some(513),
                ..ZooConfig::new(2)
            }
        ),
        "bert_base: resolution 513 is out of range (1 to 512)"
    );
    assert!(matches!(
        zoo::build("resnet51", &ZooConfig::new(2)),
        Err(ZooError::UnknownModel { .. })
    ));
    // Training-mode batch norm over one value per channel fails in PyTorch too.
    let msg = err(
        "resnet50",
        ZooConfig {
            resolution: Some(32),
            ..ZooConfig::new(1)
        },
    );
    assert!(msg.contains("one value per channel"), "{msg}");
    // Sizes that overflow the per-tensor limit are caught by validation.
    let msg = err(
        "vgg16",
        ZooConfig {
            resolution: Some(4096),
            ..ZooConfig::new(65_536)
        },
    );
    assert!(msg.contains("over the per-tensor limit"), "{msg}");
}

#[test]
fn every_resolution_in_range_builds_or_errs_cleanly() {
    for m in &zoo::MODELS {
        for r in [
            m.min_resolution,
            m.min_resolution + 1,
            m.default_resolution,
            m.min_resolution + 37,
        ] {
            let result = m.build(&ZooConfig {
                resolution: Some(r),
                ..ZooConfig::new(2)
            });
            assert!(result.is_ok(), "{} at {r}: {:?}", m.name, result.err());
        }
    }
}

#[test]
fn updates_in_the_backward_pass_follow_each_final_gradient() {
    assert_eq!(
        Optimizer::with_step_from_name("adam-in-backward"),
        Ok((Optimizer::adam(), Step::InBackward))
    );
    assert_eq!(
        Optimizer::with_step_from_name("sgd"),
        Ok((Optimizer::sgd(), Step::AtEnd))
    );
    assert_eq!(
        Optimizer::with_step_from_name("adam-in-forward"),
        Err(UnknownOptimizer("adam-in-forward".to_string()))
    );
    for m in &zoo::MODELS {
        let at_end = m.build(&ZooConfig::new(2)).unwrap();
        let in_backward = m
            .build(&ZooConfig {
                step: Step::InBackward,
                ..ZooConfig::new(2)
            })
            .unwrap();
        let named = |g: &Graph| {
            let mut ops: Vec<(String, String, Vec<String>)> = g
                .ops()
                .iter()
                .map(|o| {
                    let inputs = o.inputs.iter().map(|&t| g.tensor(t).name.clone());
                    (o.name.clone(), o.op_type.clone(), inputs.collect())
                })
                .collect();
            ops.sort();
            ops
        };
        // The same ops over the same tensors: every update reads the
        // gradient it read after the backward pass, the final one.
        assert_eq!(named(&at_end), named(&in_backward), "{}", m.name);
        let ops = in_backward.ops();
        let last_backward = ops
            .iter()
            .rposition(|o| o.phase == Phase::Backward)
            .unwrap();
        let mut early = 0;
        for (i, op) in ops.iter().enumerate() {
            if op.phase != Phase::Optimizer {
                continue;
            }
            let g = op.inputs[1];
            assert!(
                ops[i + 1..].iter().all(|o| !o.inputs.contains(&g)),
                "{}: {} runs before its gradient is final",
                m.name,
                op.name
            );
            early += usize::from(i < last_backward);
        }
        // All but the updates of what the first layer's backward reaches
        // last run inside the backward pass.
        assert!(early * 2 > in_backward.parameters().count(), "{}", m.name);
        let peak = |g: &Graph| Liveness::analyze(g).vanilla_footprint().peak;
        assert!(peak(&in_backward) <= peak(&at_end), "{}", m.name);
    }
}

#[test]
fn updates_on_the_host_keep_the_optimizer_state_off_the_device() {
    assert_eq!(
        Optimizer::with_step_from_name("adam-on-host"),
        Ok((Optimizer::adam(), Step::OnHost))
    );
    assert_eq!(
        Optimizer::with_step_from_name("sgd-on-host"),
        Ok((Optimizer::sgd(), Step::OnHost))
    );
    for m in &zoo::MODELS {
        let build = |step| {
            m.build(&ZooConfig {
                step,
                ..ZooConfig::new(2)
            })
            .unwrap()
        };
        let (in_backward, on_host) = (build(Step::InBackward), build(Step::OnHost));
        // The same iteration, op for op; only where the updates run differs.
        assert_eq!(in_backward.ops().len(), on_host.ops().len(), "{}", m.name);
        for (a, b) in in_backward.ops().iter().zip(on_host.ops()) {
            assert_eq!(
                (&a.name, &a.inputs, &a.outputs),
                (&b.name, &b.inputs, &b.outputs)
            );
            assert_eq!(b.on_host(), b.phase == Phase::Optimizer, "{}", b.name);
        }
        let (lb, lh) = (Liveness::analyze(&in_backward), Liveness::analyze(&on_host));
        let state: u64 = on_host
            .tensors()
            .iter()
            .filter(|t| t.kind == TensorKind::OptimizerState && on_host.producer(t.id).is_none())
            .map(|t| t.bytes)
            .sum();
        assert_eq!(lh.host_only_bytes(), state, "{}", m.name);
        assert_eq!(
            lh.persistent_bytes() + state,
            lb.persistent_bytes(),
            "{}",
            m.name
        );
        assert!(
            lh.vanilla_footprint().peak + state <= lb.vanilla_footprint().peak,
            "{}",
            m.name
        );
        // The state's storages are the host's; the parameters' too, read
        // on the device.
        for p in on_host.parameters() {
            let s = lh.storage(p.id);
            assert!(s.host_master && !s.host_only, "{}: {}", m.name, p.name);
        }
    }
}
