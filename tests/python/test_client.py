"""The Python client (`tensile.Client`): graph conversion, addresses and plan
files offline; the live calls against the real scheduler binary are in
tests/python/test_client_live.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tensile import client as tc
from tensile.trace import InputSpec, trace_training_step
from tensile.v1 import tensile_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))


@pytest.fixture(scope="module")
def zoo_graph(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("zoo") / "resnet50.json"
    out = subprocess.run([TENSILECTL, "graph", "export", "--model", "resnet50", "--batch", "2", "-o", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return path


def test_a_graph_file_becomes_the_same_message_as_its_dict(zoo_graph):
    doc = json.loads(zoo_graph.read_text())
    from_file = tc.graph_to_proto(zoo_graph)
    assert from_file == tc.graph_to_proto(doc)
    assert len(from_file.tensors) == len(doc["tensors"]) and len(from_file.ops) == len(doc["ops"])
    # Field by field on one op with attributes and one with an alias.
    for o, m in zip(doc["ops"], from_file.ops):
        assert (m.id, m.name, m.op_type, list(m.inputs), list(m.outputs)) == (o["id"], o["name"], o["type"], o["inputs"], o["outputs"])
        assert len(m.aliases) == len(o.get("aliases", []))
        for key, value in o.get("attrs", {}).items():
            got = m.attrs[key]
            which = got.WhichOneof("value")
            plain = {"int": got.int, "float": got.float, "bool": got.bool, "str": got.str}.get(which)
            if which == "ints":
                plain = list(got.ints.values)
            elif which == "floats":
                plain = list(got.floats.values)
            assert plain == value, (o["name"], key)
    t = from_file.tensors[0]
    assert (t.name, list(t.shape), t.bytes) == (doc["tensors"][0]["name"], doc["tensors"][0]["shape"], doc["tensors"][0]["bytes"])


def test_ops_on_the_host_keep_their_placement(tmp_path):
    path = tmp_path / "resnet50-host.json"
    out = subprocess.run(
        [TENSILECTL, "graph", "export", "--model", "resnet50", "--batch", "1", "--optimizer", "adam-on-host", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(path.read_text())
    msg = tc.graph_to_proto(doc)
    on_host = [o.get("placement") == "host" for o in doc["ops"]]
    assert any(on_host)
    assert [m.placement == pb.PLACEMENT_HOST for m in msg.ops] == on_host
    doc["ops"][0]["placement"] = "gpu"
    with pytest.raises(ValueError, match="op 0 .* placement: unknown value 'gpu'"):
        tc.graph_to_proto(doc)


def test_a_traced_model_converts():
    graph = trace_training_step(lambda: torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), torch.optim.Adam, [InputSpec("input", (2, 8))], name="mlp")
    msg = tc.graph_to_proto(graph)
    assert msg.name == "mlp"
    kinds = {pb.TensorKind.Name(t.kind) for t in msg.tensors}
    assert {"TENSOR_KIND_INPUT", "TENSOR_KIND_PARAMETER", "TENSOR_KIND_OPTIMIZER_STATE"} <= kinds


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="tensile-graph/v0"), "format is 'tensile-graph/v0'"),
        (lambda d: d["tensors"][3].update(dtype="f8"), "tensor 3 dtype: unknown value 'f8'"),
        (lambda d: d["tensors"][5].update(kind="weights"), "tensor 5 kind: unknown value 'weights'"),
        (lambda d: d["ops"][2].update(phase="sideways"), "op 2 ("),
        (lambda d: d["ops"][0].setdefault("attrs", {}).update(bad={"x": 1}), "attribute 'bad': unsupported value"),
    ],
)
def test_a_malformed_graph_names_what_is_wrong(zoo_graph, mutate, message):
    doc = json.loads(zoo_graph.read_text())
    mutate(doc)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        tc.graph_to_proto(doc)


def test_bad_graph_arguments(tmp_path):
    with pytest.raises(ValueError, match="invalid JSON"):
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        tc.graph_to_proto(bad)
    with pytest.raises(ValueError, match="No such file"):
        tc.graph_to_proto(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="not int"):
        tc.graph_to_proto(42)


def test_addresses(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert tc.target_of(None) == "unix:/run/user/7/tensile/scheduler.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert tc.target_of("") == f"unix:/tmp/tensile-{os.getuid()}/scheduler.sock"
    assert tc.target_of("unix:///tmp/s.sock") == "unix:/tmp/s.sock"
    assert tc.target_of("unix:/tmp/s.sock") == "unix:/tmp/s.sock"
    assert tc.target_of("/tmp/s.sock") == "unix:/tmp/s.sock"
    assert tc.target_of("127.0.0.1:50051") == "127.0.0.1:50051"
    assert tc.target_of("http://localhost:5") == "localhost:5"


def test_a_wire_plan_becomes_a_plan_file(zoo_graph, tmp_path):
    """Written by the Rust plan format (tensile._core.plan_from_wire), checked
    as a pushed plan is."""
    doc = json.loads(zoo_graph.read_text())
    param = next(t["id"] for t in doc["tensors"] if t["kind"] == "parameter")
    plan = pb.Plan(job_id=3, version=2, start_on_host=[param])
    plan.events.append(pb.PlanEvent(kind=pb.EVENT_KIND_SWAP_OUT, tensor=param, trigger_op=4, delay_s=2.5e-6, trigger=pb.TRIGGER_KIND_AFTER))
    plan.events.append(pb.PlanEvent(kind=pb.EVENT_KIND_SWAP_IN, tensor=param, trigger=pb.TRIGGER_KIND_ITERATION_START, delay_s=1e-3))
    plan.prediction.planned_peak_bytes = 123
    diag = pb.Diagnostic(kind=pb.DIAGNOSTIC_KIND_OVER_BUDGET, message="over", tensor=param)
    out = tc.plan_to_file(plan, doc, [diag])
    name = doc["tensors"][param]["name"]
    assert out["format"] == "tensile-plan/v1" and out["graph"] == doc["name"] and out["version"] == 2
    assert out["start_on_host"] == [{"tensor": param, "tensor_name": name}]
    first, second = out["events"]
    assert first == {"kind": "swap_out", "tensor": param, "tensor_name": name, "trigger": "after",
                     "trigger_op": 4, "trigger_op_name": doc["ops"][4]["name"], "delay_ns": 2500}
    assert second["trigger"] == "iteration_start" and "trigger_op" not in second and second["delay_ns"] == 1_000_000
    assert out["prediction"]["planned_peak_bytes"] == 123 and out["prediction"]["swap_outs"] == 1
    assert out["diagnostics"][0]["kind"] == "over_budget" and out["diagnostics"][0]["tensor"] == param
    # A job that runs free has neither a gate nor a pace in its file.
    assert "gate" not in out and "op_start_ns" not in out["prediction"]
    plan.events.append(pb.PlanEvent(kind=pb.EVENT_KIND_RELEASE, tensor=10**6))
    with pytest.raises(ValueError, match="plan event 2: tensor 1000000 is not in the graph"):
        tc.plan_to_file(plan, doc)
    # The plan file's own rules too: an activation does not start on the host.
    activation = next(t["id"] for t in doc["tensors"] if t["kind"] == "activation")
    with pytest.raises(ValueError, match=f"start_on_host 0: tensor {activation} .* is not persistent"):
        tc.plan_to_file(pb.Plan(version=1, start_on_host=[activation]), doc)


def test_a_coordinated_plans_gate_and_pace_reach_the_plan_file(zoo_graph):
    doc = json.loads(zoo_graph.read_text())
    n = len(doc["ops"])
    plan = pb.Plan(job_id=3, version=4, gate=pb.IterationGate(period_ns=200_000_000, phase_ns=70_000_000, epoch_ns=123_456))
    plan.prediction.op_start_s.extend(k * 2.5e-6 for k in range(n))  # 2.5 us per op
    out = tc.plan_to_file(plan, doc)
    assert out["gate"] == {"period_ns": 200_000_000, "phase_ns": 70_000_000, "epoch_ns": 123_456}
    assert out["prediction"]["op_start_ns"] == [k * 2500 for k in range(n)]
    # Refused as a pushed plan is (plan_from_proto), naming what is wrong.
    for gate, message in [
        (pb.IterationGate(period_ns=0, phase_ns=0, epoch_ns=1), "plan gate: gate period 0 ns is not in 1 ns to 1 hour"),
        (pb.IterationGate(period_ns=100, phase_ns=100, epoch_ns=1), "plan gate: gate phase 100 ns is not less than its period 100 ns"),
    ]:
        bad = pb.Plan(version=4, gate=gate)
        with pytest.raises(ValueError, match=message):
            tc.plan_to_file(bad, doc)
    for starts, message in [
        ([0.0, 1e-6], f"plan prediction: 2 op starts for a graph of {n} ops"),
        ([0.0, 2e-6, 1e-6] + [1e-6] * (n - 3), "plan prediction: op 2 starts before op 1"),
        ([0.0, float("nan")] + [1.0] * (n - 2), "plan prediction: op 1 starts at NaN s, not in 0 s to 1 hour"),
        ([-1e-9] + [0.0] * (n - 1), "plan prediction: op 0 starts at -0.000000001 s, not in 0 s to 1 hour"),
    ]:
        bad = pb.Plan(version=4)
        bad.prediction.op_start_s.extend(starts)
        with pytest.raises(ValueError, match=message):
            tc.plan_to_file(bad, doc)


RESOLUTION = json.loads((ROOT / "proto" / "tests" / "server-resolution.json").read_text())


@pytest.mark.parametrize("case", RESOLUTION["cases"], ids=[c["name"] for c in RESOLUTION["cases"]])
def test_the_server_is_found_as_the_shared_table_says(case, tmp_path):
    """The table the Rust rule is tested on too (proto/src/endpoint/tests.rs)."""

    def fill(text: str) -> str:
        return text.replace("{dir}", str(tmp_path))

    for name, content in case["files"].items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(RESOLUTION["gpus_json"]) if content == "table" else content)
    environ = {k: fill(v) for k, v in case["env"].items()}
    ordinal = case.get("ordinal", 0)
    expect = case["expect"]
    if "target" in expect:
        assert tc.resolve_server(case.get("explicit"), ordinal, environ) == fill(expect["target"])
    else:
        with pytest.raises(tc.ResolveError) as e:
            tc.resolve_server(case.get("explicit"), ordinal, environ)
        for part in expect["error"]:
            assert fill(part) in str(e.value)


def test_devices_give_their_ordinal():
    assert tc.device_ordinal("cuda:3") == 3
    assert tc.device_ordinal(torch.device("cuda", 2)) == 2
    assert tc.device_ordinal(torch.device("cpu")) == 0
    assert tc.device_ordinal("cuda") == tc.device_ordinal(None) == tc.device_ordinal("cpu") == 0
    assert tc.device_ordinal(1) == 1
    with pytest.raises(ValueError, match="negative"):
        tc.device_ordinal(-1)


def test_a_client_of_a_gpu_targets_its_socket(tmp_path, monkeypatch):
    (tmp_path / "gpus.json").write_text(json.dumps(RESOLUTION["gpus_json"]))
    monkeypatch.setenv("TENSILE_SOCKET_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.delenv("TENSILE_SERVER", raising=False)
    with tc.Client(device="cuda:1") as client:
        assert client.target == f"unix:{tmp_path}/gpu1.sock"
    with tc.Client(device=torch.device("cuda", 0)) as client:
        assert client.target == f"unix:{tmp_path}/gpu3.sock"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")
    with pytest.raises(tc.ResolveError, match="GPU-ffff"):
        tc.Client()
