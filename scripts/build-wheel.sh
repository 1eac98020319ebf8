#!/usr/bin/env bash
# Builds the `tensile` wheel (packaging/wheel: the Python package, its Rust
# core tensile._core and the tensile-scheduler binary, by maturin) and
# prints its path.
#
#   scripts/build-wheel.sh [--release|--debug] [-o DIR]
#
# --release (the default) builds the binary and the extension with the
# release profile, --debug with the dev profile (quicker when target/debug
# is built; the tests use it). The wheel goes to DIR (default
# target/wheels); an older wheel of the same name there is replaced. Cargo
# builds in the workspace's target folder, reusing what is built there.
# The binary rides in packaging/wheel/data/scripts for the time of the
# build (one build at a time).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

profile=(--release)
target_dir=release
out="$root/target/wheels"
usage="usage: scripts/build-wheel.sh [--release|--debug] [-o DIR]"
while (($#)); do
  case "$1" in
    --release) profile=(--release); target_dir=release ;;
    --debug) profile=(--profile dev); target_dir=debug ;;
    -o)
      [[ $# -ge 2 && -n "$2" ]] || { echo "build-wheel: -o needs a folder. $usage" >&2; exit 2; }
      out="$2"
      shift
      ;;
    -h | --help) echo "$usage"; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1'. $usage" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# maturin comes from .venv (scripts/setup.sh pins it); its messages go to stderr.
"$root/scripts/setup.sh" >&2
maturin="$root/.venv/bin/maturin"

# A folder of its own for this build, so that the one wheel in it is this build's.
staging="$(mktemp -d "$out/.build-XXXXXX")"
binary="$root/packaging/wheel/data/scripts/tensile-scheduler"
trap 'rm -rf "$staging" "$binary"' EXIT

# The scheduler binary, into the wheel's scripts (maturin builds one crate:
# the extension's).
cargo build --locked "${profile[@]}" -p tensile-scheduler --manifest-path "$root/Cargo.toml" >&2
install -m 0755 "$root/target/$target_dir/tensile-scheduler" "$binary"

# From packaging/wheel: maturin reads the pyproject.toml there, and cargo
# the workspace's .cargo/config.toml above it.
(cd "$root/packaging/wheel" && PATH="$root/.venv/bin:$PATH" "$maturin" build "${profile[@]}" --out "$staging" >&2)

wheels=("$staging"/*.whl)
[[ ${#wheels[@]} == 1 && -f "${wheels[0]}" ]] || { echo "build-wheel: maturin left no single wheel in $staging" >&2; exit 1; }
name="$(basename "${wheels[0]}")"
mv -f "${wheels[0]}" "$out/$name"
echo "$out/$name"
