"""Where a planned storage lives, and the copies that move it.

A :class:`Residence` is one storage of the plan (by root tensor id) as the
hook holds it: a device ``UntypedStorage`` and/or a host buffer from the
:class:`HostPool`, with at most one copy in flight. Storages are keyed by the
plan's root id, never by a data pointer (a freed pointer is reused at once).

Copies go through a :class:`CopyEngine`, always in batches (every storage an
event point moves goes in one call, so the host pays one call per point and
not one per storage):

* :class:`HostEngine` (CPU tensors): the "device" and the host are both CPU
  memory. ``copies="sync"`` (the default) copies the bytes at once on the
  training thread, into pooled host buffers, so that every path of the
  protocol moves real bytes in CI; ``"thread"`` runs each batch on one copy
  thread, as a GPU runs copies on its copy engine (the training thread
  waits only where it needs a copy's result); ``"none"`` moves no bytes:
  device and host being one memory, a swap hands the storage itself over
  (what the host's own work costs, a GPU's copies being the DMA engine's);
  ``completes_after=N`` (a test option) makes each copy look in flight for
  N polls, deterministically.
* :class:`CudaEngine`: copies on a side stream, ordered by events: the side
  stream waits for the compute stream before reading a tensor it produced
  (swap-out) and before writing a block the compute stream just allocated
  (swap-in); the compute stream waits for a swap-in's event before its
  consumer. A device storage is dropped only once its swap-out's event has
  completed, and a host buffer goes back to the pool only once the copy
  reading it has completed (the stream bugs torchrec #4231 and Megatron
  #7398 shipped). The compute stream is asked for at every batch, never
  cached (TRL #7195). Pinned host buffers come from the pool, allocated once
  per size: pinning per tensor synchronizes the device.

Every function here runs outside any dispatch mode (the caller's job): the
copies are the hook's, not the user's ops.
"""

from __future__ import annotations

import abc
import queue
import threading
from typing import Any, Literal

import torch

#: How a CPU engine copies (``HostEngine``).
Copies = Literal["sync", "thread", "none"]

#: Storages smaller than this are never moved: on a CPU or a GPU a copy
#: costs the host several microseconds to start, while the bytes it would
#: free are negligible. In ResNet-50's CPU plan, 77% of the swap events are
#: of storages under 64 KiB and move 0.2% of the bytes.
MIN_MOVE_BYTES = 64 * 1024


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
        if self.in_use_bytes > self.peak_in_use_bytes:
            self.peak_in_use_bytes = self.in_use_bytes
        return buf

    def give_back(self, buf: torch.Tensor) -> None:
        self.in_use_bytes -= buf.numel()
        self.free.setdefault(buf.numel(), []).append(buf)


class Copy:
    """A copy in flight. ``done`` is the engine's completion token (shared
    by the copies of one batch); ``keep`` what must stay alive until then."""

    __slots__ = ("direction", "done", "keep", "cancelled")

    def __init__(self, direction: str, done: Any, keep: Any) -> None:
        self.direction = direction  # "out" (device -> host) or "in"
        self.done = done
        self.keep = keep
        #: A swap-out whose storage was wanted back before it completed: the
        #: device bytes stay and the host copy goes once it has.
        self.cancelled = False


