"""A Python client of the Memory Scheduler (``tensile.v1.MemoryScheduler``).

The messages and the stub are generated from the one contract,
``proto/tensile/v1/tensile.proto``, into :mod:`tensile.v1`
(``scripts/gen_python_stubs.py``). This module adds what a user wants on top:
graphs given as a file, a ``tensile-graph/v1`` dict or a model traced with
:mod:`tensile.trace`; finding the scheduler (:func:`resolve_server`: an
explicit address, else ``TENSILE_SERVER``, else the socket of the job's GPU
in the socket directory's ``gpus.json``, else its ``scheduler.sock``: the
rule of ``tensile_proto::endpoint``, run through ``tensile._core``); plans
from the wire as plan documents (:func:`plan_to_file`, the Rust plan
format's writer); message size limits raised to what real graphs need; and
errors as :class:`SchedulerError`, which carries the gRPC status code and
message.

Example::

    import tensile

    client = tensile.Client()                     # the scheduler of this job's GPU (or the default socket)
    job = client.register("resnet50.json", name="resnet50")
    for update in client.plans(job):              # blocks; one item per plan version
        print(update.plan.version, len(update.plan.events))
        break
    client.report(job, iteration=0, plan_version=update.plan.version, op_latency_s=measured)
    print(client.status())
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from tensile import _core
from tensile.v1 import tensile_pb2 as pb
from tensile.v1 import tensile_pb2_grpc as pb_grpc

__all__ = [
    "Client",
    "Job",
    "ResolveError",
    "SchedulerError",
    "default_socket_path",
    "device_ordinal",
    "read_gpus_file",
    "resolve_server",
    "tls_credentials",
    "socket_dir",
    "graph_to_proto",
    "plan_to_file",
]

#: Largest message either side accepts. The gRPC default (4 MiB) rejects real
#: graphs (a traced DenseNet has about 6k ops); the scheduler's own graph
#: limits stay the real guard.
MAX_MESSAGE_BYTES = 1 << 30

GRAPH_FORMAT = "tensile-graph/v1"
PLAN_FORMAT = "tensile-plan/v1"

_DTYPES = {
    "f32": pb.DTYPE_F32,
    "f16": pb.DTYPE_F16,
    "bf16": pb.DTYPE_BF16,
    "f64": pb.DTYPE_F64,
    "i64": pb.DTYPE_I64,
    "i32": pb.DTYPE_I32,
    "i16": pb.DTYPE_I16,
    "i8": pb.DTYPE_I8,
    "u8": pb.DTYPE_U8,
    "bool": pb.DTYPE_BOOL,
}
_KINDS = {
    "input": pb.TENSOR_KIND_INPUT,
    "parameter": pb.TENSOR_KIND_PARAMETER,
    "buffer": pb.TENSOR_KIND_BUFFER,
    "activation": pb.TENSOR_KIND_ACTIVATION,
    "gradient": pb.TENSOR_KIND_GRADIENT,
    "optimizer_state": pb.TENSOR_KIND_OPTIMIZER_STATE,
    "workspace": pb.TENSOR_KIND_WORKSPACE,
    "output": pb.TENSOR_KIND_OUTPUT,
}
_PHASES = {"forward": pb.PHASE_FORWARD, "backward": pb.PHASE_BACKWARD, "optimizer": pb.PHASE_OPTIMIZER}
_ALIASES = {"in_place": pb.ALIAS_KIND_IN_PLACE, "view": pb.ALIAS_KIND_VIEW}
_PLACEMENTS = {"device": pb.PLACEMENT_DEVICE, "host": pb.PLACEMENT_HOST}
class SchedulerError(Exception):
    """A call the scheduler (or the transport) refused: ``code`` is the gRPC
    status code (``grpc.StatusCode``), ``message`` the scheduler's own words,
    which name what was wrong (the op, the tensor, the job)."""

    def __init__(self, method: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{method}: {code.name}: {message}")
        self.method = method
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class Job:
    """A registered job: its id, the secret every later call carries, and
    its state and reason (why it is queued) when it was registered."""

    id: int
    token: str
    state: int
    reason: str = ""
    lease_s: float = 0.0

    @property
    def state_name(self) -> str:
        return pb.JobState.Name(self.state)


#: The scheduler could not be found: ``gpus.json`` is unreadable, or serves
#: no GPU the job's device names; the message says which and lists the GPUs
#: it serves (a ``LookupError``, raised by the Rust rule).
ResolveError = _core.ResolveError


def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
    """The scheduler's default Unix socket, as the scheduler computes it:
    ``$XDG_RUNTIME_DIR/tensile/scheduler.sock`` when that variable is an
    absolute path, else ``/tmp/tensile-$UID/scheduler.sock``."""
    return Path(_core.default_socket_path(os.environ if environ is None else environ))


def socket_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory clients look in: ``TENSILE_SOCKET_DIR`` when set (and
    not empty), else the default one (``$XDG_RUNTIME_DIR/tensile``, else
    ``/tmp/tensile-$UID``)."""
    return Path(_core.socket_dir(os.environ if environ is None else environ))


