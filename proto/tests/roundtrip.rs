//! Wire round trips: every zoo graph survives encode -> decode -> validate,
//! and bad wire graphs get the same errors as bad files.

#![allow(clippy::unwrap_used)] // tests unwrap: a failure is the test failing

use prost::Message;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{GraphError, Limits};
use tensile_proto::convert::{graph_from_proto, graph_to_proto};
use tensile_proto::pb;

#[test]
fn every_zoo_graph_round_trips_through_protobuf() {
    for m in &zoo::MODELS {
        let g = m.build(&ZooConfig::new(2)).unwrap();
        let bytes = graph_to_proto(&g).encode_to_vec();
        let decoded = pb::Graph::decode(bytes.as_slice()).unwrap();
        let back = graph_from_proto(decoded, &Limits::default()).unwrap();
        assert_eq!(back, g, "{}", m.name);
    }
}

fn resnet() -> pb::Graph {
    graph_to_proto(&zoo::build("resnet50", &ZooConfig::new(1)).unwrap())
}

#[test]
fn unspecified_enums_are_rejected_with_the_culprit_named() {
    let mut g = resnet();
    g.tensors[3].dtype = pb::Dtype::Unspecified as i32;
    let err = graph_from_proto(g, &Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a graph: tensor 3 \"conv1\": unknown or unspecified dtype 0"
    );
    let mut g = resnet();
    g.ops[5].phase = 42;
    let err = graph_from_proto(g, &Limits::default()).unwrap_err();
    assert!(
        err.to_string().ends_with("unknown or unspecified phase 42"),
        "{err}"
    );
    let mut g = resnet();
    g.ops[0]
        .attrs
        .insert("empty".into(), pb::AttrValue { value: None });
    let err = graph_from_proto(g, &Limits::default()).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("attribute \"empty\" has no value"),
        "{err}"
    );
}

