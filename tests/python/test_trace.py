"""The PyTorch tracer (`clients/python`, `tensile.trace`) against tensilectl and the zoo.

Every traced graph must pass `tensilectl graph check`, hold exactly the
model's trainable parameters (names, order, `sum(p.numel())`), and, for the
models the zoo also builds, have the zoo's vanilla peak within 10% at the
same batch, resolution and optimizer (Adam, lr 0.001). Models are traced at
batch 2 to keep the file fast; the command line is exercised once.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torchvision

from tensile.trace import InputSpec, TraceError, trace_training_step
from tensile.trace.models import classification_loss, resolve, transformer_encoder

ROOT = Path(__file__).resolve().parents[2]
TENSILECTL = os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
PYTHON = sys.executable
BATCH = 2

ZOO_MODELS = ["resnet50", "vgg16", "densenet121", "inception_v3"]
FACTORIES = {"aten::empty", "aten::zeros", "aten::ones", "aten::full", "aten::scalar_tensor"}
RESOLUTION = {"inception_v3": 299}


def tensilectl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TENSILECTL, *args], capture_output=True, text=True)


def stats(*args: str) -> dict:
    out = tensilectl("graph", "stats", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Traces each model once per test run; returns the graph file."""
    cache: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("traced")

    def get(model: str) -> Path:
        if model not in cache:
            if model == "transformer_encoder":
                graph = trace_training_step(
                    transformer_encoder,
                    torch.optim.Adam,
                    [InputSpec("input", (BATCH, 128), torch.int64)],
                    optimizer_kwargs={"lr": 1e-3},
                    name=model,
                )
            else:
                r = RESOLUTION.get(model, 224)
                _, factory = resolve(f"torchvision:{model}")
                graph = trace_training_step(
                    factory,
                    torch.optim.Adam,
                    [InputSpec("input", (BATCH, 3, r, r))],
                    optimizer_kwargs={"lr": 1e-3},
                    name=model,
                )
            path = folder / f"{model}.json"
            path.write_text(json.dumps(graph))
            cache[model] = path
        return cache[model]

    return get


def reference_parameters(model: str) -> list[tuple[str, tuple[int, ...]]]:
    """`named_parameters()` of the model, built on the meta device (no memory)."""
    with torch.device("meta"):
        if model == "transformer_encoder":
            m = transformer_encoder()
        else:
            m = resolve(f"torchvision:{model}")[1]()
    return [(n, tuple(p.shape)) for n, p in m.named_parameters()]


def initial_parameters(graph: dict) -> list[tuple[str, tuple[int, ...]]]:
    produced = {t for op in graph["ops"] for t in op["outputs"]}
    return [
        (t["name"], tuple(t["shape"]))
        for t in graph["tensors"]
        if t["kind"] == "parameter" and t["id"] not in produced
    ]


