//! ONNX export of an [`Mlp`]: the protobuf is written with prost from a
//! subset of ONNX's public schema (`proto/onnx.proto`, compiled by
//! `build.rs`). The graph computes, for `features: float[n, 32]`,
//!
//! ```text
//! Sub(features, mean) -> Div(std) -> Clip(-3, 3) = h0
//! member k: Gemm(h0, Wk1, bk1, transB) -> Relu -> ... -> Gemm(Wk4, bk4) = yk
//! MatMul(features, select) -> Exp -> Sub(1) -> Mul(ns per FLOP, ns per byte)
//!   -> ReduceMax -> Add(launch) -> Log = ln_base
//! Sum(y1..yK) -> Mul(1/K) -> Add(ln_base) -> Clip(lo, hi) = ln_ns: float[n, 1]
//! ```
//!
//! so the normalisation and the roofline base travel inside the model (no
//! sidecar to get out of step with it). Opset 17, IR version 8: ONNX
//! Runtime 1.14 and later.

use prost::Message;
use tensile_latency_model::manifest::{INPUT, OUTPUT};

use crate::train::Mlp;

/// The generated prost types of `proto/onnx.proto`.
#[allow(
    clippy::all,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

const FLOAT: i32 = 1;
const IR_VERSION: i64 = 8;
const OPSET: i64 = 17;

/// The ONNX model of `mlp`, serialized.
pub fn export(mlp: &Mlp) -> Vec<u8> {
    let mut nodes = Vec::new();
    let width = mlp.mean.len() as i64;
    let mut inits = vec![
        tensor("mean", &[1, width], &mlp.mean),
        tensor("std", &[1, width], &mlp.std),
    ];
    nodes.push(node("sub", "Sub", &[INPUT, "mean"], "centred", vec![]));
    nodes.push(node("div", "Div", &["centred", "std"], "scaled", vec![]));
    let clip = crate::train::INPUT_CLIP as f32;
    inits.push(tensor("xlo", &[], &[-clip]));
    inits.push(tensor("xhi", &[], &[clip]));
    nodes.push(node(
        "xclip",
        "Clip",
        &["scaled", "xlo", "xhi"],
        "h0",
        vec![],
    ));
    let mut outputs = Vec::new();
    for (k, layers) in mlp.members.iter().enumerate() {
        let last = layers.len().saturating_sub(1);
        let mut input = "h0".to_owned();
        for (i, l) in layers.iter().enumerate() {
            let (w, b) = (format!("m{k}w{i}"), format!("m{k}b{i}"));
            inits.push(tensor(&w, &[l.outputs as i64, l.inputs as i64], &l.w));
            inits.push(tensor(&b, &[l.outputs as i64], &l.b));
            let dense = format!("m{k}z{i}");
            let trans_b = pb::AttributeProto {
                name: "transB".into(),
                i: 1,
                r#type: pb::attribute_proto::AttributeType::Int as i32,
                ..Default::default()
            };
            nodes.push(node(
                &format!("m{k}gemm{i}"),
                "Gemm",
                &[&input, &w, &b],
                &dense,
                vec![trans_b],
            ));
            input = if i == last {
                dense
            } else {
                let h = format!("m{k}h{}", i + 1);
                nodes.push(node(&format!("m{k}relu{i}"), "Relu", &[&dense], &h, vec![]));
                h
            };
        }
        outputs.push(input);
    }
    let refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    nodes.push(node("sum", "Sum", &refs, "summed", vec![]));
    inits.push(tensor(
        "inv_members",
        &[],
        &[1.0 / mlp.members.len().max(1) as f32],
    ));
    nodes.push(node(
        "average",
        "Mul",
        &["summed", "inv_members"],
        "residual",
        vec![],
    ));

    // ln(launch + max(flops * ns_per_flop, bytes * ns_per_byte)).
    inits.push(tensor("select", &[width, 2], &crate::train::base_select()));
    inits.push(tensor("one", &[], &[1.0]));
    inits.push(tensor(
        "cost",
        &[1, 2],
        &[mlp.base.ns_per_flop, mlp.base.ns_per_byte],
    ));
    inits.push(tensor("launch", &[], &[mlp.base.launch_ns]));
    nodes.push(node(
        "pick",
        "MatMul",
        &[INPUT, "select"],
        "log_work",
        vec![],
    ));
    nodes.push(node("exp", "Exp", &["log_work"], "work1", vec![]));
    nodes.push(node("work", "Sub", &["work1", "one"], "work", vec![]));
    nodes.push(node("roof", "Mul", &["work", "cost"], "roof_ns", vec![]));
    let axes = pb::AttributeProto {
        name: "axes".into(),
        ints: vec![1],
        r#type: pb::attribute_proto::AttributeType::Ints as i32,
        ..Default::default()
    };
    let keepdims = pb::AttributeProto {
        name: "keepdims".into(),
        i: 1,
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        ..Default::default()
    };
    nodes.push(node(
        "slower",
        "ReduceMax",
        &["roof_ns"],
        "busy_ns",
        vec![axes, keepdims],
    ));
    nodes.push(node(
        "launch",
        "Add",
        &["busy_ns", "launch"],
        "base_ns",
        vec![],
    ));
    nodes.push(node("log", "Log", &["base_ns"], "ln_base", vec![]));
    nodes.push(node(
        "corrected",
        "Add",
        &["residual", "ln_base"],
        "unclipped",
        vec![],
    ));
    inits.push(tensor("lo", &[], &[mlp.clamp.0]));
    inits.push(tensor("hi", &[], &[mlp.clamp.1]));
    nodes.push(node(
        "clip",
        "Clip",
        &["unclipped", "lo", "hi"],
        OUTPUT,
        vec![],
    ));
    let model = pb::ModelProto {
        ir_version: IR_VERSION,
        producer_name: env!("CARGO_PKG_NAME").into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: format!(
            "latency model of {}: ln(ns) from op features, the mean of {} MLPs over a roofline",
            mlp.op_type,
            mlp.members.len()
        ),
        graph: Some(pb::GraphProto {
            name: mlp.op_type.clone(),
            node: nodes,
            initializer: inits,
            input: vec![value_info(INPUT, width)],
            output: vec![value_info(OUTPUT, 1)],
            ..Default::default()
        }),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: OPSET,
        }],
        metadata_props: vec![pb::StringStringEntryProto {
            key: "op_type".into(),
            value: mlp.op_type.clone(),
        }],
        ..Default::default()
    };
    model.encode_to_vec()
}

fn node(
    name: &str,
    op: &str,
    inputs: &[&str],
    output: &str,
    attribute: Vec<pb::AttributeProto>,
) -> pb::NodeProto {
    pb::NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: inputs.iter().map(|s| (*s).to_owned()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    }
}

/// A float initializer, little-endian in `raw_data`.
fn tensor(name: &str, dims: &[i64], data: &[f32]) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: FLOAT,
        raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

/// `float[n, width]` with a symbolic batch dimension `n`.
fn value_info(name: &str, width: i64) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{Dimension, dimension::Value};
    let dim = |v| Dimension { value: Some(v) };
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: FLOAT,
                shape: Some(pb::TensorShapeProto {
                    dim: vec![
                        dim(Value::DimParam("n".into())),
                        dim(Value::DimValue(width)),
                    ],
                }),
            })),
        }),
        ..Default::default()
    }
}
