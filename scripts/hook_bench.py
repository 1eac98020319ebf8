#!/usr/bin/env python3
"""Step time and peak memory: plain training, tensile.apply, save_on_cpu, checkpointing.

    PYTHONPATH=clients/python/src TENSILECTL=target/debug/tensilectl \
        .venv/bin/python scripts/hook_bench.py --model resnet50 --batch 64 [--device cuda]

On CUDA the peak is `torch.cuda.max_memory_allocated` over the measured
steps; on the CPU there is no allocator statistic, so the table gives the
hook's own peak of resident saved bytes and leaves the others blank. Models:
`resnet50`, `resnet18` (torchvision) and `encoder` (the tracer's
`TransformerClassifier` at BERT-base's sizes: 12 layers, d_model 768, 12
heads, sequence 128, vocabulary 30522; not Hugging Face's BERT). Adam,
`foreach=False` (the plan needs per-tensor updates). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from contextlib import nullcontext
from typing import Any

import torch
import torchvision
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from train_steps import timed_steps

import tensile
from tensile.trace.models import TransformerClassifier


class Checkpointed(nn.Module):
    """Runs a block under activation checkpointing (non-reentrant)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def build(name: str) -> tuple[nn.Module, Any]:
    if name in ("resnet50", "resnet18"):
        return torchvision.models.get_model(name, weights=None), "image"
    if name == "encoder":
        return TransformerClassifier(vocab=30522, seq_len=128, d_model=768, heads=12, layers=12, classes=2), "tokens"
    raise SystemExit(f"unknown model {name!r}")


def checkpointed(model: nn.Module, name: str) -> nn.Module:
    model = copy.deepcopy(model)
    if name.startswith("resnet"):
        for attr in ("layer1", "layer2", "layer3", "layer4"):
            setattr(model, attr, nn.Sequential(*[Checkpointed(b) for b in getattr(model, attr)]))
    else:
        model.encoder.layers = nn.ModuleList(Checkpointed(layer) for layer in model.encoder.layers)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--profile", help="tensilectl device profile (default h100 on CUDA, cpu on the CPU)")
    p.add_argument("--server", help="a running scheduler (unix:PATH, HOST:PORT): adds a `tensile+server` row, "
                   "the hook reporting to it and following its plans")
    args = p.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    base, kind = build(args.model)
    base = base.to(dev)
    if kind == "image":
        batch = (torch.randn(args.batch, 3, args.resolution, args.resolution, device=dev),
                 torch.randint(0, 1000, (args.batch,), device=dev))
    else:
        batch = (torch.randint(0, 30522, (args.batch, 128), device=dev), torch.randint(0, 2, (args.batch,), device=dev))
    rows = []
    modes = ["plain", "tensile", *(["tensile+server"] if args.server else []), "save_on_cpu", "checkpoint"]
    for mode in modes:
        model = checkpointed(base, args.model) if mode == "checkpoint" else copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
        hook = nullcontext()
        if mode.startswith("tensile"):
            profile = args.profile or ("h100" if dev.type == "cuda" else "cpu")
            plan = tensile.plan(model, opt, batch, F.cross_entropy, device_profile=profile)
            hook = tensile.apply(plan, model, opt, server=args.server if mode == "tensile+server" else None)
        elif mode == "save_on_cpu":
            hook = torch.autograd.graph.save_on_cpu(pin_memory=dev.type == "cuda")
        with hook as h:
            times = timed_steps(model, opt, batch, F.cross_entropy, warmup=2, steps=args.steps, cuda=dev.type == "cuda")
        peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
        extra = ""
        if mode.startswith("tensile"):
            s = h.stats[-1]
            extra = f"saved peak {s.peak_saved_bytes / 2**20:.1f} MiB, late {s.late}, retimed {sum(x.retimed for x in h.stats)}"
            if h.session is not None:
                versions = sorted({x.plan_version for x in h.stats if x.plan_job})
                extra += f"; {h.session.reports_sent} reports sent, scheduler plan versions run {versions}"
        rows.append((mode, statistics.median(times) * 1e3, peak, extra))
        del model, opt
    plain_t, plain_p = rows[0][1], rows[0][2]
    print(f"{args.model} batch {args.batch} on {dev} ({args.steps} steps, median)\n")
    print("| mode | step ms | vs plain | peak MiB | vs plain | notes |\n|---|---|---|---|---|---|")
    for mode, t, peak, extra in rows:
        ps = f"{peak:.0f}" if peak is not None else "-"
        pr = f"{peak / plain_p - 1:+.0%}" if peak is not None and plain_p else "-"
        print(f"| {mode} | {t:.1f} | {t / plain_t - 1:+.0%} | {ps} | {pr} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
