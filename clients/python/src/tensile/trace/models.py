"""Models the command line can name, their example inputs and default losses.

A model spec is ``torchvision:NAME`` (any ``torchvision.models`` builder,
built with ``weights=None``) or ``module:function`` (a function returning an
``nn.Module``, imported and called under fake mode). Image classifiers get a
``(batch, 3, R, R)`` float input with ``R`` 224 (299 for Inception-V3) unless
told otherwise, and class-index targets; the loss is cross-entropy, or, for
models that return auxiliary logits in training (Inception-V3, GoogLeNet),
``CE(main) + 0.4 * CE(aux)`` as torchvision's reference training does and as
the zoo does.

``transformer_encoder`` is a small transformer classifier over token ids, for
tests and as an example of a ``module:function`` model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from tensile.trace.capture import TraceError

#: Weight of the auxiliary classifier's loss (torchvision's reference recipe).
AUX_WEIGHT = 0.4

#: Default resolution of the torchvision models that need more than 224.
_RESOLUTION = {"inception_v3": 299}
#: Builder arguments the tracer passes to torchvision models.
_TORCHVISION_KWARGS: dict[str, dict[str, Any]] = {
    "inception_v3": {"aux_logits": True, "init_weights": False},
    "googlenet": {"aux_logits": True, "init_weights": False},
}


def classification_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the logits; with auxiliary logits, main + 0.4 * aux."""
    if isinstance(output, torch.Tensor):
        return F.cross_entropy(output, target)
    logits = getattr(output, "logits", None)
    aux = getattr(output, "aux_logits", None)
    if isinstance(logits, torch.Tensor):
        loss = F.cross_entropy(logits, target)
        if isinstance(aux, torch.Tensor):
            loss = loss + AUX_WEIGHT * F.cross_entropy(aux, target)
        # GoogLeNet has two auxiliary heads.
        for extra in ("aux_logits1", "aux_logits2"):
            a = getattr(output, extra, None)
            if isinstance(a, torch.Tensor):
                loss = loss + AUX_WEIGHT * F.cross_entropy(a, target)
        return loss
    raise TraceError(
        f"the model returns {type(output).__name__}; the default loss needs logits "
        "(pass a loss function for other outputs)"
    )


def resolve(spec: str, resolution: int | None = None) -> tuple[str, Callable[[], nn.Module]]:
    """``(short name, factory)`` for a model spec (see the module docs).

    ``resolution`` is passed to the torchvision builders that fix their
    input size at construction (the ViTs' ``image_size``)."""
    source, sep, attr = spec.partition(":")
    if not sep or not source or not attr:
        raise TraceError(f"model spec {spec!r} is not torchvision:NAME or module:function")
    if source == "torchvision":
        import torchvision

        if attr not in torchvision.models.list_models():
            raise TraceError(f"torchvision has no model {attr!r}")
        kwargs = {"weights": None, **_TORCHVISION_KWARGS.get(attr, {})}
        if resolution is not None and attr.startswith("vit_"):
            kwargs["image_size"] = resolution
        def build() -> nn.Module:
            return torchvision.models.get_model(attr, **kwargs)

        build.__qualname__ = f"torchvision.models.{attr}"
        return attr, build
    try:
        module = importlib.import_module(source)
    except ImportError as e:
        raise TraceError(f"cannot import {source!r} for model spec {spec!r}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise TraceError(f"{source!r} has no callable {attr!r}")
    return attr, factory


def default_resolution(name: str) -> int:
    return _RESOLUTION.get(name, 224)


class TransformerClassifier(nn.Module):
    """Token embedding, learned positions, ``nn.TransformerEncoder``, mean pool, head."""

    def __init__(
        self,
        vocab: int = 1000,
        seq_len: int = 128,
        d_model: int = 256,
        heads: int = 4,
        layers: int = 4,
        classes: int = 10,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        h = self.encoder(h)
        return self.head(h.mean(dim=1))


def transformer_encoder() -> nn.Module:
    """A 4-layer, d_model 256 transformer encoder classifier (input: token ids, 128 long)."""
    return TransformerClassifier()
