"""Small Hugging Face transformers and timm models with random weights.

Shared by ``tests/python/test_models_hf.py`` (CI) and ``scripts/trace_hf.py``
(the table in ``docs/models-hf.md``). Every model is built from its
``*Config`` class (or ``timm.create_model(pretrained=False)``): nothing is
downloaded. Sizes are tiny (hidden 32, 2 layers, 16 tokens, 32x32 or 64x64
images) so that planning and 2 x 3 AdamW steps take seconds on one CPU
thread; the fine-tuning cases (:func:`causal_lm`) take a sequence length.

A case is a factory (seeded: two calls give the same weights), the example
batch ``(inputs, target)`` as ``tensile.plan`` takes it and the loss.
Variants wrap a model as a user would: ``bf16`` runs the forward under
``torch.autocast("cpu", torch.bfloat16)`` inside a wrapper module (the hook's
iteration starts at the model's forward call), ``lora`` freezes every weight
and adds trainable rank-4 adapters beside the attention projections,
``ckpt`` turns on the library's own activation checkpointing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 128


@dataclasses.dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    batch: tuple[tuple[torch.Tensor, ...], torch.Tensor]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    #: What the case stands for, for the table.
    what: str


def lm_loss(out: Any, target: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over a causal or seq2seq LM's logits."""
    return F.cross_entropy(out.logits.flatten(0, 1), target.flatten())


