"""CUDA event timing in the hook (`tensile.hook.timing`), so that it reports
op latencies on a GPU as it does on the CPU.

Without a GPU the bookkeeping is checked with a fake event class: each
`record` reads a fake clock that advances one microsecond per record, so
every op kept is 1000 ns long, and the number of synchronizes and events
made can be counted. The real test needs a CUDA device and is skipped
(with its reason) without one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

import tensile
from tensile.hook.timing import CudaOpTimer
from tensile.trace.models import TransformerClassifier

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


@pytest.fixture(autouse=True, scope="module")
def tensilectl_env():
    """`tensile.plan` finds tensilectl as CI sets it, else in this checkout."""
    os.environ.setdefault("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
    yield


class FakeClock:
    def __init__(self) -> None:
        self.us = 0
        self.syncs = 0
        self.streams: list[Any] = []

    def sync(self, *_: Any) -> None:
        self.syncs += 1


class FakeEvent:
    """`torch.cuda.Event(enable_timing=True)` on a fake clock."""

    clock = FakeClock()

    def __init__(self, enable_timing: bool = True, **_: Any) -> None:
        assert enable_timing, "the hook's events must time"
        self.t: int | None = None

    def record(self, stream: Any = None) -> None:
        FakeEvent.clock.streams.append(stream)
        self.t = FakeEvent.clock.us
        FakeEvent.clock.us += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None, "an event read before it was recorded"
        return (end.t - self.t) / 1000.0  # ms, as CUDA gives it


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's events, stream and synchronize faked on the CPU."""
    FakeEvent.clock = FakeClock()
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", FakeEvent.clock.sync)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "compute-stream")
    return FakeEvent.clock


def test_the_timer_keeps_drops_and_resolves_once_per_step(fake_cuda):
    timer = CudaOpTimer(torch.device("cpu"))
    for step in range(2):
        for k in range(4):
            timed = timer.begin()
            timer.end(timed)
            if k == 2:
                timer.drop(timed)  # not a graph op
            else:
                timer.keep(k, timed)
        assert fake_cuda.syncs == step, "no synchronize before the step's end"
        assert timer.resolve() == {0: 1000, 1: 1000, 3: 1000}
        assert fake_cuda.syncs == step + 1
    # Three pairs kept per step; the dropped pair was reused by the next op,
    # and the second step reused the first's.
    assert timer.events_made == 6, "events are reused"
    assert set(fake_cuda.streams) == {"compute-stream"}
    assert timer.resolve() == {} and fake_cuda.syncs == 2, "nothing kept: no synchronize"
    timed = timer.begin()
    timer.drop(timed)  # dropped before its end event: the start goes back once
    timer.keep(0, timer.begin())
    timer.clear()
    assert timer.resolve() == {} and timer.events_made == 6


def encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return TransformerClassifier(vocab=100, seq_len=16, d_model=32, heads=2, layers=1, classes=4)


def batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, 100, (2, 16), generator=g).to(device), torch.randint(0, 4, (2,), generator=g).to(device))
        for _ in range(STEPS)
    ]


def run(model: torch.nn.Module, data, tmp_path: Path, fake: bool):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    plan = tensile.plan(model, opt, data[0], F.cross_entropy, workdir=tmp_path)
    # Every step checked op by op, so every step is timed.
    with tensile.apply(plan, model, opt, check="ops") as hook:
        if fake:
            # The CUDA path on the CPU: event timing in place of the call's own.
            hook.measure = False
            hook.timer = CudaOpTimer(hook.device)
        for inputs, target in data:
            F.cross_entropy(model(inputs), target).backward()
            opt.step()
            opt.zero_grad()
    return plan, hook


def test_event_timing_fills_the_report_as_cpu_timing_does(fake_cuda, tmp_path):
    plan, hook = run(encoder(), batches(torch.device("cpu")), tmp_path, fake=True)
    n = len(plan.ops)
    assert fake_cuda.syncs == STEPS, "one synchronize per step, not per op"
    assert hook.stats[0].initializing and len(hook.stats[0].op_ns) < n
    assert hook.measurements(0)["op_latency_s"] == [], "an incomplete step reports no latencies"
    made = hook.timer.events_made
    for i in (1, 2):
        got = hook.measurements(i)["op_latency_s"]
        assert len(got) == n
        op_ns = hook.stats[i].op_ns
        # Every op run was timed between its two events; the detaches the
        # hook makes unnecessary did not run (0, as on the CPU).
        for k, ns in op_ns.items():
            assert ns in (0, 1000), (k, plan.op_label(k), ns)
            assert ns == 1000 or plan.ops[k]["type"] == "aten::detach", plan.op_label(k)
        assert got == [op_ns[k] / 1e9 for k in range(n)]
    assert made <= 2 * n + 16, f"{made} events for {n} ops: the pool is not reused"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the hook's CUDA event timing is not run")
def test_on_a_gpu_the_hook_reports_op_latencies(tmp_path):
    device = torch.device("cuda")
    plan, hook = run(encoder().to(device), batches(device), tmp_path, fake=False)
    assert hook.timer is not None, "CUDA models are timed by events"
    report = hook.measurements(-1)
    lat = report["op_latency_s"]
    assert len(lat) == len(plan.ops), "a steady CUDA step reports every op's latency"
    assert all(x >= 0 for x in lat) and sum(lat) > 0
    assert hook.timer.syncs == STEPS


def test_the_process_base_is_nvml_s_figure_less_the_allocated_bytes(monkeypatch):
    """tensile.hook.base on a stand-in NVML: the process is found by pid on
    the device's PCI bus id; a missing library or process is said, not
    raised."""
    import os
    import types

    from tensile.hook import base

    seen = {}

    class FakeNvml:
        def init_v2(self):
            pass

        def shutdown(self):
            pass

        def device_get_handle_by_pci_bus_id_v2(self, bus):
            seen["bus"] = bus
            return 7

        def device_get_compute_running_processes_v3(self, handle):
            assert handle == 7
            return types.SimpleNamespace(pid=[1, os.getpid()], used_gpu_memory=[5, 3_000_000_000])

    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x17, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 1_000_000_000)
    dev = torch.device("cuda", 0)
    assert base.base_bytes(dev, FakeNvml()) == (2_000_000_000, "")
    assert seen["bus"] == "00000000:17:00.0"

    class Absent(FakeNvml):
        def init_v2(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    measured, why = base.base_bytes(dev, Absent())
    assert measured is None and "NVML is not available" in why and "libnvidia-ml" in why

    class Elsewhere(FakeNvml):
        def device_get_compute_running_processes_v3(self, handle):
            return types.SimpleNamespace(pid=1, used_gpu_memory=5)

    measured, why = base.base_bytes(dev, Elsewhere())
    assert measured is None and f"no compute process {os.getpid()}" in why
