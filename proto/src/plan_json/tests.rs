//! Plan files: plans of ResNet-50 (free, and under a budget below the
//! lower bound: recomputations, waits, a diagnostic) round-trip exactly;
//! every wrong id or name is an error naming the item; random bytes and
//! mutated files are errors, never panics.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

use proptest::prelude::*;
use serde_json::Value;
use tensile_graph::Graph;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_planner::{
    CopyModel, EventKind, JobInput, JobSettings, MultiPlan, PlannerConfig, Trigger,
};

use super::*;

fn resnet() -> Graph {
    zoo::build("resnet50", &ZooConfig::new(2)).unwrap()
}

/// Ours on `graph` at 20 us per op on a 2 GB/s link (too fast for swaps
/// to hide much), under `budget`.
fn planned(graph: &Graph, budget: Option<u64>) -> MultiPlan {
    let mut config = PlannerConfig::new(CopyModel::duplex(2e9, 2e9, 10_000));
    config.budget_bytes = budget;
    let lat = vec![20_000; graph.ops().len()];
    let input = JobInput::new(graph, lat, JobSettings::default());
    tensile_planner::plan(&[input], &config).unwrap()
}

/// The plan as a file reads it back: the time lines are not stored.
fn without_timelines(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    p.prediction.timeline.clear();
    p.prediction.vanilla_timeline.clear();
    p
}

fn file_of(mp: &MultiPlan, g: &Graph) -> Value {
    serde_json::from_str(&plan_to_json(&mp.plans[0], &mp.diagnostics, g)).unwrap()
}

fn read(v: &Value, g: &Graph) -> Result<PlanFile, PlanFileError> {
    read_plan_file(serde_json::to_vec(v).unwrap(), g)
}

#[test]
fn plans_round_trip_exactly() {
    let g = resnet();
    for budget in [None, Some(1)] {
        let mp = planned(&g, budget);
        let plan = &mp.plans[0];
        let text = plan_to_json(plan, &mp.diagnostics, &g);
        let back = read_plan_file(&text, &g).unwrap();
        assert_eq!(back.plan, without_timelines(plan), "{budget:?}");
        assert_eq!(back.diagnostics, mp.diagnostics, "{budget:?}");
        assert_eq!(plan_from_json(text.as_bytes(), &g).unwrap(), back.plan);
        if budget.is_some() {
            // The budget plan has every kind of trigger, waits and a
            // diagnostic: all of them went through the file.
            let has = |f: &dyn Fn(&Event) -> bool| plan.events.iter().any(f);
            assert!(has(&|e| matches!(e.trigger, Trigger::Before(_))));
            assert!(has(&|e| e.kind == EventKind::Recompute));
            assert!(!plan.prediction.waits.is_empty());
            assert_eq!(mp.diagnostics[0].kind, DiagnosticKind::OverBudget);
        } else {
            assert!(plan.events.iter().any(|e| e.kind == EventKind::SwapOut));
        }
    }
    let text = plan_to_json(&planned(&g, None).plans[0], &[], &g);
    assert!(text.contains("\"format\": \"tensile-plan/v1\""));
    assert!(text.contains("\"trigger_op_name\": "));
}

#[test]
fn gates_round_trip_and_bad_ones_are_named() {
    let g = resnet();
    let mut plan = planned(&g, None).plans.remove(0);
    assert!(!plan_to_json(&plan, &[], &g).contains("\"gate\""));
    plan.gate = Some(tensile_planner::Gate {
        period_ns: 1_000_000,
        phase_ns: 400_000,
        epoch_ns: 77,
    });
    let text = plan_to_json(&plan, &[], &g);
    assert_eq!(
        read_plan_file(&text, &g).unwrap().plan,
        without_timelines(&plan)
    );
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["gate"]["phase_ns"] = Value::from(2_000_000u64);
    assert_eq!(
        read(&v, &g).unwrap_err().to_string(),
        "gate: gate phase 2000000 ns is not less than its period 1000000 ns"
    );
    v["gate"]["period_ns"] = Value::from(0u64);
    assert!(
        read(&v, &g)
            .unwrap_err()
            .to_string()
            .contains("gate period 0 ns")
    );
}

#[test]
fn paces_round_trip_and_bad_ones_are_named() {
    let g = resnet();
    let mut plan = planned(&g, None).plans.remove(0);
    assert!(!plan_to_json(&plan, &[], &g).contains("op_start_ns"));
    plan.prediction.op_start_ns = (0..g.ops().len() as u64).map(|i| 10 * i).collect();
    let text = plan_to_json(&plan, &[], &g);
    assert_eq!(
        read_plan_file(&text, &g).unwrap().plan,
        without_timelines(&plan)
    );
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["prediction"]["op_start_ns"][7] = Value::from(0u64);
    assert_eq!(
        read(&v, &g).unwrap_err().to_string(),
        "prediction: op 7 starts before op 6"
    );
    v["prediction"]["op_start_ns"] = Value::from(vec![1u64, 2]);
    assert!(
        read(&v, &g)
            .unwrap_err()
            .to_string()
            .contains("2 op starts for a graph of")
    );
}

#[test]
fn a_wrong_tensor_id_names_the_event() {
    let g = resnet();
    let mut v = file_of(&planned(&g, None), &g);
    v["events"][3]["tensor"] = Value::from(1_000_000_000u64);
    let err = read(&v, &g).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "event 3: tensor 1000000000 is out of range (the graph has {} tensors)",
            g.tensors().len()
        )
    );
    let mut v = file_of(&planned(&g, None), &g);
    v["events"][0]["tensor"] = Value::from(u64::MAX);
    assert!(matches!(
        read(&v, &g),
        Err(PlanFileError::TensorOutOfRange {
            at: Item::Event(0),
            ..
        })
    ));
}

