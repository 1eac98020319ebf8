#!/usr/bin/env python3
"""Step time and memory: plain training, tensile.apply, save_on_cpu, checkpointing.

    .venv/bin/python scripts/hook_bench.py --model resnet50 --batch 2 --resolution 32 --device cpu

The modes run interleaved: each of ``--rounds`` rounds runs every mode once
(``--warmup`` steps, then ``--steps`` timed ones), in an order rotated from
round to round, so that no mode always runs first or last (the machine's
state drifts). A mode's step time is the median of all its timed steps; the
spread is the lowest and highest of its per-round medians; its ratio to plain
is the median of the per-round ratios (each round's modes ran side by side).

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the timed steps
(the highest round). On the CPU, where the allocator keeps no statistic,
the hook's own count of the bytes it holds on the "device" (its resident
saved activations plus the parameters, buffers and optimizer state it
holds), beside the plan's prediction of the same bytes
(``Schedule.predicted_managed_curve``) and that prediction with no event
applied (what plain training holds of the same tensors).

The hook's Python: calls per step (packs, unpacks, module pre-hooks, the
optimizer's chunks, the step's start and end), beside the bound the hook
is held to: the saved tensors' two hooks, the modules, the chunks and the
events placed on the step's points.

Models: ``resnet50``, ``resnet18`` (torchvision) and ``encoder`` (the
tracer's ``TransformerClassifier``, at BERT-base's sizes by default: 12
layers, d_model 768, 12 heads, ``--seq`` 128 tokens; ``--d-model``,
``--heads``, ``--layers`` size it down to where a CPU step is host-bound). Adam with
``foreach=False`` (the plan's updates are per tensor). Prints a Markdown
table; ``--json FILE`` also writes the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from contextlib import nullcontext
from typing import Any

import torch
import torchvision
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import tensile
from tensile.hook import Schedule
from tensile.hook.store import MIN_MOVE_BYTES
from tensile.trace.models import TransformerClassifier


def build(name: str, args: argparse.Namespace) -> tuple[nn.Module, str]:
    if name in ("resnet50", "resnet18"):
        return torchvision.models.get_model(name, weights=None), "image"
    if name == "encoder":
        model = TransformerClassifier(vocab=30522, seq_len=args.seq, d_model=args.d_model, heads=args.heads,
                                      layers=args.layers, classes=2)
        return model, "tokens"
    raise SystemExit(f"hook_bench: unknown model {name!r} (resnet50, resnet18, encoder)")


def checkpointed(model: nn.Module, name: str) -> nn.Module:
    """Activation checkpointing (non-reentrant) around each residual block or
    encoder layer: the block's ``forward`` is wrapped in place, so the
    modules around it (the encoder's fast-path checks) see the same layers."""
    model = copy.deepcopy(model)
    if name.startswith("resnet"):
        blocks = [b for attr in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, attr)]
    else:
        blocks = list(model.encoder.layers)
    for block in blocks:
        inner = block.forward
        block.forward = lambda *args, _f=inner, **kwargs: checkpoint(_f, *args, use_reentrant=False, **kwargs)
    return model


class Mode:
    """One way of training the same model on the same batch."""

    def __init__(self, name: str, model: nn.Module, args: argparse.Namespace, batch: Any, dev: torch.device) -> None:
        self.name = name
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
        self.plan = None
        if name.startswith("tensile"):
            profile = args.profile or ("h100" if dev.type == "cuda" else "cpu")
            self.plan = tensile.plan(model, self.opt, batch, F.cross_entropy, device_profile=profile, budget_mb=args.budget_mb)
        self.times: list[list[float]] = []
        self.peaks: list[int] = []
        self.stats: list[Any] = []
        self.applier: Any = None

    def context(self, args: argparse.Namespace, dev: torch.device) -> Any:
        if self.name == "tensile":
            return tensile.apply(self.plan, self.model, self.opt, copies=args.copies)
        if self.name == "tensile-nocopy":
            return tensile.apply(self.plan, self.model, self.opt, copies="none")
        if self.name == "tensile+server":
            return tensile.apply(self.plan, self.model, self.opt, server=args.server, copies=args.copies)
        if self.name == "save_on_cpu":
            return torch.autograd.graph.save_on_cpu(pin_memory=dev.type == "cuda")
        return nullcontext()