class Residence:
    """One planned storage: where its bytes are and who holds it."""

    __slots__ = (
        "id",
        "name",
        "device",
        "nbytes",
        "dev",
        "host",
        "copy",
        "live",
        "handles",
        "counted",
        "obj",
        "meta",
        "dropped",
        "obj_on_dev",
    )

    def __init__(self, storage_id: int, name: str, device: torch.device, nbytes: int) -> None:
        self.id = storage_id
        self.name = name
        self.device = device
        self.nbytes = nbytes
        self.dev: torch.UntypedStorage | None = None
        self.host: torch.Tensor | None = None  # uint8 pool buffer
        self.copy: Copy | None = None
        #: Saved-tensor handles alive (activation storages), and the handles
        #: themselves, whose cached device views go when the bytes leave.
        self.live = 0
        self.handles: list[Any] = []
        #: Whether the hook counts it among the resident saved bytes.
        self.counted = False
        #: For parameters, buffers and optimizer state: the tensor object the
        #: model or optimizer holds (moved through its ``.data``) and its
        #: ``(dtype, storage offset, size, stride)``.
        self.obj: torch.Tensor | None = None
        self.meta: tuple[Any, ...] = ()
        #: Released for a planned recomputation: no bytes anywhere until it
        #: is rebuilt.
        self.dropped = False
        #: ``obj`` points at ``dev`` (not at the host copy).
        self.obj_on_dev = True

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
    """Starts and finishes copies between residences' device and host bytes."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        #: Copies that had to be waited for (still in flight when needed).
        self.waited = 0
        #: Batches started (one host call each).
        self.batches = 0
        #: Bytes copied in either direction (not counting hand-overs
        #: without a copy).
        self.copied_bytes = 0

    @abc.abstractmethod
    def swap_out(self, batch: list[Residence]) -> None:
        """Starts copying each residence's device bytes into a host buffer;
        the device bytes are dropped once the copy has completed (``settle``)."""

    @abc.abstractmethod
    def swap_in(self, batch: list[Residence]) -> None:
        """Allocates each residence's device bytes and starts copying its host
        buffer into them; the buffer goes back to the pool once done."""

    @abc.abstractmethod
    def complete(self, token: Any, wait: bool) -> bool:
        """Whether the copies behind ``token`` (a ``Copy.done``) have
        completed, waiting for them when ``wait``. The caller then finishes
        the residence (drops the device bytes of a swap-out, the host buffer
        of a swap-in): never before."""

    def before_use(self, res: Residence) -> None:
        """Orders the device's next kernels after ``res``'s swap-in without
        waiting on the host (CUDA); engines without a device queue have
        nothing to do (the caller waits with ``complete``)."""

    def drop_host(self, res: Residence) -> None:
        if res.host is not None:
            self.pool.give_back(res.host)
            res.host = None

    def close(self) -> None:
        """Stops what the engine runs in the background (nothing by default)."""


class _Done:
    """Completion of one batch run by the copy thread."""

    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None


class HostEngine(CopyEngine):
    """Copies between CPU "device" storages and the host pool.

    ``copies="sync"`` (the default) copies at once; ``"thread"`` runs each
    batch on one copy thread; ``"none"`` hands storages over without a copy.
    ``completes_after`` (a test option, with ``"sync"``) makes each copy look
    in flight for that many polls."""

    def __init__(self, pool: HostPool, completes_after: int = 0, copies: Copies = "sync") -> None:
        super().__init__(pool)
        if copies not in ("thread", "sync", "none"):
            raise ValueError(f"copies must be 'sync', 'thread' or 'none', not {copies!r}")
        self.completes_after = completes_after
        self.threaded = copies == "thread" and completes_after == 0
        self.zero_copy = copies == "none" and completes_after == 0
        self._work: queue.SimpleQueue[Any] | None = None
        self._thread: threading.Thread | None = None

    def _run(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> Any:
        self.batches += 1
        self.copied_bytes += sum(t.nbytes for t in srcs)
        if not self.threaded:
            torch._foreach_copy_(dsts, srcs)
            return [self.completes_after] if self.completes_after else None
        if self._thread is None:
            self._work = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._copier, name="tensile-copies", daemon=True)
            self._thread.start()
        done = _Done()
        assert self._work is not None
        self._work.put((dsts, srcs, done))
        return done

    def _copier(self) -> None:
        assert self._work is not None
        while True:
            item = self._work.get()
            if item is None:
                return
            dsts, srcs, done = item
            try:
                torch._foreach_copy_(dsts, srcs)
            except BaseException as e:  # handed to the thread that waits for it
                done.error = e
            done.event.set()

    def complete(self, token: Any, wait: bool) -> bool:
        if token is None:
            return True
        if isinstance(token, list):  # completes_after
            if token[0] > 0 and not wait:
                token[0] -= 1
                return False
            token[0] = 0
            return True
        if not token.event.is_set():
            if not wait:
                return False
            token.event.wait()
        if token.error is not None:
            raise RuntimeError(f"a copy on the hook's copy thread failed: {token.error}") from token.error
        return True

    def swap_out(self, batch: list[Residence]) -> None:
        if self.zero_copy:
            self.batches += 1
            for r in batch:
                r.host = bytes_of(r.dev)  # type: ignore[arg-type]
                r.dev = None
            return
        bufs = [self.pool.take(r.nbytes) for r in batch]
        token = self._run(bufs, [bytes_of(r.dev) for r in batch])  # type: ignore[arg-type]
        for r, buf in zip(batch, bufs):
            r.host = buf
            if token is None:
                r.dev = None  # the copy has completed: nothing is dropped before it
            else:
                r.copy = Copy("out", token, r.dev)

    def swap_in(self, batch: list[Residence]) -> None:
        if self.zero_copy:
            self.batches += 1
            for r in batch:
                r.dev = r.host.untyped_storage()  # type: ignore[union-attr]
                r.host = None
            return
        devs = [torch.empty(r.nbytes, dtype=torch.uint8, device=r.device) for r in batch]
        token = self._run(devs, [r.host for r in batch])  # type: ignore[misc]
        for r, dev in zip(batch, devs):
            r.dev = dev.untyped_storage()
            if token is None:
                self.drop_host(r)
            else:
                r.copy = Copy("in", token, r.host)

    def close(self) -> None:
        if self._thread is not None and self._work is not None:
            self._work.put(None)
            self._thread.join()
            self._thread = None


class CudaEngine(CopyEngine):
    """Copies on one side stream per device, ordered by CUDA events."""

    def __init__(self, pool: HostPool) -> None:
        super().__init__(pool)
        self.side: dict[torch.device, torch.cuda.Stream] = {}

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        side = self.side.get(device)
        if side is None:
            side = self.side[device] = torch.cuda.Stream(device=device)
        return side

    def _batch(self, device: torch.device, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> Any:
        self.batches += 1
        self.copied_bytes += sum(t.nbytes for t in srcs)
        compute = torch.cuda.current_stream(device)
        side = self._side(device)
        # Swap-out: the producers' kernels come first. Swap-in: the blocks
        # may have just been freed by compute-stream work.
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            torch._foreach_copy_(dsts, srcs, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        return done

    def swap_out(self, batch: list[Residence]) -> None:
        bufs = [self.pool.take(r.nbytes) for r in batch]
        done = self._batch(batch[0].device, bufs, [bytes_of(r.dev) for r in batch])  # type: ignore[arg-type]
        for r, buf in zip(batch, bufs):
            r.host = buf
            # The device bytes stay held until `done` completes (settle).
            r.copy = Copy("out", done, r.dev)

    def swap_in(self, batch: list[Residence]) -> None:
        device = batch[0].device
        devs = [torch.empty(r.nbytes, dtype=torch.uint8, device=device) for r in batch]  # on the compute stream
        done = self._batch(device, devs, [r.host for r in batch])  # type: ignore[misc]
        for r, dev in zip(batch, devs):
            r.dev = dev.untyped_storage()
            r.copy = Copy("in", done, r.host)

    def complete(self, token: Any, wait: bool) -> bool:
        if token.query():
            return True
        if wait:
            token.synchronize()
            return True
        return False

    def before_use(self, res: Residence) -> None:
        """Orders the compute stream after an in-flight swap-in of ``res``
        (the host does not wait)."""
        c = res.copy
        if c is not None and c.direction == "in":
            torch.cuda.current_stream(res.device).wait_event(c.done)


def engine_for(device: torch.device, completes_after: int = 0, copies: Copies = "sync") -> CopyEngine:
    if device.type == "cuda":
        return CudaEngine(HostPool(pin=True))
    if device.type == "cpu":
        return HostEngine(HostPool(pin=False), completes_after, copies)
    raise ValueError(f"tensile.apply supports cpu and cuda models, not {device.type}")
