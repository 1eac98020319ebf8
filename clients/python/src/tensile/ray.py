"""``tensile.ray``: TENSILE schedulers on a Ray cluster, for training tasks
that share a GPU.

Ray puts several tasks on one GPU when they ask for a fraction of it
(``@ray.remote(num_gpus=0.5)``, Ray Train's ``resources_per_worker={"GPU":
0.5}``) and leaves their memory to them. This module gives every GPU of
the cluster a ``tensile-scheduler`` and every such task the address of its
GPU's scheduler and a memory budget equal to its share::

    # the driver, once (again after nodes join)
    ray.init()
    tensile.ray.start(device="a6000")

    @ray.remote(num_gpus=0.5, max_retries=2)
    def train():
        plan = tensile.plan(model, opt, batch, loss_fn,
                            server=tensile.ray.scheduler_address(),
                            budget_mb=tensile.ray.budget_mb())
        with tensile.apply(plan, model, opt, name="run-3"):
            ...  # the unchanged training loop

* :func:`start` puts one detached actor on every alive node that has GPUs
  (pinned there, no CPU asked), named ``schedulers-<node id>`` in the Ray
  namespace ``tensile``. The actor launches and owns one scheduler per GPU,
  serving GPU ``N`` on the Unix socket ``DIR/gpuN.sock``, ``DIR`` being a
  new folder per node (``tensile-XXXX`` under the node's temporary
  folder, or under ``socket_root``). A second call finds the actors,
  restarts a scheduler that exited, and covers nodes that joined since.
  The schedulers die with their actor (``PR_SET_PDEATHSIG``), so a node
  that leaves takes its schedulers with it. :func:`stop` stops them all.
* Inside a task or actor: :func:`scheduler_address` is
  ``unix:DIR/gpuN.sock`` of the task's node and GPU (the node from the
  runtime context, the GPU from ``get_accelerator_ids()["GPU"]``), and
  :func:`budget_mb` is the task's share of that GPU's memory.

The scheduler binary is found on each node: the ``binary`` argument of
:func:`start`, else ``$TENSILE_SCHEDULER_BIN``, else ``tensile-scheduler``
on ``PATH``, else the one in the running Python environment's scripts
folder (where a wheel installs it).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from tensile import _core

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as e:  # pragma: no cover - ray is pinned in the project's setup
    raise ImportError("tensile.ray needs Ray: pip install ray") from e

__all__ = [
    "NAMESPACE",
    "NodeSchedulers",
    "TensileRayError",
    "budget_mb",
    "find_scheduler_binary",
    "gpu_share",
    "launch_schedulers",
    "nodes",
    "scheduler_address",
    "start",
    "stop",
]

#: The Ray namespace of the per-node actors.
NAMESPACE = "tensile"
_PREFIX = "schedulers-"
#: The longest Unix socket path Linux takes (``sun_path`` is 108 bytes).
MAX_SOCKET_PATH = 107


class TensileRayError(RuntimeError):
    """What ``tensile.ray`` cannot do, and why (one line)."""


@dataclasses.dataclass(frozen=True)
class NodeSchedulers:
    """The schedulers of one node, as its actor reports them."""

    node_id: str
    #: The node's socket folder: GPU ``N`` is served on ``DIR/gpuN.sock``.
    socket_dir: str
    #: Ray's ids of the node's GPUs (``"0"``, ``"1"``, ...), as tasks see them.
    gpus: tuple[str, ...]
    #: Per GPU id, the memory its scheduler plans for (its budget when started), bytes.
    memory_bytes: Mapping[str, int]
    #: Per GPU id, the scheduler's process id; 0 for one that has exited.
    pids: Mapping[str, int]
    #: The ``--device`` profile given, or ``None`` for the scheduler's default.
    device: str | None

    def address(self, gpu: str | int) -> str:
        """``unix:DIR/gpuN.sock``, the scheduler of GPU ``gpu``."""
        key = str(gpu)
        if key not in self.gpus:
            raise TensileRayError(
                f"node {self.node_id} has schedulers for GPUs {', '.join(self.gpus)}, not for GPU {key}"
            )
        return f"unix:{socket_path(self.socket_dir, key)}"


def socket_path(socket_dir: str | os.PathLike[str], gpu: str) -> str:
    """``DIR/gpuN.sock``: where the scheduler of GPU ``gpu`` listens (the
    endpoint rule's name for a GPU's socket, ``tensile._core``)."""
    return os.path.join(os.fspath(socket_dir), _core.gpu_socket_name(int(gpu)))


# ---------------------------------------------------------------------------
# The driver's side


def start(
    *,
    device: str | None = None,
    memory_mb: int | None = None,
    binary: str | os.PathLike[str] | None = None,
    socket_root: str | os.PathLike[str] | None = None,
    scheduler_args: Sequence[str] = (),
    timeout_s: float = 60.0,
) -> list[NodeSchedulers]:
    """Starts the schedulers of every alive node of the connected cluster
    that has GPUs, and returns every started node's :class:`NodeSchedulers`.

    ``device`` is the scheduler's ``--device`` profile (a built-in name such
    as ``a6000`` or ``h100``, or a profile file on the nodes); ``None``
    leaves it to the scheduler: the node's GPU as ``nvidia-smi`` sees it,
    else ``a6000``. ``memory_mb`` (MB of 10^6 bytes) is the memory each
    scheduler plans for, its ``--budget-mb``; ``None``: the profile's.
    ``socket_root`` is the folder on each node under which the node's
    socket folder is made (default: the node's temporary folder); the
    socket paths must stay within 107 bytes. ``scheduler_args`` go to every
    scheduler's command line as they are (``["--lease-s", "5"]``).

    Idempotent: nodes already started are kept as they are (a scheduler
    that exited is started again), nodes that joined since are started.
    Settings that differ from a started node's are refused: :func:`stop`
    first. The GPU count of a node is its ``GPU`` resource; the GPU ids are
    those Ray hands to the node's tasks.
    """
    _need_connection("start")
    if memory_mb is not None and (isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1):
        raise TensileRayError(f"memory_mb must be a positive whole number of MB (10^6 bytes), got {memory_mb!r}")
    if device is not None and (not isinstance(device, str) or not device.strip()):
        raise TensileRayError(f"device must be a profile name or file, got {device!r}")
    if isinstance(scheduler_args, str) or not all(isinstance(a, str) for a in scheduler_args):
        raise TensileRayError(f"scheduler_args must be a list of strings, got {scheduler_args!r}")
    settings = {
        "device": device,
        "memory_mb": memory_mb,
        "binary": None if binary is None else os.fspath(binary),
        "socket_root": None if socket_root is None else os.fspath(socket_root),
        "scheduler_args": list(scheduler_args),
    }
    actor_class = ray.remote(num_cpus=0, max_restarts=0)(_NodeActor)
    pending = []
    for node in ray.nodes():
        gpus = int(node.get("Resources", {}).get("GPU", 0))
        if not node.get("Alive") or gpus < 1:
            continue
        node_id = node["NodeID"]
        actor: Any = actor_class.options(
            name=_PREFIX + node_id,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(node_id)
        pending.append((node_id, actor.ensure.remote(settings, gpus, timeout_s)))
    started: list[NodeSchedulers] = []
    failed: list[tuple[str, BaseException]] = []
    for node_id, ref in pending:  # every answer is taken, so that Ray reports no error twice
        try:
            started.append(NodeSchedulers(**ray.get(ref, timeout=timeout_s + 30)))
        except ray.exceptions.RayTaskError as e:
            failed.append((node_id, e.cause if isinstance(e.cause, TensileRayError) else e))
        except ray.exceptions.GetTimeoutError:
            failed.append((node_id, TensileRayError(f"its schedulers did not start within {timeout_s + 30:.0f} s")))
    if failed:
        node_id, why = failed[0]
        more = f" (and {len(failed) - 1} more nodes)" if len(failed) > 1 else ""
        raise TensileRayError(f"node {node_id}: {why}{more}") from why
    return started


def nodes() -> list[NodeSchedulers]:
    """Every node whose schedulers are started (its actor alive)."""
    _need_connection("nodes")
    found: list[NodeSchedulers] = []
    for _, actor in _actors():
        try:
            found.append(NodeSchedulers(**ray.get(actor.info.remote(), timeout=30)))
        except ray.exceptions.RayActorError:
            continue  # its node has just gone
    return found


def stop(timeout_s: float = 30.0) -> list[str]:
    """Stops every node's schedulers (SIGTERM, then SIGKILL after
    ``timeout_s``), removes their socket folders and kills their actors;
    returns the nodes whose actor stopped its schedulers. An actor that does
    not answer is killed all the same, and its schedulers end with it."""
    _need_connection("stop")
    stopped: list[str] = []
    for node_id, actor in _actors():
        try:
            ray.get(actor.stop.remote(timeout_s), timeout=timeout_s + 30)
            stopped.append(node_id)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # its node is gone (its schedulers with it), or it hangs: killed below
        ray.kill(actor, no_restart=True)
    return stopped


def _actors() -> list[tuple[str, Any]]:
    named = ray.util.list_named_actors(all_namespaces=True)
    found: list[tuple[str, Any]] = []
    for entry in named:
        if entry.get("namespace") != NAMESPACE or not entry.get("name", "").startswith(_PREFIX):
            continue
        try:
            found.append((entry["name"][len(_PREFIX) :], ray.get_actor(entry["name"], namespace=NAMESPACE)))
        except ValueError:
            continue  # gone since it was listed
    return found


# ---------------------------------------------------------------------------
# The task's side


def scheduler_address(gpu: str | int | None = None) -> str:
    """The address (``unix:DIR/gpuN.sock``) of the scheduler of this task's
    GPU on this task's node. For a task that holds several GPUs, ``gpu``
    says which (one of ``ray.get_runtime_context().get_accelerator_ids()["GPU"]``)."""
    node_id, gpu_id, _ = _placement("scheduler_address", gpu)
    info = _node_info(node_id)
    return info.address(gpu_id)


def gpu_share(gpu: str | int | None = None) -> float:
    """The fraction of its GPU this task holds (``num_gpus=0.5``: 0.5; a task
    that holds whole GPUs holds 1.0 of each)."""
    return float(_placement("gpu_share", gpu)[2])


def budget_mb(gpu: str | int | None = None) -> int:
    """This task's memory budget on its GPU, MB (10^6 bytes): its share of
    the GPU times the memory the GPU's scheduler plans for (``memory_mb``
    of :func:`start`, else the device profile's), rounded down to a whole
    MB, so that the budgets of the tasks sharing a GPU add up to at most its
    memory. ``num_gpus=0.5`` on the ``a6000`` profile (51,527,024,640
    bytes): 25763. Pass it to ``tensile.plan(..., budget_mb=)``."""
    node_id, gpu_id, share = _placement("budget_mb", gpu)
    info = _node_info(node_id)
    info.address(gpu_id)  # a GPU the node's schedulers serve
    return int(share * info.memory_bytes[gpu_id] // 1_000_000)


def _placement(what: str, gpu: str | int | None) -> tuple[str, str, Fraction]:
    """This task's node id, its GPU id and its share of that GPU."""
    _need_connection(what)
    context = ray.get_runtime_context()
    if getattr(getattr(context, "worker", None), "mode", None) != ray.WORKER_MODE:
        raise TensileRayError(
            f"tensile.ray.{what}() runs inside a Ray task or actor (a Ray Train worker); this is the driver"
        )
    ids = [str(i) for i in context.get_accelerator_ids().get("GPU", [])]
    held = context.get_assigned_resources().get("GPU", 0.0)
    if not ids or held <= 0:
        raise TensileRayError(
            f"tensile.ray.{what}(): this task holds no GPU; ask Ray for a share of one "
            "(@ray.remote(num_gpus=0.5), or Ray Train's resources_per_worker={'GPU': 0.5})"
        )
    if gpu is None:
        if len(ids) > 1:
            raise TensileRayError(f"tensile.ray.{what}(): this task holds GPUs {', '.join(ids)}: pass gpu= one of them")
        gpu_id = ids[0]
    else:
        gpu_id = str(gpu)
        if gpu_id not in ids:
            raise TensileRayError(
                f"tensile.ray.{what}(gpu={gpu!r}): this task holds GPU {', '.join(ids)}, not {gpu_id}"
            )
    # Ray keeps resources in units of 1/10000; str() gives that decimal exactly.
    share = Fraction(str(held)) / len(ids)
    return context.get_node_id(), gpu_id, share


