"""`tensile.plan` and `tensile.apply` on the CPU: a plan applied inside eager training.

The proofs of issue 15:

* parity: three Adam steps of a model trained with the hook give gradients
  (every step) and parameters bit-identical (`torch.equal`) to the same
  three steps without it, on one thread, same init, same batches, same RNG;
* memory: the hook's own count of *resident saved bytes* (bytes of the
  distinct activation storages that autograd saved and that the hook holds
  on the device, sampled after each forward/backward op once that op's
  events have fired) peaks within 5% of the plan's prediction of the same
  quantity (`Schedule.predicted_saved_curve`: each saved storage from its
  producing op to its last backward read, minus the stretches the plan's
  events keep it on the host). The plan must save at least 25% of the
  vanilla saved peak, so a hook that moved nothing would fail;
* a model changed after tracing is refused, naming the first differing op.

Models are kept small (ResNet-18 at 96x96, batch 8; the tracer's transformer
encoder at d_model 64) so that the file runs in seconds.
"""

import os
import tempfile
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn
from torch.nn import functional as F

import tensile
from tensile.hook import Schedule
from tensile.trace.models import TransformerClassifier

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, scope="module")
def tensilectl_env():
    """`tensile.plan` finds tensilectl as CI sets it, else in this checkout."""
    os.environ.setdefault("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
    yield


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return TransformerClassifier(vocab=100, seq_len=32, d_model=64, heads=4, layers=2, classes=10)


def image_batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 96, 96, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def token_batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 100, (4, 32), generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


def adam(params):
    return torch.optim.Adam(params, lr=1e-3)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


def train(model: nn.Module, batches, plan=None, make_optimizer=adam, in_flight=0):
    """STEPS steps of the user's unchanged loop; returns (grads per step, params, hook)."""
    optimizer = make_optimizer(model.parameters())
    grads = []
    torch.manual_seed(2)  # dropout masks: the same draws with and without the hook
    hook = tensile.apply(plan, model, optimizer, copies_complete_after=in_flight) if plan is not None else None
    applier = hook.__enter__() if hook is not None else None
    try:
        for inputs, target in batches:
            loss = F.cross_entropy(model(inputs), target)
            loss.backward()
            optimizer.step()
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.zero_grad()
    finally:
        if hook is not None:
            hook.__exit__(None, None, None)
    return grads, [p.detach().clone() for p in model.parameters()], applier


def planned(model: nn.Module, batch, tmp_path: Path, make_optimizer=adam):
    optimizer = make_optimizer(model.parameters())
    return tensile.plan(model, optimizer, batch, F.cross_entropy, workdir=tmp_path)


def assert_bit_identical(plain, hooked):
    grads_a, params_a, _ = plain
    grads_b, params_b, _ = hooked
    for step, (ga, gb) in enumerate(zip(grads_a, grads_b)):
        for i, (a, b) in enumerate(zip(ga, gb)):
            assert torch.equal(a, b), f"gradient {i} differs at step {step}"
    for i, (a, b) in enumerate(zip(params_a, params_b)):
        assert torch.equal(a, b), f"parameter {i} differs after {STEPS} steps"


@pytest.mark.parametrize(
    "make, batches",
    [(resnet18, image_batches), (encoder, token_batches)],
    ids=["resnet18", "transformer_encoder"],
)
def test_three_steps_are_bit_identical_with_the_hook(make, batches, tmp_path):
    data = batches(STEPS)
    plain = train(make(), data)
    model = make()
    plan = planned(model, data[0], tmp_path)
    assert plan.events, "the plan has no events: nothing would be tested"
    hooked = train(model, data, plan)
    assert_bit_identical(plain, hooked)
    stats = hooked[2].stats
    assert len(stats) == STEPS
    assert stats[0].initializing and not stats[1].initializing
    # The first step is checked op by op, the next ones run on its record.
    assert [s.mode for s in stats] == ["checked"] + ["fast"] * (STEPS - 1)
    assert all(s.ops == len(plan.ops) for s in stats[1:])
    assert all(s.swap_outs > 0 and s.swap_ins > 0 for s in stats)
    assert stats[-1].late == 0, f"late fetches in a steady iteration: {stats[-1].late_storages}"
    # The checked step timed its forward and backward ops (its optimizer
    # step, the state-creating first, is not the graph's); the detaches the
    # hook makes unnecessary at 0.
    op_ns = stats[0].op_ns
    assert sorted(op_ns) == list(range(Schedule(plan).optimizer_start))
    assert all(ns > 0 for k, ns in op_ns.items() if plan.ops[k]["type"] != "aten::detach")
    assert stats[-1].op_ns == {}, "a fast step times nothing"


def test_sgd_with_momentum_and_weight_decay_is_bit_identical(tmp_path):
    data = token_batches(STEPS)
    plain = train(encoder(), data, make_optimizer=sgd)
    model = encoder()
    plan = planned(model, data[0], tmp_path, make_optimizer=sgd)
    hooked = train(model, data, plan, make_optimizer=sgd)
    assert_bit_identical(plain, hooked)
    assert hooked[2].stats[-1].swap_outs > 0


def test_a_plan_under_a_budget_applies_bit_identically(tmp_path):
    data = image_batches(STEPS)
    plain = train(resnet18(), data)
    model = resnet18()
    free = planned(model, data[0], tmp_path / "free")
    budget_mb = int(free.prediction["planned_peak_bytes"] / 1e6 * 0.8)
    optimizer = adam(model.parameters())
    plan = tensile.plan(model, optimizer, data[0], F.cross_entropy, budget_mb=budget_mb, workdir=tmp_path)
    assert plan.prediction["planned_peak_bytes"] < free.prediction["planned_peak_bytes"]
    hooked = train(model, data, plan)
    assert_bit_identical(plain, hooked)


def test_gradient_clipping_between_backward_and_step_is_allowed(tmp_path):
    data = token_batches(STEPS)

    def run(model, plan=None):
        optimizer = adam(model.parameters())
        torch.manual_seed(2)
        hook = tensile.apply(plan, model, optimizer) if plan is not None else nullcontext()
        with hook as applier:
            for inputs, target in data:
                F.cross_entropy(model(inputs), target).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01, foreach=False)
                optimizer.step()
                optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()], applier

    plain, _ = run(encoder())
    model = encoder()
    hooked, applier = run(model, planned(model, data[0], tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))
    # The checked step counts the clipping's ops; the fast ones never see them.
    assert applier.stats[0].untraced_ops > 0 and applier.stats[-1].late == 0
    first, last = applier.measurements(0), applier.measurements()
    # The first iteration fetches what its parking left on the host, and the
    # prefetches planned inside autograd nodes; the last one fetches nothing.
    assert first["iteration"] == 0 and len(first["late_prefetches"]) + first["passive_swaps"] == applier.stats[0].late
    assert first["op_latency_s"] == []  # its optimizer step is not checked
    assert last["iteration"] == STEPS - 1 and last["late_prefetches"] == [] and last["stall_s"] == 0
    # No step after the first was timed op by op (without a scheduler none is).
    assert last["op_latency_s"] == [] and last["peak_bytes"] > 0


