//! BERT-base as Hugging Face transformers'
//! `BertForSequenceClassification(BertConfig(num_labels=classes))` with the
//! eager attention implementation, in training mode: bert-base-uncased sizes
//! (vocabulary 30522, hidden 768, 12 layers of 12 heads, intermediate 3072,
//! 512 positions, 2 token types, LayerNorm eps 1e-12, dropout 0.1
//! everywhere), a tanh pooler on the first token, dropout and a linear
//! classifier, cross-entropy on the logits. The "resolution" is the sequence
//! length.
//!
//! Attention follows transformers' `eager_attention_forward`: the per-head
//! views `[B, 12, S, 64]` are transposes, so `torch.matmul` (ATen's batched
//! path for two 4-D operands) reshapes each operand to `[B*12, n, m]`, which
//! copies it (`clone` then a view) whenever its strides cannot merge batch and
//! heads, i.e. when both B and S exceed 1: the query, the transposed key and
//! the value are copied; the attention probabilities, contiguous, are only
//! viewed. `transpose(1, 2).contiguous()` of the context copies it unless
//! S is 1. Scores are scaled by `64 ** -0.5` (`aten::mul`).
//!
//! Approximations:
//! - the inputs are what the model receives after its own preprocessing:
//!   `position_ids` `[1, S]` and `token_type_ids` (slices of registered
//!   buffers when not passed) and the attention mask already extended to the
//!   additive float `[B, 1, 1, S]` (transformers 4's `get_extended_attention_mask`;
//!   transformers 5 builds `[B, 1, S, S]` for eager attention, or skips the
//!   add when nothing is padded);
//! - the builder creates parameters in call order, so to list them in
//!   `named_parameters()` order (which is also the optimizer's order) the
//!   position embedding is looked up before the token-type one, two small ops
//!   earlier than transformers does (so its backward runs one op later);
//! - the no-op `expand`s inside `torch.matmul` and the final no-op
//!   `.contiguous()` are left out, `_unsafe_view` is an `aten::view` and
//!   `transpose` an `aten::permute`;
//! - the word embedding's `padding_idx=0` is not recorded (the builder's
//!   embedding has none); it changes no shape or size;
//! - in the backward pass (built by the builder's autograd) gradients are
//!   viewed back where PyTorch's `reshape` copies the transposed ones: up to
//!   four `[B, S, 768]` copies per layer are missing, and `bmm`'s two gradients
//!   come in the other order (PyTorch computes `mat2`'s first).
//!
//! Checked against a trace of one training step of transformers 5.23 on
//! PyTorch 2.11 (CPU, B in {1, 2}, S in {1, 8}): the same non-view ops with
//! the same shapes, forward and backward, apart from the differences above.

use crate::builder::Builder;
use crate::ir::{DType, TensorId};
use crate::zoo::{Dims, ZooModel};

pub(crate) const BERT_BASE: ZooModel = ZooModel {
    name: "bert_base",
    description: "BERT-base (transformers BertForSequenceClassification, eager attention), sequence length 128",
    params: 109_483_778,
    default_resolution: 128,
    default_classes: 2,
    min_resolution: 1,
    max_resolution: MAX_POSITIONS,
    build,
};

const VOCAB: u64 = 30_522;
const HIDDEN: u64 = 768;
const LAYERS: usize = 12;
const HEADS: u64 = 12;
const HEAD_DIM: u64 = HIDDEN / HEADS;
const INTERMEDIATE: u64 = 3072;
const MAX_POSITIONS: u64 = 512;
const TYPE_VOCAB: u64 = 2;
const EPS: f64 = 1e-12;
const DROPOUT: f64 = 0.1;
/// `attention_head_size ** -0.5`.
const SCALING: f64 = 0.125;

fn build(b: &mut Builder, d: &Dims) -> TensorId {
    let (batch, seq) = (d.batch, d.resolution);
    let input_ids = b.input("input_ids", vec![batch, seq], DType::I64);
    let token_type_ids = b.input("token_type_ids", vec![batch, seq], DType::I64);
    let position_ids = b.input("position_ids", vec![1, seq], DType::I64);
    let mask = b.input("attention_mask", vec![batch, 1, 1, seq], DType::F32);
    let labels = b.input("labels", vec![batch], DType::I64);

    let mut h = embeddings(b, input_ids, token_type_ids, position_ids);
    for i in 0..LAYERS {
        h = layer(b, &format!("bert.encoder.layer.{i}"), h, mask);
    }
    let pooled = pooler(b, h);

    let x = b.dropout("dropout", pooled, DROPOUT);
    let logits = b.linear("classifier", x, d.classes, true);
    // `loss_fct(logits.view(-1, num_labels), labels.view(-1))`.
    let logits = b.view("logits.view", logits, vec![batch, d.classes]);
    let labels = b.view("labels.view", labels, vec![batch]);
    b.cross_entropy("loss", logits, labels)
}

/// `BertEmbeddings`: word + token type + position, LayerNorm, dropout.
fn embeddings(
    b: &mut Builder,
    input_ids: TensorId,
    token_type_ids: TensorId,
    position_ids: TensorId,
) -> TensorId {
    let n = |part: &str| format!("bert.embeddings.{part}");
    let words = b.embedding(&n("word_embeddings"), input_ids, VOCAB, HIDDEN);
    // Looked up before the token types only to create the parameters in
    // `named_parameters()` order (see the module docs).
    let positions = b.embedding(
        &n("position_embeddings"),
        position_ids,
        MAX_POSITIONS,
        HIDDEN,
    );
    let types = b.embedding(
        &n("token_type_embeddings"),
        token_type_ids,
        TYPE_VOCAB,
        HIDDEN,
    );
    let e = b.add(&n("add_token_type"), words, types);
    let e = b.add(&n("add_position"), e, positions);
    let e = b.layer_norm(&n("LayerNorm"), e, EPS);
    b.dropout(&n("dropout"), e, DROPOUT)
}

