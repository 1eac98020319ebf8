//! Validation: every rule, each with the message a user sees.

use expect_test::{Expect, expect};
use tensile_graph::{AliasKind, Limits, Liveness, Phase, Placement, TensorId, TensorKind};

use crate::util::{G, tiny};

/// Builds `g` and checks the error message.
fn rejects(g: G, message: Expect) {
    let err = g.build().expect_err("the graph must be rejected");
    message.assert_eq(&err.to_string());
}

#[test]
fn the_tiny_fixture_is_valid() {
    let g = tiny().build().unwrap();
    assert_eq!(g.ops().len(), 9);
    assert_eq!(g.param_count(), 128);
    // Aliases share memory: r is h's memory, v a view of it, w' is w.
    assert_eq!(g.storage_root(TensorId(3)), TensorId(2));
    assert_eq!(g.storage_root(TensorId(4)), TensorId(2));
    assert_eq!(g.storage_root(TensorId(10)), TensorId(1));
    assert!(g.is_persistent(TensorId(10)));
    assert!(!g.is_persistent(TensorId(3)));
}

#[test]
fn ids_must_be_dense_and_in_order() {
    let mut g = tiny();
    g.draft.tensors[3].id = TensorId(7);
    rejects(
        g,
        expect![[r#"the tensor at index 3 has id 7; tensor ids must be 0, 1, 2, ... in order"#]],
    );
    let mut g = tiny();
    g.draft.ops.swap(0, 1);
    rejects(
        g,
        expect![[r#"the op at index 0 has id 1; op ids must be 0, 1, 2, ... in order"#]],
    );
}

#[test]
fn inputs_and_outputs_must_be_in_range() {
    let mut g = tiny();
    g.draft.ops[2].inputs[0] = TensorId(99);
    rejects(
        g,
        expect![[r#"op 2 "flat": input #0 is tensor 99, out of range (the graph has 11 tensors)"#]],
    );
    let mut g = tiny();
    g.draft.ops[0].outputs.push(TensorId(11));
    rejects(
        g,
        expect![[r#"op 0 "fc": output #1 is tensor 11, out of range (the graph has 11 tensors)"#]],
    );
}

#[test]
fn bytes_must_match_shape_and_dtype() {
    let mut g = tiny();
    g.draft.tensors[2].bytes = 100;
    rejects(
        g,
        expect![[r#"tensor 2 "h": bytes is 100 but shape [4, 16] of f32 needs 256"#]],
    );
}

#[test]
fn sizes_that_overflow_or_exceed_limits_are_refused() {
    let mut g = tiny();
    g.draft.tensors[2].shape = vec![u64::MAX, 2];
    rejects(
        g,
        expect![[
            r#"tensor 2 "h": shape [18446744073709551615, 2] of f32 overflows 64-bit byte counts"#
        ]],
    );
    let mut g = tiny();
    let t = &mut g.draft.tensors[2];
    t.shape = vec![1 << 20, 1 << 20];
    t.bytes = 1 << 42;
    rejects(
        g,
        expect![[
            r#"tensor 2 "h" is 4398046511104 bytes, over the per-tensor limit of 1099511627776"#
        ]],
    );
    let mut g = tiny();
    g.draft.tensors[2].shape = vec![1; 9];
    g.draft.tensors[2].bytes = 4;
    rejects(
        g,
        expect![[r#"tensor 2 "h" has rank 9, over the limit of 8"#]],
    );
}

#[test]
fn counts_are_limited() {
    let limits = Limits {
        max_ops: 3,
        ..Limits::default()
    };
    let err = tensile_graph::Graph::new(tiny().draft, &limits).unwrap_err();
    assert_eq!(err.to_string(), "the graph has 9 ops, over the limit of 3");
}

#[test]
fn a_graph_needs_an_op() {
    // Reported before anything else: a graph without ops also leaves every
    // activation unproduced, which would be a less helpful message.
    let mut g = tiny();
    g.draft.ops.clear();
    rejects(
        g,
        expect![[r#"the graph "tiny" has no ops: there is nothing to run or plan"#]],
    );
}

#[test]
fn a_tensor_is_produced_once() {
    let mut g = tiny();
    g.draft.ops[3].outputs.push(TensorId(2));
    rejects(
        g,
        expect![[r#"tensor 2 "h" is produced twice: by op 0 "fc" and by op 3 "loss""#]],
    );
    let mut g = tiny();
    g.draft.ops[3].outputs.push(TensorId(5));
    rejects(
        g,
        expect![[r#"op 3 "loss" lists tensor 5 "loss" twice among its outputs"#]],
    );
}

#[test]
fn only_initial_kinds_may_be_unproduced() {
    let mut g = tiny();
    g.t("orphan", &[2], TensorKind::Activation);
    rejects(
        g,
        expect![[
            r#"tensor 11 "orphan" (kind activation) is never produced; only inputs, parameters, buffers and optimizer state may exist at iteration start"#
        ]],
    );
    let mut g = tiny();
    g.draft.tensors[2].kind = TensorKind::Input;
    rejects(
        g,
        expect![[r#"tensor 2 "h" has kind input but is produced by op 0 "fc""#]],
    );
}

#[test]
fn use_before_production_is_an_ordering_error() {
    // Swap relu and flat (renumbering ids): flat now reads r before relu makes it.
    let mut g = tiny();
    g.draft.ops.swap(1, 2);
    for (i, op) in g.draft.ops.iter_mut().enumerate() {
        op.id = tensile_graph::OpId(i as u32);
    }
    rejects(
        g,
        expect![[
            r#"op 1 "flat" reads tensor 3 "r" before op 2 "relu" produces it (ops must be listed in execution order)"#
        ]],
    );
}

#[test]
fn cycles_are_named() {
    // fc also reads loss, which depends on fc: fc -> relu -> flat -> loss -> fc.
    let mut g = tiny();
    g.draft.ops[0].inputs.push(TensorId(5));
    rejects(
        g,
        expect![[
            r#"the graph has a cycle: op 0 "fc" -> op 1 "relu" -> op 2 "flat" -> op 3 "loss" -> op 0 "fc""#
        ]],
    );
}

#[test]
fn an_overwritten_version_is_never_read_again() {
    // h was overwritten by relu_ (op 1); reading it in the backward is a bug.
    let mut g = tiny();
    g.draft.ops[6].inputs.push(TensorId(2));
    rejects(
        g,
        expect![[
            r#"op 6 "relu.backward" reads tensor 2 "h" after op 1 "relu" overwrote it in place"#
        ]],
    );
}

#[test]
fn aliases_are_checked() {
    let mut g = tiny();
    g.alias(tensile_graph::OpId(0), 3, 0, AliasKind::View);
    rejects(
        g,
        expect![[
            r#"op 0 "fc": alias output #3 -> input #0 is out of range (1 outputs, 2 inputs)"#
        ]],
    );
    let mut g = tiny();
    g.alias(tensile_graph::OpId(1), 0, 0, AliasKind::View);
    rejects(
        g,
        expect![[r#"op 1 "relu": output #0 aliases more than one input"#]],
    );
    // An in-place output must keep its input's shape.
    let mut g = tiny();
    g.alias(tensile_graph::OpId(0), 0, 0, AliasKind::InPlace);
    rejects(
        g,
        expect![[
            r#"op 0 "fc": in-place output tensor 2 "h" must have the shape and dtype of the input it overwrites, tensor 0 "x""#
        ]],
    );
}

#[test]
fn op_types_and_attributes_are_checked() {
    let mut g = tiny();
    g.draft.ops[4].op_type = " ".into();
    rejects(g, expect![[r#"op 4 "loss.backward" has an empty op type"#]]);
    let mut g = tiny();
    g.draft.ops[4]
        .attrs
        .insert("eps".into(), tensile_graph::AttrValue::Float(f64::NAN));
    rejects(
        g,
        expect![[r#"op 4 "loss.backward": attribute "eps" is not a finite number"#]],
    );
}

#[test]
fn errors_are_one_line_even_for_odd_names() {
    let mut g = tiny();
    g.draft.ops[0].name = "multi\nline".into();
    g.draft.ops[0].inputs[0] = TensorId(1000);
    rejects(
        g,
        expect![[
            r#"op 0 "multi\nline": input #0 is tensor 1000, out of range (the graph has 11 tensors)"#
        ]],
    );
}

#[test]
fn host_ops_update_persistent_storage_that_only_they_write() {
    // The tiny fixture's update (op 8) on the host is valid; its weight is
    // the host's then.
    let mut g = tiny();
    g.draft.ops[8].placement = Placement::Host;
    let ok = g.build().unwrap();
    let live = Liveness::analyze(&ok);
    let w = live.storage(TensorId(1));
    assert!(w.host_master && !w.host_only, "{w:?}");
    // A host op that writes what is not persistent.
    let mut g = tiny();
    g.draft.ops[1].placement = Placement::Host;
    rejects(
        g,
        expect![[
            r#"op 1 "relu" runs on the host, but it updates tensor 2 "h", which is not persistent (a parameter, buffer or optimizer state)"#
        ]],
    );
    // A host op's output that is not an update in place.
    let mut g = tiny();
    g.draft.ops[8].placement = Placement::Host;
    g.draft.ops[8].aliases.clear();
    rejects(
        g,
        expect![[
            r#"op 8 "w.sgd" runs on the host, but its output tensor 10 "w'" is not an in-place update of one of its inputs"#
        ]],
    );
    // A device op that reads the weight after the host op updated it.
    let mut g = tiny();
    g.draft.ops[8].placement = Placement::Host;
    let late = g.t("late", &[8, 16], TensorKind::Gradient);
    g.op(
        "late",
        "aten::clone",
        Phase::Optimizer,
        &[TensorId(10)],
        &[late],
    );
    rejects(
        g,
        expect![[
            r#"op 8 "w.sgd" runs on the host, but op 9 "late" reads tensor 10 "w'" on the device after the host op updated its storage"#
        ]],
    );
}
