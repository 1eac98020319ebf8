//! ONNX export of an [`Mlp`]: the protobuf is written with prost from a
//! subset of ONNX's public schema (`proto/onnx.proto`, compiled by
//! `build.rs`). The graph computes, for `features: float[n, 32]`,
//!
//! ```text
//! Sub(features, mean) -> Div(std) -> Clip(-3, 3) -> Gemm(W1, b1, transB)
//!   -> Relu -> ...
//!   -> Gemm(Wn, bn, transB) -> Clip(lo, hi) = ln_ns: float[n, 1]
//! ```
//!
//! so the normalisation travels inside the model (no sidecar to get out of
//! step with it). Opset 17, IR version 8: ONNX Runtime 1.14 and later.

use prost::Message;

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

/// The input's name: `float[n, FEATURE_LEN]`.
pub const INPUT: &str = "features";
/// The output's name: `float[n, 1]`, the natural log of the latency in ns.
pub const OUTPUT: &str = "ln_ns";

const FLOAT: i32 = 1;
const IR_VERSION: i64 = 8;
const OPSET: i64 = 17;

/// The ONNX model of `mlp`, serialized.
pub fn export(mlp: &Mlp) -> Vec<u8> {
    let mut nodes = Vec::new();
    let mut inits = vec![
        tensor("mean", &[1, mlp.mean.len() as i64], &mlp.mean),
        tensor("std", &[1, mlp.std.len() as i64], &mlp.std),
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
    let last = mlp.layers.len().saturating_sub(1);
    for (i, l) in mlp.layers.iter().enumerate() {
        let (w, b) = (format!("w{i}"), format!("b{i}"));
        inits.push(tensor(&w, &[l.outputs as i64, l.inputs as i64], &l.w));
        inits.push(tensor(&b, &[l.outputs as i64], &l.b));
        let input = format!("h{i}");
        let dense = if i == last {
            "unclipped".to_owned()
        } else {
            format!("z{i}")
        };
        let trans_b = pb::AttributeProto {
            name: "transB".into(),
            i: 1,
            r#type: pb::attribute_proto::AttributeType::Int as i32,
            ..Default::default()
        };
        nodes.push(node(
            &format!("gemm{i}"),
            "Gemm",
            &[&input, &w, &b],
            &dense,
            vec![trans_b],
        ));
        if i != last {
            nodes.push(node(
                &format!("relu{i}"),
                "Relu",
                &[&dense],
                &format!("h{}", i + 1),
                vec![],
            ));
        }
    }
    inits.push(tensor("lo", &[], &[mlp.clamp.0]));
    inits.push(tensor("hi", &[], &[mlp.clamp.1]));
    nodes.push(node(
        "clip",
        "Clip",
        &["unclipped", "lo", "hi"],
        OUTPUT,
        vec![],
    ));
    let width = mlp.mean.len() as i64;
    let model = pb::ModelProto {
        ir_version: IR_VERSION,
        producer_name: "tensile-latency-model".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        doc_string: format!("latency MLP of {}: ln(ns) from op features", mlp.op_type),
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
