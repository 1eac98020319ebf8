"""Running the bundled binaries: a log per run, a timeout within the
check's time, the libtorch CUDA library preloaded for tch binaries, and
(on a GPU) the process's device memory as nvidia-smi sees it."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import results


def tch_env() -> dict[str, str]:
    """The environment of a binary that links libtorch: ``TENSILE_TCH_PRELOAD``
    (libtorch_cuda.so, set by gpu-check.sh on a GPU run: the binaries do not
    link it, and without it libtorch sees no CUDA device) as LD_PRELOAD."""
    env = dict(os.environ)
    env.setdefault("RUST_BACKTRACE", "0")
    preload = os.environ.get("TENSILE_TCH_PRELOAD", "")
    if preload:
        env["LD_PRELOAD"] = preload
    return env


class SmiSampler:
    """Polls nvidia-smi for the device memory of a set of processes; keeps
    each one's maximum and the most they held together in one poll
    (``joint_peak_mib``), MiB, CUDA contexts included."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.pids: set[int] = set()
        self.peak_mib: dict[int, int] = {}
        self.joint_peak_mib = 0
        self.enabled = bool(os.environ.get("GPU_CHECK_SMI")) and shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SmiSampler:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            self.take(out)
            self._stop.wait(self.period_s)

    def take(self, out: str) -> None:
        """One poll's ``pid, used MiB`` lines."""
        held = 0
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                pid, mib = int(parts[0]), int(parts[1])
                if pid in self.pids:
                    self.peak_mib[pid] = max(self.peak_mib.get(pid, 0), mib)
                    held += mib
        self.joint_peak_mib = max(self.joint_peak_mib, held)


@dataclasses.dataclass
class Run:
    rc: int
    stdout: str
    seconds: float
    log: Path
    smi_peak_mib: int | None = None
    timed_out: bool = False
    #: Seconds it was given (the check's time left, less a margin).
    given_s: float = float("inf")

    def check_time(self, what: str) -> None:
        """A run stopped at the check's time limit having been given less
        than five minutes is not a result: :class:`results.OutOfTime`
        (rerun to resume). One given more is a failure (it hung)."""
        if self.timed_out and self.given_s < 300:
            raise results.OutOfTime(f"{what} was stopped at this run's time limit ({self.given_s:.0f} s): rerun to resume")

    def error(self) -> str:
        """The last lines of the log that say what went wrong."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()] if self.log.exists() else []
        tail = [ln for ln in lines if "Error" in ln or "error" in ln or "panicked" in ln][-2:] or lines[-2:]
        what = "timed out" if self.timed_out else f"exit status {self.rc}"
        return f"{what}: " + " | ".join(tail)[-400:]


def start(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Starts ``cmd`` with its stderr appended to ``log`` and its stdout to
    ``log`` + ``.out`` (files, not pipes: nothing blocks on a full pipe)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as err:
        err.write(f"$ {' '.join(cmd)}\n")
    with _out(log).open("w") as out, log.open("a") as err:
        return subprocess.Popen(list(cmd), stdout=out, stderr=err, text=True, env=env)


def _out(log: Path) -> Path:
    return log.with_name(log.name + ".out")


def finish(p: subprocess.Popen[str], log: Path, t0: float, timeout: float) -> Run:
    """Waits for ``p`` (at most ``timeout`` s, then stops it) and returns
    its stdout."""
    timed_out = False
    try:
        p.wait(timeout=min(max(1.0, timeout), 1e6))
    except subprocess.TimeoutExpired:
        timed_out = True
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    out = _out(log).read_text(errors="replace") if _out(log).exists() else ""
    return Run(124 if timed_out else p.returncode, out, time.time() - t0, log, timed_out=timed_out, given_s=timeout)


def run(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None, margin_s: float = 15) -> Run:
    """Runs ``cmd`` to its end or until the check's time is nearly up; its
    stdout is returned (and kept beside ``log``, which has its stderr)."""
    t0 = time.time()
    with SmiSampler() as smi:
        p = start(cmd, log, env)
        smi.pids.add(p.pid)
        r = finish(p, log, t0, results.time_left() - margin_s)
    r.smi_peak_mib = smi.peak_mib.get(p.pid) if smi.enabled else None
    return r