def host_copy_rate(nbytes: int = 64 << 20, reps: int = 5) -> float:
    """GB/s of ``torch``'s copy between two host buffers of ``nbytes``
    (best of ``reps``), the rate a CPU device's swaps run at."""
    import time

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def run_round(mode: Mode, batch: Any, args: argparse.Namespace, cuda: bool) -> None:
    import time

    times = []
    with mode.context(args, torch.device(args.device)) as hook:
        for i in range(args.warmup + args.steps):
            if i == args.warmup and cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            loss = F.cross_entropy(mode.model(batch[0]), batch[1])
            loss.backward()
            mode.opt.step()
            mode.opt.zero_grad()
            if cuda:
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        if hook is not None and hasattr(hook, "stats"):
            mode.stats.extend(hook.stats[args.warmup :])
            mode.applier = hook
    mode.times.append(times)
    if cuda:
        mode.peaks.append(torch.cuda.max_memory_allocated())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--seq", type=int, default=128, help="the encoder's tokens per sample")
    p.add_argument("--d-model", type=int, default=768, help="the encoder's width (BERT-base's by default)")
    p.add_argument("--heads", type=int, default=12, help="the encoder's attention heads")
    p.add_argument("--layers", type=int, default=12, help="the encoder's layers")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=8, help="timed steps per mode and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per mode and round (the hook checks its first)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", help="comma-separated, plain first (default: plain,tensile,save_on_cpu,checkpoint, and "
                   "tensile-nocopy after tensile on the CPU: the hook with copies='none', its own host work alone)")
    p.add_argument("--profile", help="device profile to plan for (default h100 on CUDA, cpu on the CPU)")
    p.add_argument("--budget-mb", type=float, help="plan under this budget (MB of 10^6 bytes)")
    p.add_argument("--copies", default="thread", choices=["thread", "sync"], help="the CPU's copies: on a copy thread or at once")
    p.add_argument("--server", help="a running scheduler (unix:PATH, HOST:PORT): adds a `tensile+server` mode")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    if args.warmup < 2:
        raise SystemExit("hook_bench: --warmup must be at least 2 (a fresh optimizer's step and the hook's checked step)")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    base, kind = build(args.model, args)
    base = base.to(dev)
    if kind == "image":
        batch = (torch.randn(args.batch, 3, args.resolution, args.resolution, device=dev),
                 torch.randint(0, 1000, (args.batch,), device=dev))
        size = f"batch {args.batch} at {args.resolution}x{args.resolution}"
    else:
        batch = (torch.randint(0, 30522, (args.batch, args.seq), device=dev), torch.randint(0, 2, (args.batch,), device=dev))
        size = f"batch {args.batch} of {args.seq} tokens (d_model {args.d_model}, {args.layers} layers)"
    default = "plain,tensile,tensile-nocopy,save_on_cpu,checkpoint" if dev.type == "cpu" else "plain,tensile,save_on_cpu,checkpoint"
    names = [m for m in (args.modes or default).split(",") if m]
    if args.server and "tensile+server" not in names:
        names.append("tensile+server")
    if names[0] != "plain":
        raise SystemExit("hook_bench: --modes must start with plain (the others are compared with it)")
    modes = [Mode(n, checkpointed(base, args.model) if n == "checkpoint" else copy.deepcopy(base), args, batch, dev) for n in names]
    total = args.rounds * len(modes)
    done = 0
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        for mode in order:
            run_round(mode, batch, args, cuda)
            done += 1
            print(f"\rround {r + 1}/{args.rounds}: {done}/{total} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    plain = modes[0]
    tensile_mode = next((m for m in modes if m.name == "tensile"), None)
    rows = []
    for m in modes:
        all_times = [t for ts in m.times for t in ts]
        per_round = [statistics.median(ts) for ts in m.times]
        ratios = [statistics.median(ts) / statistics.median(pt) for ts, pt in zip(m.times, plain.times)]
        row: dict[str, Any] = {
            "mode": m.name,
            "step_ms": statistics.median(all_times) * 1e3,
            "round_ms": [x * 1e3 for x in per_round],
            "vs_plain": statistics.median(ratios) - 1,
            "vs_plain_range": [min(ratios) - 1, max(ratios) - 1],
        }
        if cuda:
            row["peak_mib"] = max(m.peaks) / 2**20
        if m.stats:
            s = m.stats
            row["calls"] = statistics.median(x.calls for x in s)
            row["packs"] = statistics.median(x.packs for x in s)
            row["late"] = max(x.late for x in s)
            row["modes_run"] = sorted({x.mode for x in s})
            row["managed_peak_mib"] = max(x.max_managed_bytes for x in s) / 2**20
            row["saved_peak_mib"] = max(x.peak_saved_bytes for x in s) / 2**20
            row["copied_mb"] = statistics.median(x.copied_bytes for x in s) / 1e6
        rows.append(row)

    print(f"{args.model} {size} on {dev}: {args.rounds} rounds x {args.steps} timed steps per mode, modes interleaved\n")
    print("| mode | step ms | spread of round medians | vs plain (median of rounds) | range | peak |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        peak = f"{row['peak_mib']:.0f} MiB" if cuda else (
            f"{row['managed_peak_mib']:.1f} MiB held by the hook" if "managed_peak_mib" in row else "-"
        )
        lo, hi = min(row["round_ms"]), max(row["round_ms"])
        vr = row["vs_plain_range"]
        print(f"| {row['mode']} | {row['step_ms']:.1f} | {lo:.1f}-{hi:.1f} | {row['vs_plain']:+.1%} | "
              f"{vr[0]:+.1%} to {vr[1]:+.1%} | {peak} |")
    if tensile_mode is not None and tensile_mode.plan is not None:
        plan = tensile_mode.plan
        sched = Schedule(plan)
        pred = sched.predicted_managed_curve(MIN_MOVE_BYTES)
        vanilla = sched.predicted_managed_curve(1 << 62)  # nothing moves
        trow = next(r for r in rows if r["mode"] == "tensile")
        print()
        print(f"plan: {plan.summary()}")
        print(f"the bytes the hook holds (resident saved activations, parameters, buffers, optimizer state): "
              f"predicted peak {max(pred) / 2**20:.1f} MiB, without the plan {max(vanilla) / 2**20:.1f} MiB, "
              f"measured {trow['managed_peak_mib']:.1f} MiB (saved activations alone {trow['saved_peak_mib']:.1f} MiB)")
        s = tensile_mode.stats[-1]
        a = tensile_mode.applier
        events = sum(len(x) for x in a.fire_at)
        bound = 2 * trow["packs"] + len(a.modules) + len(a.chunks) + 3 + events
        trow["calls_bound"] = bound
        print(f"the hook's Python per step: {trow['calls']:.0f} calls ({trow['packs']:.0f} saved tensors, a pack and an "
              f"unpack each; {len(a.modules)} module pre-hooks; {len(a.chunks)} optimizer chunks; the iteration's start, "
              f"the optimizer's pre- and post-hook) and {s.batches} copy batches for {events} planned events; bound: 2 x {trow['packs']:.0f} + "
              f"{len(a.modules)} + {len(a.chunks)} + 3 + {events} = {bound:.0f}. Late fetches: {trow['late']}; steps "
              f"run {', '.join(trow['modes_run'])}")
        if dev.type == "cpu" and trow["copied_mb"] > 0:
            rate = host_copy_rate()
            floor_ms = trow["copied_mb"] / rate
            plain_ms = rows[0]["step_ms"]
            trow["copy_floor_ms"] = floor_ms
            print(f"copies: {trow['copied_mb']:.0f} MB a step; at this machine's memcpy rate ({rate:.2f} GB/s, measured "
                  f"now) that alone is {floor_ms:.1f} ms, {floor_ms / plain_ms:+.1%} of plain's step: on a CPU device the "
                  f"copies run on the cores that train, where a GPU's copy engine overlaps them with compute")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "size": size, "device": str(dev), "rounds": args.rounds,
                       "steps": args.steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