/// `BertLayer`: self-attention, then the feed-forward block, each closed by
/// dropout, a residual sum and LayerNorm.
fn layer(b: &mut Builder, name: &str, x: TensorId, mask: TensorId) -> TensorId {
    let a = self_attention(b, &format!("{name}.attention.self"), x, mask);
    let h = add_norm(b, &format!("{name}.attention.output"), a, x);
    let i = b.linear(&format!("{name}.intermediate.dense"), h, INTERMEDIATE, true);
    let i = b.gelu(&format!("{name}.intermediate.intermediate_act_fn"), i);
    add_norm(b, &format!("{name}.output"), i, h)
}

/// `BertSelfOutput` / `BertOutput`: `LayerNorm(dropout(dense(x)) + residual)`.
fn add_norm(b: &mut Builder, name: &str, x: TensorId, residual: TensorId) -> TensorId {
    let h = b.linear(&format!("{name}.dense"), x, HIDDEN, true);
    let h = b.dropout(&format!("{name}.dropout"), h, DROPOUT);
    let h = b.add(&format!("{name}.add"), h, residual);
    b.layer_norm(&format!("{name}.LayerNorm"), h, EPS)
}

/// `BertSelfAttention` with `eager_attention_forward`.
fn self_attention(b: &mut Builder, name: &str, x: TensorId, mask: TensorId) -> TensorId {
    let shape = b.shape(x).to_vec();
    let (batch, seq) = (shape[0], shape[1]);
    // Whether `[B, 12, S, 64]` transposed from `[B, S, 12, 64]` (or with its
    // last two dims swapped) must be copied to merge B and the heads.
    let split_copies = batch > 1 && seq > 1;
    let heads = |b: &mut Builder, proj: &str| {
        let p = format!("{name}.{proj}");
        let y = b.linear(&p, x, HIDDEN, true);
        // Its gradient arrives permuted back: autograd's reshape copies it.
        let shape = vec![batch, seq, HEADS, HEAD_DIM];
        let y = b.view_grad_copies(&format!("{p}.view"), y, shape, split_copies);
        b.permute(&format!("{p}.transpose"), y, vec![0, 2, 1, 3])
    };
    let q = heads(b, "query");
    let k = heads(b, "key");
    let v = heads(b, "value");

    let kt = b.permute(&format!("{name}.key.transpose_2_3"), k, vec![0, 1, 3, 2]);
    let scores = matmul(
        b,
        &format!("{name}.matmul_qk"),
        (q, split_copies),
        (kt, split_copies),
        false,
    );
    let scores = b.scale(&format!("{name}.scaling"), scores, SCALING);
    let scores = b.add(&format!("{name}.add_mask"), scores, mask);
    let probs = b.softmax(&format!("{name}.softmax"), scores, -1);
    let probs = b.dropout(&format!("{name}.dropout"), probs, DROPOUT);
    let context = matmul(
        b,
        &format!("{name}.matmul_pv"),
        (probs, false),
        (v, split_copies),
        split_copies,
    );

    let context = b.permute(&format!("{name}.transpose_out"), context, vec![0, 2, 1, 3]);
    let context = if seq > 1 {
        b.contiguous(&format!("{name}.contiguous"), context)
    } else {
        context
    };
    b.view(
        &format!("{name}.reshape"),
        context,
        vec![batch, seq, HIDDEN],
    )
}

/// `torch.matmul` of two 4-D tensors `[B, H, n, k]` and `[B, H, k, m]` as
/// ATen's batched path runs it: each operand reshaped to 3-D (copied first
/// when its flag says its strides forbid a view), `bmm`, and the product
/// viewed back to `[B, H, n, m]`. `grad_copies`: the product's gradient
/// arrives permuted (attention transposes the product), so the backward of
/// that last view copies it before viewing it as 3-D.
fn matmul(
    b: &mut Builder,
    name: &str,
    (a, a_copies): (TensorId, bool),
    (c, c_copies): (TensorId, bool),
    grad_copies: bool,
) -> TensorId {
    let to_3d = |b: &mut Builder, operand: &str, t: TensorId, copies: bool| {
        let s = b.shape(t).to_vec();
        let t = if copies {
            b.contiguous(&format!("{name}.{operand}.clone"), t)
        } else {
            t
        };
        b.view(
            &format!("{name}.{operand}.view"),
            t,
            vec![s[0] * s[1], s[2], s[3]],
        )
    };
    let (sa, sc) = (b.shape(a).to_vec(), b.shape(c).to_vec());
    let a3 = to_3d(b, "mat1", a, a_copies);
    let c3 = to_3d(b, "mat2", c, c_copies);
    let out = b.bmm(name, a3, c3);
    let shape = vec![sa[0], sa[1], sa[2], sc[3]];
    b.view_grad_copies(&format!("{name}.view"), out, shape, grad_copies)
}

/// `BertPooler`: the first token's hidden state, dense, tanh.
fn pooler(b: &mut Builder, h: TensorId) -> TensorId {
    let first = b.select("bert.pooler.select", h, 1, 0);
    let p = b.linear("bert.pooler.dense", first, HIDDEN, true);
    b.tanh("bert.pooler.activation", p)
}
