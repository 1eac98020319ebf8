"""The deployment files in deploy/: the Dockerfile, the Kubernetes manifests, the Slurm recipe.

Nothing here builds an image, talks to a cluster or starts Slurm (none of
them is available where the tests run). What can be checked offline is:
the Dockerfile is parsed with BuildKit's own parser (the ``dockerfile``
package) and checked against the repository (COPY sources, .dockerignore,
pins, Cargo targets, stage ARGs); the manifests are validated against
Kubernetes 1.30's schemas, strictly (kubernetes-validate, which bundles
them), and checked for what a schema cannot see (the scheduler takes no GPU,
the job mounts the scheduler's socket directory); the systemd unit goes
through ``systemd-analyze verify``; the Slurm TaskProlog runs on fake Slurm
environments; and the scheduler as the deploy files start it (its
``--socket-mode``), the TaskProlog and the Kubernetes probe's command run
against a real scheduler serving two simulated GPUs.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from types import ModuleType
from typing import Any

import dockerfile
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROLOG = DEPLOY / "slurm" / "tensile-taskprolog"
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
WORKER = os.environ.get("TENSILE_WORKER", str(ROOT / "target" / "debug" / "tensile-worker"))
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
# The Kubernetes version the manifests are validated against: one that
# kubernetes-validate bundles (1.25 to 1.37 in 1.37.0) and that clusters run.
K8S_VERSION = "1.30.0"
SOCKET_DIR = "/run/tensile"


# --- helpers -----------------------------------------------------------------


def load_prolog() -> ModuleType:
    """The TaskProlog script as a module (it has no .py suffix: it is installed as is)."""
    loader = importlib.machinery.SourceFileLoader("tensile_taskprolog", str(PROLOG))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run_prolog(env: dict[str, str], direct: bool = False) -> list[str]:
    """Runs the TaskProlog as slurmd would, in exactly ``env`` (and the
    scheduler binary it asks for the endpoint rule); its output lines."""
    cmd = [str(PROLOG)] if direct else [sys.executable, str(PROLOG)]
    env = {"PATH": os.environ["PATH"], "TENSILE_SCHEDULER_BIN": SCHEDULER, **env}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"the TaskProlog failed (it must never fail a task): {out.stderr}"
    assert out.stderr == "", f"slurmd discards a TaskProlog's stderr, so nothing may go there: {out.stderr}"
    return out.stdout.splitlines()


def listen(path: Path) -> socket.socket:
    """A Unix socket listening at ``path`` (a stand-in scheduler socket)."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen()
    return s


def write_gpus_json(d: Path, budgets: dict[int, int]) -> None:
    """A gpus.json as the scheduler writes it, GPU index -> budget in bytes."""
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000",
            "name": "NVIDIA A100-SXM4-80GB",
            "memory_bytes": 85_899_345_920,
            "budget_bytes": b,
            "socket": f"gpu{i}.sock",
        }
        for i, b in budgets.items()
    ]
    (d / "gpus.json").write_text(json.dumps({"gpus": gpus}, indent=2))


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every resource of deploy/k8s/, with its file."""
    out = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        out.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    return out


def resource(kind: str, name: str) -> dict[str, Any]:
    """The manifest resource of that kind and name."""
    hits = [doc for _, doc in manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(hits)}"
    return hits[0]


def dockerfile_commands() -> tuple[Any, ...]:
    """deploy/Dockerfile, parsed by BuildKit's parser."""
    return dockerfile.parse_file(str(DEPLOY / "Dockerfile"))


def setup_pins() -> dict[str, str]:
    """The ``name==version`` pins of scripts/setup.sh."""
    text = (ROOT / "scripts" / "setup.sh").read_text()
    return dict(re.findall(r'^\s*"([A-Za-z0-9_.-]+)==([^"]+)"', text, flags=re.M))


def dockerignore_patterns() -> list[str]:
    """The patterns of .dockerignore (Docker anchors them at the context's root)."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip().rstrip("/") for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def pattern_matches(pattern: str, path: str) -> bool:
    """Docker's .dockerignore match of one pattern against a context path (``**`` = any depth)."""
    pat, parts = pattern.split("/"), path.split("/")

    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(parts)
        if pat[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(parts) + 1))
        return j < len(parts) and fnmatchcase(parts[j], pat[i]) and match(i + 1, j + 1)

    return match(0, 0)


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (or a folder above it) out of the build context."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(pattern_matches(p, prefix) for p in dockerignore_patterns() for prefix in prefixes)


