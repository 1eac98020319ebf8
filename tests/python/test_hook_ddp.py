"""The hook under DistributedDataParallel: two processes (gloo, on the CPU)
train a ResNet-18 on their own shards, each with ``tensile.plan`` and
``tensile.apply`` given the DDP wrapper as a user would, and end
bit-identical to the same two processes training without the hook (and to
each other: the all-reduce ran)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import tensile

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(10 + rank)
    return [(torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(STEPS)]


def train(rank: int, hooked: bool) -> tuple[list[torch.Tensor], list[str]]:
    torch.manual_seed(0)
    model = DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = batches(rank)
    modes: list[str] = []
    if hooked:
        plan = tensile.plan(model, optimizer, data[0], F.cross_entropy)
        assert plan.events, "the plan moves nothing: the hook would be tested on nothing"
        ctx = tensile.apply(plan, model, optimizer)
    else:
        ctx = None
    applier = ctx.__enter__() if ctx is not None else None
    try:
        for inputs, target in data:
            F.cross_entropy(model(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    if applier is not None:
        modes = [s.mode for s in applier.stats]
        assert all(s.swap_outs > 0 for s in applier.stats), "a step moved nothing"
    return [p.detach().clone() for p in model.parameters()], modes


def worker(rank: int, init: str, out: str) -> None:
    os.environ.setdefault("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        plain, _ = train(rank, hooked=False)
        hooked, modes = train(rank, hooked=True)
        torch.save({"plain": plain, "hooked": hooked, "modes": modes}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_ddp_processes_train_bit_identically_with_the_hook(tmp_path):
    init = f"file://{tmp_path / 'rendezvous'}"
    out = str(tmp_path / "result")
    mp.start_processes(worker, args=(init, out), nprocs=2, start_method="spawn")
    results = [torch.load(f"{out}.{rank}") for rank in range(2)]
    for rank, r in enumerate(results):
        assert r["modes"] == ["checked"] + ["fast"] * (STEPS - 1), (rank, r["modes"])
        for i, (a, b) in enumerate(zip(r["plain"], r["hooked"])):
            assert torch.equal(a, b), f"rank {rank}: parameter {i} differs with the hook"
    # The all-reduce ran: both ranks hold the same parameters.
    assert all(torch.equal(a, b) for a, b in zip(results[0]["hooked"], results[1]["hooked"]))


def test_data_parallel_is_refused_in_one_line():
    model = torch.nn.DataParallel(torchvision.models.resnet18(num_classes=10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    plan = tensile.plan(model.module, optimizer, batches(0)[0], F.cross_entropy)
    with pytest.raises(tensile.PlanApplyError, match="DistributedDataParallel") as e:
        tensile.apply(plan, model, optimizer).__enter__()
    assert "\n" not in str(e.value)
