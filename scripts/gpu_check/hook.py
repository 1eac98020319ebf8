#!/usr/bin/env python3
"""The hook on the device: step time and peak memory of one model trained
plain, under ``tensile.apply`` (its plan as made, and planned again under
the peak activation checkpointing reached), under
``torch.autograd.graph.save_on_cpu`` and with activation checkpointing.
One row per mode, written as it ends; on CUDA each mode runs in a process
of its own, so that ``torch.cuda.max_memory_allocated`` sees that mode
alone.

    hook.py --results DIR --model resnet50 --batch 64 --device cuda --profile h100
    hook.py --results DIR --model encoder --batch 32 --device cuda --profile h100
    hook.py --results DIR --model llama --batch 2 --seq 1024 --device cuda --profile h100

Models: ``resnet50`` (torchvision's, or the same architecture defined here
when torchvision is missing) at ``--resolution``; ``encoder``, the
tracer's ``TransformerClassifier`` at BERT-base's sizes (12 layers,
d_model 768, 12 heads, sequence 128, vocabulary 30522), or with ``--tiny``
at d_model 64, 2 layers, sequence 32; ``llama``, a causal LM fine-tuned on
``--seq`` tokens: Hugging Face's ``LlamaForCausalLM`` (hidden 1024, 8
layers, 16 heads, vocabulary 32000; with ``--tiny`` hidden 64, 2 layers)
when ``transformers`` is installed, else the same architecture defined
here. Adam with ``foreach=False`` (the plan needs per-tensor updates). The
``tensile-ckpt`` mode runs after ``checkpoint`` and plans under its
measured peak (on the CPU, where there is none, it plans without a
budget). On the CPU there is no allocator peak: the rows give the hook's
own count of the bytes it holds.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import types
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_steps import timed_steps  # noqa: E402  (scripts/, beside this folder)

STEP = "hook"
MODES = ["plain", "tensile", "save_on_cpu", "checkpoint", "tensile-ckpt"]


def import_tensile() -> tuple[Any, str]:
    """``tensile``, and a note when it had to be loaded without grpcio.

    The package's ``__init__`` imports its gRPC client, which needs grpcio
    and protobuf; ``tensile.plan`` and ``tensile.apply`` need neither. When
    they are missing, the package's modules are loaded without its
    ``__init__``, with a stand-in for the scheduler session (``server=``
    then fails, and no mode here uses it)."""
    try:
        import tensile

        return tensile, ""
    except ImportError as e:
        if (e.name or "").split(".")[0] not in ("grpc", "google"):
            raise
        missing = e.name
    for name in [m for m in sys.modules if m == "tensile" or m.startswith("tensile.")]:
        del sys.modules[name]
    spec = importlib.util.find_spec("tensile")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the tensile package is not importable: put clients/python/src on PYTHONPATH")
    pkg = types.ModuleType("tensile")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensile"] = pkg
    session = types.ModuleType("tensile.hook.session")

    class Session:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"{missing} is not installed: no scheduler session")

    class PushedPlan:
        pass

    session.Session, session.PushedPlan = Session, PushedPlan  # type: ignore[attr-defined]
    sys.modules["tensile.hook.session"] = session
    import tensile.hook
    import tensile.planning

    pkg.plan, pkg.apply = tensile.planning.plan, tensile.hook.apply  # type: ignore[attr-defined]
    return pkg, f"{missing} is not installed: tensile loaded without its gRPC client"


def resnet50() -> Any:
    """torchvision's ResNet-50, or the same architecture when torchvision is missing."""
    if importlib.util.find_spec("torchvision") is not None:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                if stride != 1 or cin != out
                else None
            )

        def forward(self, x: Any) -> Any:
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
            cin = 64
            for i, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]):
                layer = []
                for b in range(blocks):
                    layer.append(Bottleneck(cin, width, stride if b == 0 else 1))
                    cin = width * 4
                setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(2048, 1000)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet50()