def cargo_bins() -> dict[str, set[str]]:
    """The workspace's packages and their binary targets (``cargo metadata``, offline)."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    meta = json.loads(out.stdout)
    return {p["name"]: {t["name"] for t in p["targets"] if "bin" in t["kind"]} for p in meta["packages"]}


def flags_of(args: list[str]) -> set[str]:
    """The long flags (``--name``, ``--name=value``) in an argument list."""
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def help_text(*cmd: str) -> str:
    """A binary's ``--help`` output."""
    out = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{cmd} --help: {out.stderr}"
    return out.stdout


# --- the Dockerfile ----------------------------------------------------------

INSTRUCTIONS = {
    "FROM", "ARG", "RUN", "COPY", "ADD", "ENV", "WORKDIR", "CMD", "ENTRYPOINT", "LABEL",
    "USER", "EXPOSE", "VOLUME", "SHELL", "STOPSIGNAL", "HEALTHCHECK", "ONBUILD",
}  # fmt: skip


def check_stages(cmds: tuple[Any, ...]) -> None:
    """What a build would fail on first, and BuildKit's parser lets through
    (it takes any word for an instruction, any number of arguments)."""
    first_from = next(c.start_line for c in cmds if c.cmd == "FROM")
    global_args = {c.value[0].split("=", 1)[0] for c in cmds if c.cmd == "ARG" and c.start_line < first_from}
    stages: list[str] = []
    declared: set[str] = set()
    for c in cmds:
        assert c.cmd in INSTRUCTIONS, f"line {c.start_line}: unknown instruction {c.cmd}"
        if c.cmd == "FROM":
            assert len(c.value) == 3 and c.value[1].upper() == "AS", f"line {c.start_line}: name every stage (FROM image AS name)"
            stages.append(c.value[2])
            declared = {"PATH", "HOME"}  # what every base image has
            continue
        if not stages:
            assert c.cmd == "ARG", f"line {c.start_line}: only ARG may come before the first FROM"
            continue
        if c.cmd == "ARG":
            name = c.value[0].split("=", 1)[0]
            assert "=" in c.value[0] or name in global_args, f"line {c.start_line}: ARG {name} has no value and no global one"
            declared.add(name)
        elif c.cmd == "ENV":
            assert len(c.value) % 2 == 0, f"line {c.start_line}: ENV takes NAME value pairs"
            for ref in re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", " ".join(c.value[1::2])):
                assert ref in declared, f"line {c.start_line}: ${ref} is not declared in stage {stages[-1]}"
            declared.update(c.value[0::2])
        elif c.cmd == "COPY":
            assert len(c.value) >= 2, f"line {c.start_line}: COPY needs a source and a destination"
            for flag in c.flags:
                if flag.startswith("--from="):
                    assert flag.split("=", 1)[1] in stages[:-1], f"line {c.start_line}: {flag} names no earlier stage"
        elif c.cmd == "RUN":
            # Upper-case names are the build's ARGs and ENVs (lower-case ones
            # are the commands' own shell variables): a global ARG not
            # declared again in a stage is empty there.
            for ref in re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", " ".join(c.value)):
                assert ref in declared, f"line {c.start_line}: ${ref} is not declared in stage {stages[-1]}"
    assert stages == ["build", "runtime"]
    assert cmds[-1].cmd == "CMD" and cmds[-1].json, "the image's command, in exec form (signals reach the scheduler)"


def test_the_dockerfile_is_well_formed_stage_by_stage():
    check_stages(dockerfile_commands())


def test_the_stage_checks_catch_an_arg_not_declared_in_its_stage():
    # The control for the test above: the classic mistake must fail it.
    text = (DEPLOY / "Dockerfile").read_text()
    bad = text.replace("ARG TORCHVISION_VERSION\n", "", 1)
    assert bad != text
    with pytest.raises(AssertionError, match=r"\$TORCHVISION_VERSION is not declared in stage runtime"):
        check_stages(dockerfile.parse_string(bad))
    with pytest.raises(AssertionError, match="unknown instruction FORM"):
        check_stages(dockerfile.parse_string(text.replace("FROM python", "FORM python")))


def test_every_copy_source_is_in_the_build_context():
    copies = [c for c in dockerfile_commands() if c.cmd == "COPY" and not c.flags]
    assert copies
    for c in copies:
        for src in c.value[:-1]:
            rel = os.path.normpath(src)
            assert (ROOT / rel).exists(), f"line {c.start_line}: COPY {src}: no such path in the repository"
            if rel != ".":
                assert not ignored(rel), f"line {c.start_line}: COPY {src}: .dockerignore excludes it"


