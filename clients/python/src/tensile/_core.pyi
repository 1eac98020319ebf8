"""Type stubs of ``tensile._core``, the project's Rust crates under the
Python package (clients/python-core): the planner, the plan format, the
gate clock, the session protocol and the endpoint rule."""

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

__version__: str
#: The longest gate period (and op start) a plan may carry: an hour, in ns.
MAX_PERIOD_NS: int
#: The plan format this module reads and writes: ``tensile-plan/v1``.
PLAN_FORMAT: str

class PlanningError(RuntimeError):
    """Planning failed: an unknown device profile, latency models that
    cannot be loaded, a planner error."""

class PlanFormatError(ValueError):
    """A plan that is not a valid ``tensile-plan/v1`` document for its
    graph; the message names the item."""

class ResolveError(LookupError):
    """The scheduler could not be found: ``gpus.json`` is unreadable, or
    serves no GPU the job's device names."""

# -- the planner ------------------------------------------------------------

def plan(
    graph: Mapping[str, Any] | str,
    device: str,
    *,
    budget_bytes: int | None = None,
    recompute: bool = True,
    stop_at_budget: bool = False,
    latency_models: str = "auto",
) -> dict[str, Any]:
    """Plans ``graph`` alone on the device profile ``device``, as
    ``tensilectl plan`` does, without the GIL: ``{"plan": <tensile-plan/v1
    dict>, "report": <tensilectl plan --json's report>, "warnings": [str]}``."""

# -- the plan format --------------------------------------------------------

def read_plan(graph: Mapping[str, Any] | str, plan: Mapping[str, Any] | str) -> dict[str, Any]:
    """A plan document validated against ``graph``, as the format writes it."""

def plan_from_wire(graph: Mapping[str, Any] | str, plan: bytes, diagnostics: Sequence[bytes] = ...) -> dict[str, Any]:
    """A serialized ``tensile.v1.Plan`` (and its ``Diagnostic``s) as a plan
    document for ``graph``, checked as a pushed plan is."""

# -- the gate clock ---------------------------------------------------------

class Gate:
    """When a coordinated job may start its iterations: the slots
    ``epoch_ns + phase_ns + n * period_ns``."""

    def __init__(self, period_ns: int, phase_ns: int, epoch_ns: int) -> None: ...
    @property
    def period_ns(self) -> int: ...
    @property
    def phase_ns(self) -> int: ...
    @property
    def epoch_ns(self) -> int: ...
    @staticmethod
    def from_dict(doc: Mapping[str, int]) -> Gate: ...
    def to_dict(self) -> dict[str, int]: ...
    def nearest_slot(self, now: int) -> int: ...
    @staticmethod
    def epoch_at(previous: Gate | None, now: int) -> int: ...
    @staticmethod
    def epoch_for(previous: Gate | None, anchor: Gate | None, now: int) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class GateClock:
    """A driver's position on its job's slots."""

    def __init__(self, gate: Gate) -> None: ...
    @property
    def gate(self) -> Gate: ...
    @property
    def next_ns(self) -> int | None: ...
    def set_gate(self, gate: Gate) -> None: ...
    def start_at(self, now_ns: int) -> int: ...

def gate_of(plan: Mapping[str, Any]) -> Gate | None:
    """The gate of a plan document, or None (the job runs free)."""

def pace_of(plan: Mapping[str, Any], n_ops: int) -> list[int]:
    """The pace of a plan document (``prediction.op_start_ns``), checked."""

def pace_from_seconds(starts_s: Sequence[float], n_ops: int) -> list[int]:
    """A pace from the wire (seconds) in ns, checked."""

# -- the memory guard ---------------------------------------------------------

def guard_victims(candidates: Sequence[tuple[int, int, int]], held: int, need: int, limit: int) -> list[int]:
    """The storages to move off the device, in order, so that ``held +
    need`` bytes fit under ``limit``: from ``(storage, bytes, next_use)``
    candidates, the one used again last first, ties by storage id (the
    executor's rule)."""

# -- the session protocol ---------------------------------------------------

class Session:
    """A job's connection to its scheduler, on a background thread."""

    def __init__(
        self,
        graph: Mapping[str, Any] | str,
        server: str | None = None,
        name: str = "",
        *,
        priority: int = 0,
        device_ordinal: int = 0,
        allow_recompute: bool | None = None,
        base_bytes: int | None = None,
        call_timeout_s: float = 5.0,
        max_backoff_s: float = 5.0,
    ) -> None: ...
    def iteration_done(self, measurements: Mapping[str, Any]) -> tuple[int, int, int, dict[str, Any]] | None:
        """Queues a report; ``(job_id, registration, version, plan)`` of a
        newer plan, if one arrived.

        ``measurements``: ``iteration`` (int), ``op_latency_s`` (one float
        per op of the graph, else nothing is sent), ``stall_s``,
        ``late_prefetches`` (storage ids), ``passive_swaps``, ``peak_bytes``
        (the most bytes the job's storages held at once), and ``base_bytes``
        (optional int): the device bytes the process holds outside the job's
        storages, measured in the process (on CUDA, the process's used memory
        less the storages' peak) after its first steps; a process that runs
        several jobs gives each its share (the figure divided by the jobs,
        rounded up). Absent or ``None``: not measured (on the CPU, before the
        first measurement), and the scheduler keeps the base it plans with.
        Measure it over a whole step, with the caching allocator's cache given
        back at each plan switch (``torch.cuda.empty_cache()``), as the worker
        does: what a former plan reserved would otherwise count as the base,
        and grow it each time a re-plan lowers the storages.
        The scheduler plans with a measured base in place of the device
        profile's when the two differ by more than a tenth and 64 MiB, and
        refuses the report (a warning in ``take_log``) past the device's
        memory. A field of the wrong kind (``base_bytes=-1``, ``1.5``,
        ``float("nan")``) raises ``ValueError`` naming it."""
    def take_plan(self) -> tuple[int, int, int, dict[str, Any]] | None:
        """The newer plan to switch to, if one arrived, without a report."""
    def wait_for_plan(
        self, timeout_s: float, other_than: tuple[int, int] | None = None
    ) -> tuple[int, int, int, dict[str, Any]] | None: ...
    def finish(self, timeout_s: float = 5.0) -> bool: ...
    def status(self) -> dict[str, Any]: ...
    def take_log(self) -> list[tuple[str, str]]: ...

# -- the endpoint rule ------------------------------------------------------

def resolve_server(address: str | None = None, ordinal: int = 0, environ: Mapping[str, str] | None = None) -> str:
    """The scheduler a job of CUDA ordinal ``ordinal`` talks to."""

def socket_dir(environ: Mapping[str, str] | None = None) -> str: ...
def default_socket_path(environ: Mapping[str, str] | None = None) -> str: ...
def device_ordinal(device: str) -> int: ...
def gpu_socket_name(index: int) -> str: ...
def read_gpus_file(directory: str | PathLike[str]) -> dict[str, Any] | None: ...