def llama(a: argparse.Namespace) -> Any:
    """A Llama causal LM returning its logits: Hugging Face's when
    ``transformers`` is installed, else the same architecture (RMSNorm,
    rotary attention, SwiGLU) defined here."""
    import torch
    from torch import nn

    hidden, layers, heads, inter = (64, 2, 4, 172) if a.tiny else (1024, 8, 16, 2816)
    vocab = 32000
    if importlib.util.find_spec("transformers") is not None:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=a.seq,
                             attn_implementation="eager", use_cache=False)

        class Logits(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lm = LlamaForCausalLM(config)

            def forward(self, ids: Any) -> Any:
                return self.lm(input_ids=ids).logits.flatten(0, 1)

        return Logits()

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: Any) -> Any:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rotate(x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = RMSNorm(hidden), RMSNorm(hidden)
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
            self.down = nn.Linear(inter, hidden, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, mask: Any) -> Any:
            b, t, _ = x.shape
            h = self.ln1(x)
            q, k, v = (f(h).view(b, t, heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            att = (q @ k.transpose(-1, -2)) / (hidden // heads) ** 0.5 + mask
            x = x + self.o((att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, hidden))
            h = self.ln2(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = RMSNorm(hidden), nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            t = ids.shape[1]
            d = hidden // heads
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=ids.device).float() / d))
            ang = torch.outer(torch.arange(t, device=ids.device).float(), inv)
            cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
            mask = torch.full((t, t), float("-inf"), device=ids.device).triu(1)
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x, cos, sin, mask)
            return self.head(self.norm(x)).flatten(0, 1)

    return Llama()


def build(a: argparse.Namespace) -> tuple[Any, tuple[Any, Any]]:
    """The model and one batch, on the device."""
    import torch

    from tensile.trace.models import TransformerClassifier

    torch.manual_seed(0)
    dev = torch.device(a.device)
    if a.model == "llama":
        model = llama(a)
        ids = torch.randint(0, 32000, (a.batch, a.seq))
        # Fine-tuning's labels: each token's next (the last one's own, for the shape).
        batch = (ids, torch.cat((ids[:, 1:], ids[:, -1:]), 1).flatten())
    elif a.model == "resnet50":
        model = resnet50()
        batch = (torch.randn(a.batch, 3, a.resolution, a.resolution), torch.randint(0, 1000, (a.batch,)))
    elif a.model == "encoder":
        vocab, seq, d, heads, layers = (1000, 32, 64, 4, 2) if a.tiny else (30522, 128, 768, 12, 12)
        model = TransformerClassifier(vocab=vocab, seq_len=seq, d_model=d, heads=heads, layers=layers, classes=2)
        batch = (torch.randint(0, vocab, (a.batch, seq)), torch.randint(0, 2, (a.batch,)))
    else:
        raise SystemExit(f"unknown model {a.model!r}: resnet50, encoder or llama")
    return model.to(dev), (batch[0].to(dev), batch[1].to(dev))


def checkpointed(model: Any, name: str) -> Any:
    """Activation checkpointing (non-reentrant) around each residual block
    or encoder layer: the block's ``forward`` is wrapped in place, so the
    modules around it (the encoder's fast-path checks) see the same layers."""
    from torch.utils.checkpoint import checkpoint

    model = copy.deepcopy(model)
    if name == "resnet50":
        blocks = [b for attr in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, attr)]
    elif name == "llama":
        blocks = list(model.lm.model.layers) if hasattr(model, "lm") else list(model.blocks)
    else:
        blocks = list(model.encoder.layers)
    for block in blocks:
        inner = block.forward
        block.forward = lambda *args, _f=inner, **kwargs: checkpoint(_f, *args, use_reentrant=False, **kwargs)
    return model