def test_copies_in_flight_lose_nothing(tmp_path):
    """Copies that complete only some op boundaries later, as on a GPU: a
    device copy is held until its swap-out completes, a consumer waits for
    a swap-in in flight, a write cancels a swap-out; results stay identical."""
    data = token_batches(STEPS)
    plain = train(encoder(), data)
    model = encoder()
    plan = planned(model, data[0], tmp_path)
    hooked = train(model, data, plan, in_flight=3)
    assert_bit_identical(plain, hooked)
    applier = hooked[2]
    assert not applier.inflight and all(res.on_device and res.copy is None for res in applier.persist.values())
    assert applier.engine.pool.in_use_bytes == 0, "a host buffer was never given back"
    assert applier.engine.waited > 0, "no copy was ever in flight when needed: the test tested nothing"


def test_resident_saved_peak_matches_the_plan(tmp_path):
    data = image_batches(2)
    model = resnet18()
    plan = planned(model, data[0], tmp_path)
    schedule = Schedule(plan)
    predicted = max(schedule.predicted_saved_curve())
    vanilla = max(schedule.vanilla_saved_curve())
    assert predicted < 0.75 * vanilla, "the plan must move saved activations for this test to mean anything"
    _, _, applier = train(model, data, plan)
    measured = applier.stats[-1].peak_saved_bytes
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted, vanilla)


