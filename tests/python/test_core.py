"""``tensile._core``, the Rust crates under the Python package.

* The planner in the process gives the plan ``tensilectl plan`` writes for
  the same graph, profile and budget (with and without recomputation, on a
  roofline profile and on ``cpu``'s learned models), releases the GIL while
  it plans, and says what is wrong as a Python exception with the Rust
  message.
* The plan format reads back what it writes and names the item at fault.
* The endpoint rule is the one ``tensile-scheduler endpoint`` prints.
* The module links no libtorch (its shared object's dependencies).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tensile import _core

ROOT = Path(__file__).resolve().parents[2]
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))


def tensilectl(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([TENSILECTL, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> tuple[Path, dict]:
    """ResNet-50 at batch 2 from the zoo, as a graph file and its dict."""
    path = tmp_path_factory.mktemp("zoo") / "resnet50.json"
    tensilectl("graph", "export", "--model", "resnet50", "--batch", "2", "-o", str(path))
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    "device, budget_mb, recompute",
    [("a6000", None, True), ("a6000", 150, True), ("a6000", 150, False), ("cpu", None, True)],
)
def test_the_plan_is_tensilectls_plan(resnet, tmp_path, device, budget_mb, recompute):
    path, graph = resnet
    out = tmp_path / "plan.json"
    args = ["plan", str(path), "--device", device, "-o", str(out), "--json"]
    if budget_mb is not None:
        args += ["--budget-mb", str(budget_mb)]
    if not recompute:
        args.append("--no-recompute")
    report = json.loads(tensilectl(*args).stdout)
    got = _core.plan(graph, device, budget_bytes=None if budget_mb is None else budget_mb * 10**6, recompute=recompute)
    assert got["plan"] == json.loads(out.read_text())
    for key in ("vanilla_peak_bytes", "planned_peak_bytes", "swap_outs", "recomputed_ops", "lower_bound_bytes", "diagnostics"):
        assert got["report"][key] == report[key], key
    if budget_mb is not None:
        recomputes = [e for e in got["plan"]["events"] if e["kind"] == "recompute"]
        assert bool(recomputes) == recompute, "the budget must make the planner recompute when it may"
    # A graph as JSON text plans the same.
    budget = None if budget_mb is None else budget_mb * 10**6
    assert _core.plan(json.dumps(graph), device, budget_bytes=budget, recompute=recompute)["plan"] == got["plan"]


def test_planning_releases_the_gil(resnet):
    _, graph = resnet
    ticks: list[float] = []
    stop = threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        start = time.monotonic()
        for _ in range(3):
            _core.plan(graph, "a6000", budget_bytes=150 * 10**6)
        end = time.monotonic()
    finally:
        stop.set()
        counter.join()
    middle = [t for t in ticks if start + 0.3 * (end - start) < t < end - 0.3 * (end - start)]
    assert end - start > 0.05, "planning took too little time to tell"
    assert len(middle) > 5, f"another thread ran {len(middle)} times while the planner ran {end - start:.2f} s"


@pytest.mark.parametrize(
    "call, kind, message",
    [
        (lambda g: _core.plan(g, "tpu"), _core.PlanningError, 'unknown device "tpu": not a built-in profile (a6000, h100, h200, paper, cpu)'),
        (lambda g: _core.plan("{not json", "a6000"), ValueError, "graph: "),
        (lambda g: _core.plan({**g, "ops": g["ops"][:-1] + [{**g["ops"][-1], "inputs": [10**6]}]}, "a6000"), ValueError,
         "tensor 1000000"),
        (lambda g: _core.plan(g, "a6000", budget_bytes=0), ValueError, "budget_bytes must be positive"),
        (lambda g: _core.plan(g, "a6000", stop_at_budget=True), ValueError, "stop_at_budget needs budget_bytes"),
        (lambda g: _core.plan(g, "a6000", budget_bytes=-1), OverflowError, ""),
        (lambda g: _core.plan({"format": "tensile-graph/v1", "x": object()}, "a6000"), ValueError, "graph is not JSON"),
    ],
)
def test_bad_input_is_an_exception_naming_what_is_wrong(resnet, call, kind, message):
    _, graph = resnet
    with pytest.raises(kind) as e:
        call(graph)
    assert message in str(e.value)


def test_the_plan_format_reads_back_what_it_writes_and_names_the_item(resnet):
    _, graph = resnet
    doc = _core.plan(graph, "a6000", budget_bytes=150 * 10**6)["plan"]
    assert _core.read_plan(graph, doc) == doc
    assert _core.read_plan(json.dumps(graph), json.dumps(doc)) == doc
    bad = json.loads(json.dumps(doc))
    bad["events"][3]["tensor_name"] = "not-its-name"
    with pytest.raises(_core.PlanFormatError, match="event 3: tensor .* is .* in the graph, not \"not-its-name\""):
        _core.read_plan(graph, bad)
    with pytest.raises(_core.PlanFormatError, match="the plan is for graph"):
        _core.read_plan(graph, {**doc, "graph": "another"})
    with pytest.raises(ValueError, match="not a tensile.v1.Plan message"):
        _core.plan_from_wire(graph, b"\xff\xff\xff")


def test_the_endpoint_rule_is_the_schedulers(tmp_path):
    table = json.loads((ROOT / "proto" / "tests" / "server-resolution.json").read_text())
    (tmp_path / "gpus.json").write_text(json.dumps(table["gpus_json"]))
    env = {"TENSILE_SOCKET_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "3,1", "PATH": os.environ["PATH"]}
    for device, ordinal in (("cuda:0", 0), ("cuda:1", 1)):
        printed = subprocess.run([SCHEDULER, "endpoint", "--device", device], env=env, capture_output=True, text=True, timeout=30)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout.strip() == _core.resolve_server(None, ordinal, env)
    assert _core.resolve_server(None, 1, env) == f"unix:{tmp_path}/gpu1.sock"
    assert _core.device_ordinal("cuda:3") == 3 and _core.gpu_socket_name(2) == "gpu2.sock"
    assert [g["index"] for g in _core.read_gpus_file(tmp_path)["gpus"]] == [0, 1, 2, 3]
    assert _core.read_gpus_file(tmp_path / "none") is None
    with pytest.raises(_core.ResolveError, match="CUDA_VISIBLE_DEVICES entry \"7\""):
        _core.resolve_server(None, 0, {**env, "CUDA_VISIBLE_DEVICES": "7"})
    assert isinstance(_core.ResolveError("x"), LookupError)


def test_the_module_links_no_libtorch():
    linked = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True, check=True).stdout
    assert "libtorch" not in linked and "libc10" not in linked, linked
    assert "libpython" not in linked, "an extension module leaves the interpreter's symbols to the interpreter"


def test_the_guard_moves_the_storage_used_again_last_first():
    """The executor's rule (tensile_planner::guard) through the binding: 400
    bytes held plus 100 wanted under 300 moves two, the one needed last
    first; nothing moves when it fits; ties go by storage id."""
    candidates = [(1, 100, 10), (2, 100, 50), (3, 100, 30), (4, 100, 2**64 - 1)]
    assert _core.guard_victims(candidates, 400, 100, 300) == [4, 2]
    assert _core.guard_victims(candidates, 100, 100, 300) == []
    assert _core.guard_victims([(7, 10, 5), (3, 10, 5)], 20, 0, 5) == [3, 7]


@pytest.mark.parametrize("bad", [-1, 1.5, float("nan"), True, "912"])
def test_a_base_that_is_not_a_byte_count_is_a_value_error_naming_it(resnet, tmp_path, bad):
    _, graph = resnet
    # No scheduler answers there: the reports queue, and the checks of
    # the binding are what is tested.
    s = _core.Session(graph, f"unix:{tmp_path / 'none.sock'}", "base", max_backoff_s=0.2)
    try:
        ops = len(graph["ops"])
        step = {"iteration": 3, "op_latency_s": [1e-3] * ops}
        # Measured, not measured (None) and absent are all taken.
        for base in ({"base_bytes": 912_000_000}, {"base_bytes": None}, {}):
            assert s.iteration_done({**step, **base}) is None
        with pytest.raises(ValueError, match="measurements' base_bytes is .*, not a whole number of bytes"):
            s.iteration_done({**step, "base_bytes": bad})
        # Even where nothing would be sent (not every op timed).
        with pytest.raises(ValueError, match="base_bytes"):
            s.iteration_done({"iteration": 3, "op_latency_s": [], "base_bytes": bad})
    finally:
        s.finish(5.0)