#[test]
fn wire_graphs_are_validated_like_files() {
    let mut g = resnet();
    g.ops[10].inputs[0] = 1_000_000;
    let err = graph_from_proto(g, &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::InputOutOfRange {
                tensor: 1_000_000,
                ..
            }
        ),
        "{err}"
    );
    let g = resnet();
    let limits = Limits {
        max_tensors: 10,
        ..Limits::default()
    };
    let err = graph_from_proto(g, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::TooMany {
                what: "tensors",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn diagnostics_keep_their_kind_and_tensor_on_the_wire() {
    use tensile_planner::{Diagnostic, DiagnosticKind};
    use tensile_proto::convert::{diagnostic_from_proto, diagnostic_to_proto};
    for (i, kind) in DiagnosticKind::ALL.into_iter().enumerate() {
        let d = Diagnostic {
            job: i,
            kind,
            tensor: (i % 2 == 0).then_some(tensile_graph::TensorId(i as u32 * 7)),
            message: format!("{} happened", kind.name()),
        };
        let wire = diagnostic_to_proto(&d, 100 + i as u64);
        assert_eq!(wire.job_id, 100 + i as u64);
        let bytes = wire.encode_to_vec();
        let back = pb::Diagnostic::decode(bytes.as_slice()).unwrap();
        assert_eq!(diagnostic_from_proto(&back, i).unwrap(), d);
    }
    let unspecified = pb::Diagnostic::default();
    let err = diagnostic_from_proto(&unspecified, 0).unwrap_err();
    assert_eq!(err.to_string(), "unknown or unspecified diagnostic kind 0");
}

#[test]
fn plans_round_trip_through_protobuf_and_bad_ones_are_named() {
    use tensile_planner::{CopyModel, JobInput, JobSettings, PlannerConfig, Trigger};
    use tensile_proto::convert::{PlanFromProtoError, plan_from_proto, plan_to_proto};
    let g = zoo::build("resnet50", &ZooConfig::new(2)).unwrap();
    let lat = vec![50_000; g.ops().len()];
    let cfg = PlannerConfig::new(CopyModel::duplex(12e9, 12e9, 10_000));
    let plan = tensile_planner::plan(&[JobInput::new(&g, lat, JobSettings::default())], &cfg)
        .unwrap()
        .plans
        .remove(0);
    assert!(
        plan.events
            .iter()
            .any(|e| matches!(e.trigger, Trigger::After(_)))
    );
    let wire = plan_to_proto(&plan, 42);
    assert_eq!(wire.job_id, 42);
    let bytes = wire.encode_to_vec();
    let back = plan_from_proto(&pb::Plan::decode(bytes.as_slice()).unwrap(), &g).unwrap();
    assert_eq!(back.version, plan.version);
    assert_eq!(back.start_on_host, plan.start_on_host);
    // Delays travel as seconds: equal to the nanosecond.
    assert_eq!(back.events, plan.events);
    assert_eq!(
        back.prediction.planned_peak_bytes,
        plan.prediction.planned_peak_bytes
    );
    // The swap counts do not travel; they are the events'.
    assert_eq!(
        (back.prediction.swap_outs, back.prediction.swap_ins),
        (
            plan.count(tensile_planner::EventKind::SwapOut),
            plan.count(tensile_planner::EventKind::SwapIn)
        )
    );

    let mut bad = wire.clone();
    bad.events[0].tensor = u32::MAX;
    let err = plan_from_proto(&bad, &g).unwrap_err();
    assert!(
        matches!(err, PlanFromProtoError::Tensor { index: 0, .. }),
        "{err}"
    );
    let mut bad = wire.clone();
    bad.events[0].delay_s = f64::NAN;
    assert!(
        plan_from_proto(&bad, &g)
            .unwrap_err()
            .to_string()
            .contains("delay NaN")
    );
    let mut bad = wire.clone();
    bad.events[0].kind = 99;
    assert_eq!(
        plan_from_proto(&bad, &g).unwrap_err().to_string(),
        "event 0: unknown or unspecified event kind 99"
    );

    // A pace travels to the nanosecond; a wrong one is refused, named.
    let n = g.ops().len();
    let paced = tensile_planner::Plan {
        prediction: tensile_planner::Prediction {
            op_start_ns: (0..n as u64).map(|i| i * 1_000).collect(),
            ..plan.prediction.clone()
        },
        ..plan.clone()
    };
    let back = plan_from_proto(&plan_to_proto(&paced, 1), &g).unwrap();
    assert_eq!(back.prediction.op_start_ns, paced.prediction.op_start_ns);
    let mut bad = plan_to_proto(&paced, 1);
    let pred = bad.prediction.as_mut().unwrap();
    pred.op_start_s.swap(3, 4);
    assert_eq!(
        plan_from_proto(&bad, &g).unwrap_err().to_string(),
        "prediction: op 4 starts before op 3"
    );
    let pred = bad.prediction.as_mut().unwrap();
    pred.op_start_s.truncate(5);
    assert!(
        plan_from_proto(&bad, &g)
            .unwrap_err()
            .to_string()
            .contains(&format!("5 op starts for a graph of {n} ops"))
    );
    let pred = bad.prediction.as_mut().unwrap();
    pred.op_start_s = vec![f64::NAN; n];
    assert!(
        plan_from_proto(&bad, &g)
            .unwrap_err()
            .to_string()
            .contains("op 0 starts at NaN s")
    );

    // A gate travels whole; absurd ones are refused, naming the number.
    let gate = tensile_planner::Gate {
        period_ns: 250_000_000,
        phase_ns: 125_000_000,
        epoch_ns: 987_654_321,
    };
    let gated = tensile_planner::Plan {
        gate: Some(gate),
        ..plan.clone()
    };
    let wire = plan_to_proto(&gated, 1);
    let back = plan_from_proto(
        &pb::Plan::decode(wire.encode_to_vec().as_slice()).unwrap(),
        &g,
    )
    .unwrap();
    assert_eq!(back.gate, Some(gate));
    assert_eq!(
        plan_from_proto(&plan_to_proto(&plan, 1), &g).unwrap().gate,
        None
    );
    for (period, phase, what) in [
        (0, 0, "gate period 0 ns is not in 1 ns to 1 hour"),
        (u64::MAX, 0, "is not in 1 ns to 1 hour"),
        (
            100,
            100,
            "gate phase 100 ns is not less than its period 100 ns",
        ),
    ] {
        let mut bad = wire.clone();
        bad.gate = Some(pb::IterationGate {
            period_ns: period,
            phase_ns: phase,
            epoch_ns: 0,
        });
        let err = plan_from_proto(&bad, &g).unwrap_err().to_string();
        assert!(err.starts_with("gate: ") && err.contains(what), "{err}");
    }
}
