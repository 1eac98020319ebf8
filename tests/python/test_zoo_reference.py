"""The zoo's graphs against the reference PyTorch models, name by name.

For the models torchvision has, the parameters of the exported graph (their
names, shapes and order) must equal `named_parameters()` of the torchvision
model, which also fixes the optimizer's update order.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torchvision

ROOT = Path(__file__).resolve().parents[2]
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))

REFERENCES = {
    "vgg16": lambda: torchvision.models.vgg16(weights=None),
    "resnet50": lambda: torchvision.models.resnet50(weights=None),
    "densenet121": lambda: torchvision.models.densenet121(weights=None),
    "inception_v3": lambda: torchvision.models.inception_v3(
        weights=None, aux_logits=True, init_weights=False
    ),
}


def exported_parameters(model: str):
    out = subprocess.run(
        [TENSILECTL, "graph", "export", "--model", model, "--batch", "2", "--compact"],
        check=True,
        capture_output=True,
    )
    graph = json.loads(out.stdout)
    produced = {t for op in graph["ops"] for t in op["outputs"]}
    return [
        (t["name"], tuple(t["shape"]))
        for t in graph["tensors"]
        if t["kind"] == "parameter" and t["id"] not in produced
    ]


@pytest.mark.parametrize("model", sorted(REFERENCES))
def test_parameters_match_torchvision(model):
    reference = [(n, tuple(p.shape)) for n, p in REFERENCES[model]().named_parameters()]
    ours = exported_parameters(model)
    assert len(ours) == len(reference)
    assert ours == reference
    assert sum(_numel(s) for _, s in ours) == sum(_numel(s) for _, s in reference)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