def _node_info(node_id: str) -> NodeSchedulers:
    try:
        actor: Any = ray.get_actor(_PREFIX + node_id, namespace=NAMESPACE)
    except ValueError:
        raise TensileRayError(
            f"no TENSILE schedulers on node {node_id}: "
            "call tensile.ray.start() in the driver (again after a node joins)"
        ) from None
    try:
        answer: dict[str, Any] = ray.get(actor.info.remote(), timeout=60)
        info = NodeSchedulers(**answer)
    except ray.exceptions.RayActorError as e:
        raise TensileRayError(f"the TENSILE schedulers of node {node_id} are gone: {e}") from e
    dead = [g for g in info.gpus if not info.pids.get(g)]
    if dead:
        raise TensileRayError(
            f"the scheduler of GPU {dead[0]} on node {node_id} has exited (its log: "
            f"{os.path.join(info.socket_dir, f'gpu{dead[0]}.log')}); tensile.ray.start() starts it again"
        )
    return info


def _need_connection(what: str) -> None:
    if not ray.is_initialized():
        raise TensileRayError(f"tensile.ray.{what}(): Ray is not initialized (ray.init() first)")


# ---------------------------------------------------------------------------
# The node's side


def find_scheduler_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """``binary``, else ``$TENSILE_SCHEDULER_BIN``, else ``tensile-scheduler``
    on ``PATH``, else in this Python environment's scripts folder."""
    for given, source in (
        (binary, "binary"),
        (os.environ.get("TENSILE_SCHEDULER_BIN") or None, "TENSILE_SCHEDULER_BIN"),
    ):
        if given is not None:
            path = os.fspath(given)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise TensileRayError(f"{source}={path} is not an executable file")
            return path
    found = shutil.which("tensile-scheduler")
    if found:
        return found
    scripts = sysconfig.get_path("scripts")
    candidate = os.path.join(scripts, "tensile-scheduler") if scripts else ""
    if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
        return candidate
    raise TensileRayError(
        "tensile-scheduler not found: pass binary= to tensile.ray.start(), set TENSILE_SCHEDULER_BIN on the nodes, "
        "or put it on their PATH"
    )


