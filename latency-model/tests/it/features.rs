//! Feature vectors of small readable graphs, pinned; and, bit for bit, the
//! features the shipped models were trained on.

use std::collections::{BTreeMap, HashSet};

use expect_test::expect;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_latency_model::dataset::read_samples;
use tensile_latency_model::manifest::shipped_cpu_models;
use tensile_latency_model::{FEATURE_LEN, op_features};

use crate::util::{grouped_conv, tiny_cnn};

/// One line per kernel op: type, then the features to two decimals.
fn render(g: &tensile_graph::Graph, utilization: f32) -> String {
    let mut out = String::new();
    for op in g.ops() {
        let Some(f) = op_features(g, op, utilization) else {
            out.push_str(&format!("{} view\n", op.op_type));
            continue;
        };
        assert_eq!(f.len(), FEATURE_LEN);
        let nums: Vec<String> = f.iter().map(|x| format!("{x:.2}")).collect();
        out.push_str(&format!("{} {}\n", op.op_type, nums.join(" ")));
    }
    out
}

#[test]
fn tiny_cnn_features() {
    expect![[r#"
        aten::convolution 0.50 4.00 1.58 2.00 3.17 3.17 2.32 2.00 2.00 2.00 0.00 0.00 0.00 2.32 1.58 2.32 3.17 3.17 3.00 1.00 1.00 1.00 1.00 0.00 0.00 1.00 0.00 0.00 0.00 14.78 11.98 8.96
        aten::view view
        aten::t view
        aten::addmm 0.50 4.00 0.00 0.00 0.00 2.00 0.00 0.00 1.58 8.01 0.00 0.00 8.01 2.00 0.00 0.00 1.58 2.00 3.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 11.59 12.33 10.33
        aten::_log_softmax 0.50 4.00 0.00 0.00 1.58 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.58 2.00 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 4.95 5.61 2.81
        aten::nll_loss_forward 0.50 4.00 0.00 0.00 1.58 2.00 0.00 0.00 0.00 1.58 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.58 5.04 3.17
        aten::ones_like 0.50 4.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.32 1.00
        aten::nll_loss_backward 0.50 4.00 0.00 0.00 0.00 0.00 0.00 0.00 1.58 2.00 0.00 0.00 0.00 1.58 0.00 0.00 1.58 2.00 4.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.58 5.36 3.46
        aten::_log_softmax_backward_data 0.50 4.00 0.00 0.00 1.58 2.00 0.00 0.00 1.58 2.00 0.00 0.00 0.00 0.00 0.00 0.00 1.58 2.00 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 4.64 6.19 3.70
        aten::mm 0.50 4.00 0.00 0.00 1.58 2.00 0.00 0.00 2.00 8.01 0.00 0.00 0.00 0.00 0.00 0.00 1.58 8.01 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 11.59 12.33 9.60
        aten::t view
        aten::mm 0.50 4.00 0.00 0.00 2.00 1.58 0.00 0.00 1.58 8.01 0.00 0.00 0.00 0.00 0.00 0.00 2.00 8.01 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 11.59 12.33 9.02
        aten::sum 0.50 4.00 0.00 0.00 1.58 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.00 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.81 5.21 2.81
        aten::view view
        aten::convolution_backward 0.50 4.00 1.58 2.32 3.17 3.17 1.58 2.00 3.17 3.17 2.32 2.00 2.00 2.00 2.32 2.00 2.00 2.00 3.00 1.00 1.00 1.00 1.00 0.00 0.00 1.00 0.00 6.00 0.00 14.78 11.98 9.97
        aten::_fused_sgd_ 0.50 4.00 2.32 2.00 2.00 2.00 2.32 2.00 2.00 2.00 2.32 2.00 2.00 2.00 2.32 2.00 2.00 2.00 3.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.01 8.76 11.08 8.34
        aten::_fused_sgd_ 0.50 4.00 0.00 0.00 0.00 2.32 0.00 0.00 0.00 2.32 0.00 0.00 0.00 2.32 0.00 0.00 0.00 2.32 3.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.01 4.09 6.34 3.70
        aten::_fused_sgd_ 0.50 4.00 0.00 0.00 2.00 8.01 0.00 0.00 2.00 8.01 0.00 0.00 2.00 8.01 0.00 0.00 2.00 8.01 3.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.01 11.59 13.91 11.17
        aten::_fused_sgd_ 0.50 4.00 0.00 0.00 0.00 2.00 0.00 0.00 0.00 2.00 0.00 0.00 0.00 2.00 0.00 0.00 0.00 2.00 3.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.01 3.70 5.93 3.32
    "#]]
    .assert_eq(&render(&tiny_cnn(), 0.5));
}

#[test]
fn grouped_strided_conv_features() {
    expect![[r#"
        aten::convolution 0.00 4.00 1.00 2.32 3.32 3.32 3.17 1.58 2.00 2.00 0.00 0.00 0.00 0.00 1.00 3.17 2.32 2.32 2.00 1.58 1.58 0.00 0.00 0.00 0.00 1.58 0.00 0.00 0.00 12.17 11.22 8.87
        aten::view view
        aten::_log_softmax 0.00 4.00 0.00 0.00 1.00 7.01 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 7.01 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 9.32 10.00 7.01
        aten::nll_loss_forward 0.00 4.00 0.00 0.00 1.00 7.01 0.00 0.00 0.00 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 4.39 7.02
        aten::ones_like 0.00 4.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 2.32 1.00
        aten::nll_loss_backward 0.00 4.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 7.01 0.00 0.00 0.00 1.00 0.00 0.00 1.00 7.01 4.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 9.03 7.04
        aten::_log_softmax_backward_data 0.00 4.00 0.00 0.00 1.00 7.01 0.00 0.00 1.00 7.01 0.00 0.00 0.00 0.00 0.00 0.00 1.00 7.01 2.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 1.00 0.00 0.00 9.00 10.59 8.01
        aten::view view
        aten::convolution_backward 0.00 4.00 1.00 3.17 2.32 2.32 1.00 2.32 3.32 3.32 3.17 1.58 2.00 2.00 3.17 1.58 2.00 2.00 3.00 1.58 1.58 0.00 0.00 0.00 0.00 1.58 0.00 2.00 0.00 12.17 11.22 9.22
        aten::_fused_adam_ 0.00 4.00 3.17 1.58 2.00 2.00 3.17 1.58 2.00 2.00 3.17 1.58 2.00 2.00 3.17 1.58 2.00 2.00 4.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 0.00 11.17 11.98 9.17
    "#]]
    .assert_eq(&render(&grouped_conv(), 0.0));
}

#[test]
fn utilization_is_clamped_and_only_changes_slot_zero() {
    let g = tiny_cnn();
    for op in g.ops() {
        let (Some(a), Some(b), Some(c)) = (
            op_features(&g, op, 0.0),
            op_features(&g, op, 7.0),
            op_features(&g, op, f32::NAN),
        ) else {
            continue;
        };
        assert_eq!(b[0], 1.0);
        assert_eq!(c[0], 0.0);
        assert_eq!(a[1..], b[1..]);
    }
}

#[test]
fn the_shipped_models_training_features_are_computed_bit_for_bit() {
    // Every held-out sample measured on a zoo build (`model@BxR`) carries
    // the features the profiler computed: serving must compute the same
    // bits from the same graph, or the models see inputs they were not
    // trained on.
    let samples = read_samples(&shipped_cpu_models().join("heldout.jsonl")).unwrap();
    let mut by_source: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for s in &samples {
        by_source.entry(s.source.as_str()).or_default().push(s);
    }
    let mut checked = 0;
    for (source, group) in by_source {
        let Some((name, size)) = source.split_once('@') else {
            continue;
        };
        let Some((batch, res)) = size.split_once('x') else {
            continue;
        };
        let (Ok(batch), Ok(res)) = (batch.parse(), res.parse()) else {
            continue;
        };
        if zoo::MODELS.iter().all(|m| m.name != name) {
            continue;
        }
        let mut cfg = ZooConfig::new(batch);
        cfg.resolution = Some(res);
        let g = zoo::build(name, &cfg).unwrap();
        let loads: HashSet<u32> = group.iter().map(|s| s.features[0].to_bits()).collect();
        let mut computed = HashSet::new();
        for op in g.ops() {
            for &u in &loads {
                if let Some(f) = op_features(&g, op, f32::from_bits(u)) {
                    computed.insert((op.op_type.as_str(), f.map(f32::to_bits)));
                }
            }
        }
        for s in group {
            let bits: Vec<u32> = s.features.iter().map(|x| x.to_bits()).collect();
            let bits: [u32; FEATURE_LEN] = bits.try_into().unwrap();
            assert!(
                computed.contains(&(s.op_type.as_str(), bits)),
                "{source} {}: features differ from the profile's",
                s.op_type
            );
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} samples from zoo builds");
}