@pytest.mark.parametrize("model", ZOO_MODELS + ["transformer_encoder"])
def test_traced_graph_is_valid_and_holds_the_parameters(model, traced):
    path = traced(model)
    check = tensilectl("graph", "check", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    graph = json.loads(path.read_text())
    reference = reference_parameters(model)
    assert initial_parameters(graph) == reference
    numel = sum(torch.Size(s).numel() for _, s in reference)
    assert stats(str(path))["params"] == numel
    # One iteration: all three phases, and one Adam update (addcdiv_) per parameter.
    phases = [op["phase"] for op in graph["ops"]]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    updates = [op for op in graph["ops"] if op["type"] == "aten::addcdiv_"]
    assert len(updates) == len(reference)
    assert all(op["phase"] == "optimizer" for op in updates)
    # Every op that is not a factory reads a tensor (none lost its inputs).
    assert all(op["inputs"] or op["type"] in FACTORIES for op in graph["ops"])


@pytest.mark.parametrize("model", ZOO_MODELS)
def test_vanilla_peak_matches_the_zoo(model, traced):
    ours = stats(str(traced(model)))
    zoo = stats("--model", model, "--batch", str(BATCH))
    assert ours["params"] == zoo["params"]
    # Same persistent memory, except the Adam step counters PyTorch keeps per
    # parameter (a 4-byte f32 scalar each), which the zoo's fused update lacks.
    n_params = len(reference_parameters(model))
    assert ours["persistent_bytes"] == zoo["persistent_bytes"] + 4 * n_params
    ratio = ours["vanilla_peak_bytes"] / zoo["vanilla_peak_bytes"]
    assert 0.9 <= ratio <= 1.1, (ours["vanilla_peak_bytes"], zoo["vanilla_peak_bytes"])


def test_aliases_follow_the_op_schemas(traced):
    graph = json.loads(traced("resnet50").read_text())
    tensors = graph["tensors"]
    views = {"aten::view", "aten::t", "aten::expand", "aten::detach", "aten::_reshape_alias"}
    seen_view = seen_in_place = 0
    for op in graph["ops"]:
        kinds = {a["output"]: a["kind"] for a in op.get("aliases", [])}
        if op["type"] in views:
            assert kinds == {0: "view"}, op
            seen_view += 1
        if op["type"].endswith("_"):
            assert kinds.get(0) == "in_place", op
            out, inp = tensors[op["outputs"][0]], tensors[op["inputs"][0]]
            assert (out["shape"], out["dtype"]) == (inp["shape"], inp["dtype"])
            seen_in_place += 1
    assert seen_view > 100 and seen_in_place > 1000
    # Batch norm writes its running statistics: new versions of the buffers.
    bn = next(op for op in graph["ops"] if op["type"] == "aten::native_batch_norm")
    names = [tensors[t]["name"] for t in bn["outputs"][3:]]
    assert names == ["bn1.running_mean'", "bn1.running_var'"]
    # Views and versions share their root's storage: keeping everything for
    # the whole iteration costs the bytes of the root tensors only.
    aliased = {op["outputs"][a["output"]] for op in graph["ops"] for a in op.get("aliases", [])}
    roots = sum(t["bytes"] for t in tensors if t["id"] not in aliased)
    assert stats(str(traced("resnet50")))["keep_all_peak_bytes"] == roots
    assert roots < 0.7 * sum(t["bytes"] for t in tensors)


def test_kinds_of_initial_tensors(traced):
    graph = json.loads(traced("resnet50").read_text())
    produced = {t for op in graph["ops"] for t in op["outputs"]}
    initial = {t["name"]: t["kind"] for t in graph["tensors"] if t["id"] not in produced}
    assert initial["input"] == "input" and initial["target"] == "input"
    assert initial["conv1.weight"] == "parameter"
    assert initial["bn1.running_mean"] == "buffer"
    assert initial["bn1.num_batches_tracked"] == "buffer"
    for state in ("exp_avg", "exp_avg_sq", "step"):
        assert initial[f"conv1.weight.{state}"] == "optimizer_state"
    loss = [t for t in graph["tensors"] if t["kind"] == "output"]
    assert len(loss) == 1 and loss[0]["shape"] == []
    # Each parameter's gradient, as the optimizer reads it, is named after it.
    grads = {t["name"]: t for t in graph["tensors"] if t["name"].endswith(".grad")}
    assert len(grads) == 161
    assert grads["conv1.weight.grad"]["kind"] == "gradient"
    assert grads["conv1.weight.grad"]["shape"] == [64, 3, 7, 7]
    # Views of parameters are not parameters (as in the zoo); updates are.
    fc_t = next(t for t in graph["tensors"] if t["name"] == "fc.t")
    assert fc_t["kind"] == "activation"
    assert next(t for t in graph["tensors"] if t["name"] == "fc.weight'")["kind"] == "parameter"


def test_sgd_has_one_momentum_buffer_per_parameter(tmp_path):
    graph = trace_training_step(
        lambda: torchvision.models.resnet18(),
        torch.optim.SGD,
        [InputSpec("input", (BATCH, 3, 64, 64))],
        optimizer_kwargs={"lr": 0.01, "momentum": 0.9},
        name="resnet18_sgd",
    )
    path = tmp_path / "r18.json"
    path.write_text(json.dumps(graph))
    assert tensilectl("graph", "check", str(path)).returncode == 0
    with torch.device("meta"):
        params = list(torchvision.models.resnet18().named_parameters())
    state = [t["name"] for t in graph["tensors"] if t["kind"] == "optimizer_state" and not t["name"].endswith("'")]
    assert state == [f"{n}.momentum_buffer" for n, _ in params]


def test_a_real_module_is_traced_without_touching_its_parameters(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    before = [p.detach().clone() for p in model.parameters()]
    graph = trace_training_step(model, torch.optim.Adam, [InputSpec("input", (4, 8))], name="mlp")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(graph))
    assert stats(str(path))["params"] == sum(p.numel() for p in model.parameters())


def test_inception_loss_adds_the_weighted_aux_loss():
    out = torchvision.models.InceptionOutputs(torch.zeros(2, 5), torch.zeros(2, 5))
    target = torch.tensor([0, 3])
    main = torch.nn.functional.cross_entropy(out.logits, target)
    assert torch.isclose(classification_loss(out, target), 1.4 * main)


BAD_MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Gate(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x * 2
            return x

    def branchy():
        return nn.Sequential(nn.Linear(8, 8), Gate(), nn.Linear(8, 4))

    class HostScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * float(x.abs().max())  # reads a value on the host

    class Custom(nn.Module):
        def forward(self, x):
            return HostScale.apply(x)

    def custom_function():
        return nn.Sequential(nn.Linear(8, 8), nn.Sequential(Custom()), nn.Linear(8, 4))
    """
)


@pytest.fixture()
def bad_models(tmp_path, monkeypatch):
    (tmp_path / "bad_models.py").write_text(BAD_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_data_dependent_control_flow_names_the_module(bad_models):
    _, factory = resolve("bad_models:branchy")
    with pytest.raises(TraceError) as e:
        trace_training_step(factory, torch.optim.Adam, [InputSpec("input", (2, 8))])
    assert "module '1' (Gate)" in str(e.value)
    assert "data-dependent control flow" in str(e.value)


def test_untraceable_custom_function_names_it_and_its_module(bad_models):
    out = subprocess.run(
        [PYTHON, "-m", "tensile.trace", "--model", "bad_models:custom_function", "--input-shape", "8", "--batch", "2"],
        capture_output=True,
        text=True,
        cwd=bad_models,
        env={**os.environ, "PYTHONPATH": str(bad_models)},
    )
    assert out.returncode == 1
    assert out.stdout == ""
    message = out.stderr.strip()
    assert message.startswith("error: cannot trace the backward of HostScaleBackward")
    assert "created in module '1.0' (Custom)" in message
    assert "custom autograd function HostScale.backward" in message


def test_the_command_writes_a_valid_graph(tmp_path):
    path = tmp_path / "graph.json"
    out = subprocess.run(
        [PYTHON, "-m", "tensile.trace", "--model", "torchvision:resnet50", "--batch", "2", "--optimizer", "adam", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "traced resnet50_b2_adam" in out.stderr
    check = tensilectl("graph", "check", str(path))
    assert check.returncode == 0, check.stdout
    assert stats(str(path))["params"] == 25_557_032


class _Tricky(torch.nn.Module):
    """Views that are lists (chunk), an in-place write through a slice, tied
    weights, and an LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.lstm = torch.nn.LSTM(16, 16, batch_first=True)
        self.fc = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(tokens))
        h = self.fc(h[:, -1])
        a, b = h.chunk(2, dim=1)
        h = torch.cat([a * 2, b], dim=1)
        h[:, :3] *= 2
        return self.head(h.relu())


def test_list_views_slices_and_tied_weights(tmp_path):
    graph = trace_training_step(_Tricky, torch.optim.Adam, [InputSpec("input", (4, 7), torch.int64)], name="tricky")
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(graph))
    check = tensilectl("graph", "check", str(path))
    assert check.returncode == 0, check.stdout
    # The tied weight is one parameter, updated once.
    names = [n for n, _ in initial_parameters(graph)]
    assert names.count("emb.weight") == 1 and not any(n.startswith("head.") for n in names)
    assert stats(str(path))["params"] == sum(p.numel() for p in _Tricky().parameters())
    # chunk -> split: both parts are views of the linear layer's output.
    split = next(op for op in graph["ops"] if op["type"] == "aten::split")
    assert split["aliases"] == [
        {"output": 0, "input": 0, "kind": "view"},
        {"output": 1, "input": 0, "kind": "view"},
    ]
    assert all(op["inputs"] or op["type"] in FACTORIES for op in graph["ops"])


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def test_every_input_binds_to_a_named_argument():
    """``@ARG`` attributes say which inputs each tensor argument takes (the
    kernels bind by them): together they cover every input, and ``mul(x, x)``
    style reuse points two arguments at one input."""
    graph = trace_training_step(_Tricky, torch.optim.Adam, [InputSpec("input", (4, 7), torch.int64)], name="tricky")
    reused = False
    for op in graph["ops"]:
        binding = {k: v for k, v in op.get("attrs", {}).items() if k.startswith("@") and isinstance(v, list)}
        bound = {i for k, v in binding.items() if k != "@step" for i in v if i >= 0}
        extra = set(op["attrs"].get("@step", []))
        assert bound | extra == set(range(len(op["inputs"]))), op
        flat = [i for k, v in binding.items() if k != "@step" for i in v]
        reused |= len(flat) > len(set(flat))
    assert reused, "some op reads one tensor through two arguments (addcmul_(g, g) in Adam)"