def test_dockerignore_keeps_the_sources_and_drops_what_is_built():
    # `COPY . .` builds the workspace: every member and the lock file must
    # be in the context, and the heavy local folders out of it.
    members = re.findall(r'^\s*"([^"]+)",', (ROOT / "Cargo.toml").read_text().split("default-members")[0], flags=re.M)
    assert "scheduler-service" in members
    for path in [*members, "Cargo.toml", "Cargo.lock", "proto/tensile/v1/tensile.proto", "clients/python/pyproject.toml"]:
        assert not ignored(path), f".dockerignore excludes {path}, which the build needs"
    for path in ["target", ".venv", ".git", "clients/python/src/tensile/__pycache__"]:
        assert ignored(path), f".dockerignore lets {path} into the build context"
    assert not any(p.startswith("!") for p in dockerignore_patterns()), "the check above does not follow exceptions"


def test_the_dockerfile_pins_are_setup_sh_pins():
    pins = setup_pins()
    args = {}
    for c in dockerfile_commands():
        if c.cmd == "ARG" and "=" in c.value[0]:
            name, value = c.value[0].split("=", 1)
            args[name] = value.strip('"')
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["TORCHVISION_VERSION"] == pins["torchvision"]
    assert args["ONNXRUNTIME_VERSION"] == pins["onnxruntime"]
    assert args["MATURIN_VERSION"] == pins["maturin"]
    # The Python stubs name the grpcio-tools that generated them and the
    # protobuf they need; the image installs that grpcio and such a protobuf.
    stubs = ROOT / "clients" / "python" / "src" / "tensile" / "v1"
    generated = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", (stubs / "tensile_pb2_grpc.py").read_text())
    assert generated and generated.group(1) == pins["grpcio-tools"] == args["GRPCIO_VERSION"]
    floor = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", (stubs / "tensile_pb2.py").read_text())
    assert floor
    assert args["PROTOBUF_SPEC"] == f">={'.'.join(floor.groups())},<{int(floor.group(1)) + 1}"


def test_the_images_match_the_toolchains():
    froms = {c.value[2]: c.value[0] for c in dockerfile_commands() if c.cmd == "FROM"}
    rust = re.fullmatch(r"rust:(\d+)\.(\d+)-bookworm", froms["build"])
    assert rust, froms["build"]
    need = re.search(r'rust-version = "(\d+)\.(\d+)"', (ROOT / "Cargo.toml").read_text())
    assert need and (int(rust.group(1)), int(rust.group(2))) >= (int(need.group(1)), int(need.group(2)))
    # .cargo/config.toml and both stages' paths say python3.11; Debian
    # bookworm's python3 (the build stage's) is 3.11.
    assert "python3.11" in (ROOT / ".cargo" / "config.toml").read_text()
    assert froms["runtime"] == "python:3.11-slim-bookworm"
    env_paths = [v for c in dockerfile_commands() if c.cmd == "ENV" for v in c.value[1::2] if "site-packages" in v]
    assert env_paths and all("/lib/python3.11/site-packages/" in v for v in env_paths)


def test_the_binaries_are_the_workspace_binaries():
    bins = cargo_bins()
    cmds = dockerfile_commands()
    build = next(c for c in cmds if c.cmd == "RUN" and "cargo build" in c.value[0])
    packages = re.findall(r"-p (\S+)", build.value[0])
    assert sorted(packages) == ["tensile-scheduler", "tensile-worker", "tensilectl"]
    for p in packages:
        assert p in bins, f"cargo build -p {p}: no such package in the workspace"
    copied = next(c for c in cmds if c.cmd == "COPY" and "--from=build" in c.flags)
    names = [Path(s).name for s in copied.value[:-1]]
    assert sorted(names) == sorted(packages)
    for n in names:
        assert any(n in targets for targets in bins.values()), f"COPY --from=build {n}: no such binary target"
    assert f"target/release/$b" in build.value[0] and all(n in build.value[0] for n in names)


# --- Kubernetes --------------------------------------------------------------


def test_the_manifests_validate_against_kubernetes_schemas_offline():
    docs = manifests()
    assert {d["kind"] for _, d in docs} == {"Namespace", "DaemonSet", "Job", "ConfigMap"}
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {e.message} at {'.'.join(map(str, e.path))}")