def launch_schedulers(
    binary: str,
    gpus: Sequence[str],
    socket_dir: str,
    *,
    device: str | None,
    budget_mb: int | None,
    extra_args: Sequence[str] = (),
) -> dict[str, subprocess.Popen[bytes]]:
    """Launches the schedulers of ``gpus``, GPU ``N`` served on
    ``socket_dir/gpuN.sock``, each logging to ``socket_dir/gpuN.log``;
    returns each GPU's process. The one place that knows the command line
    (one process per GPU today). Each process gets SIGTERM when the
    thread that launched it exits (Linux), so schedulers never outlive
    their node's actor."""
    launched = {}
    for gpu in gpus:
        sock = socket_path(socket_dir, gpu)
        if os.path.exists(sock):
            os.unlink(sock)  # left by a scheduler that exited
        args = [binary, "--listen", f"unix:{sock}", "--state", "none"]
        if device is not None:
            args += ["--device", device]
        if budget_mb is not None:
            args += ["--budget-mb", str(budget_mb)]
        args += list(extra_args)
        with open(os.path.join(socket_dir, f"gpu{gpu}.log"), "ab") as log:
            launched[gpu] = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
    return launched


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when its parent
    thread exits (``prctl(PR_SET_PDEATHSIG)``); None elsewhere. The libc
    lookup happens here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took hold
            os._exit(1)

    return preexec


