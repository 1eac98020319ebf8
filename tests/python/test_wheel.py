"""The `tensile` wheel (packaging/wheel, `scripts/build-wheel.sh`) in a
fresh virtual environment, as a cluster node gets it.

The wheel is built with the debug profile (reusing target/debug) and
installed with pip into a new `python3.11 -m venv`, dependencies and all;
nothing of the repository's `.venv` is visible there. From that
environment:

* the wheel holds every file of the Python package, its Rust core (the
  abi3 extension module ``tensile._core``) and a manylinux binary, both
  needing only glibc, libm and libgcc_s; its metadata requires grpcio,
  protobuf and onnxruntime 1.31.1, and torch only as an extra;
* `tensile-scheduler` on the environment's PATH reports the package's
  version, serves on a Unix socket (`--device a6000 --budget-mb 1000
  --state none`) with its learned latency models loaded by the ONNX Runtime
  of the environment's own onnxruntime wheel (seen in the process's memory
  map, with ORT_DYLIB_PATH unset), and a `tensile.Client` imported from the
  environment (not from the repository, and without torch) registers a job
  and receives its plan; SIGTERM stops the scheduler with status 0;
* with torch borrowed (below), ``tensile.plan()`` plans a model in the
  process, with no scheduler and no ``tensilectl`` on PATH or in
  ``TENSILECTL``, its learned CPU latency models on the environment's own
  ONNX Runtime, and ``tensile.apply`` trains the model under that plan
  bit-identically to plain training;
* `tests/python/test_ray.py` runs with the environment's Python, Ray and
  pytest installed there from the wheel's `ray` extra. torch is borrowed
  from the repository's `.venv` (a `.pth` line after the environment's own
  packages, added only for this step): PyPI's torch wheel and its CUDA
  libraries are several GB, too much to download in a test, and the wheel
  does not require torch.

Downloads: the dependencies are fetched from PyPI into
target/wheel-test/wheelhouse once and installed from there with
`--no-index` afterwards, so a rerun needs no network. Without network and
without that folder the install fails; `TENSILE_SKIP_WHEEL_TEST=1` skips
this file on such a machine (the only reason to).
"""

from __future__ import annotations

import contextlib
import email.message
import email.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "python" / "src" / "tensile"
#: Downloaded dependencies, kept between runs (target/ is the build's scratch folder).
WHEELHOUSE = ROOT / "target" / "wheel-test" / "wheelhouse"
#: What a manylinux binary may link (the libraries every glibc system has).
SYSTEM_LIBS = {"linux-vdso.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2", "librt.so.1"}
#: The step timings of this run, printed at the end (pytest -s, or the summary's captured output).
TIMES: dict[str, float] = {}

pytestmark = pytest.mark.skipif(
    os.environ.get("TENSILE_SKIP_WHEEL_TEST") == "1",
    reason="TENSILE_SKIP_WHEEL_TEST=1: no PyPI here for the wheel's dependencies",
)