def test_the_validator_rejects_a_misspelt_field():
    # The control for the test above: a strict validation that fails on a typo.
    ds = json.loads(json.dumps(resource("DaemonSet", "tensile-scheduler")))
    ds["spec"]["template"]["spec"]["nodeSelectr"] = ds["spec"]["template"]["spec"].pop("nodeSelector")
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeSelectr"):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_the_scheduler_daemonset_sees_every_gpu_and_takes_none():
    ds = resource("DaemonSet", "tensile-scheduler")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (c,) = pod["containers"]
    resources = c.get("resources", {})
    for kind in ("requests", "limits"):
        assert "nvidia.com/gpu" not in resources.get(kind, {}), "the scheduler must not take a GPU from the device plugin"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    args = c["command"] + c["args"]
    assert args[:5] == ["tensile-scheduler", "--gpus", "all", "--socket-dir", SOCKET_DIR]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    assert mounts["sockets"] == SOCKET_DIR and volumes["sockets"]["path"] == SOCKET_DIR
    assert volumes["sockets"]["type"] == "DirectoryOrCreate"
    state = args[args.index("--state") + 1]
    assert mounts["state"] == state == volumes["state"]["path"]
    assert "lifecycle" not in c, "the scheduler opens its own sockets (--socket-mode)"
    for probe in ("readinessProbe", "livenessProbe"):
        script = c[probe]["exec"]["command"][-1]
        assert f"{SOCKET_DIR}/gpu*.sock" in script and "tensilectl status --server" in script


def test_the_sample_job_mounts_the_sockets_and_finds_its_gpu():
    job = resource("Job", "tensile-sample")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["TENSILE_SOCKET_DIR"] == SOCKET_DIR
    assert "TENSILE_SERVER" not in env, "the job finds its GPU's socket through gpus.json and the device plugin's uuid"
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == SOCKET_DIR]
    assert mount["readOnly"] is True
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["hostPath"] == {"path": SOCKET_DIR, "type": "Directory"}
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_commands_the_manifests_run_are_in_the_image():
    in_image = set()
    for c in dockerfile_commands():
        if c.cmd == "COPY" and c.value[-1].startswith("/usr/local/bin/"):
            dest = c.value[-1]
            in_image.update(Path(s).name for s in c.value[:-1]) if dest.endswith("/") else in_image.add(Path(dest).name)
    assert in_image == {"tensile-scheduler", "tensile-worker", "tensilectl"}
    ds = resource("DaemonSet", "tensile-scheduler")["spec"]["template"]["spec"]["containers"][0]
    job = resource("Job", "tensile-sample")["spec"]["template"]["spec"]["containers"][0]
    assert ds["command"][0] in in_image and job["command"][0] in in_image
    image = {ds["image"], job["image"]}
    assert image == {"tensile:0.1.0"}, "one image, the tag deploy/README.md builds"


