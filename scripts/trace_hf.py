#!/usr/bin/env python3
"""The hook on Hugging Face transformers and timm models: the tables of docs/models-hf.md.

    PYTHONPATH=clients/python/src TENSILECTL=target/debug/tensilectl \\
        .venv/bin/python scripts/trace_hf.py [--finetune 512 1024] [--only NAME ...] > tables.md

For every model of ``tests/python/hf_models.py`` (``suite(more=True)``:
small configs, random weights, nothing downloaded) it plans with
``tensile.plan``, trains 3 AdamW steps with and without ``tensile.apply``
on one thread and prints a row: ops, whether every step's gradients and the
final parameters are ``torch.equal`` (or the one-line error), the ops run in
another form than traced (``tensile/hook/forms.py``), the hook's resident
saved bytes at the peak against the plan's prediction and against plain
training, and seconds. ``--finetune`` adds the fine-tuning table: a Llama
causal LM (hidden 32, 2 layers, batch 2) at each sequence length, plain,
bf16 autocast, LoRA-style frozen weights and activation checkpointing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import hf_models  # noqa: E402
import tensile  # noqa: E402
from tensile.hook import Schedule  # noqa: E402

STEPS = 3


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def train(case: hf_models.Case, model: torch.nn.Module, plan: tensile.Plan | None = None):
    inputs, target = case.batch
    optimizer = adamw(model)
    torch.manual_seed(2)
    grads = []
    hook = tensile.apply(plan, model, optimizer) if plan is not None else None
    applier = hook.__enter__() if hook is not None else None
    try:
        for _ in range(STEPS):
            case.loss(model(*inputs), target).backward()
            optimizer.step()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
            optimizer.zero_grad()
    finally:
        if hook is not None:
            hook.__exit__(None, None, None)
    return grads, [p.detach().clone() for p in model.parameters()], applier


def run(case: hf_models.Case) -> dict:
    """One model: plan, plain and hooked training, and what the hook measured."""
    start = time.perf_counter()
    row: dict = {"name": case.name, "what": case.what}
    plain = train(case, case.make())
    model = case.make()
    try:
        plan = tensile.plan(model, adamw(model), case.batch, case.loss, workdir=tempfile.mkdtemp(prefix="trace-hf-"))
    except tensile.PlanError as e:
        row["result"] = f"refused at tensile.plan: {e}"
        return row
    try:
        hooked = train(case, model, plan)
    except (tensile.PlanMismatchError, tensile.PlanApplyError) as e:
        row["result"] = f"refused by tensile.apply: {e}"
        return row
    same = all(torch.equal(a, b) for ga, gb in zip(plain[0], hooked[0]) for a, b in zip(ga, gb)) and all(
        torch.equal(a, b) for a, b in zip(plain[1], hooked[1])
    )
    stats = hooked[2].stats[-1]
    s = Schedule(plan)
    row.update(
        result="bit-identical" if same else "DIFFERS",
        ops=len(plan.ops),
        forms=", ".join(f"{n} {f}" for f, n in sorted(stats.other_forms.items())) or "-",
        measured=stats.peak_saved_bytes,
        predicted=max(s.predicted_saved_curve()),
        vanilla=max(s.vanilla_saved_curve()),
        late=stats.late,
        seconds=time.perf_counter() - start,
    )
    return row


def mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finetune", type=int, nargs="*", default=[], help="sequence lengths of the fine-tuning table")
    p.add_argument("--only", nargs="*", help="these models of the suite only (by name)")
    p.add_argument("--no-suite", action="store_true", help="the fine-tuning table only")
    args = p.parse_args()
    torch.set_num_threads(1)
    if not args.no_suite:
        print("| model | case | result | ops | other forms | saved peak MB: hook / plan / plain | late | s |")
        print("|---|---|---|---|---|---|---|---|")
        for case in hf_models.suite(more=True):
            if args.only and case.name not in args.only:
                continue
            print(line(run(case)), flush=True)
    if args.finetune:
        print("\n| case | result | ops | saved peak MB: hook / plan / plain | hook / plan | hook / plain | late | s |")
        print("|---|---|---|---|---|---|---|---|")
        for seq in args.finetune:
            for variants in ((), ("bf16",), ("lora",), ("ckpt",)):
                r = run(hf_models.causal_lm("llama", seq=seq, variants=variants))
                if "ops" not in r:
                    print(f"| {r['name']} | {r['result']} | | | | | | |", flush=True)
                    continue
                print(
                    f"| {r['name']} | {r['result']} | {r['ops']} | {mb(r['measured'])} / {mb(r['predicted'])} / "
                    f"{mb(r['vanilla'])} | {r['measured'] / r['predicted']:.3f} | {r['measured'] / r['vanilla']:.2f} | "
                    f"{r['late']} | {r['seconds']:.0f} |",
                    flush=True,
                )
    return 0


def line(r: dict) -> str:
    if "ops" not in r:
        return f"| {r['name']} | {r['what']} | {r['result'].replace('|', '/')} | | | | | |"
    return (
        f"| {r['name']} | {r['what']} | {r['result']} | {r['ops']} | {r['forms']} | "
        f"{mb(r['measured'])} / {mb(r['predicted'])} / {mb(r['vanilla'])} | {r['late']} | {r['seconds']:.0f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