def test_step_dependent_scalars_are_recomputed_not_baked():
    """Adam's bias corrections change every step: the traced graph marks the
    two scalars with their formula and the step tensor they come from."""
    graph = trace_training_step(_mlp, torch.optim.Adam, [InputSpec("input", (2, 4))], optimizer_kwargs={"lr": 0.01})
    tensors = graph["tensors"]
    marked = [op for op in graph["ops"] if any(k.startswith("@scalar.") for k in op.get("attrs", {}))]
    params = [t["name"] for t in tensors if t["kind"] == "parameter" and not t["name"].endswith("'")]
    assert len(marked) == 2 * len(params)
    formulas = sorted(v for op in marked for k, v in op["attrs"].items() if k.startswith("@scalar."))
    assert formulas == ["adam.bias_correction2_sqrt"] * len(params) + ["adam.neg_step_size"] * len(params)
    for op in marked:
        attrs = op["attrs"]
        assert attrs["@lr"] == 0.01 and attrs["@beta1"] == 0.9 and attrs["@beta2"] == 0.999
        step = tensors[op["inputs"][attrs["@step"][0]]]
        owner = op["name"].split(".update.")[0]
        # The step tensor after this step's increment.
        assert step["name"] == f"{owner}.step'" and step["kind"] == "optimizer_state"


def test_an_unknown_step_dependent_scalar_is_refused():
    """NAdam bakes a momentum schedule no formula here reproduces: refused,
    naming the op, rather than a graph that is right only at the traced step."""
    with pytest.raises(TraceError, match=r"update\..*attribute .* no known formula"):
        trace_training_step(_mlp, torch.optim.NAdam, [InputSpec("input", (2, 4))])