def deploy_socket_modes() -> dict[str, str]:
    """The ``--socket-mode`` each way of starting the node's scheduler passes:
    the DaemonSet, the image's CMD, the systemd unit."""
    ds = resource("DaemonSet", "tensile-scheduler")["spec"]["template"]["spec"]["containers"][0]
    cmd = list(next(c for c in dockerfile_commands() if c.cmd == "CMD").value)
    unit = (DEPLOY / "slurm" / "tensile-scheduler.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, flags=re.M)
    assert exec_start
    modes = {}
    for where, args in (("DaemonSet", ds["args"]), ("Dockerfile CMD", cmd), ("systemd unit", exec_start.group(1).split())):
        assert "--socket-mode" in args, f"{where} starts the scheduler without --socket-mode: other users' jobs could not connect"
        modes[where] = args[args.index("--socket-mode") + 1]
    return modes


def test_every_deploy_file_opens_the_sockets_to_every_user_and_nothing_else():
    assert set(deploy_socket_modes().values()) == {"0666"}
    # Nothing else changes modes: no script, no hook.
    assert not (DEPLOY / "tensile-open-sockets").exists()
    for path in [*DEPLOY.rglob("*"), *(ROOT / "scripts").rglob("*")]:
        if path.is_file():
            assert "tensile-open-sockets" not in path.read_text(errors="replace") or path.name == "README.md", path


def test_the_flags_the_deploy_files_pass_exist():
    # tensile-scheduler's flags in the DaemonSet, the image's CMD and the
    # systemd unit; the worker's in the sample job; tensilectl's in the probes.
    ds = resource("DaemonSet", "tensile-scheduler")["spec"]["template"]["spec"]["containers"][0]
    cmd = next(c for c in dockerfile_commands() if c.cmd == "CMD").value
    unit = (DEPLOY / "slurm" / "tensile-scheduler.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, flags=re.M)
    assert exec_start
    scheduler_flags = flags_of(ds["args"]) | flags_of(list(cmd)) | flags_of(exec_start.group(1).split())
    assert {"--gpus", "--socket-dir", "--state", "--socket-mode"} <= scheduler_flags
    scheduler_help = help_text(SCHEDULER)
    for flag in scheduler_flags:
        assert re.search(rf"{flag}\b", scheduler_help), f"tensile-scheduler has no {flag}"
    job = resource("Job", "tensile-sample")["spec"]["template"]["spec"]["containers"][0]
    worker_help = help_text(WORKER)
    for flag in flags_of(job["args"]):
        assert re.search(rf"{flag}\b", worker_help), f"tensile-worker has no {flag}"
    assert "--server" in help_text(TENSILECTL, "status")


# --- Slurm -------------------------------------------------------------------


def gres_conf() -> tuple[list[str], dict[str, int]]:
    """deploy/slurm/gres.conf: the GPU device files, and the shard count of each."""
    gpus: list[str] = []
    shards: dict[str, int] = {}
    for line in (DEPLOY / "slurm" / "gres.conf").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        kv = dict(word.split("=", 1) for word in line.split())
        if kv["Name"] == "gpu":
            m = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", kv["File"])
            gpus.extend([f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)] if m else [kv["File"]])
        elif kv["Name"] == "shard":
            shards[kv["File"]] = int(kv["Count"])
    return gpus, shards


def test_the_slurm_configuration_agrees_with_itself_and_the_taskprolog():
    gpus, shards = gres_conf()
    assert gpus == ["/dev/nvidia0", "/dev/nvidia1"]
    assert set(shards) == set(gpus), "every GPU is sold in shards"
    per_gpu = load_prolog().DEFAULT_SHARDS_PER_GPU
    assert set(shards.values()) == {per_gpu}, "the TaskProlog's shares assume gres.conf's shards per GPU"
    conf = (DEPLOY / "slurm" / "slurm.conf.excerpt").read_text()
    settings = dict(re.findall(r"^(\w+)=(\S+)", conf, flags=re.M))
    assert set(settings["GresTypes"].split(",")) == {"gpu", "shard"}
    assert settings["SelectType"] == "select/cons_tres", "gres/shard needs cons_tres"
    assert Path(settings["TaskProlog"]).name == PROLOG.name
    gres = re.search(r"^NodeName=.*\bGres=(\S+)", conf, flags=re.M)
    assert gres and gres.group(1) == f"gpu:{len(gpus)},shard:{sum(shards.values())}"


def test_the_systemd_unit_verifies_and_serves_the_taskprolog_directory(tmp_path):
    unit = (DEPLOY / "slurm" / "tensile-scheduler.service").read_text()
    execs = re.findall(r"^(ExecStart|ExecStartPost)=(\S+) (.*)$", unit, flags=re.M)
    assert [e[0] for e in execs] == ["ExecStart", "ExecStartPost"]
    (_, _, start_args), (_, post, post_args) = execs
    start = start_args.split()
    assert start[start.index("--socket-dir") + 1] == load_prolog().DEFAULT_SOCKET_DIR == SOCKET_DIR
    # Started once the scheduler has written gpus.json (every socket listens).
    assert post == "/bin/sh" and f"[ -f {SOCKET_DIR}/gpus.json ]" in post_args
    assert re.search(r"^TimeoutStartSec=\d+$", unit, flags=re.M), "the wait for gpus.json is bounded"
    assert re.search(r"^RuntimeDirectory=tensile$", unit, flags=re.M), "systemd makes /run/tensile"
    state = start[start.index("--state") + 1]
    assert re.search(rf"^StateDirectory={Path(state).name}$", unit, flags=re.M)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze here: the unit's syntax is not checked")
    # verify wants the executables to exist: stand-ins for the installed ones.
    fake = tmp_path / "fake"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    copy = tmp_path / "tensile-scheduler.service"
    copy.write_text(re.sub(r"/usr/local/bin/[\w-]+", str(fake), unit))
    out = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr


GB = 1_000_000_000


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    """A node's socket directory: a scheduler (stand-in) serving GPUs 0 (48 GB budget) and 1 (40 GB)."""
    d = tmp_path / "tensile"
    d.mkdir()
    write_gpus_json(d, {0: 48 * GB, 1: 40 * GB})
    socks = [listen(d / "gpu0.sock"), listen(d / "gpu1.sock")]
    yield d
    for s in socks:
        s.close()


def step(gpus: str, **env: str) -> dict[str, str]:
    """A step's environment as slurmd gives a TaskProlog: one task on node 0 unless said."""
    base = {"SLURM_STEP_GPUS": gpus, "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "1"}
    return {**base, **env}


@pytest.mark.parametrize(
    ("env", "server", "budget_mb"),
    [
        # srun --gres=shard:16 on GPU 1: half of its 32 shards.
        (step("1", SLURM_SHARDS_ON_NODE="16"), "gpu1", 20_000),
        # srun -n2 --gres=shard:8: the job's 8 shards are per node, for both tasks.
        (step("0", SLURM_SHARDS_ON_NODE="8", SLURM_LOCALID="1", SLURM_STEP_TASKS_PER_NODE="2"), "gpu0", 6_000),
        # --gres=gpu:1: the whole GPU.
        (step("1"), "gpu1", 40_000),
        # --gres=gpu:2 -n2: one task per GPU, by local id (cuda:LOCAL_RANK).
        (step("0,1", SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE="2"), "gpu0", 48_000),
        (step("0,1", SLURM_LOCALID="1", SLURM_STEP_TASKS_PER_NODE="2"), "gpu1", 40_000),
        # --gres=gpu:2, one task: its cuda:0.
        (step("1,0"), "gpu1", 40_000),
        # Four tasks on two GPUs: two on each.
        (step("0,1", SLURM_LOCALID="3", SLURM_STEP_TASKS_PER_NODE="4"), "gpu1", 20_000),
        # The batch script: the job's GPUs, no step.
        ({"SLURM_JOB_GPUS": "1", "SLURM_SHARDS_ON_NODE": "8"}, "gpu1", 10_000),
        # Node 3 of a step laid out 2(x3),1 runs one task, node 1 two.
        (step("0", SLURM_SHARDS_ON_NODE="8", SLURM_NODEID="3", SLURM_STEP_TASKS_PER_NODE="2(x3),1"), "gpu0", 12_000),
        (step("0", SLURM_SHARDS_ON_NODE="8", SLURM_NODEID="1", SLURM_STEP_TASKS_PER_NODE="2(x3),1"), "gpu0", 6_000),
        # More shards than a GPU has: the whole GPU, no more.
        (step("0", SLURM_SHARDS_ON_NODE="64"), "gpu0", 48_000),
        # A site with 8 shards per GPU.
        (step("0", SLURM_SHARDS_ON_NODE="4", TENSILE_SHARDS_PER_GPU="8"), "gpu0", 24_000),
        # No Slurm GPU variable, only CUDA's.
        ({"CUDA_VISIBLE_DEVICES": "1"}, "gpu1", 40_000),
    ],
)
def test_the_taskprolog_exports_the_gpu_socket_and_the_share(node, env, server, budget_mb):
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **env})
    assert lines == [
        f"export TENSILE_SOCKET_DIR={node}",
        f"export TENSILE_SERVER=unix:{node}/{server}.sock",
        f"export TENSILE_BUDGET_MB={budget_mb}",
    ]