def class_loss(out: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(getattr(out, "logits", out), target)


class Autocast(nn.Module):
    """A model whose forward runs under bf16 autocast (the user's wrapper)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, *args: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.m(*args)


class LoRA(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (``B A x``)."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.02)
        self.b = nn.Parameter(torch.randn(base.out_features, rank) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.a), self.b)


LORA_TARGETS = ("q_proj", "v_proj", "query_key_value", "query", "value", "q_lin", "v_lin", "q", "v")


def with_lora(model: nn.Module) -> nn.Module:
    """Freezes every weight and adds adapters beside the attention projections."""
    for p in model.parameters():
        p.requires_grad_(False)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if name in LORA_TARGETS and isinstance(child, nn.Linear):
                setattr(parent, name, LoRA(child))
    return model


def _variant(make: Callable[[], nn.Module], variants: tuple[str, ...]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = make()
        for v in variants:
            if v == "ckpt":
                model.activation_checkpointing_enable()
            elif v == "lora":
                with_lora(model)
            elif v == "bf16":
                model = Autocast(model)
            else:
                raise ValueError(f"unknown variant {v!r} (ckpt, lora, bf16)")
        return model

    return build


def _seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return make()

    return build


def _tokens(batch: int, seq: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seq), generator=g), torch.randint(0, VOCAB, (batch, seq), generator=g)


def _lm_config(cls: Any, seq: int, **extra: Any) -> Any:
    return cls(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=max(64, seq), **extra,
    )


def causal_lm(family: str, seq: int = 16, batch: int = 2, variants: tuple[str, ...] = ()) -> Case:
    """``llama``, ``qwen2`` or ``gpt_neox`` at ``seq`` tokens, hidden 32, 2 layers."""
    import transformers as T

    configs = {
        "llama": (T.LlamaForCausalLM, lambda: _lm_config(T.LlamaConfig, seq, num_key_value_heads=2)),
        "qwen2": (T.Qwen2ForCausalLM, lambda: _lm_config(T.Qwen2Config, seq, num_key_value_heads=2)),
        "gpt_neox": (T.GPTNeoXForCausalLM, lambda: _lm_config(T.GPTNeoXConfig, seq)),
    }
    cls, config = configs[family]
    ids, target = _tokens(batch, seq)
    name = "+".join((family, *variants)) + (f"@{seq}" if seq != 16 else "")
    return Case(name, _variant(_seeded(lambda: cls(config())), variants), ((ids,), target), lm_loss,
                f"{cls.__name__}, {seq} tokens")


def sequence_classifier(family: str, variants: tuple[str, ...] = (), mask: bool = False) -> Case:
    """``bert`` or ``distilbert`` at 16 tokens; ``mask`` passes an attention
    mask with padding in the first sequence."""
    import transformers as T

    ids, _ = _tokens(2, 16)
    labels = torch.tensor([0, 2])
    if family == "bert":
        make = lambda: T.BertForSequenceClassification(_lm_config(T.BertConfig, 16, num_labels=3))  # noqa: E731
    else:
        make = lambda: T.DistilBertForSequenceClassification(  # noqa: E731
            T.DistilBertConfig(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4, num_labels=3)
        )
    inputs: tuple[torch.Tensor, ...] = (ids,)
    if mask:
        m = torch.ones(2, 16, dtype=torch.long)
        m[0, -5:] = 0
        inputs = (ids, m)
    name = "+".join((family, *variants)) + ("+mask" if mask else "")
    cls = "BertForSequenceClassification" if family == "bert" else "DistilBertForSequenceClassification"
    return Case(name, _variant(_seeded(make), variants), (inputs, labels), class_loss,
                cls + (", padded mask" if mask else ""))


def t5() -> Case:
    """T5 (encoder-decoder): input ids, attention mask and decoder input ids."""
    import transformers as T

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 16), generator=g)
    decoder = torch.randint(0, VOCAB, (2, 8), generator=g)
    target = torch.randint(0, VOCAB, (2, 8), generator=g)
    mask = torch.ones(2, 16, dtype=torch.long)
    config = T.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                        decoder_start_token_id=0)
    return Case("t5", _seeded(lambda: T.T5ForConditionalGeneration(config)), ((ids, mask, decoder), target),
                lm_loss, "T5ForConditionalGeneration, 16 + 8 tokens")


def vit() -> Case:
    import transformers as T

    g = torch.Generator().manual_seed(1)
    config = T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, num_labels=10)
    batch = ((torch.randn(2, 3, 32, 32, generator=g),), torch.randint(0, 10, (2,), generator=g))
    return Case("vit", _seeded(lambda: T.ViTForImageClassification(config)), batch, class_loss,
                "ViTForImageClassification, 32x32")


def timm_model(arch: str, side: int = 64) -> Case:
    import timm

    g = torch.Generator().manual_seed(1)
    kwargs: dict[str, Any] = {"num_classes": 10, "pretrained": False}
    if any(s in arch for s in ("vit", "deit", "swin")):
        kwargs["img_size"] = side
    batch = ((torch.randn(2, 3, side, side, generator=g),), torch.randint(0, 10, (2,), generator=g))
    return Case(f"timm:{arch}", _seeded(lambda: timm.create_model(arch, **kwargs)), batch, class_loss,
                f"timm {arch}, {side}x{side}")


#: The timm models of the suite: four families (ConvNeXt, EfficientNet,
#: ResNet-D, ViT); the script adds DeiT and Swin.
TIMM_CI = ("convnext_atto", "efficientnet_b0", "resnet18d", "vit_tiny_patch16_224")
TIMM_MORE = ("deit_tiny_patch16_224", "swin_tiny_patch4_window7_224")


def suite(more: bool = False) -> list[Case]:
    """The model suite of CI (``more``: also the slower models of the table)."""
    cases = [
        sequence_classifier("bert"),
        sequence_classifier("bert", mask=True),
        sequence_classifier("bert", variants=("bf16",)),
        sequence_classifier("bert", variants=("lora",)),
        sequence_classifier("bert", variants=("ckpt",)),
        sequence_classifier("distilbert"),
        causal_lm("llama"),
        causal_lm("qwen2"),
        causal_lm("gpt_neox"),
        t5(),
        vit(),
        *(timm_model(a) for a in TIMM_CI),
    ]
    if more:
        cases += [causal_lm(f, variants=v) for f in ("llama", "qwen2", "gpt_neox") for v in (("bf16",), ("lora",), ("ckpt",))]
        cases += [timm_model(a) for a in TIMM_MORE]
    return cases
