//! FLOPs and bytes of single ops, checked by hand, and op classes.

use tensile_graph::TensorKind;
use tensile_latency_model::{DeviceProfile, OpClass, OpCost, op_class, op_cost, roofline_ns};

use crate::util::{grouped_conv, only, tiny_cnn, zoo_graphs};

#[test]
fn conv_forward_is_two_flops_per_multiply_add() {
    let g = tiny_cnn();
    let conv = only(&g, "aten::convolution");
    // Output [2, 4, 8, 8] = 512 elements, each 3 * 3 * 3 = 27 multiply-adds,
    // plus one bias add.
    let flops = 2.0 * 512.0 * 27.0 + 512.0;
    // Input 2*3*8*8, weight 4*3*3*3, bias 4, output 512; all f32.
    let bytes = 4.0 * (384.0 + 108.0 + 4.0 + 512.0);
    assert_eq!(op_cost(&g, conv), OpCost { flops, bytes });
    assert_eq!(op_class(conv), OpClass::Conv);
}

#[test]
fn grouped_strided_conv_counts_channels_per_group() {
    let g = grouped_conv();
    let conv = only(&g, "aten::convolution");
    // Output [1, 8, 4, 4] = 128 elements; weight [8, 2, 3, 3]: 18 each.
    assert_eq!(g.tensor(conv.outputs[0]).shape, [1, 8, 4, 4]);
    let cost = op_cost(&g, conv);
    assert_eq!(cost.flops, 2.0 * 128.0 * 18.0);
    assert_eq!(cost.bytes, 4.0 * (324.0 + 144.0 + 128.0));
}

#[test]
fn conv_backward_computes_only_the_masked_gradients() {
    let g = tiny_cnn();
    let bw = only(&g, "aten::convolution_backward");
    // The image needs no gradient: weight and bias only.
    assert_eq!(bw.ints_attr("output_mask"), Some(&[0, 1, 1][..]));
    // Weight gradient: as many multiply-adds as the forward; bias: one add
    // per grad-output element.
    let flops = 2.0 * 512.0 * 27.0 + 512.0;
    // Reads grad_output and the input (not the weight), writes both grads.
    let bytes = 4.0 * (512.0 + 384.0 + 108.0 + 4.0);
    assert_eq!(op_cost(&g, bw), OpCost { flops, bytes });
}

#[test]
fn addmm_is_two_m_k_n_plus_the_bias() {
    let g = tiny_cnn();
    let fc = only(&g, "aten::addmm");
    // [2, 256] x [256, 3] + bias [3].
    let flops = 2.0 * 2.0 * 256.0 * 3.0 + 6.0;
    let bytes = 4.0 * (3.0 + 512.0 + 768.0 + 6.0);
    assert_eq!(op_cost(&g, fc), OpCost { flops, bytes });
    assert_eq!(op_class(fc), OpClass::Matmul);
    // Its backward: grad_input = g [2, 3] x W [3, 256]; grad_weight = g.t() x x.
    let mms: Vec<_> = g.ops().iter().filter(|o| o.op_type == "aten::mm").collect();
    assert_eq!(mms.len(), 2);
    for mm in mms {
        assert_eq!(
            op_cost(&g, mm).flops,
            2.0 * 2.0 * 3.0 * 256.0,
            "{}",
            mm.name
        );
    }
}

#[test]
fn views_cost_nothing_and_take_no_time() {
    let p = DeviceProfile::builtin("a6000").unwrap();
    let g = tiny_cnn();
    let views: Vec<_> = g
        .ops()
        .iter()
        .filter(|o| matches!(o.op_type.as_str(), "aten::view" | "aten::t"))
        .collect();
    assert!(views.len() >= 3);
    for op in views {
        assert_eq!(op_class(op), OpClass::View);
        assert_eq!(op_cost(&g, op), OpCost::ZERO);
        assert_eq!(roofline_ns(&p, op, &op_cost(&g, op)), 0);
    }
}

#[test]
fn unknown_ops_cost_their_bytes() {
    let mut draft = tiny_cnn().into_draft();
    let relu = draft
        .ops
        .iter_mut()
        .find(|o| o.op_type == "aten::addmm")
        .unwrap();
    relu.op_type = "custom::mystery".into();
    let g = tensile_graph::Graph::new(draft, &Default::default()).unwrap();
    let op = only(&g, "custom::mystery");
    let bytes: u64 = op
        .inputs
        .iter()
        .chain(&op.outputs)
        .map(|&t| g.tensor(t).bytes)
        .sum();
    assert_eq!(
        op_cost(&g, op),
        OpCost {
            flops: 0.0,
            bytes: bytes as f64
        }
    );
    assert_eq!(op_class(op), OpClass::Elementwise);
}

#[test]
fn roofline_is_launch_plus_the_slower_roof() {
    let p = DeviceProfile::builtin("a6000").unwrap();
    let g = tiny_cnn();
    let conv = only(&g, "aten::convolution");
    let e = p.efficiency.conv;
    let big = OpCost {
        flops: 1e12,
        bytes: 1e6,
    };
    let compute = 1e12 / (p.peak_flops * e.compute) * 1e9;
    assert_eq!(
        roofline_ns(&p, conv, &big),
        p.kernel_launch_ns + compute.ceil() as u64
    );
    let wide = OpCost {
        flops: 1.0,
        bytes: 1e9,
    };
    let memory = 1e9 / (p.mem_bytes_per_s * e.memory) * 1e9;
    assert_eq!(
        roofline_ns(&p, conv, &wide),
        p.kernel_launch_ns + memory.ceil() as u64
    );
    assert_eq!(roofline_ns(&p, conv, &OpCost::ZERO), p.kernel_launch_ns);
}

#[test]
fn every_zoo_op_has_a_finite_cost_and_a_class() {
    for g in zoo_graphs(2) {
        let mut kinds = std::collections::BTreeSet::new();
        for op in g.ops() {
            let c = op_cost(&g, op);
            assert!(
                c.flops.is_finite() && c.flops >= 0.0,
                "{} {}",
                g.name(),
                op.name
            );
            assert!(
                c.bytes.is_finite() && c.bytes >= 0.0,
                "{} {}",
                g.name(),
                op.name
            );
            let class = op_class(op);
            kinds.insert(class);
            if class.is_kernel() && op.op_type != "aten::ones_like" {
                assert!(c.bytes > 0.0, "{} {} moves no bytes", g.name(), op.name);
            }
            // The heavy ops do arithmetic.
            if matches!(class, OpClass::Conv | OpClass::Matmul | OpClass::Optimizer) {
                assert!(c.flops > 0.0, "{} {}", g.name(), op.name);
            }
        }
        assert!(kinds.contains(&OpClass::Optimizer), "{}", g.name());
        assert!(kinds.contains(&OpClass::View), "{}", g.name());
    }
}

#[test]
fn optimizer_updates_read_four_and_write_three_tensors() {
    let g = grouped_conv();
    let adam = g
        .ops()
        .iter()
        .find(|o| o.op_type == "aten::_fused_adam_")
        .unwrap();
    let p = adam.inputs[0];
    assert_eq!(g.tensor(p).kind, TensorKind::Parameter);
    let numel = 8.0 * 2.0 * 3.0 * 3.0;
    let c = op_cost(&g, adam);
    assert_eq!(c.bytes, 7.0 * 4.0 * numel);
    assert!(c.flops > 10.0 * numel);
}