def device_ordinal(device: Any) -> int:
    """The CUDA ordinal of a device: ``cuda:N`` (a string, or a
    ``torch.device`` of index N) is N, an int is itself; ``cuda``, ``cpu``
    and ``None`` are 0 (the job's first visible GPU)."""
    if device is None:
        return 0
    if isinstance(device, bool):
        raise TypeError("a device is a name such as 'cuda:1', an ordinal or a torch.device, not a bool")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device ordinal {device} is negative")
        return device
    if getattr(device, "type", None) is not None:
        index = getattr(device, "index", None)
        return int(index) if index is not None else 0
    return _core.device_ordinal(str(device))


def read_gpus_file(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``DIR/gpus.json``, checked (at least one GPU, indices unique, every
    field there), or ``None`` when there is none; :class:`ResolveError`
    when it cannot be read or is not one."""
    return _core.read_gpus_file(os.fspath(directory))


def resolve_server(
    address: str | os.PathLike[str] | None = None,
    device: Any = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The scheduler a job on ``device`` (``cuda:N``, an ordinal, a
    ``torch.device``; ``None``: 0) talks to, as an address for
    :func:`target_of`: ``address`` when given; else ``TENSILE_SERVER``; else,
    when the socket directory (``TENSILE_SOCKET_DIR``, else the default one)
    holds ``gpus.json``, the socket of the job's GPU (its ordinal mapped
    through ``CUDA_VISIBLE_DEVICES``, else ``NVIDIA_VISIBLE_DEVICES``, matched
    by index or uuid prefix); else ``DIR/scheduler.sock``. Raises
    :class:`ResolveError` naming the GPU and listing those served when
    ``gpus.json`` has no such GPU. The rule is ``tensile_proto::endpoint``'s
    (``tensile._core.resolve_server``)."""
    explicit = None if address is None else os.fspath(address)
    return _core.resolve_server(explicit, device_ordinal(device), os.environ if environ is None else environ)


def target_of(address: str | os.PathLike[str] | None) -> str:
    """A gRPC target for ``address``: ``None`` or ``""`` is the single
    device's default socket (clients find theirs with
    :func:`resolve_server` first); ``unix:PATH`` or an absolute path is a
    Unix socket; ``HOST:PORT`` (or ``http://HOST:PORT``) is TCP."""
    if address is None or str(address).strip() == "":
        return f"unix:{default_socket_path()}"
    text = str(address).strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        return f"unix:{path}"
    if text.startswith("/"):
        return f"unix:{text}"
    for scheme in ("http://", "https://"):
        if text.startswith(scheme):
            return text[len(scheme) :]
    return text


def graph_to_proto(graph: str | os.PathLike[str] | Mapping[str, Any] | pb.Graph) -> pb.Graph:
    """The wire form of a graph given as a ``tensile-graph/v1`` file, its
    parsed dict (what :func:`tensile.trace.trace_training_step` returns), or
    a ``Graph`` message. Only the shape of the document is checked here; the
    scheduler validates the graph itself and names the op or tensor at
    fault."""
    if isinstance(graph, pb.Graph):
        return graph
    if isinstance(graph, (str, os.PathLike)):
        path = Path(graph)
        try:
            doc = json.loads(path.read_text())
        except OSError as e:
            raise ValueError(f"graph file {path}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"graph file {path}: invalid JSON: {e}") from None
        return _graph_from_dict(doc, str(path))
    if isinstance(graph, Mapping):
        return _graph_from_dict(graph, "graph")
    raise TypeError(f"a graph is a file path, a {GRAPH_FORMAT} dict or a tensile.v1.Graph, not {type(graph).__name__}")


def _graph_from_dict(doc: Mapping[str, Any], what: str) -> pb.Graph:
    if doc.get("format") != GRAPH_FORMAT:
        raise ValueError(f"{what}: format is {doc.get('format')!r}, expected {GRAPH_FORMAT!r}")
    out = pb.Graph(name=str(doc.get("name", "")))
    for i, t in enumerate(doc.get("tensors", [])):
        where = f"{what}: tensor {i}"
        out.tensors.append(
            pb.Tensor(
                id=int(t["id"]),
                name=str(t["name"]),
                shape=[int(d) for d in t["shape"]],
                dtype=_lookup(_DTYPES, t["dtype"], f"{where} dtype"),
                bytes=int(t["bytes"]),
                kind=_lookup(_KINDS, t["kind"], f"{where} kind"),
            )
        )
    for i, o in enumerate(doc.get("ops", [])):
        where = f"{what}: op {i} ({o.get('name', '?')})"
        op = pb.Op(
            id=int(o["id"]),
            name=str(o["name"]),
            op_type=str(o["type"]),
            phase=_lookup(_PHASES, o["phase"], f"{where} phase"),
            inputs=[int(x) for x in o["inputs"]],
            outputs=[int(x) for x in o["outputs"]],
            placement=_lookup(_PLACEMENTS, o.get("placement", "device"), f"{where} placement"),
        )
        for key, value in o.get("attrs", {}).items():
            op.attrs[key].CopyFrom(_attr(value, f"{where} attribute {key!r}"))
        for a in o.get("aliases", []):
            op.aliases.append(
                pb.Alias(output=int(a["output"]), input=int(a["input"]), kind=_lookup(_ALIASES, a["kind"], f"{where} alias"))
            )
        out.ops.append(op)
    return out


def _lookup(table: Mapping[str, int], value: Any, what: str) -> int:
    if value not in table:
        raise ValueError(f"{what}: unknown value {value!r} (expected one of {', '.join(table)})")
    return table[value]


def _attr(value: Any, what: str) -> pb.AttrValue:
    # The JSON reading of graph/src/json.rs: bool, then int, then float,
    # then string, then a list of ints, then a list of numbers.
    if isinstance(value, bool):
        return pb.AttrValue(bool=value)
    if isinstance(value, int):
        return pb.AttrValue(int=value)
    if isinstance(value, float):
        return pb.AttrValue(float=value)
    if isinstance(value, str):
        return pb.AttrValue(str=value)
    if isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return pb.AttrValue(ints=pb.IntList(values=value))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return pb.AttrValue(floats=pb.FloatList(values=[float(v) for v in value]))
    raise ValueError(f"{what}: unsupported value {value!r}")


def plan_to_file(plan: pb.Plan, graph: Mapping[str, Any], diagnostics: Sequence[pb.Diagnostic] = ()) -> dict[str, Any]:
    """A plan from the wire as a ``tensile-plan/v1`` document (the format of
    ``tensilectl plan -o``, docs/plan-format.md) for the graph it was made
    for: what ``tensile.apply`` and ``tensile-worker --plan`` read. Written
    and checked by the Rust plan format (``tensile._core.plan_from_wire``):
    a coordinated job's gate becomes ``gate`` and its pace
    ``prediction.op_start_ns``; a plan that does not fit the graph is a
    ``ValueError`` (``tensile._core.PlanFormatError``) naming what is
    wrong."""
    return _core.plan_from_wire(
        dict(graph), plan.SerializeToString(), [d.SerializeToString() for d in diagnostics]
    )


def tls_credentials(
    address: str,
    *,
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> grpc.ChannelCredentials | None:
    """The TLS credentials for ``address`` (a resolved one), by the rule
    every client follows (``tensile_proto::tls``): a Unix socket never uses
    TLS; ``https://HOST:PORT`` does and needs a CA; ``http://HOST:PORT``
    does not; ``HOST:PORT`` does when a CA is given. ``ca``, ``cert``,
    ``key`` default to ``TENSILE_TLS_CA``, ``TENSILE_TLS_CERT``,
    ``TENSILE_TLS_KEY``; ``cert`` and ``key`` (mutual TLS) go together and
    need the CA. ``None``: plaintext. A file that cannot be read is a
    ``ValueError`` naming it."""
    env = os.environ if environ is None else environ

    def pick(given: str | os.PathLike[str] | None, var: str) -> str | None:
        value = os.fspath(given) if given is not None else env.get(var, "")
        return value if value.strip() else None

    ca_path, cert_path, key_path = pick(ca, "TENSILE_TLS_CA"), pick(cert, "TENSILE_TLS_CERT"), pick(key, "TENSILE_TLS_KEY")
    text = str(address).strip()
    if text.startswith("unix:") or text.startswith("/"):
        return None
    if ca_path is None:
        if cert_path is not None or key_path is not None:
            raise ValueError("tls_cert/tls_key (TENSILE_TLS_CERT/TENSILE_TLS_KEY) need tls_ca (TENSILE_TLS_CA): the CA that signed the scheduler's certificate")
        if text.startswith("https://"):
            raise ValueError(f"{text}: https needs tls_ca (TENSILE_TLS_CA): the CA that signed the scheduler's certificate")
        return None
    if text.startswith("http://"):
        return None
    if (cert_path is None) != (key_path is None):
        raise ValueError("tls_cert (TENSILE_TLS_CERT) and tls_key (TENSILE_TLS_KEY) go together: a certificate and its private key")

    def read(what: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise ValueError(f"{what} {path}: {e.strerror or e}") from e

    root = read("tls_ca (TENSILE_TLS_CA)", ca_path)
    if root is not None and b"-----BEGIN CERTIFICATE-----" not in root:
        raise ValueError(f"tls_ca (TENSILE_TLS_CA) {ca_path}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)")
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=read("tls_key (TENSILE_TLS_KEY)", key_path),
        certificate_chain=read("tls_cert (TENSILE_TLS_CERT)", cert_path),
    )


class Client:
    """A connection to one scheduler.

    ``address``: ``unix:PATH`` or an absolute path for a socket,
    ``HOST:PORT`` or ``https://HOST:PORT`` for TCP, or ``None`` for the
    scheduler this job finds by default (:func:`resolve_server`:
    ``TENSILE_SERVER``, else the socket of ``device``'s GPU in
    ``gpus.json``, else the default socket). ``device``: the job's device
    (``"cuda:1"``, an ordinal, a ``torch.device``; default 0), which picks
    its GPU's scheduler. ``timeout_s`` bounds every unary call (plan
    streams are open-ended). ``tls_ca``, ``tls_cert``, ``tls_key`` (else
    ``TENSILE_TLS_CA``, ``TENSILE_TLS_CERT``, ``TENSILE_TLS_KEY``): TLS to
    a TCP scheduler, by :func:`tls_credentials`' rule.
    """

    def __init__(
        self,
        address: str | os.PathLike[str] | None = None,
        timeout_s: float = 60.0,
        *,
        device: Any = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        resolved = resolve_server(address, device)
        credentials = tls_credentials(resolved, ca=tls_ca, cert=tls_cert, key=tls_key)
        self.target = target_of(resolved)
        self.tls = credentials is not None
        self.timeout_s = timeout_s
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if self.target.startswith("unix:"):
            # gRPC core sends the socket path as the HTTP/2 :authority, which
            # the scheduler's HTTP/2 stack rejects as malformed (RST_STREAM,
            # PROTOCOL_ERROR); any host name does.
            options.append(("grpc.default_authority", "localhost"))
        if credentials is None:
            self._channel = grpc.insecure_channel(self.target, options=options)
        else:
            self._channel = grpc.secure_channel(self.target, credentials, options=options)
        self._stub = pb_grpc.MemorySchedulerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise _error(method, e) from None

    def register(
        self,
        graph: str | os.PathLike[str] | Mapping[str, Any] | pb.Graph,
        name: str = "",
        *,
        op_latency_s: Sequence[float] = (),
        priority: int = 0,
        max_swap_rate: float = 0.0,
        allow_recompute: bool | None = None,
        base_bytes: int = 0,
    ) -> Job:
        """Registers a job with its graph; the first plan arrives on :meth:`plans`."""
        g = graph_to_proto(graph)
        settings = pb.JobSettings(max_swap_rate=max_swap_rate, priority=priority, base_bytes=base_bytes)
        if allow_recompute is not None:
            settings.allow_recompute = allow_recompute
        request = pb.RegisterJobRequest(name=name or g.name, graph=g, settings=settings, op_latency_s=list(op_latency_s))
        r = self._call("RegisterJob", request)
        return Job(id=r.job_id, token=r.token, state=r.state, reason=r.reason, lease_s=r.lease_s)

    def plans(self, job: Job, after_version: int = 0, timeout_s: float | None = None) -> Iterator[pb.PlanUpdate]:
        """The job's plans: the newest at once, then each new version as it
        is made. Ends when the job is unregistered or the scheduler stops;
        with ``timeout_s``, the stream ends with DEADLINE_EXCEEDED after that
        long."""
        request = pb.SubscribePlansRequest(job_id=job.id, token=job.token, after_version=after_version)
        stream = self._stub.SubscribePlans(request, timeout=timeout_s)
        try:
            yield from stream
        except grpc.RpcError as e:
            raise _error("SubscribePlans", e) from None
        finally:
            stream.cancel()

    def plan_stream(self, job: Job, after_version: int = 0) -> Any:
        """The job's plan stream as gRPC's call object: iterate it for
        ``PlanUpdate`` messages (errors raise ``grpc.RpcError``) and call its
        ``cancel()`` from any thread to end it (what a background reader
        needs, which :meth:`plans` cannot give)."""
        request = pb.SubscribePlansRequest(job_id=job.id, token=job.token, after_version=after_version)
        return self._stub.SubscribePlans(request)

    def report(
        self,
        job: Job,
        iteration: int,
        plan_version: int,
        op_latency_s: Sequence[float],
        *,
        stall_s: float = 0.0,
        late_prefetches: Sequence[int] = (),
        passive_swaps: int = 0,
        peak_bytes: int = 0,
        base_bytes: int = 0,
    ) -> pb.ReportLatenciesResponse:
        """One iteration's measured op latencies (seconds, one per op);
        ``base_bytes``: the device bytes the process holds outside the job's
        storages, as measured (0: not measured), which the scheduler plans
        with when it differs materially from the job's base."""
        request = pb.ReportLatenciesRequest(
            job_id=job.id,
            token=job.token,
            iteration=iteration,
            plan_version=plan_version,
            op_latency_s=list(op_latency_s),
            stall_s=stall_s,
            late_prefetches=list(late_prefetches),
            passive_swaps=passive_swaps,
            peak_bytes=peak_bytes,
            base_bytes=base_bytes,
        )
        return self._call("ReportLatencies", request)

    def heartbeat(self, job: Job) -> pb.HeartbeatResponse:
        """Renews the job's lease without a report."""
        return self._call("Heartbeat", pb.HeartbeatRequest(job_id=job.id, token=job.token))

    def unregister(self, job: Job) -> None:
        self._call("UnregisterJob", pb.UnregisterJobRequest(job_id=job.id, token=job.token))

    def status(self, job_id: int = 0) -> pb.GetStatusResponse:
        """Jobs, their states and plans, and the memory picture (one job when ``job_id`` is set)."""
        return self._call("GetStatus", pb.GetStatusRequest(job_id=job_id))

    def set_budget(self, budget_bytes: int, admin_token: str = "") -> pb.SetMemoryBudgetResponse:
        """Changes the memory budget shared by all jobs (the admin token when the scheduler has one)."""
        return self._call("SetMemoryBudget", pb.SetMemoryBudgetRequest(budget_bytes=budget_bytes, admin_token=admin_token))

    def plan_graph(
        self,
        graph: str | os.PathLike[str] | Mapping[str, Any] | pb.Graph,
        *,
        budget_bytes: int = 0,
        device: str = "",
        op_latency_s: Sequence[float] = (),
        allow_recompute: bool | None = None,
    ) -> pb.PlanGraphResponse:
        """Plans one graph offline, touching no registered job."""
        settings = pb.JobSettings()
        if allow_recompute is not None:
            settings.allow_recompute = allow_recompute
        request = pb.PlanGraphRequest(
            graph=graph_to_proto(graph),
            settings=settings,
            op_latency_s=list(op_latency_s),
            device=pb.DeviceProfile(name=device),
            budget_bytes=budget_bytes,
        )
        return self._call("PlanGraph", request)


def _error(method: str, e: grpc.RpcError) -> SchedulerError:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    return SchedulerError(method, code, details or "")
