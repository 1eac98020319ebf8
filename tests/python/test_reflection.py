"""gRPC server reflection of the real `tensile-scheduler` binary, asked by a
stock client (grpcio-reflection, scripts/setup.sh's pin): v1alpha through
its descriptor database, as grpcurl before 1.9 and most tools ask, and v1
through the same messages on v1's method (the two versions' messages are
the same on the wire)."""

import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest

reflection_pb2 = pytest.importorskip(
    "grpc_reflection.v1alpha.reflection_pb2", reason="grpcio-reflection is not installed (scripts/setup.sh pins it)"
)
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
SERVICES = {
    "tensile.v1.MemoryScheduler",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


@pytest.fixture(scope="module")
def channel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reflection")
    sock = folder / "scheduler.sock"
    log = open(folder / "scheduler.log", "w")
    proc = subprocess.Popen(
        [SCHEDULER, "--listen", f"unix:{sock}", "--state", "none", "--latency-models", "roofline"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tensile-scheduler did not start: {(folder / 'scheduler.log').read_text()}")
        time.sleep(0.05)
    # The authority a Unix socket's path would give is not a valid HTTP/2
    # authority; the scheduler's server refuses it (tensile.client does the same).
    with grpc.insecure_channel(f"unix:{sock}", options=[("grpc.default_authority", "localhost")]) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch
    proc.terminate()
    proc.wait(timeout=15)
    log.close()


def test_v1alpha_lists_the_services_and_describes_the_scheduler(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    assert SERVICES <= set(db.get_services())
    # The descriptor of a method's file comes back too: a client can call it.
    f = db.FindFileContainingSymbol("tensile.v1.MemoryScheduler")
    assert f.package == "tensile.v1"
    assert "GetStatus" in [m.name for s in f.service for m in s.method]


def test_v1_lists_the_same_services(channel):
    info = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (answer,) = list(info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
    assert SERVICES <= {s.name for s in answer.list_services_response.service}
