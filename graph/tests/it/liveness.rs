//! Activity analysis and the vanilla footprint on a readable fixture.

use expect_test::expect;
use tensile_graph::builder::{Builder, Optimizer};
use tensile_graph::{DType, Liveness, TensorId};

use crate::util::tiny;

#[test]
fn tiny_graph_frees_each_storage_after_its_last_use() {
    let g = tiny().build().unwrap();
    // x, w at start (128 + 512 B). h/r/v share one 256 B block, freed after
    // relu.backward (op 6), its last reader. w' is w: persistent, never freed.
    expect![[r#"
        graph tiny
          t0 x [4, 8] f32 input 128 B
          t1 w [8, 16] f32 parameter 512 B
          t2 h [4, 16] f32 activation 256 B
          t3 r [4, 16] f32 activation 256 B (memory of t2)
          t4 v [64] f32 activation 256 B (memory of t2)
          t5 loss [] f32 output 4 B
          t6 grad:v [64] f32 gradient 256 B
          t7 grad:r [4, 16] f32 gradient 256 B (memory of t6)
          t8 grad:h [4, 16] f32 gradient 256 B
          t9 grad:w [8, 16] f32 gradient 512 B
          t10 w' [8, 16] f32 parameter 512 B (memory of t1)
        at start: 640 B
        op0 forward aten::mm fc (t0 x, t1 w) -> (t2 h) +256 B | 896 B
        op1 forward aten::relu_ relu (t2 h) -> (t3 r) +0 B | 896 B
        op2 forward aten::view flat (t3 r) -> (t4 v) +0 B | 896 B
        op3 forward aten::sum loss (t4 v) -> (t5 loss) +4 B | 900 B
        op4 backward aten::ones_like loss.backward (t5 loss, t4 v) -> (t6 grad:v) +256 B | 1156 B
        op5 backward aten::view flat.backward (t6 grad:v) -> (t7 grad:r) +0 B | 1156 B
        op6 backward aten::threshold_backward relu.backward (t7 grad:r, t3 r) -> (t8 grad:h) +256 B, free t2 t6 | 1412 B
        op7 backward aten::mm fc.backward (t0 x, t8 grad:h) -> (t9 grad:w) +512 B, free t0 t8 | 1412 B
        op8 optimizer aten::_fused_sgd_ w.sgd (t1 w, t9 grad:w) -> (t10 w') +0 B, free t9 | 1028 B
        vanilla peak: 1412 B during op6
    "#]]
    .assert_eq(&tensile_graph::text::render(&g));
}

#[test]
fn persistent_and_output_storage_is_kept() {
    let g = tiny().build().unwrap();
    let live = Liveness::analyze(&g);
    let w = live.storage(TensorId(10));
    assert!(w.persistent && w.freed_after.is_none() && w.born.is_none());
    let loss = live.storage(TensorId(5));
    assert!(!loss.persistent && loss.freed_after.is_none());
    assert_eq!(live.persistent_bytes(), 512);
    assert_eq!(live.bytes_at_start(), 640);
    // Keeping everything: start + h + loss + grad:v + grad:h + grad:w.
    assert_eq!(
        live.keep_all_footprint().peak,
        640 + 256 + 4 + 256 + 256 + 512
    );
}

#[test]
fn every_freed_storage_is_freed_once_after_it_is_born() {
    for name in ["resnet50", "densenet121", "bert_base"] {
        let g = tensile_graph::zoo::build(name, &tensile_graph::zoo::ZooConfig::new(2)).unwrap();
        let live = Liveness::analyze(&g);
        let mut freed = vec![0; live.storages.len()];
        for (k, frees) in live.frees.iter().enumerate() {
            for s in frees {
                freed[s.index()] += 1;
                let st = &live.storages[s.index()];
                assert!(
                    st.born.is_none_or(|b| b.index() <= k),
                    "{name}: storage freed before birth"
                );
                assert!(!st.persistent);
            }
        }
        for (s, n) in live.storages.iter().zip(freed) {
            assert_eq!(n, usize::from(s.freed_after.is_some()), "{name}");
        }
        let v = live.vanilla_footprint();
        let end = *v.during.last().unwrap();
        assert!(v.peak >= end && v.peak >= v.at_start);
        assert!(v.peak <= live.keep_all_footprint().peak);
    }
}

/// A tiny MLP through the builder: the backward and optimizer ops PyTorch
/// would run, with what each needs saved from the forward pass.
#[test]
fn builder_makes_pytorchs_backward() {
    let mut b = Builder::new("mlp");
    let x = b.input("x", vec![4, 8], DType::F32);
    let y = b.input("y", vec![4], DType::I64);
    let h = b.linear("fc1", x, 16, true);
    let h = b.relu_("relu", h);
    let logits = b.linear("fc2", h, 3, false);
    let loss = b.cross_entropy("loss", logits, y);
    let g = b.finish(loss, Optimizer::sgd()).unwrap();
    let ops: Vec<String> = g
        .ops()
        .iter()
        .map(|o| {
            let ins: Vec<&str> = o
                .inputs
                .iter()
                .map(|&t| g.tensor(t).name.as_str())
                .collect();
            format!("{:<9} {:<34} {}", o.phase.name(), o.op_type, ins.join(", "))
        })
        .collect();
    expect![[r#"
        forward   aten::t                            fc1.weight
        forward   aten::addmm                        fc1.bias, x, fc1.weight.t
        forward   aten::relu_                        fc1
        forward   aten::t                            fc2.weight
        forward   aten::mm                           relu, fc2.weight.t
        forward   aten::_log_softmax                 fc2
        forward   aten::nll_loss_forward             loss.log_softmax, y
        backward  aten::ones_like                    loss
        backward  aten::nll_loss_backward            grad:loss, loss.log_softmax, y, loss.total_weight
        backward  aten::_log_softmax_backward_data   grad:loss.log_softmax, loss.log_softmax
        backward  aten::mm                           grad:fc2, fc2.weight
        backward  aten::t                            grad:fc2
        backward  aten::mm                           fc2.backward.grad_t, relu
        backward  aten::threshold_backward           grad:relu, relu
        backward  aten::t                            grad:fc1
        backward  aten::mm                           fc1.backward.grad_t, x
        backward  aten::sum                          grad:fc1
        optimizer aten::_fused_sgd_                  fc1.weight, grad:fc1.weight, fc1.weight.momentum_buffer
        optimizer aten::_fused_sgd_                  fc1.bias, grad:fc1.bias, fc1.bias.momentum_buffer
        optimizer aten::_fused_sgd_                  fc2.weight, grad:fc2.weight, fc2.weight.momentum_buffer
    "#]]
    .assert_eq(&(ops.join("\n") + "\n"));
}
