//! The JSON format: round trips and clear errors.

use tensile_graph::builder::Step;
use tensile_graph::zoo::{self, ZooConfig};
use tensile_graph::{GraphError, Limits, json};

use crate::util::tiny;

#[test]
fn every_zoo_graph_round_trips_through_json() {
    for m in &zoo::MODELS {
        for step in Step::ALL {
            let config = ZooConfig {
                step,
                ..ZooConfig::new(2)
            };
            let g = m.build(&config).unwrap();
            for text in [json::to_string(&g), json::to_string_pretty(&g)] {
                let back = json::parse(text.as_bytes(), &Limits::default()).unwrap();
                assert_eq!(back, g, "{} {step:?}", m.name);
            }
        }
    }
}

#[test]
fn placement_is_written_only_for_host_ops() {
    let on_host = zoo::build(
        "resnet50",
        &ZooConfig {
            step: Step::OnHost,
            ..ZooConfig::new(1)
        },
    )
    .unwrap();
    let text = json::to_string(&on_host);
    let host_ops = on_host.ops().iter().filter(|o| o.on_host()).count();
    assert_eq!(text.matches("\"placement\":\"host\"").count(), host_ops);
    assert!(!text.contains("\"placement\":\"device\""));
    let bad = text.replacen("\"placement\":\"host\"", "\"placement\":\"gpu\"", 1);
    let err = json::parse(bad.as_bytes(), &Limits::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown placement \"gpu\" (expected device or host)"),
        "{err}"
    );
}

#[test]
fn unknown_enums_and_fields_name_the_culprit() {
    let text = json::to_string_pretty(&tiny().build().unwrap());
    let parse = |s: &str| {
        json::parse(s.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string()
    };
    let bad_dtype = text.replacen("\"dtype\": \"f32\"", "\"dtype\": \"f31\"", 1);
    assert_eq!(
        parse(&bad_dtype),
        "not a graph: tensor 0 \"x\": unknown dtype \"f31\" (expected one of f32, f16, bf16, f64, i64, i32, i16, i8, u8, bool)"
    );
    let bad_phase = text.replacen("\"phase\": \"forward\"", "\"phase\": \"sideways\"", 1);
    assert_eq!(
        parse(&bad_phase),
        "not a graph: op 0 \"fc\": unknown phase \"sideways\" (expected one of forward, backward, optimizer)"
    );
    let extra = text.replacen("\"name\": \"tiny\"", "\"name\": \"tiny\", \"colour\": 3", 1);
    assert!(
        parse(&extra).contains("unknown field `colour`"),
        "{}",
        parse(&extra)
    );
    assert_eq!(parse(""), "not a graph: the input is empty");
    assert!(parse("{").starts_with("not a graph: invalid graph JSON: EOF"));
    let wrong_format = text.replacen("tensile-graph/v1", "tensile-graph/v0", 1);
    assert_eq!(
        parse(&wrong_format),
        "not a graph: format is \"tensile-graph/v0\", expected \"tensile-graph/v1\""
    );
}

#[test]
fn ids_beyond_32_bits_are_out_of_range_not_truncated() {
    let text = json::to_string(&tiny().build().unwrap());
    let bad = text.replacen("\"inputs\":[0,1]", "\"inputs\":[4294967296,1]", 1);
    let err = json::parse(bad.as_bytes(), &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            GraphError::InputOutOfRange {
                tensor: 4_294_967_296,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    let limits = Limits {
        max_input_bytes: 10,
        ..Limits::default()
    };
    let err = json::parse(b"{\"format\": \"tensile-graph/v1\"}", &limits).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the input is 30 bytes, over the limit of 10 bytes"
    );
}

#[test]
fn deep_nesting_is_an_error() {
    let deep = "[".repeat(100_000);
    let err = json::parse(deep.as_bytes(), &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("invalid graph JSON"), "{err}");
}

#[test]
fn counts_are_refused_before_any_item_is_decoded() {
    // The tiny graph's tensors and ops are valid, but the limits are under
    // its counts: the count, not a later check, is what gets reported, by
    // the draft parser as by validation.
    let text = json::to_string(&tiny().build().unwrap());
    let limits = Limits {
        max_tensors: 2,
        ..Limits::default()
    };
    let err = json::parse_draft(text.as_bytes(), &limits).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the graph has 11 tensors, over the limit of 2"
    );
    let limits = Limits {
        max_ops: 2,
        ..Limits::default()
    };
    let err = json::parse_draft(text.as_bytes(), &limits).unwrap_err();
    assert_eq!(err.to_string(), "the graph has 9 ops, over the limit of 2");
}