@pytest.mark.parametrize(
    "env",
    [
        {},  # no GPU at all
        {"SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": ""},
        {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},  # a GRES with no device files
    ],
)
def test_the_taskprolog_says_nothing_to_a_task_without_a_gpu(node, env):
    assert run_prolog({"TENSILE_SOCKET_DIR": str(node), **env}) == []


def test_the_taskprolog_says_nothing_where_tensile_is_not_deployed(tmp_path):
    assert run_prolog({"TENSILE_SOCKET_DIR": str(tmp_path / "none"), **step("0")}) == []


def test_the_taskprolog_keeps_what_the_user_set(node):
    env = {"TENSILE_SOCKET_DIR": str(node), "TENSILE_SERVER": "unix:/mine.sock", "TENSILE_BUDGET_MB": "123", **step("0")}
    assert run_prolog(env) == [f"export TENSILE_SOCKET_DIR={node}"]


def test_the_taskprolog_names_a_gpu_the_scheduler_does_not_serve(node):
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **step("3")})
    assert lines[0] == f"export TENSILE_SOCKET_DIR={node}"
    assert len(lines) == 2 and lines[1].startswith("print tensile: GPU 3 is not served")
    assert "lists 0, 1" in lines[1] and "TENSILE_SERVER is not set" in lines[1]


def test_the_taskprolog_warns_when_no_scheduler_listens(node):
    (node / "gpu1.sock").unlink()
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **step("1")})
    # The address is still given: a scheduler that is restarting comes back
    # there, and the job's session registers again.
    assert lines[:2] == [f"export TENSILE_SOCKET_DIR={node}", f"export TENSILE_SERVER=unix:{node}/gpu1.sock"]
    assert lines[2] == f"print tensile: no scheduler listens on {node}/gpu1.sock yet (is tensile-scheduler running?)"
    assert lines[3] == "export TENSILE_BUDGET_MB=40000"


