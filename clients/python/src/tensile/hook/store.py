"""Where a planned storage lives, and the copies that move it.

A :class:`Residence` is one storage of the plan (by root tensor id) as the
hook holds it: a device ``UntypedStorage`` and/or a host buffer from the
:class:`HostPool`, with at most one copy in flight. Storages are keyed by the
plan's root id, never by a data pointer (a freed pointer is reused at once).

Copies go through a :class:`CopyEngine`:

* :class:`HostEngine` (CPU tensors): the "device" and the host are both CPU
  memory; copies run at once, into and out of pooled host buffers, so the
  whole protocol (pool, residency, fetch on demand, counters) runs in CI.
* :class:`CudaEngine`: copies on a side stream, ordered by events: the side
  stream waits for the compute stream before reading a tensor it produced
  (swap-out) and before writing a block the compute stream just allocated
  (swap-in); the compute stream waits for a swap-in's event before its
  consumer. A device storage is dropped only once its swap-out's event has
  completed, and a host buffer goes back to the pool only once the copy
  reading it has completed (the stream bugs torchrec #4231 and
  Megatron #7398 shipped). The compute stream is asked for at every copy, never
  cached (TRL #7195). Untested here: no GPU was lent to this work.

Every function here runs with the dispatch modes disabled (the caller's
job): the copies are the hook's, not the user's ops.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import torch


class HostPool:
    """Host buffers reused by exact size (pinned on CUDA), allocated once."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.free: dict[int, list[torch.Tensor]] = {}
        self.allocated_bytes = 0
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0

    def take(self, nbytes: int) -> torch.Tensor:
        free = self.free.get(nbytes)
        if free:
            buf = free.pop()
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            self.allocated_bytes += nbytes
        self.in_use_bytes += nbytes
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
        return buf

    def give_back(self, buf: torch.Tensor) -> None:
        self.in_use_bytes -= buf.numel()
        self.free.setdefault(buf.numel(), []).append(buf)


@dataclasses.dataclass
class Copy:
    """A copy in flight: ``done`` is None once complete (always on the CPU)."""

    direction: str  # "out" (device -> host) or "in"
    done: Any = None  # torch.cuda.Event
    keep: Any = None  # what must stay alive until the copy is done


class Residence:
    """One planned storage: where its bytes are and who holds it."""

    def __init__(self, storage_id: int, name: str, device: torch.device, nbytes: int) -> None:
        self.id = storage_id
        self.name = name
        self.device = device
        self.nbytes = nbytes
        self.dev: torch.UntypedStorage | None = None
        self.host: torch.Tensor | None = None  # uint8 pool buffer
        self.copy: Copy | None = None
        #: Saved-tensor handles alive (activation storages).
        self.live = 0
        #: Whether the hook counts it among the resident saved bytes.
        self.counted = False
        #: For parameters, buffers and optimizer state: the tensor object the
        #: model or optimizer holds (moved through its ``.data``) and its
        #: ``(dtype, storage offset, size, stride)``.
        self.obj: torch.Tensor | None = None
        self.meta: tuple[Any, ...] = ()

    @property
    def on_device(self) -> bool:
        return self.dev is not None


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over a whole storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def view_of(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, size: Any, stride: Any) -> torch.Tensor:
    """A tensor over ``storage`` with the given metadata (no copy)."""
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


