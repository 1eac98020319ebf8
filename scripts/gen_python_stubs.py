#!/usr/bin/env python3
"""Generates the Python gRPC stubs of the one contract, proto/tensile/v1/tensile.proto.

The messages (``tensile_pb2``), the client/server classes (``tensile_pb2_grpc``)
and their type stubs (``.pyi``, by mypy-protobuf) land in
``clients/python/src/tensile/v1/``: the proto package ``tensile.v1`` is the
Python package ``tensile.v1``, so the generated imports resolve inside our own
package. The output depends only on the proto and on the pinned grpcio-tools
and mypy-protobuf (scripts/setup.sh); ``tests/python/test_stubs.py`` fails when
the committed stubs drift from the proto.

    .venv/bin/python scripts/gen_python_stubs.py          # regenerate in place
    .venv/bin/python scripts/gen_python_stubs.py --check  # exit 1 on drift
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO = "tensile/v1/tensile.proto"
PACKAGE_DIR = ROOT / "clients/python/src/tensile/v1"
GENERATED = ("tensile_pb2.py", "tensile_pb2.pyi", "tensile_pb2_grpc.py", "tensile_pb2_grpc.pyi")
INIT = '"""Generated gRPC stubs of tensile.v1 (scripts/gen_python_stubs.py); do not edit."""\n'


def generate(out: Path) -> None:
    """Writes the generated package (``__init__.py`` and the stubs) into ``out``."""
    from grpc_tools import protoc  # a dev-time dependency, pinned by scripts/setup.sh

    # protoc-gen-mypy and protoc-gen-mypy_grpc are console scripts beside this Python.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            str(PROTO_ROOT / PROTO),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"gen_python_stubs: protoc failed on {PROTO}")
        out.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / "tensile/v1" / name, out / name)
    (out / "__init__.py").write_text(INIT)


def drift(out: Path) -> list[str]:
    """Files of ``out`` that differ from a fresh generation (missing ones included)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "v1"
        generate(fresh)
        names = ("__init__.py", *GENERATED)
        return [n for n in names if not (out / n).exists() or not filecmp.cmp(fresh / n, out / n, shallow=False)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs drift from the proto")
    args = parser.parse_args()
    if args.check:
        stale = drift(PACKAGE_DIR)
        if stale:
            print(f"stale Python stubs in {PACKAGE_DIR}: {', '.join(stale)}; run scripts/gen_python_stubs.py")
            return 1
        print("Python stubs match the proto")
        return 0
    generate(PACKAGE_DIR)
    print(f"wrote {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
