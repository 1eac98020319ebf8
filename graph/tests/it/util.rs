//! Helpers to write small graphs by hand.

use tensile_graph::{
    Alias, AliasKind, DType, Graph, GraphDraft, GraphError, Limits, Op, OpId, Phase, Placement,
    Tensor, TensorId, TensorKind,
};

/// A graph under construction; ids are assigned in order.
#[derive(Debug, Default)]
pub(crate) struct G {
    pub(crate) draft: GraphDraft,
}

impl G {
    pub(crate) fn new(name: &str) -> G {
        G {
            draft: GraphDraft {
                name: name.into(),
                ..GraphDraft::default()
            },
        }
    }

    /// An f32 tensor of the given shape and kind.
    pub(crate) fn t(&mut self, name: &str, shape: &[u64], kind: TensorKind) -> TensorId {
        let id = TensorId(self.draft.tensors.len() as u32);
        self.draft.tensors.push(Tensor {
            id,
            name: name.into(),
            shape: shape.to_vec(),
            dtype: DType::F32,
            bytes: shape.iter().product::<u64>() * 4,
            kind,
        });
        id
    }

    pub(crate) fn op(
        &mut self,
        name: &str,
        op_type: &str,
        phase: Phase,
        inputs: &[TensorId],
        outputs: &[TensorId],
    ) -> OpId {
        let id = OpId(self.draft.ops.len() as u32);
        self.draft.ops.push(Op {
            id,
            name: name.into(),
            op_type: op_type.into(),
            attrs: tensile_graph::Attrs::new(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            aliases: Vec::new(),
            phase,
            placement: Placement::Device,
        });
        id
    }

    /// Marks output `output` of `op` as sharing input `input`'s memory.
    pub(crate) fn alias(&mut self, op: OpId, output: u32, input: u32, kind: AliasKind) {
        self.draft.ops[op.index()].aliases.push(Alias {
            output,
            input,
            kind,
        });
    }

    pub(crate) fn build(self) -> Result<Graph, GraphError> {
        Graph::new(self.draft, &Limits::default())
    }
}

/// x -> fc (addmm) -> relu_ (in place) -> view -> loss, with the backward of
/// the fc weight and an SGD-like in-place update: small, but it has every
/// kind of storage the analysis distinguishes.
pub(crate) fn tiny() -> G {
    use TensorKind::*;
    let mut g = G::new("tiny");
    let x = g.t("x", &[4, 8], Input);
    let w = g.t("w", &[8, 16], Parameter);
    let h = g.t("h", &[4, 16], Activation);
    let r = g.t("r", &[4, 16], Activation);
    let v = g.t("v", &[64], Activation);
    let loss = g.t("loss", &[], Output);
    let gv = g.t("grad:v", &[64], Gradient);
    let gr = g.t("grad:r", &[4, 16], Gradient);
    let gh = g.t("grad:h", &[4, 16], Gradient);
    let gw = g.t("grad:w", &[8, 16], Gradient);
    let w2 = g.t("w'", &[8, 16], Parameter);
    g.op("fc", "aten::mm", Phase::Forward, &[x, w], &[h]);
    let relu = g.op("relu", "aten::relu_", Phase::Forward, &[h], &[r]);
    g.alias(relu, 0, 0, AliasKind::InPlace);
    let view = g.op("flat", "aten::view", Phase::Forward, &[r], &[v]);
    g.alias(view, 0, 0, AliasKind::View);
    g.op("loss", "aten::sum", Phase::Forward, &[v], &[loss]);
    g.op(
        "loss.backward",
        "aten::ones_like",
        Phase::Backward,
        &[loss, v],
        &[gv],
    );
    let gview = g.op("flat.backward", "aten::view", Phase::Backward, &[gv], &[gr]);
    g.alias(gview, 0, 0, AliasKind::View);
    g.op(
        "relu.backward",
        "aten::threshold_backward",
        Phase::Backward,
        &[gr, r],
        &[gh],
    );
    g.op("fc.backward", "aten::mm", Phase::Backward, &[x, gh], &[gw]);
    let step = g.op(
        "w.sgd",
        "aten::_fused_sgd_",
        Phase::Optimizer,
        &[w, gw],
        &[w2],
    );
    g.alias(step, 0, 0, AliasKind::InPlace);
    g
}