#[test]
fn a_name_mismatch_names_the_event_and_both_names() {
    let g = resnet();
    let mp = planned(&g, None);
    let mut v = file_of(&mp, &g);
    let e = &mp.plans[0].events[2];
    v["events"][2]["tensor_name"] = Value::from("not.this.one");
    let err = read(&v, &g).unwrap_err().to_string();
    let want = format!(
        "event 2: tensor {} is {:?} in the graph, not \"not.this.one\"",
        e.tensor.0,
        g.tensor(e.tensor).name
    );
    assert_eq!(err, want);
    let i = mp.plans[0]
        .events
        .iter()
        .position(|e| matches!(e.trigger, Trigger::After(_)))
        .unwrap();
    let mut v = file_of(&mp, &g);
    v["events"][i]["trigger_op_name"] = Value::from("elsewhere");
    let err = read(&v, &g).unwrap_err().to_string();
    assert!(err.starts_with(&format!("event {i}: op ")), "{err}");
    assert!(err.ends_with("not \"elsewhere\""), "{err}");
}

#[test]
fn the_plan_must_be_for_this_graph_and_this_format() {
    let g = resnet();
    let v = file_of(&planned(&g, None), &g);
    let other = zoo::build("resnet50", &ZooConfig::new(4)).unwrap();
    let err = read(&v, &other).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the plan is for graph \"resnet50_b2_r224_adam\", not \"resnet50_b4_r224_adam\""
    );
    let mut bad = v.clone();
    bad["format"] = Value::from("tensile-plan/v0");
    assert!(matches!(read(&bad, &g), Err(PlanFileError::Format { .. })));
    let mut bad = v.clone();
    bad["events"][1]["kind"] = Value::from("teleport");
    assert_eq!(
        read(&bad, &g).unwrap_err().to_string(),
        "event 1: unknown event kind \"teleport\""
    );
    let after = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .position(|e| e["trigger"] == "after")
        .unwrap();
    let mut bad = v.clone();
    bad["events"][after]["trigger"] = Value::from("iteration_start");
    assert_eq!(
        read(&bad, &g).unwrap_err().to_string(),
        format!("event {after}: trigger \"iteration_start\" has no trigger op")
    );
    let mut bad = v.clone();
    bad["surprise"] = Value::from(1);
    let err = read(&bad, &g).unwrap_err().to_string();
    assert!(err.contains("unknown field `surprise`"), "{err}");
}

#[test]
fn events_name_storage_roots_and_start_on_host_is_persistent() {
    let g = resnet();
    let mp = planned(&g, None);
    // A view: a tensor whose storage root is another tensor.
    let view = g
        .tensors()
        .iter()
        .find(|t| g.storage_root(t.id) != t.id)
        .unwrap();
    let mut v = file_of(&mp, &g);
    v["events"][0]["tensor"] = Value::from(view.id.0);
    v["events"][0]["tensor_name"] = Value::from(view.name.clone());
    let err = read(&v, &g).unwrap_err().to_string();
    assert!(err.contains("events name the storage's root"), "{err}");
    let activation = g.tensors().iter().find(|t| !g.is_persistent(t.id)).unwrap();
    let mut v = file_of(&mp, &g);
    v["start_on_host"] = serde_json::json!([
        {"tensor": activation.id.0, "tensor_name": activation.name}
    ]);
    let err = read(&v, &g).unwrap_err().to_string();
    assert!(err.starts_with("start_on_host 0: "), "{err}");
}

#[test]
fn a_plan_from_elsewhere_is_checked_by_the_files_rules_without_a_panic() {
    let g = resnet();
    let mp = planned(&g, Some(1));
    check_plan(&mp.plans[0], &g).unwrap();
    let view = g
        .tensors()
        .iter()
        .find(|t| g.storage_root(t.id) != t.id)
        .unwrap();
    let mut on_view = mp.plans[0].clone();
    on_view.events[0].tensor = view.id;
    let err = check_plan(&on_view, &g).unwrap_err().to_string();
    assert!(err.contains("events name the storage's root"), "{err}");
    let mut out_of_range = mp.plans[0].clone();
    out_of_range.events[1].tensor = TensorId(u32::MAX);
    let err = check_plan(&out_of_range, &g).unwrap_err().to_string();
    assert!(
        err.starts_with("event 1: tensor 4294967295 is out of range"),
        "{err}"
    );
    let mut bad_op = mp.plans[0].clone();
    bad_op.events[0].trigger = Trigger::After(OpId(u32::MAX));
    let err = check_plan(&bad_op, &g).unwrap_err().to_string();
    assert!(
        err.starts_with("event 0: op 4294967295 is out of range"),
        "{err}"
    );
}

#[test]
fn empty_input_is_not_a_plan() {
    let g = resnet();
    for text in ["", "  \n", "null", "[]", "{}"] {
        let err = plan_from_json(text, &g).unwrap_err();
        assert!(
            matches!(err, PlanFileError::Malformed { .. }),
            "{text:?}: {err}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_are_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let g = zoo::build("resnet50", &ZooConfig::new(1)).unwrap();
        prop_assert!(plan_from_json(&bytes, &g).is_err());
    }

    #[test]
    fn mutated_files_never_panic(at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let g = zoo::build("resnet50", &ZooConfig::new(1)).unwrap();
        let mp = planned(&g, None);
        let mut text = plan_to_json(&mp.plans[0], &mp.diagnostics, &g).into_bytes();
        let i = at.index(text.len());
        text[i] = byte;
        // Either it still reads (a changed delay) or it is an error.
        let _ = read_plan_file(&text, &g);
    }
}