def run_mode(a: argparse.Namespace, mode: str) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    tensile, note = import_tensile()
    if a.threads:
        torch.set_num_threads(a.threads)
    cuda = a.device.startswith("cuda")
    model, batch = build(a)
    if mode == "checkpoint":
        model = checkpointed(model, a.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
    row: dict[str, Any] = {"model": a.model, "batch": a.batch, "mode": mode, "device": a.device}
    if a.model == "resnet50":
        row["resolution"] = a.resolution
    if note:
        row["note"] = note
    if a.model == "llama":
        row["seq"] = a.seq
    hook: AbstractContextManager[Any] = nullcontext()
    if mode.startswith("tensile"):
        budget = None
        if mode == "tensile-ckpt":
            ckpt = results.row_of(a.results, STEP, f"{a.tag}-checkpoint") or {}
            peak = ckpt.get("peak_mb")
            budget = int(peak) if peak else None
            row["budget_mb"] = budget
        t0 = time.perf_counter()
        plan = tensile.plan(model, opt, batch, F.cross_entropy, device_profile=a.profile, budget_mb=budget)
        row["plan_s"] = round(time.perf_counter() - t0, 2)
        row["planned_peak_mb"] = round(plan.prediction["planned_peak_bytes"] / 1e6, 1)
        hook = tensile.apply(plan, model, opt)
    elif mode == "save_on_cpu":
        hook = torch.autograd.graph.save_on_cpu(pin_memory=cuda)
    with hook as h:
        times = timed_steps(model, opt, batch, F.cross_entropy, warmup=a.warmup, steps=a.steps, cuda=cuda)
    row["step_ms"] = round(statistics.median(times) * 1e3, 2)
    row["steps"] = len(times)
    row["peak_mb"] = round(torch.cuda.max_memory_allocated() / 1e6, 1) if cuda else None
    if mode.startswith("tensile"):
        s = h.stats[-1]
        row.update(
            saved_peak_mb=round(s.peak_saved_bytes / 1e6, 1),
            held_peak_mb=round(s.max_managed_bytes / 1e6, 1),
            late=s.late,
            step_modes=sorted({x.mode for x in h.stats[a.warmup :]}),
            calls=s.calls,
            packs=s.packs,
            ops=h.s.n_ops,
            released=s.released,
            recomputed=s.recomputed,
            # The process's device memory outside its tensors, measured after
            # the third step (CUDA and NVML only).
            base_mb=None if h.base_bytes is None else round(h.base_bytes / 1e6, 1),
        )
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--model", required=True, choices=["resnet50", "encoder", "llama"])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--seq", type=int, default=1024, help="llama's tokens per sample")
    p.add_argument("--tiny", action="store_true", help="the encoder at d_model 64, 2 layers, sequence 32; llama at hidden 64")
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile", default="h100", help="tensilectl's device profile for the plan")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--one", metavar="MODE", help=argparse.SUPPRESS)  # run one mode, print its row
    a = p.parse_args()
    a.tag = f"{a.model}-b{a.batch}" + (
        f"-r{a.resolution}" if a.model == "resnet50" else f"-s{a.seq}" if a.model == "llama" else ""
    ) + ("-tiny" if a.tiny else "")
    if a.one:
        print("ROW " + json.dumps(run_mode(a, a.one)))
        return 0
    modes = [m for m in a.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}: {', '.join(MODES)}")
    tag = a.tag
    isolate = a.device.startswith("cuda")
    logs = a.results / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for mode in modes:
        row_id = f"{tag}-{mode}"
        if results.has_row(a.results, STEP, row_id):
            print(f"  {row_id}: done before")
            continue
        try:
            results.need_time(90 if isolate else 20, row_id)
        except results.OutOfTime as e:
            print(f"  {e}")
            return results.INCOMPLETE
        try:
            if isolate:
                row = isolated(a, mode, logs / f"hook-{row_id}.log")
            else:
                row = run_mode(a, mode)
        except results.OutOfTime as e:
            print(f"  {e}")
            return results.INCOMPLETE
        except Exception as e:  # a failure is a result: recorded, the next mode goes on
            row = {"model": a.model, "batch": a.batch, "mode": mode, "status": "failed", "reason": f"{type(e).__name__}: {e}"}
        row["id"] = row_id
        results.add_row(a.results, STEP, row)
        if row.get("status") == "failed":
            print(f"  {row_id}: failed: {row['reason']}")
        else:
            peak = "-" if row.get("peak_mb") is None else f"{row['peak_mb']} MB"
            saved = f", saved peak {row['saved_peak_mb']} MB" if "saved_peak_mb" in row else ""
            print(f"  {row_id}: {row['step_ms']} ms/step, peak {peak}{saved}")
    return 0


def isolated(a: argparse.Namespace, mode: str, log: Path) -> dict[str, Any]:
    """One mode in a fresh process (its own CUDA allocator statistics)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--one", mode]
    left = results.time_left() - 15
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=min(max(5.0, left), 1e6))
    except subprocess.TimeoutExpired as e:
        if left < 300:
            raise results.OutOfTime(f"{mode} was stopped at this run's time limit: rerun to resume") from e
        raise RuntimeError(f"{mode} ran past {left:.0f} s") from e
    log.write_text(f"$ {' '.join(cmd)}\n{r.stderr}\n{r.stdout}")
    for line in r.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    tail = [ln for ln in r.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
    reason = f"exit status {r.returncode}: {tail[0]}"
    return {"model": a.model, "batch": a.batch, "mode": mode, "status": "failed", "reason": reason}


if __name__ == "__main__":
    sys.exit(main())
