"""The timed training steps that the hook benchmarks share
(``scripts/hook_bench.py``, ``scripts/gpu_check/hook.py``)."""

from __future__ import annotations

import time
from typing import Any, Callable


def timed_steps(model: Any, opt: Any, batch: tuple[Any, Any], loss_fn: Callable[..., Any], *,
                warmup: int, steps: int, cuda: bool) -> list[float]:
    """Runs ``warmup + steps`` training steps (forward, loss, backward,
    optimizer step) and returns the seconds each of the last ``steps``
    took. On CUDA each step ends with a synchronize, and the allocator's
    peak statistic is reset when the warm-up ends, so that
    ``torch.cuda.max_memory_allocated`` covers the measured steps only."""
    import torch

    times = []
    for i in range(warmup + steps):
        if i == warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times
