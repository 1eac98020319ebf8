"""The generated Python stubs (clients/python/src/tensile/v1) match the one proto.

Regenerates them from proto/tensile/v1/tensile.proto with the pinned
grpcio-tools and mypy-protobuf into a temporary folder and compares byte for
byte: a change to the proto without `scripts/gen_python_stubs.py` fails here.
"""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_python_stubs", ROOT / "scripts" / "gen_python_stubs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto():
    gen = load_generator()
    stale = gen.drift(gen.PACKAGE_DIR)
    assert stale == [], f"stale stubs {stale}: run scripts/gen_python_stubs.py"


def test_drift_is_detected(tmp_path):
    gen = load_generator()
    out = tmp_path / "v1"
    gen.generate(out)
    assert gen.drift(out) == []
    grpc_stub = out / "tensile_pb2_grpc.py"
    grpc_stub.write_text(grpc_stub.read_text().replace("SubscribePlans", "SubscribePlanz", 1))
    (out / "tensile_pb2.pyi").unlink()
    assert gen.drift(out) == ["tensile_pb2.pyi", "tensile_pb2_grpc.py"]


def test_every_rpc_of_the_proto_is_in_the_stub():
    from tensile.v1 import tensile_pb2, tensile_pb2_grpc

    service = tensile_pb2.DESCRIPTOR.services_by_name["MemoryScheduler"]
    names = {m.name for m in service.methods}
    assert {"RegisterJob", "SubscribePlans", "ReportLatencies", "UnregisterJob", "GetStatus", "SetMemoryBudget", "PlanGraph"} <= names
    stub_methods = set(vars(tensile_pb2_grpc.MemorySchedulerServicer))
    assert names <= stub_methods