class _NodeActor:
    """The detached actor that owns one node's schedulers. Ray runs its
    methods on the process's main thread, which launches the schedulers,
    so they live exactly as long as this process."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.settings: dict[str, Any] | None = None
        self.socket_dir: str | None = None
        self.gpus: tuple[str, ...] = ()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.memory: dict[str, int] = {}

    def ensure(self, settings: dict[str, Any], gpu_count: int, timeout_s: float) -> dict[str, Any]:
        """Launches what is not running; returns :meth:`info`."""
        actual = ray.get_runtime_context().get_node_id()
        if actual != self.node_id:
            raise TensileRayError(f"the actor of node {self.node_id} runs on node {actual}")
        if self.settings is None:
            self.settings = settings
            self.gpus = _node_gpu_ids(gpu_count)
            root = settings["socket_root"] or tempfile.gettempdir()
            os.makedirs(root, exist_ok=True)
            self.socket_dir = tempfile.mkdtemp(prefix="tensile-", dir=root)
            longest = max((socket_path(self.socket_dir, g) for g in self.gpus), key=len)
            if len(longest.encode()) > MAX_SOCKET_PATH:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                self.settings = None
                raise TensileRayError(
                    f"the socket path {longest} is {len(longest.encode())} bytes, over the {MAX_SOCKET_PATH} "
                    "a Unix socket takes: pass a shorter socket_root"
                )
        elif settings != self.settings:
            was = self.settings
            differ = ", ".join(f"{k}={was[k]!r}" for k in sorted(settings) if settings[k] != was[k])
            raise TensileRayError(
                f"its schedulers were started with other settings ({differ}): "
                "call tensile.ray.stop() first to change them"
            )
        assert self.socket_dir is not None
        down = [g for g in self.gpus if g not in self.procs or self.procs[g].poll() is not None]
        if down:
            try:
                binary = find_scheduler_binary(settings["binary"])
                self.procs.update(
                    launch_schedulers(
                        binary,
                        down,
                        self.socket_dir,
                        device=settings["device"],
                        budget_mb=settings["memory_mb"],
                        extra_args=settings["scheduler_args"],
                    )
                )
                deadline = time.monotonic() + timeout_s
                for gpu in down:
                    self.memory[gpu] = self._wait_ready(gpu, deadline)
            except BaseException:
                for gpu in down:
                    if gpu in self.procs and self.procs[gpu].poll() is None:
                        self.procs[gpu].kill()
                        self.procs[gpu].wait()
                if not any(p.poll() is None for p in self.procs.values()):
                    self.stop(0)  # nothing runs: a corrected start() begins anew
                    self.settings = None
                raise
        return self.info()

    def _wait_ready(self, gpu: str, deadline: float) -> int:
        """Waits for GPU ``gpu``'s scheduler to answer; returns its budget, bytes."""
        from tensile.client import Client, SchedulerError

        assert self.socket_dir is not None
        sock = socket_path(self.socket_dir, gpu)
        proc = self.procs[gpu]
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise TensileRayError(
                    f"the scheduler of GPU {gpu} exited with status {proc.returncode}: {self._log_tail(gpu)}"
                )
            if os.path.exists(sock):
                try:
                    with Client(f"unix:{sock}", timeout_s=5) as client:
                        return int(client.status().memory.budget_bytes)
                except SchedulerError as e:
                    last = str(e)
            time.sleep(0.05)
        proc.kill()
        raise TensileRayError(f"the scheduler of GPU {gpu} did not answer on {sock} in time ({last or 'no socket'})")

    def _log_tail(self, gpu: str) -> str:
        assert self.socket_dir is not None
        try:
            lines = Path(self.socket_dir, f"gpu{gpu}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:]) or "(empty log)"

    def info(self) -> dict[str, Any]:
        """What :class:`NodeSchedulers` holds."""
        return {
            "node_id": self.node_id,
            "socket_dir": self.socket_dir or "",
            "gpus": self.gpus,
            "memory_bytes": dict(self.memory),
            "pids": {g: (p.pid if p.poll() is None else 0) for g, p in self.procs.items()},
            "device": (self.settings or {}).get("device"),
        }

    def stop(self, timeout_s: float) -> None:
        """Stops the schedulers (SIGTERM, then SIGKILL after ``timeout_s``)
        and removes the socket folder."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
        self.memory.clear()
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None


def _node_gpu_ids(count: int) -> tuple[str, ...]:
    """The ids Ray hands this node's tasks: the first ``count`` entries of
    the node's ``CUDA_VISIBLE_DEVICES`` when it was started with one (an
    actor that asks for no GPU sees the node's), else ``0 .. count-1``."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if len(visible) >= count:
        return tuple(visible[:count])
    return tuple(str(i) for i in range(count))