def test_the_taskprolog_without_gpus_json_gives_the_socket_but_no_budget(tmp_path):
    # Schedulers started one per GPU (--listen unix:DIR/gpuN.sock) write no gpus.json.
    s = listen(tmp_path / "gpu1.sock")
    try:
        lines = run_prolog({"TENSILE_SOCKET_DIR": str(tmp_path), **step("1", SLURM_SHARDS_ON_NODE="16")})
    finally:
        s.close()
    assert lines == [f"export TENSILE_SOCKET_DIR={tmp_path}", f"export TENSILE_SERVER=unix:{tmp_path}/gpu1.sock"]


@pytest.mark.parametrize(
    ("env", "names"),
    [
        (step("GPU-1c7e"), "SLURM_STEP_GPUS='GPU-1c7e' is not a list of GPU indices"),
        (step("0", SLURM_STEP_TASKS_PER_NODE="two"), "SLURM_STEP_TASKS_PER_NODE='two': cannot read 'two'"),
        (step("0", SLURM_NODEID="5", SLURM_STEP_TASKS_PER_NODE="1(x2)"), "SLURM_STEP_TASKS_PER_NODE='1(x2)' has no entry for node 5"),
        (step("0", SLURM_SHARDS_ON_NODE="8", TENSILE_SHARDS_PER_GPU="0"), "TENSILE_SHARDS_PER_GPU=0: a GPU has at least one shard"),
        (step("0", SLURM_SHARDS_ON_NODE="many"), "SLURM_SHARDS_ON_NODE='many' is not a whole number"),
    ],
)
def test_the_taskprolog_names_what_it_cannot_read_and_never_fails_the_task(node, env, names):
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **env})
    assert lines == [f"print tensile: task prolog: {names}"]


def test_the_taskprolog_names_a_broken_gpus_json(node):
    (node / "gpus.json").write_text('{"gpus": [{"index": 0}]}')
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **step("0")})
    assert len(lines) == 1 and lines[0].startswith(f"print tensile: task prolog: {node}/gpus.json: not a gpus file")


def test_the_taskprolog_runs_as_installed(node):
    # slurmd executes the file itself: its shebang and mode must work.
    assert PROLOG.stat().st_mode & stat.S_IXOTH
    interpreter = PROLOG.read_text().splitlines()[0].removeprefix("#!")
    if not Path(interpreter).exists():
        pytest.skip(f"{interpreter} (the TaskProlog's interpreter on compute nodes) is not on this machine")
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(node), **step("1", SLURM_SHARDS_ON_NODE="16")}, direct=True)
    assert lines[1] == f"export TENSILE_SERVER=unix:{node}/gpu1.sock"


# --- against a real scheduler --------------------------------------------------