def test_a_model_changed_after_tracing_is_refused_naming_the_op(tmp_path):
    data = image_batches(1)
    model = resnet18()
    plan = planned(model, data[0], tmp_path)
    model.relu = nn.GELU()  # the stem's activation
    index = next(op["id"] for op in plan.ops if op["name"] == "relu.relu_")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with pytest.raises(tensile.PlanMismatchError) as e:
        with tensile.apply(plan, model, optimizer) as applier:
            F.cross_entropy(model(data[0][0]), data[0][1]).backward()
    message = str(e.value)
    assert f"op {index}:" in message and "aten::relu_" in message and "aten::gelu" in message, message
    assert "\n" not in message
    # Leaving the block put every planned tensor back on the device.
    assert all(res.on_device for res in applier.persist.values())


def test_evaluation_inside_the_block_is_left_alone(tmp_path):
    data = token_batches(2)
    model = encoder()
    plan = planned(model, data[0], tmp_path)
    optimizer = adam(model.parameters())
    with tensile.apply(plan, model, optimizer) as applier:
        for inputs, target in data:
            F.cross_entropy(model(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                model(inputs)
            model(inputs)  # eval mode with gradients on: still not a training iteration
            model.train()
    assert len(applier.stats) == 2 and applier.stats[-1].ops == len(plan.ops)


def test_a_changed_shape_is_refused_before_training(tmp_path):
    data = image_batches(1)
    model = resnet18()
    plan = planned(model, data[0], tmp_path)
    model.fc = nn.Linear(512, 12)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with pytest.raises(tensile.PlanApplyError, match=r"'fc.weight' has shape \[12, 512\]"):
        with tensile.apply(plan, model, optimizer):
            pass


def test_a_plan_without_a_workdir_leaves_no_files_behind(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = encoder()
    optimizer = adam(model.parameters())
    plan = tensile.plan(model, optimizer, token_batches(1)[0], F.cross_entropy)
    assert plan.events and plan.graph_path is None and plan.plan_path is None
    # Nor when planning fails.
    with pytest.raises(tensile.PlanError, match="unknown device"):
        tensile.plan(model, optimizer, token_batches(1)[0], F.cross_entropy, device_profile="tpu")
    assert list(tmp_path.iterdir()) == []


def test_an_optimizer_that_does_not_hold_the_models_parameters_is_refused():
    model = resnet18()
    optimizer = torch.optim.Adam(list(model.parameters())[1:], lr=1e-3)
    with pytest.raises(tensile.PlanError, match="optimizer's parameter 0 is bn1.weight, the model's trainable parameter 0 is conv1.weight"):
        tensile.plan(model, optimizer, image_batches(1)[0], F.cross_entropy)


def test_planning_needs_no_tensilectl_and_an_unknown_profile_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSILECTL", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    model = resnet18()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert tensile.plan(model, optimizer, image_batches(1)[0], F.cross_entropy).events
    with pytest.raises(tensile.PlanError, match='unknown device "tpu": not a built-in profile'):
        tensile.plan(model, optimizer, image_batches(1)[0], F.cross_entropy, device_profile="tpu")


def test_plan_knows_the_graph_and_the_events(tmp_path):
    model = encoder()
    plan = planned(model, token_batches(1)[0], tmp_path)
    names = {t["id"]: t["name"] for t in plan.tensors}
    for e in plan.events:
        assert names[e["tensor"]] == e["tensor_name"]
        if "trigger_op" in e:
            assert plan.ops[e["trigger_op"]]["name"] == e["trigger_op_name"]
    assert plan.graph_path.exists() and plan.plan_path.exists()
    assert tensile.load_plan(plan.graph_path, plan.plan_path).events == plan.events


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA copy engine is not exercised")
def test_cuda_parity(tmp_path):
    def per_tensor_adam(params):
        return torch.optim.Adam(params, lr=1e-3, foreach=False)

    data = [(x.cuda(), y.cuda()) for x, y in image_batches(STEPS)]
    # cuDNN's default backward convolutions sum in any order: without its
    # deterministic algorithms two plain runs already differ.
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):
        plain = train(resnet18().cuda(), data, make_optimizer=per_tensor_adam)
        # The device repeats itself, so a difference below is the hook's.
        assert_bit_identical(plain, train(resnet18().cuda(), data, make_optimizer=per_tensor_adam))
        model = resnet18().cuda()
        plan = planned(model, data[0], tmp_path, make_optimizer=per_tensor_adam)
        hooked = train(model, data, plan, make_optimizer=per_tensor_adam)
    assert_bit_identical(plain, hooked)


def test_an_epoch_whose_last_batch_is_smaller_trains_to_the_end_bit_identically(tmp_path, caplog):
    """Two epochs of 4 full batches and a last one of 3 (a DataLoader
    without drop_last): the small batches run unplanned, said once, the
    step after each is checked again, and training is bit-identical."""
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(35, 3, 64, 64, generator=g), torch.randint(0, 10, (35,), generator=g)
    epoch = [(xs[i : i + 8], ys[i : i + 8]) for i in range(0, 35, 8)]
    data = epoch + epoch
    plain = train(resnet18(), data)
    model = resnet18()
    plan = planned(model, data[0], tmp_path)
    with caplog.at_level("WARNING", logger="tensile.hook"):
        hooked = train(model, data, plan)
    assert_bit_identical(plain, hooked)
    modes = [s.mode for s in hooked[2].stats]
    assert modes == ["checked", "fast", "fast", "fast", "off", "checked", "fast", "fast", "fast", "off"], modes
    said = [r.getMessage() for r in caplog.records if "drop_last=True" in r.getMessage()]
    assert len(said) == 1 and "drop_last=True" in said[0], said


def test_a_metric_computed_before_backward_is_stepped_over(tmp_path):
    data = image_batches(STEPS)

    def run(model, plan=None):
        optimizer = adam(model.parameters())
        hits = []
        with tensile.apply(plan, model, optimizer) if plan is not None else nullcontext() as applier:
            for inputs, target in data:
                out = model(inputs)
                hits.append((out.argmax(1) == target).float().mean().item())  # before backward()
                F.cross_entropy(out, target).backward()
                optimizer.step()
                optimizer.zero_grad()
        return hits, [p.detach().clone() for p in model.parameters()], applier

    plain_hits, plain, _ = run(resnet18())
    model = resnet18()
    hits, hooked, applier = run(model, planned(model, data[0], tmp_path))
    assert hits == plain_hits and all(torch.equal(a, b) for a, b in zip(plain, hooked))
    assert applier.stats[0].untraced_ops > 0 and [s.mode for s in applier.stats] == ["checked", "fast", "fast"]


def test_a_fast_step_calls_python_only_at_its_points(tmp_path):
    """Python per step: a pack and an unpack per saved tensor, the modules'
    pre-hooks, the optimizer's chunks, the iteration's start and the
    optimizer's pre- and post-hooks, nothing per op; the events go in
    batches."""
    data = image_batches(STEPS)
    model = resnet18()
    plan = planned(model, data[0], tmp_path)
    _, _, applier = train(model, data, plan)
    s = applier.stats[-1]
    ops = len(plan.ops)
    assert s.mode == "fast" and s.packs > 0
    bound = 2 * s.packs + len(applier.modules) + len(applier.chunks) + 3
    assert s.calls <= bound < ops, (s.calls, bound, ops)
    # At most a batch of swap-outs and one of swap-ins per point with events.
    assert 0 < s.batches <= 2 * sum(1 for evs in applier.fire_at if evs)


def test_a_compiled_model_is_refused_in_one_line(tmp_path):
    model = resnet18()
    plan = planned(model, image_batches(1)[0], tmp_path)
    with pytest.raises(tensile.PlanApplyError, match="torch.compile") as e:
        tensile.apply(plan, torch.compile(model), adam(model.parameters())).__enter__()
    assert "\n" not in str(e.value)


def test_every_step_is_checked_and_timed_with_check_ops(tmp_path):
    data = token_batches(STEPS)
    plain = train(encoder(), data)
    model = encoder()
    plan = planned(model, data[0], tmp_path)
    optimizer = adam(model.parameters())
    torch.manual_seed(2)
    with tensile.apply(plan, model, optimizer, check="ops") as applier:
        for inputs, target in data:
            F.cross_entropy(model(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(plain[1], [p.detach() for p in model.parameters()]))
    assert [s.mode for s in applier.stats] == ["checked"] * STEPS
    assert sorted(applier.stats[-1].op_ns) == list(range(len(plan.ops)))
    assert len(applier.measurements()["op_latency_s"]) == len(plan.ops)


class Branchy(nn.Module):
    """Data-dependent control flow: which layer runs depends on the values
    of the input (``on="input"``) or of a parameter (``on="weight"``)."""

    def __init__(self, on: str = "input") -> None:
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)
        self.on = on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = x if self.on == "input" else self.a.weight
        return self.a(x) if value.sum() > 0 else torch.tanh(self.b(x))


def test_a_branch_on_a_parameter_value_is_refused_in_one_line(tmp_path):
    model = Branchy(on="weight")
    optimizer = adam(model.parameters())
    batch = (torch.randn(2, 4), torch.randint(0, 2, (2,)))
    with pytest.raises(tensile.PlanError) as e:
        tensile.plan(model, optimizer, batch, F.cross_entropy, workdir=tmp_path)
    message = str(e.value)
    assert "\n" not in message and "Branchy" in message and "data-dependent control flow" in message, message


def test_a_branch_on_the_input_follows_the_example_and_another_path_is_refused(tmp_path):
    """The tracer reads what eager mode reads from the example batch
    (tensile.trace.eager_paths): the plan holds for batches that take the
    same branch; one that takes the other is refused, naming the op."""
    torch.manual_seed(0)
    model = Branchy()
    reference = Branchy()
    reference.load_state_dict(model.state_dict())
    positive = (torch.rand(2, 4) + 0.1, torch.tensor([0, 1]))
    optimizer = adam(model.parameters())
    plan = tensile.plan(model, optimizer, positive, F.cross_entropy, workdir=tmp_path)
    assert any(op["name"].startswith("a.") for op in plan.ops) and not any(op["name"].startswith("b.") for op in plan.ops)
    for m, opt, hook in ((reference, adam(reference.parameters()), None), (model, optimizer, plan)):
        with tensile.apply(hook, m, opt) if hook is not None else nullcontext():
            for _ in range(STEPS):
                F.cross_entropy(m(positive[0]), positive[1]).backward()
                opt.step()
                opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    with pytest.raises(tensile.PlanMismatchError, match=r"^op \d+: the plan expects .*, the model ran aten::tanh:") as e:
        with tensile.apply(plan, model, optimizer):
            F.cross_entropy(model(-positive[0]), positive[1]).backward()
    assert "\n" not in str(e.value)


def test_the_predicted_saved_curve_follows_its_definition():
    """A five-op graph worked by hand: activation A (400 B) and B (800 B) are
    made in the forward, read in the backward; the plan has A on the host
    from after op 1 until after op 3."""
    t = lambda i, name, kind, nbytes: {"id": i, "name": name, "shape": [nbytes // 4], "dtype": "f32",
                                       "bytes": nbytes, "kind": kind}
    op = lambda i, phase, ins, outs: {"id": i, "name": f"op{i}", "type": "aten::mul", "phase": phase,
                                      "inputs": ins, "outputs": outs}
    graph = {
        "format": "tensile-graph/v1", "name": "tiny",
        "tensors": [t(0, "x", "input", 400), t(1, "A", "activation", 400), t(2, "B", "activation", 800),
                    t(3, "loss", "output", 4), t(4, "gB", "gradient", 800), t(5, "gA", "gradient", 400)],
        "ops": [op(0, "forward", [0], [1]), op(1, "forward", [1], [2]), op(2, "forward", [2], [3]),
                op(3, "backward", [3, 2], [4]), op(4, "backward", [4, 1], [5])],
    }
    ev = lambda kind, after: {"kind": kind, "tensor": 1, "tensor_name": "A", "trigger": "after",
                              "trigger_op": after, "trigger_op_name": f"op{after}", "delay_ns": 0}
    plan = tensile.Plan(graph, {"format": "tensile-plan/v1", "graph": "tiny", "version": 1, "start_on_host": [],
                                "events": [ev("swap_out", 1), ev("swap_in", 3)], "prediction": {}, "diagnostics": []})
    s = Schedule(plan)
    assert s.saved_storages() == {1: (0, 4), 2: (1, 3)}
    assert s.vanilla_saved_curve() == [400, 1200, 1200, 400, 0]
    assert s.predicted_saved_curve() == [400, 800, 800, 400, 0]


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 16), nn.Linear(4, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.a(x) + self.b(y)))


def test_stateless_sgd_and_two_inputs_are_checked_from_the_first_step(tmp_path):
    torch.manual_seed(0)
    model = TwoInputs()
    reference = TwoInputs()
    reference.load_state_dict(model.state_dict())
    batch = ((torch.randn(5, 8), torch.randn(5, 4)), torch.randint(0, 3, (5,)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = tensile.plan(model, optimizer, batch, F.cross_entropy, workdir=tmp_path)
    for m, hook in ((reference, None), (model, plan)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1) if hook is None else optimizer
        with tensile.apply(hook, m, opt) if hook is not None else nullcontext() as applier:
            for _ in range(STEPS):
                F.cross_entropy(m(*batch[0]), batch[1]).backward()
                opt.step()
                opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    # Plain SGD has no state to create: every step, the first included, is checked whole.
    assert [(s.initializing, s.ops) for s in applier.stats] == [(False, len(plan.ops))] * STEPS


def test_a_multi_tensor_optimizer_is_refused_before_training(tmp_path):
    model = encoder()
    plan = planned(model, token_batches(1)[0], tmp_path)
    with pytest.raises(tensile.PlanApplyError, match="group 0 runs foreach .*foreach=False"):
        tensile.apply(plan, model, torch.optim.Adam(model.parameters(), foreach=True)).__enter__()


def test_plans_switched_between_steps_apply_bit_identically(tmp_path):
    """`hook.use_plan` (what a scheduler's new plan goes through): the
    planned plan, then one without events, then the planned one again, each
    from a step boundary on; persistent tensors the old plan parked across
    iterations come back; results stay identical."""
    data = token_batches(5)
    plain = train(encoder(), data)[1]
    model = encoder()
    plan = planned(model, data[0], tmp_path)
    bare = tensile.Plan(plan.graph, {**plan.plan, "version": 7, "events": [], "start_on_host": []})
    optimizer = adam(model.parameters())
    torch.manual_seed(2)
    with tensile.apply(plan, model, optimizer) as applier:
        for i, (inputs, target) in enumerate(data):
            F.cross_entropy(model(inputs), target).backward()
            optimizer.step()
            optimizer.zero_grad()
            if i == 1:
                applier.use_plan(bare, job_id=3)
                assert all(res.on_device for res in applier.persist.values())
            if i == 2:
                applier.use_plan(plan, job_id=3)
    assert all(torch.equal(a, b) for a, b in zip(plain, [p.detach() for p in model.parameters()]))
    runs = [(s.plan_job, s.plan_version, s.swap_outs > 0) for s in applier.stats]
    v = plan.plan["version"]
    assert runs == [(0, v, True), (0, v, True), (3, 7, False), (3, v, True), (3, v, True)], runs
    assert applier.stats[-1].late == 0
    assert applier.measurements(2)["plan_version"] == 7


def test_a_plan_is_switched_only_between_steps_and_only_for_the_same_graph(tmp_path):
    data = token_batches(1)
    model = encoder()
    plan = planned(model, data[0], tmp_path / "encoder")
    other = planned(resnet18(), image_batches(1)[0], tmp_path / "resnet")
    optimizer = adam(model.parameters())
    with tensile.apply(plan, model, optimizer) as applier:
        with pytest.raises(tensile.PlanMismatchError, match=r"op 0 is .* in the applied graph, .* in the new plan's"):
            applier.use_plan(other)
        refused = []

        def mid_step(module, args, out):
            with pytest.raises(tensile.PlanApplyError, match="between iterations, not inside one") as e:
                applier.use_plan(plan)
            refused.append(str(e.value))

        handle = model.head.register_forward_hook(mid_step)
        F.cross_entropy(model(data[0][0]), data[0][1]).backward()
        handle.remove()
        optimizer.step()
    assert refused and applier.plan is plan
    with pytest.raises(tensile.PlanApplyError, match="server is a bool"):
        tensile.apply(plan, model, optimizer, server=True).__enter__()


def test_a_plan_that_recomputes_applies_bit_identically(tmp_path):
    """A plan made for a GPU under a tight budget recomputes convolutions'
    outputs: the hook drops each at the plan's release and runs its
    producer again from the saved inputs; training stays bit-identical and
    the saved peak is the plan's, lower than swapping alone reaches."""
    data = image_batches(STEPS)
    plain = train(resnet18(), data)
    model = resnet18()
    optimizer = adam(model.parameters())
    free = tensile.plan(model, optimizer, data[0], F.cross_entropy, device_profile="a6000")
    budget_mb = int(free.prediction["planned_peak_bytes"] * 0.6 / 1e6)
    plan = tensile.plan(model, optimizer, data[0], F.cross_entropy, device_profile="a6000", budget_mb=budget_mb)
    recomputed = {e["tensor"] for e in plan.events if e["kind"] == "recompute"}
    assert recomputed, "the plan recomputes nothing: the test would test nothing"
    hooked = train(model, data, plan)
    assert_bit_identical(plain, hooked)
    applier = hooked[2]
    assert not applier.refused_recomputes
    for s in applier.stats:
        assert s.released == s.recomputed == len(recomputed), (s.mode, s.released, s.recomputed)
    assert applier.stats[-1].late == 0, applier.stats[-1].late_storages
    # The plan's prediction of the resident saved bytes, within 1% (the hook
    # does not hold storages under 64 KiB, which the prediction counts).
    predicted = max(Schedule(plan).predicted_saved_curve())
    assert abs(applier.stats[-1].peak_saved_bytes - predicted) <= 0.01 * predicted


def test_a_plan_over_its_budget_is_said_when_it_is_made(tmp_path, caplog):
    model = resnet18()
    with caplog.at_level("WARNING", logger="tensile"):
        plan = tensile.plan(model, adam(model.parameters()), image_batches(1)[0], F.cross_entropy, budget_mb=1)
    assert plan.prediction["planned_peak_bytes"] > 1_000_000
    said = [r.getMessage() for r in caplog.records if "over budget_mb=1" in r.getMessage()]
    assert len(said) == 1 and "lower bound" in said[0] and "\n" not in said[0], said
