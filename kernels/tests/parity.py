"""PyTorch's side of the kernels' parity test (``kernels/tests/parity.rs``).

Usage: ``parity.py OUT_DIR [--steps N] [--model M] [--optimizer O]
[--trace-only]``. Traces the model (``resnet18``: torchvision's ResNet-18 at
resolution 64, batch 2; ``mlp``: a two-layer perceptron, batch 4;
``encoder``: the tracer's transformer encoder, 16 tokens, batch 2) with our
tracer and optimizer (``adam``, ``adamw`` with weight decay, ``sgd`` with
momentum) into ``OUT_DIR/graph.json``. Unless ``--trace-only``: builds the
same model seeded and writes its parameters and buffers (``init.safetensors``)
and a seeded batch (``inputs.safetensors``); then runs PyTorch's own N
(default 3) training steps on one thread, the per-tensor optimizer as traced,
and writes the parameters and buffers after them (``torch.safetensors``) and
the losses (``losses.json``).

``--baked`` skips the tracer's second trace, so the step-dependent scalars
stay as baked at the traced step (the negative control).

``parity.py OUT_DIR --zoo NAME [--steps N] [--optimizer adam|sgd]``: no
trace; the torchvision model the zoo's NAME follows (batch 2, resolution 32),
seeded, with the fused optimizer the zoo's graph names (``fused=True``): for
comparing the zoo's own graph with PyTorch.

``parity.py OUT_DIR --torchvision A,B,...`` only traces those torchvision
models (batch 2, resolution 64, 224 for ViT and Swin, SGD with momentum)
into ``OUT_DIR/graph_NAME.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torchvision
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from tensile.trace import InputSpec, trace_training_step
from tensile.trace.capture import capture
from tensile.trace.convert import to_graph
from tensile.trace.models import TransformerClassifier, classification_loss

CLASSES = {"resnet18": 1000, "mlp": 10, "encoder": 10}
OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}),
    "sgd": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
}


def build(model: str) -> nn.Module:
    if model == "resnet18":
        return torchvision.models.resnet18(num_classes=CLASSES[model])
    if model == "mlp":
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, CLASSES[model]))
    return TransformerClassifier(vocab=50, seq_len=16, d_model=32, heads=2, layers=2, classes=CLASSES[model])


def batch_spec(model: str) -> InputSpec:
    if model == "resnet18":
        return InputSpec("input", (2, 3, 64, 64))
    if model == "mlp":
        return InputSpec("input", (4, 16))
    return InputSpec("input", (2, 16), torch.int64)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--model", choices=sorted(CLASSES), default="resnet18")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    p.add_argument("--trace-only", action="store_true")
    p.add_argument("--baked", action="store_true", help="leave step-dependent scalars baked (negative control)")
    p.add_argument("--torchvision", help="comma-separated torchvision models to trace only")
    p.add_argument("--zoo", help="a torchvision model the zoo builds: PyTorch's side only, fused optimizer")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if args.torchvision:
        for name in args.torchvision.split(","):
            res = 224 if name.startswith(("vit", "swin")) else 64
            kwargs = {"aux_logits": True, "init_weights": False} if name == "googlenet" else {}
            graph = trace_training_step(
                lambda: torchvision.models.get_model(name, weights=None, **kwargs),
                optimizer=torch.optim.SGD,
                optimizer_kwargs={"lr": 0.01, "momentum": 0.9},
                inputs=[InputSpec("input", (2, 3, res, res))],
                name=name,
            )
            (out / f"graph_{name}.json").write_text(json.dumps(graph))
        return
    opt_cls, opt_kwargs = OPTIMIZERS[args.optimizer]
    if args.zoo:
        torch.manual_seed(0)
        model = torchvision.models.get_model(args.zoo, weights=None)
        x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 1000, (2,))
        train(model, x, y, opt_cls(model.parameters(), **opt_kwargs, fused=True), args.steps, out)
        return
    spec = batch_spec(args.model)
    if args.baked:
        # The negative control: one trace, its step-dependent scalars left as
        # baked at the traced step.
        target = InputSpec("target", (spec.shape[0],), torch.int64)
        captured = capture(lambda: build(args.model), opt_cls, opt_kwargs, classification_loss, [spec], target)
        graph = to_graph(captured)
    else:
        graph = trace_training_step(
            lambda: build(args.model),
            optimizer=opt_cls,
            optimizer_kwargs=opt_kwargs,
            inputs=[spec],
            name=f"{args.model}_{args.optimizer}",
        )
    (out / "graph.json").write_text(json.dumps(graph))
    if args.trace_only:
        return

    torch.manual_seed(0)
    model = build(args.model)
    if spec.dtype == torch.int64:
        x = torch.randint(0, 50, spec.shape)
    else:
        x = torch.randn(spec.shape)
    y = torch.randint(0, CLASSES[args.model], (spec.shape[0],))
    train(model, x, y, opt_cls(model.parameters(), **opt_kwargs, foreach=False), args.steps, out)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer, steps: int, out: Path) -> None:
    """Writes the init and the batch, trains ``steps`` steps, writes the result."""
    model.train()
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, out / "init.safetensors")
    save_file({"input": x, "target": y}, out / "inputs.safetensors")
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, out / "torch.safetensors")
    (out / "losses.json").write_text(json.dumps(losses))


if __name__ == "__main__":
    main()
