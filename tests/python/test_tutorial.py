"""docs/tutorial.md, run as a reader would: its training script saved as
`train.py`, its shell blocks run in order in one shell (the install block
aside: the test suite has set up and built already), with the binaries
this suite tests and a private default socket. Both scripts must train to
the end under the scheduler's plans."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BIN = ROOT / "target" / "debug"
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(BIN / "tensile-scheduler"))
TENSILECTL = os.environ.get("TENSILECTL", str(BIN / "tensilectl"))

FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(TUTORIAL.read_text())]


def test_the_tutorials_commands_train_both_scripts(tmp_path):
    found = blocks()
    scripts = [body for lang, body in found if lang == "python" and body.startswith("# train.py")]
    assert len(scripts) == 1, "the tutorial has one train.py block"
    (tmp_path / "train.py").write_text(scripts[0])
    shell = [body for lang, body in found if lang == "sh"]
    install = [b for b in shell if "scripts/setup.sh" in b]
    assert len(install) == 1, "one install block, the one this test leaves to the suite's setup"
    steps = [b for b in shell if b is not install[0]]
    assert steps, "the tutorial has commands to run"
    script = "\n".join(steps)
    for release, here in (
        ("target/release/tensile-scheduler", SCHEDULER),
        ("target/release/tensilectl", TENSILECTL),
        (".venv/bin/python", sys.executable),
    ):
        script = script.replace(release, here)
    # Whatever is left running if a step fails is stopped with the shell.
    script = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, XDG_RUNTIME_DIR=str(run))
    env.pop("TENSILE_SERVER", None)
    env.pop("TENSILE_SOCKET_DIR", None)
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"the tutorial's commands failed:\n{done.stdout}\n{done.stderr}"
    assert "budget" in done.stdout, f"tensilectl status printed no budget line:\n{done.stdout}"
    for name in ("first", "second"):
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"{name}: step")]
        assert [int(line.split()[2].rstrip(",")) for line in lines] == [10, 20, 30, 40], (
            f"{name} did not train to the end:\n{done.stdout}\n{(tmp_path / (name + '.log')).read_text()}"
        )
        versions = {int(re.search(r"plan version (\d+)", line).group(1)) for line in lines}
        assert min(versions) >= 1, f"{name} trained on no plan of the scheduler's: {lines}"