def wait_for(cond: Any, what: str, timeout_s: float = 20.0) -> None:
    """Polls ``cond()`` until it is true, or fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


NOBODY = 65534


def status_as_nobody(server: Path) -> subprocess.CompletedProcess[str] | None:
    """``tensilectl status`` on ``server`` as user nobody, or None where that
    cannot run (not root here, or tensilectl in a folder nobody may enter)."""
    if os.geteuid() != 0:
        return None
    run = {"capture_output": True, "text": True, "timeout": 60, "user": NOBODY, "group": NOBODY, "extra_groups": []}
    try:
        if subprocess.run([TENSILECTL, "--version"], **run).returncode != 0:
            return None
    except PermissionError:
        return None
    return subprocess.run([TENSILECTL, "status", "--server", f"unix:{server}"], **run)


@contextlib.contextmanager
def running_scheduler(log: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real tensile-scheduler serving two simulated GPUs, 1000 MB each, in a
    fresh world-readable directory; stopped (SIGTERM) and removed after."""
    d = Path(tempfile.mkdtemp(prefix="tensile-deploy-", dir="/tmp"))
    d.chmod(0o755)  # as systemd's RuntimeDirectory and the kubelet's hostPath make it
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [SCHEDULER, "--gpus", "0,1", "--socket-dir", str(d), "--device", "a6000", "--budget-mb", "1000", "--state", "none", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The scheduler as the deploy files start it (their --socket-mode)."""
    with running_scheduler(tmp_path / "scheduler.log", "--socket-mode", deploy_socket_modes()["systemd unit"]) as running:
        yield running


def tensilectl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """tensilectl with ``env`` added to this process's environment."""
    return subprocess.run([TENSILECTL, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_a_real_scheduler_opened_to_every_user_and_found_by_the_taskprolog(scheduler):
    proc, d = scheduler
    # Once gpus.json names them, the sockets are open to every user.
    wait_for(lambda: (d / "gpus.json").exists(), "the scheduler's gpus.json")
    for n in (0, 1):
        assert stat.S_IMODE((d / f"gpu{n}.sock").stat().st_mode) == 0o666
    assert not (d / "gpus.json").stat().st_mode & stat.S_IWOTH, "only the sockets are opened"
    after = status_as_nobody(d / "gpu1.sock")
    if after is not None:
        assert after.returncode == 0, after.stderr

    # GPU 1's budget changes (the scheduler rewrites gpus.json); the
    # TaskProlog of a shard:16 task on GPU 1 reads it there.
    gpu1 = {"TENSILE_SERVER": f"unix:{d}/gpu1.sock"}
    changed = tensilectl("budget", "600", env=gpu1)
    assert changed.returncode == 0, changed.stderr
    wait_for(lambda: '"budget_bytes": 600000000' in (d / "gpus.json").read_text(), "gpus.json to show GPU 1's new budget")
    lines = run_prolog({"TENSILE_SOCKET_DIR": str(d), **step("1", SLURM_SHARDS_ON_NODE="16")})
    assert lines == [f"export TENSILE_SOCKET_DIR={d}", f"export TENSILE_SERVER=unix:{d}/gpu1.sock", "export TENSILE_BUDGET_MB=300"]
    exported = dict(ln.removeprefix("export ").split("=", 1) for ln in lines)
    status = tensilectl("status", "--json", env=exported)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["budget_bytes"] == 600 * 1_000_000, "the task's TENSILE_SERVER is GPU 1's scheduler"
    # A Kubernetes training pod: the sample job's environment, and the uuid
    # of its GPU from the device plugin; no TENSILE_SERVER.
    job = resource("Job", "tensile-sample")["spec"]["template"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"].replace(SOCKET_DIR, str(d)) for e in job["env"]}
    uuid = next(g["uuid"] for g in json.loads((d / "gpus.json").read_text())["gpus"] if g["index"] == 1)
    pod_env["NVIDIA_VISIBLE_DEVICES"] = uuid
    clean = {k: v for k, v in os.environ.items() if k not in {"TENSILE_SERVER", "CUDA_VISIBLE_DEVICES", "TENSILE_SOCKET_DIR"}}
    # What tensile.plan(..., server="default") does in the pod, on cuda:0.
    code = "import tensile\nc = tensile.Client(device='cuda:0')\nprint(c.target, c.status().memory.budget_bytes)"
    found = subprocess.run([sys.executable, "-c", code], env={**clean, **pod_env}, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == [f"unix:{d}/gpu1.sock", str(600 * 1_000_000)], f"the pod of GPU {uuid}: {found.stdout}"
    on_gpu0 = run_prolog({"TENSILE_SOCKET_DIR": str(d), **step("0", SLURM_SHARDS_ON_NODE="16")})
    assert on_gpu0[1:] == [f"export TENSILE_SERVER=unix:{d}/gpu0.sock", "export TENSILE_BUDGET_MB=500"]

    # The DaemonSet's probe, on this directory: passes while the scheduler
    # serves, fails once it has stopped (and removed its sockets).
    ds = resource("DaemonSet", "tensile-scheduler")["spec"]["template"]["spec"]["containers"][0]
    probe = ds["livenessProbe"]["exec"]["command"]
    probe = [*probe[:-1], probe[-1].replace(SOCKET_DIR, str(d))]
    path = {**os.environ, "PATH": f"{Path(TENSILECTL).parent}:{os.environ['PATH']}"}
    alive = subprocess.run(probe, env=path, capture_output=True, text=True, timeout=60)
    assert alive.returncode == 0, alive.stderr
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert not list(d.glob("gpu*.sock")) and not (d / "gpus.json").exists()
    dead = subprocess.run(probe, env=path, capture_output=True, text=True, timeout=60)
    assert dead.returncode != 0


def test_a_scheduler_without_socket_mode_is_closed_to_other_users(tmp_path):
    # The control for the test above: the mode comes from the flag.
    with running_scheduler(tmp_path / "scheduler.log") as (_, d):
        wait_for(lambda: (d / "gpus.json").exists(), "the scheduler's gpus.json")
        for n in (0, 1):
            assert not stat.S_IMODE((d / f"gpu{n}.sock").stat().st_mode) & stat.S_IWOTH
        closed = status_as_nobody(d / "gpu1.sock")
        if closed is not None:
            assert closed.returncode != 0 and "Permission denied" in closed.stderr, closed.stderr
