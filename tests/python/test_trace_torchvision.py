"""The tracer takes the models users bring: torchvision's families, builders
that compute with tensor values, and one-line errors for the rest.

`scripts/trace_torchvision.py` tries every torchvision classification model
(the table is in `docs/trace-torchvision.md`); this file keeps a
representative subset fast for CI, at 64x64 and batch 2: one model per
family that builds differently (RegNet computes its widths with
`.tolist()` while building, so the meta device cannot build it), each graph
checked by `tensilectl graph check` and holding the model's parameters.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tensile.trace import InputSpec, TraceError, trace_training_step
from tensile.trace.capture import build_model
from tensile.trace.models import resolve

ROOT = Path(__file__).resolve().parents[2]
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))

SUBSET = ["regnet_y_400mf", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1", "vit_b_32"]


def check(graph: dict, tmp_path: Path) -> None:
    path = tmp_path / f"{graph['name']}.json"
    path.write_text(json.dumps(graph))
    done = subprocess.run([TENSILECTL, "graph", "check", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", SUBSET)
def test_torchvision_family_traces(name, tmp_path):
    _, factory = resolve(f"torchvision:{name}", resolution=64)
    graph = trace_training_step(factory, torch.optim.Adam, [InputSpec("input", (2, 3, 64, 64))], name=name)
    check(graph, tmp_path)
    with torch.device("meta") if not name.startswith("regnet") else torch.device("cpu"):
        reference = factory()
    want = [n for n, p in reference.named_parameters() if p.requires_grad]
    got = [t["name"] for t in graph["tensors"] if t["kind"] == "parameter" and not t["name"].endswith("'")]
    assert got == want


class ValueBuilt(nn.Module):
    """Widths computed from tensor values at construction, as RegNet does."""

    def __init__(self) -> None:
        super().__init__()
        widths = (torch.arange(1, 4) * 8).tolist()
        self.layers = nn.Sequential(*[nn.Linear(a, b) for a, b in zip([4, *widths[:-1]], widths)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_a_builder_that_reads_tensor_values_is_built_on_the_cpu(tmp_path):
    with pytest.raises(NotImplementedError), torch.device("meta"):
        ValueBuilt()  # what crashed the tracer before
    graph = trace_training_step(
        ValueBuilt, torch.optim.SGD, [InputSpec("input", (2, 4))], InputSpec("target", (2,), torch.int64),
        loss_fn=F.cross_entropy, optimizer_kwargs={"lr": 0.1}, name="value_built",
    )
    check(graph, tmp_path)
    assert [t["shape"] for t in graph["tensors"] if t["kind"] == "parameter"][:2] == [[8, 4], [8]]


def test_a_model_that_cannot_be_built_is_one_line_naming_it():
    def broken() -> nn.Module:
        raise ValueError("bad width\nsecond line")

    with pytest.raises(TraceError) as e:
        build_model(broken, "mine")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("cannot build model 'mine' (")
    assert "broken" in message and "ValueError: bad width" in message


def test_the_command_reports_an_unbuildable_model_in_one_line(tmp_path):
    module = tmp_path / "badmodels.py"
    module.write_text("def broken():\n    raise RuntimeError('no such layer\\nmore')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [os.sys.executable, "-m", "tensile.trace", "--model", "badmodels:broken", "--batch", "1"],
        capture_output=True, text=True, env=env,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot build model" in lines[0] and "RuntimeError: no such layer" in lines[0]


def test_an_input_too_small_for_the_model_is_one_line_naming_the_module(tmp_path):
    module = tmp_path / "smallmodels.py"
    module.write_text(
        "from torch import nn\n"
        "def pooled():\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(8), nn.Flatten(), nn.Linear(4, 10))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [os.sys.executable, "-m", "tensile.trace", "--model", "smallmodels:pooled", "--batch", "1",
         "--resolution", "4", "-o", str(tmp_path / "g.json")],
        capture_output=True, text=True, env=env,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no logged traceback from the fake-tensor kernels
    assert "module '1' (MaxPool2d)" in lines[0] and "shape does not fit" in lines[0], lines[0]
