#!/usr/bin/env bash
# Sets up everything the build and the tests need, idempotently:
#   .venv/  Python 3.11 with torch (the libtorch that tch links), torchvision,
#           onnxruntime (the shared library ort loads), onnx, grpcio-tools,
#           grpcio-reflection (a stock client of the reflection test),
#           transformers and timm (the hook's model suite), ray,
#           kubernetes-validate and maturin, and the project's
#           Python package;
#   .cargo/config.toml already points LIBTORCH and ORT_DYLIB_PATH at .venv/.
# The package is installed editable by maturin, with its Rust core
# (tensile._core, clients/python-core) built in place by cargo's dev
# profile. Two stamp files record what was installed: the pins, and the
# Rust sources the core was last built from; a second run with the same
# pins and sources returns in well under a second, and one after a change
# of the Rust sources rebuilds the core in place (`maturin develop
# --skip-install`: seconds when the change is elsewhere).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv="$root/.venv"
python="${PYTHON:-python3}"

# The pins. torch 2.11.0 is exactly what tch 0.24 expects; torchvision must
# match torch. Change them together with the tch version in Cargo.toml.
pins=(
  "torch==2.11.0"
  "torchvision==0.26.0"
  "onnxruntime==1.31.1"
  "onnx==1.23.2"
  "grpcio-tools==1.76.0"
  # A stock reflection client for tests/python/test_reflection.py.
  "grpcio-reflection==1.76.0"
  "mypy-protobuf==5.1.0"
  "pytest==8.4.2"
  # transformers 5.24.0 needs safetensors >= 0.8.0 (was 0.7.0).
  "safetensors==0.8.0"
  # Test dependencies of the hook's model suite (tests/python/test_models_hf.py,
  # scripts/trace_hf.py): small configs with random weights, nothing downloaded.
  "transformers==5.24.0"
  "timm==1.0.31"
  # Clusters (tensile.ray and its tests; Ray Train's prepare_model under the
  # hook, tests/python/test_ray_train.py), the deployment manifests' offline
  # validation, and the wheel that carries the scheduler binary.
  "ray[train]==2.60.0"
  "kubernetes-validate==1.37.0"
  "maturin==1.16.0"
  # deploy/Dockerfile's offline checks (tests/python/test_deploy.py) parse it
  # with BuildKit's own parser, which this package wraps.
  "dockerfile==3.4.0"
)
stamp="$venv/.tensile-setup"
want="$(printf '%s\n' "${pins[@]}"; sha256sum clients/python/pyproject.toml 2>/dev/null || true)"
core_stamp="$venv/.tensile-core"

# The Rust core's sources, as one hash: every Rust, manifest and proto file
# of the workspace (git's list, untracked files included; outside a git
# checkout, find's), the lock file, and the device profiles the crates
# embed.
rust_sources() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard -- \
      '*.rs' '*.toml' '*.proto' Cargo.lock 'latency-model/profiles/*' 'latency-model/models/cpu/roofline.json'
  else
    find . \( -path ./target -o -path ./.venv -o -path ./.git \) -prune -o -type f \
      \( -name '*.rs' -o -name '*.toml' -o -name '*.proto' -o -name Cargo.lock \
      -o -path './latency-model/profiles/*' -o -path ./latency-model/models/cpu/roofline.json \) -print0
  fi | sort -z | xargs -0 sha256sum | sha256sum
}

# Builds tensile._core in place, next to the package's sources.
build_core() {
  echo "setup: building the Rust core tensile._core (maturin develop)"
  (cd clients/python && PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --skip-install --quiet >&2)
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then
  sources="$(rust_sources)"
  if [[ ! -f "$core_stamp" || "$(cat "$core_stamp")" != "$sources" ]]; then
    build_core
    printf '%s' "$sources" >"$core_stamp"
  fi
  echo "setup: .venv is up to date"
  exit 0
fi

# .cargo/config.toml names .venv/lib/python3.11/...: another Python would
# install fine and then fail the Rust build with "torch/torch.h: No such file".
need_311() {
  "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "setup: $1 is not Python 3.11, which .cargo/config.toml expects (set PYTHON=python3.11)" >&2
    exit 1
  }
}

if [[ ! -x "$venv/bin/python" ]]; then
  need_311 "$python"
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
need_311 "$venv/bin/python"

echo "setup: installing ${pins[*]} (the first time takes a few minutes: torch is large)"
"$venv/bin/python" -m pip install --quiet --progress-bar off "${pins[@]}"

if [[ -f clients/python/pyproject.toml ]]; then
  echo "setup: installing the tensile Python package (editable) and building its Rust core"
  sources="$(rust_sources)"
  # maturin is the build backend, from .venv (no build isolation: no
  # download), building with the workspace's dev profile.
  PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
    "$venv/bin/python" -m pip install --quiet --progress-bar off --no-deps --no-build-isolation -e clients/python
  printf '%s' "$sources" >"$core_stamp"
fi

# Sanity: the libraries the Rust build links or loads are where .cargo/config.toml says.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
test -f "$site/torch/lib/libtorch_cpu.so" || { echo "setup: libtorch_cpu.so missing under $site/torch/lib" >&2; exit 1; }
ls "$site"/onnxruntime/capi/libonnxruntime.so.* >/dev/null 2>&1 || { echo "setup: libonnxruntime.so missing under $site/onnxruntime/capi" >&2; exit 1; }

printf '%s' "$want" >"$stamp"
echo "setup: done"