class CopyEngine(abc.ABC):
    """Starts and finishes copies between a residence's device and host bytes."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        #: Copies that had to be waited for (still in flight when needed).
        self.waited = 0

    @abc.abstractmethod
    def swap_out(self, res: Residence) -> None:
        """Starts copying ``res``'s device bytes into a host buffer; the
        device bytes are dropped once the copy has completed."""

    @abc.abstractmethod
    def swap_in(self, res: Residence) -> None:
        """Allocates ``res``'s device bytes and starts copying the host
        buffer into them; the buffer goes back to the pool once done."""

    @abc.abstractmethod
    def settle(self, res: Residence, wait: bool) -> bool:
        """Finishes ``res``'s copy if it is complete (or waits for it when
        ``wait``); True when no copy is left in flight."""

    def before_use(self, res: Residence) -> None:
        """Orders the consumer after ``res``'s swap-in (nothing to do when
        copies complete at once)."""

    def drop_host(self, res: Residence) -> None:
        if res.host is not None:
            self.pool.give_back(res.host)
            res.host = None


class HostEngine(CopyEngine):
    """Copies between CPU "device" storages and the host pool.

    The bytes move at once. ``completes_after`` (a test option) makes each
    copy look in flight for that many polls, as a GPU copy is, so that the
    hook's in-flight paths (device bytes held until the swap-out completes,
    a swap-in waited for, a write cancelling a swap-out) run in CI."""

    def __init__(self, pool: HostPool, completes_after: int = 0) -> None:
        super().__init__(pool)
        self.completes_after = completes_after

    def swap_out(self, res: Residence) -> None:
        assert res.dev is not None and res.copy is None
        buf = self.pool.take(res.nbytes)
        buf.copy_(bytes_of(res.dev))
        res.host = buf
        if self.completes_after:
            res.copy = Copy("out", done=[self.completes_after], keep=res.dev)
        else:
            res.dev = None  # the copy has completed: nothing is dropped before it

    def swap_in(self, res: Residence) -> None:
        assert res.host is not None and res.copy is None
        dev = torch.empty(res.nbytes, dtype=torch.uint8, device=res.device)
        dev.copy_(res.host)
        res.dev = dev.untyped_storage()
        if self.completes_after:
            res.copy = Copy("in", done=[self.completes_after], keep=res.host)
        else:
            self.drop_host(res)

    def settle(self, res: Residence, wait: bool) -> bool:
        c = res.copy
        if c is None:
            return True
        if c.done[0] > 0:
            if not wait:
                c.done[0] -= 1
                return False
            self.waited += 1
        if c.direction == "out":
            res.dev = None
        else:
            self.drop_host(res)
        res.copy = None
        return True


class CudaEngine(CopyEngine):
    """Copies on one side stream per device, ordered by CUDA events."""

    def __init__(self, pool: HostPool) -> None:
        super().__init__(pool)
        self.side: dict[torch.device, torch.cuda.Stream] = {}

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self.side:
            self.side[device] = torch.cuda.Stream(device=device)
        return self.side[device]

    def swap_out(self, res: Residence) -> None:
        assert res.dev is not None and res.copy is None
        compute = torch.cuda.current_stream(res.device)
        side = self._side(res.device)
        buf = self.pool.take(res.nbytes)
        side.wait_stream(compute)  # the producer's kernels come first
        with torch.cuda.stream(side):
            buf.copy_(bytes_of(res.dev), non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        res.host = buf
        # The device bytes stay held until `done` completes (settle).
        res.copy = Copy("out", done, keep=res.dev)

    def swap_in(self, res: Residence) -> None:
        assert res.host is not None and res.copy is None
        compute = torch.cuda.current_stream(res.device)
        side = self._side(res.device)
        dev = torch.empty(res.nbytes, dtype=torch.uint8, device=res.device)  # on the compute stream
        side.wait_stream(compute)  # the block may have just been freed by compute-stream work
        with torch.cuda.stream(side):
            dev.copy_(res.host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        res.dev = dev.untyped_storage()
        res.copy = Copy("in", done, keep=res.host)

    def settle(self, res: Residence, wait: bool) -> bool:
        c = res.copy
        if c is None:
            return True
        if not c.done.query():
            if not wait:
                return False
            self.waited += 1
            c.done.synchronize()
        if c.direction == "out":
            res.dev = None  # only now: the copy reading it has completed
        else:
            self.drop_host(res)  # the copy reading the host buffer has completed
        res.copy = None
        return True

    def before_use(self, res: Residence) -> None:
        """Orders the compute stream after an in-flight swap-in of ``res``."""
        if res.copy is not None and res.copy.direction == "in":
            torch.cuda.current_stream(res.device).wait_event(res.copy.done)


def engine_for(device: torch.device, completes_after: int = 0) -> CopyEngine:
    if device.type == "cuda":
        return CudaEngine(HostPool(pin=True))
    if device.type == "cpu":
        return HostEngine(HostPool(pin=False), completes_after)
    raise ValueError(f"tensile.apply supports cpu and cuda models, not {device.type}")