@dataclass
class Env:
    """The fresh virtual environment with the wheel installed."""

    root: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        """Its scripts folder."""
        return self.root / "bin"

    @property
    def python(self) -> Path:
        """Its interpreter."""
        return self.bin / "python"

    def environ(self) -> dict[str, str]:
        """This process's environment with the venv's scripts first on PATH,
        the venv activated, and nothing that points at the repository's
        builds or libraries."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("ORT_DYLIB_PATH", "TENSILE_SCHEDULER", "TENSILE_SCHEDULER_BIN", "TENSILECTL", "PYTHONPATH", "PYTHONHOME")
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return env

    def run(self, *args: str | Path, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Runs a command in the venv's environment (in ``cwd``, else the
        venv's folder); fails the test, with its output, when it exits with
        a nonzero status."""
        out = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=self.environ(), cwd=cwd or self.root, timeout=timeout)
        assert out.returncode == 0, f"{' '.join(map(str, args))} exited with {out.returncode}:\n{out.stdout}\n{out.stderr}"
        return out

    def site_packages(self) -> Path:
        """Its purelib folder, as the venv's Python says."""
        out = self.run(self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        return Path(out.stdout.strip()).resolve()


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    """Records how long ``step`` took in :data:`TIMES`."""
    start = time.monotonic()
    try:
        yield
    finally:
        TIMES[step] = TIMES.get(step, 0.0) + time.monotonic() - start


def requirements(wheel: Path, extra: str | None = None) -> list[str]:
    """The wheel's Requires-Dist: the unconditional ones, or those of ``extra``."""
    meta = metadata(wheel)
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        name, _, marker = req.partition(";")
        if (extra is None and not marker) or (extra is not None and f"extra == '{extra}'" in marker):
            out.append(name.strip())
    return out


def metadata(wheel: Path) -> email.message.Message:
    """The wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def pip_install(env: Env, targets: Sequence[str], wanted: Sequence[str]) -> None:
    """Installs ``targets`` into ``env`` from :data:`WHEELHOUSE` without an
    index; when that lacks something, first downloads ``wanted`` (the
    requirements) into it from PyPI."""
    offline = [env.python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", WHEELHOUSE, *targets]
    first = subprocess.run([str(a) for a in offline], capture_output=True, text=True, env=env.environ(), timeout=600)
    if first.returncode == 0:
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    env.run(env.python, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest", WHEELHOUSE, *wanted, timeout=600)
    env.run(*offline, timeout=600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built by scripts/build-wheel.sh --debug."""
    out = tmp_path_factory.mktemp("wheels")
    with timed("build the wheel (debug)"):
        built = subprocess.run([str(ROOT / "scripts" / "build-wheel.sh"), "--debug", "-o", str(out)], capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, f"scripts/build-wheel.sh failed:\n{built.stderr}"
    path = Path(built.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out and path.suffix == ".whl", built.stdout
    return path


@pytest.fixture(scope="module")
def env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """A new virtual environment (python3.11 -m venv) with the wheel installed by its own pip."""
    # python3.11 on PATH, else the interpreter the repository's .venv was made from.
    python311 = shutil.which("python3.11") or (sys._base_executable if sys.version_info[:2] == (3, 11) else None)
    assert python311, "no python3.11 on PATH: the wheel test makes its environment with it"
    root = tmp_path_factory.mktemp("fresh") / "venv"
    with timed("python3.11 -m venv"):
        subprocess.run([python311, "-m", "venv", str(root)], check=True, timeout=300)
    fresh = Env(root, wheel)
    with timed("pip install the wheel and its dependencies"):
        pip_install(fresh, [str(wheel)], requirements(wheel))
    return fresh


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small traced training step (traced here, with the repository's torch)."""
    import torch

    from tensile.trace import InputSpec, trace_training_step

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    graph = trace_training_step(model, torch.optim.SGD, [InputSpec("input", (8, 32))], name="wheel-mlp")
    path = tmp_path_factory.mktemp("graph") / "mlp.json"
    path.write_text(json.dumps(graph))
    return path


@pytest.fixture(scope="module", autouse=True)
def report_times() -> Iterator[None]:
    """Prints the steps' times after the module's tests."""
    start = time.monotonic()
    yield
    TIMES["the whole file"] = time.monotonic() - start
    print("\nwheel test times:", ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items()), file=sys.stderr)


def test_the_wheel_holds_the_package_and_a_manylinux_binary(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        tags = [line.split(": ", 1)[1] for line in z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode().splitlines() if line.startswith("Tag: ")]
        version = metadata(wheel)["Version"]
        data = f"tensile-{version}.data/scripts"
        binary = tmp_path / "tensile-scheduler"
        binary.write_bytes(z.read(f"{data}/tensile-scheduler"))
        binary.chmod(0o755)
        extension = tmp_path / "_core.abi3.so"
        extension.write_bytes(z.read("tensile/_core.abi3.so"))
        trace_script = z.read(f"{data}/tensile-trace").decode()

    # Every module and stub of the package, its extension module, and nothing
    # else of its folder (no caches, not the editable install's own build).
    on_disk = {f"tensile/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts}
    in_wheel = {n for n in names if n.startswith("tensile/")}
    assert in_wheel == on_disk | {"tensile/_core.abi3.so"}
    assert wheel.name == f"tensile-{version}-{tags[0]}.whl"
    assert len(tags) == 1 and re.fullmatch(r"cp311-abi3-manylinux_2_\d+_x86_64", tags[0]), tags

    # The binary and the extension link only what every glibc system has:
    # nothing for auditwheel to bundle (the extension takes Python's symbols
    # from the interpreter, and loads ONNX Runtime at run time).
    for built in (binary, extension):
        ldd = subprocess.run(["ldd", str(built)], capture_output=True, text=True, check=True).stdout
        linked = {line.split()[0].rsplit("/", 1)[-1] for line in ldd.splitlines() if line.strip()}
        assert linked and linked <= SYSTEM_LIBS, f"{built.name} links {sorted(linked - SYSTEM_LIBS)}"

    assert requirements(wheel) == ["grpcio>=1.76.0,<2", "protobuf>=6.31.1,<7", "onnxruntime==1.31.1"]
    assert [r.split(">")[0] for r in requirements(wheel, "torch")] == ["torch"]
    assert trace_script.startswith("#!python\n") and "tensile.trace.__main__" in trace_script


def test_the_scheduler_and_the_client_from_the_fresh_environment(env: Env, graph_file: Path, tmp_path: Path) -> None:
    site = env.site_packages()
    assert ROOT not in site.parents, f"the fresh venv's packages are under the repository: {site}"

    version = env.run("tensile-scheduler", "--version").stdout.strip()
    assert version == f"tensile-scheduler {metadata(env.wheel)['Version']}"
    assert shutil.which("tensile-scheduler", path=env.environ()["PATH"]) == str(env.bin / "tensile-scheduler")

    sock = tmp_path / "s.sock"
    log_path = tmp_path / "scheduler.log"
    models = ROOT / "latency-model" / "models" / "cpu"
    args = ["tensile-scheduler", "--listen", f"unix:{sock}", "--device", "a6000", "--budget-mb", "1000", "--state", "none", "--latency-models", str(models)]
    with timed("scheduler and client"), open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env.environ(), cwd=tmp_path)
        try:
            wait_for(sock, proc, log_path)
            # Logged once the models are loaded (the socket may be bound before).
            wait_for_line(log_path, f"learned models in {models}", proc)
            # The launched command is the scheduler itself (a binary, no wrapper), and
            # the ONNX Runtime it loaded is the fresh environment's wheel's.
            assert Path(f"/proc/{proc.pid}/exe").resolve() == (env.bin / "tensile-scheduler").resolve()
            ort = {line.split()[-1] for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines() if "libonnxruntime.so" in line}
            assert len(ort) == 1, f"ONNX Runtime mapped from {ort or 'nowhere'}; log:\n{log_path.read_text()}"
            assert Path(ort.pop()).resolve().parent == site / "onnxruntime" / "capi"

            client = env.run(env.python, "-c", CLIENT, f"unix:{sock}", str(graph_file), timeout=120)
            seen = json.loads(client.stdout)
            assert Path(seen["file"]).resolve() == site / "tensile" / "__init__.py"
            assert seen["version"] == metadata(env.wheel)["Version"]
            assert not seen["torch"], "import tensile and the client loaded torch"
            assert seen["job"] > 0 and seen["plan"] >= 1 and seen["listed"]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail("tensile-scheduler did not stop within 20 s of SIGTERM")
    assert code == 0, f"tensile-scheduler exited with {code}:\n{log_path.read_text()}"


#: Run by the fresh venv's Python: registers the graph, waits for its plan, prints what it saw.
CLIENT = textwrap.dedent(
    """
    import json, sys
    import tensile
    from tensile.v1 import tensile_pb2 as pb

    address, graph = sys.argv[1], sys.argv[2]
    with tensile.Client(address) as client:
        job = client.register(graph, name="from-the-wheel")
        for update in client.plans(job, timeout_s=60):
            if update.state == pb.JOB_STATE_ACTIVE and update.plan.version >= 1:
                break
        listed = [j.name for j in client.status().jobs] == ["from-the-wheel"]
        client.unregister(job)
    print(json.dumps({"file": tensile.__file__, "version": tensile.__version__, "torch": "torch" in sys.modules,
                      "job": job.id, "plan": update.plan.version, "listed": listed}))
    """
)


def wait_for(sock: Path, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    """Waits for the scheduler's socket; fails with its log if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tensile-scheduler did not start:\n{log.read_text()}")
        time.sleep(0.05)


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Waits for ``text`` in the scheduler's log; fails with the log if it
    exits or does not write it in time."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the scheduler's log never said {text!r}:\n{log.read_text()}")
        time.sleep(0.05)


def test_the_wheel_plans_in_the_process_with_no_scheduler_and_no_tensilectl(env: Env) -> None:
    # Borrowed for this step only: pip would take the repository's packages
    # on that path as installed (the Ray step installs its own after).
    borrowed = borrow_torch(env)
    try:
        with timed("tensile.plan and tensile.apply from the wheel"):
            out = env.run(env.python, "-c", PLAN_HERE, timeout=600)
    finally:
        borrowed.unlink()
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    site = env.site_packages()
    assert Path(seen["core"]).resolve().parent == site / "tensile"
    assert seen["tensilectl"] is None and not seen["TENSILECTL"]
    assert seen["events"] > 0 and seen["ops"] > 0 and seen["device"] == "cpu"
    assert seen["ort"] and Path(seen["ort"]).resolve().parent == site / "onnxruntime" / "capi", seen["ort"]
    assert seen["identical"], "training under the plan differs from plain training"


#: Run by the fresh venv's Python (torch borrowed): plans a small model with
#: tensile.plan() (no server), trains it under the plan and plainly, and
#: prints what it saw.
PLAN_HERE = textwrap.dedent(
    """
    import json, os, shutil
    from pathlib import Path
    # No tensilectl anywhere: planning must not need one.
    os.environ["PATH"] = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "tensilectl")))
    import torch
    from torch.nn import functional as F
    import tensile

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(3)]

    def train(m, plan=None):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        hook = tensile.apply(plan, m, opt) if plan is not None else None
        if hook is not None:
            hook.__enter__()
        try:
            for x, y in data:
                F.cross_entropy(m(x), y).backward()
                opt.step()
                opt.zero_grad()
        finally:
            if hook is not None:
                hook.__exit__(None, None, None)
        return [p.detach().clone() for p in m.parameters()]

    m = model()
    plan = tensile.plan(m, torch.optim.SGD(m.parameters(), lr=0.1), data[0], F.cross_entropy)
    plain, hooked = train(model()), train(model(), plan)
    ort = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libonnxruntime.so" in line]
    print(json.dumps({
        "core": tensile._core.__file__, "tensilectl": shutil.which("tensilectl"), "TENSILECTL": os.environ.get("TENSILECTL"),
        "events": len(plan.events), "ops": len(plan.ops), "device": plan.report["device"],
        "ort": ort[0] if ort else None,
        "identical": all(torch.equal(a, b) for a, b in zip(plain, hooked)),
    }))
    """
)


# ---------------------------------------------------------------------------
# Hook: tests/python/test_ray.py (tensile.ray on a multi-node Ray cluster)
# with the fresh environment's Python, so that its schedulers are the
# wheel's binary found on PATH.

RAY_TEST = ROOT / "tests" / "python" / "test_ray.py"


def test_ray_runs_with_the_wheel(env: Env) -> None:
    if not RAY_TEST.is_file():
        pytest.skip("tests/python/test_ray.py is not written yet: this is where the wheel runs it")
    with timed("pip install tensile[ray] and pytest"):
        pip_install(env, [f"{env.wheel}[ray]", "pytest==8.4.2"], [*requirements(env.wheel), *requirements(env.wheel, "ray"), "pytest==8.4.2"])
    borrow_torch(env)
    where = json.loads(env.run(env.python, "-c", WHERE).stdout)
    site = env.site_packages()
    for name in ("tensile", "ray", "onnxruntime", "grpc", "pytest"):
        assert site in Path(where[name]).resolve().parents, f"{name} comes from {where[name]}, not the fresh venv"
    # The schedulers tensile.ray launches are the wheel's binary.
    assert Path(where["scheduler"]) == env.bin / "tensile-scheduler"
    with timed("tests/python/test_ray.py"):
        ran = env.run(env.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", RAY_TEST, timeout=600, cwd=ROOT)
    print(f"\ntest_ray.py in the fresh venv: {ran.stdout.strip().splitlines()[-1]}", file=sys.stderr)
    env.run("tensile-trace", "--help")


#: Prints where each module the Ray test uses is imported from.
WHERE = textwrap.dedent(
    """
    import importlib, json
    import tensile.ray
    where = {m: importlib.import_module(m).__file__ for m in ("tensile", "ray", "onnxruntime", "grpc", "pytest", "torch")}
    print(json.dumps({**where, "scheduler": tensile.ray.find_scheduler_binary()}))
    """
)


def borrow_torch(env: Env) -> Path:
    """Makes the repository's torch importable in ``env`` after its own
    packages (see the module's docstring for why); the ``.pth`` file that
    does it."""
    import torch

    repo_site = Path(torch.__file__).resolve().parents[1]
    pth = env.site_packages() / "zz-borrowed-torch.pth"
    pth.write_text(f"{repo_site}\n")
    return pth
