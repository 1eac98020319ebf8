"""Gates, pace and the memory budget in the hook (issue 20, several jobs on one GPU).

* The gate's arithmetic is the Rust one: the hook runs
  ``planner/src/gate.rs``'s types themselves (``tensile._core``), whose
  unit tests hold the cases; here, the binding keeps their invariants on
  random gates and refuses what is not a gate, naming what is wrong.
* A plan file with a gate makes a training loop start its steps at the
  gate's slots of ``time.monotonic_ns()``; a late step starts at once; a
  step more than a period late drops the missed slots; gates move nothing
  but time (parameters bit-identical). A pace holds ops back to their
  planned start without entering the reported latencies.
* ``budget_mb`` below what the plan predicts: the hook's resident saved
  bytes never pass it, results stay bit-identical, and the guard acted; a
  budget below one op's need is a clear error.

CPU, one thread, the tracer's transformer encoder (d_model 64), so that the
file runs in seconds; the gate tests sleep about a second each.
"""

import json
import os
import random
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tensile
from tensile import _core
from tensile.hook import Gate, GateClock, Schedule
from tensile.hook.gate import gate_of, pace_of
from tensile.trace.models import TransformerClassifier

ROOT = Path(__file__).resolve().parents[2]
PERIOD = 200_000_000  # ns
PHASE = 70_000_000
#: How far a measured step start may be from the one the gate clock gives
#: (sleep overshoot, a loaded machine).
TOL = 6_000_000


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """The encoder's plan, traced and planned once for the module."""
    os.environ.setdefault("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))
    model = encoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    p = tensile.plan(model, optimizer, batches(1)[0], F.cross_entropy, workdir=tmp_path_factory.mktemp("plan"))
    assert p.events, "the plan has no events: the budget tests would test nothing"
    return p


@pytest.fixture(scope="module")
def plain():
    """Plain training (no hook) of n steps: gradients and parameters."""
    runs = {}

    def run(n):
        if n not in runs:
            runs[n] = train(encoder(), batches(n))
        return runs[n]

    return run


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return TransformerClassifier(vocab=100, seq_len=32, d_model=64, heads=4, layers=2, classes=10)


def batches(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 100, (4, 32), generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


def train(model, data, plan=None, before_step=None, **options):
    """The user's unchanged loop. Returns (grads per step, params, applier,
    per step (ready, started, backward_done) on time.monotonic_ns()):
    `ready` just before the forward call, `started` when the model's
    forward began (a pre-hook that runs after the hook's own, that is after
    its gate), `backward_done` when `loss.backward()` returned."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    grads, times = [], []
    torch.manual_seed(2)
    started: list[int] = []
    # The encoder's storages are small: moved too (64 KiB and up by default).
    hook = tensile.apply(plan, model, optimizer, min_move_bytes=0, **options) if plan is not None else None
    applier = hook.__enter__() if hook is not None else None
    handle = model.register_forward_pre_hook(lambda m, a: started.append(time.monotonic_ns()))
    try:
        for i, (inputs, target) in enumerate(data):
            if before_step is not None:
                before_step(i, applier)
            ready = time.monotonic_ns()
            loss = F.cross_entropy(model(inputs), target)
            loss.backward()
            backward_done = time.monotonic_ns()
            optimizer.step()
            grads.append([p.grad.clone() for p in model.parameters()])
            optimizer.zero_grad()
            times.append((ready, started[-1], backward_done))
    finally:
        handle.remove()
        if hook is not None:
            hook.__exit__(None, None, None)
    return grads, [p.detach().clone() for p in model.parameters()], applier, times


def assert_identical(plain, hooked):
    assert len(plain[0]) == len(hooked[0])
    for step, (ga, gb) in enumerate(zip(plain[0], hooked[0])):
        for i, (a, b) in enumerate(zip(ga, gb)):
            assert torch.equal(a, b), f"gradient {i} differs at step {step}"
    for i, (a, b) in enumerate(zip(plain[1], hooked[1])):
        assert torch.equal(a, b), f"parameter {i} differs"


def gated_doc(plan, gate=None, pace=None):
    """The plan's document with a gate (and a pace)."""
    doc = json.loads(json.dumps(plan.plan))
    if gate is not None:
        doc["gate"] = gate
    if pace is not None:
        doc["prediction"]["op_start_ns"] = pace
    return doc


def with_gate(plan, tmp_path, gate=None, pace=None, name="gated.json"):
    """The plan as a file with a gate (and a pace), read back as the user would."""
    path = tmp_path / name
    path.write_text(json.dumps(gated_doc(plan, gate, pace)))
    return tensile.load_plan(plan.graph_path, path)


# -- the binding: planner/src/gate.rs's types, whose unit tests hold the cases --


def gate(period, phase, epoch):
    return Gate(period_ns=period, phase_ns=phase, epoch_ns=epoch)


def test_the_hook_runs_the_rust_gate_clock():
    assert Gate is _core.Gate and GateClock is _core.GateClock
    assert gate_of is _core.gate_of and pace_of is _core.pace_of
    g = gate(100, 30, 1_000)
    assert (g.period_ns, g.phase_ns, g.epoch_ns) == (100, 30, 1_000)
    assert Gate.from_dict(g.to_dict()) == g and hash(Gate.from_dict(g.to_dict())) == hash(g)
    assert g != gate(100, 31, 1_000) and repr(g) == "Gate(period_ns=100, phase_ns=30, epoch_ns=1000)"
    clock = GateClock(g)
    assert clock.gate == g and clock.next_ns is None
    start = clock.start_at(1_010)
    assert start == 1_030 and clock.next_ns == 1_130


def test_slots_keep_their_invariants_on_random_gates():
    """The binding keeps the gate clock's promises, whatever the gate: the
    nearest slot is on the grid within half a period (or the first one after
    the clock's zero); an iteration never starts before it is ready, waits
    at most a period, starts on a slot when it waits, and the next slot is
    at most a period after its start."""
    rng = random.Random(7)
    for _ in range(500):
        period = rng.randint(1, 10**9)
        g = gate(period, rng.randrange(period), rng.randint(0, 10**12))
        now = rng.randint(0, 2 * 10**12)
        slot = g.nearest_slot(now)
        assert (slot - g.epoch_ns - g.phase_ns) % period == 0
        assert abs(slot - now) <= period // 2 or slot < period
        clock = GateClock(g)
        for _ in range(5):
            start = clock.start_at(now)
            assert now <= start <= now + period
            if start > now:
                assert (start - g.epoch_ns - g.phase_ns) % period == 0
            assert start <= clock.next_ns <= start + period
            now = start + rng.randint(0, 2 * period)


def test_a_plans_gate_and_pace_are_read_as_the_plan_format_reads_them():
    doc = {"gate": {"period_ns": 200, "phase_ns": 70, "epoch_ns": 5}, "prediction": {"op_start_ns": [0, 5, 5]}}
    assert gate_of(doc) == gate(200, 70, 5) and pace_of(doc, 3) == [0, 5, 5]
    assert gate_of({"prediction": {}}) is None and pace_of({"prediction": {}}, 3) == []
    for bad, message in [
        ({"prediction": {"op_start_ns": [0, 1]}}, "prediction.op_start_ns: 2 op starts for a graph of 3 ops"),
        ({"prediction": {"op_start_ns": [5, 4, 4]}}, "prediction.op_start_ns: op 1 starts before op 0"),
        ({"prediction": {"op_start_ns": [0, 1.5, 2]}}, "prediction.op_start_ns: op 1 starts at 1.5, not a whole number of ns"),
        ({"prediction": {"op_start_ns": "0,1,2"}}, "prediction.op_start_ns is a str, not a list of ns"),
    ]:
        with pytest.raises(ValueError, match=message):
            pace_of(bad, 3)
    assert _core.pace_from_seconds([0.0, 2.5e-6, 2.5e-6], 3) == [0, 2500, 2500]
    with pytest.raises(ValueError, match="op 1 starts before op 0"):
        _core.pace_from_seconds([1.0, 0.5, 2.0], 3)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"period_ns": 0, "phase_ns": 0, "epoch_ns": 5}, "gate period 0 ns is not in 1 ns to 1 hour"),
        ({"period_ns": 3_600_000_000_001, "phase_ns": 0, "epoch_ns": 5}, "gate period 3600000000001 ns is not in 1 ns to 1 hour"),
        ({"period_ns": 100, "phase_ns": 100, "epoch_ns": 5}, "gate phase 100 ns is not less than its period 100 ns"),
        ({"period_ns": 100, "phase_ns": -1, "epoch_ns": 5}, "gate phase_ns is -1, not a whole number of ns"),
        ({"period_ns": 100.0, "phase_ns": 0, "epoch_ns": 5}, "gate period_ns is 100.0, not a whole number of ns"),
        ({"period_ns": 100, "phase_ns": 0}, "gate lacks 'epoch_ns'"),
        ({"period_ns": 100, "phase_ns": 0, "epoch_ns": 5, "offset_ns": 1}, "gate has unknown key 'offset_ns'"),
        ([100, 0, 5], "gate is a list, not an object"),
    ],
)
def test_a_bad_gate_is_refused_naming_what_is_wrong(doc, message):
    with pytest.raises(ValueError) as e:
        Gate.from_dict(doc)
    assert message in str(e.value)


# -- gates in a training loop --------------------------------------------------


def replay(g: Gate, times):
    """The starts the Rust GateClock gives for the steps' ready times."""
    clock = GateClock(g)
    return [clock.start_at(ready) for ready, _, _ in times]


def test_a_gated_plan_starts_its_steps_at_the_slots_and_changes_nothing_else(plan, plain, tmp_path):
    epoch = time.monotonic_ns()
    g = gate(PERIOD, PHASE, epoch)
    gated = with_gate(plan, tmp_path, g.to_dict())
    hooked = train(encoder(), batches(4), gated)
    assert_identical(plain(4), hooked)
    applier, times = hooked[2], hooked[3]
    expected = replay(g, times)
    for i, ((ready, started, _), want) in enumerate(zip(times, expected)):
        assert want - 1_000_000 <= started <= want + TOL, f"step {i} started {(started - want) / 1e6:+.2f} ms from its slot"
        stats = applier.stats[i]
        assert abs(stats.start_ns - want) <= TOL and stats.start_ns <= started
        assert abs(stats.gate_wait_ns - (want - ready)) <= TOL
    # Steps after the first come early for their slot (a step takes well
    # under the period), so they waited and started on the grid.
    waited = [i for i, (ready, _, _) in enumerate(times) if expected[i] > ready]
    assert len(waited) >= 2, f"only steps {waited} waited: the machine is too loaded for a {PERIOD / 1e6:.0f} ms period"
    for i in waited:
        assert (expected[i] - epoch - PHASE) % PERIOD == 0
        assert applier.stats[i].gate_wait_ns > 0
    assert all(s.paced_ns == 0 for s in applier.stats)  # no pace in this plan


def test_a_late_step_starts_at_once_and_one_a_period_late_drops_the_missed_slots(plan, plain, tmp_path):
    g = gate(PERIOD, PHASE, time.monotonic_ns())

    def delay(i, applier):
        nxt = applier.gate_clock.next_ns
        if i == 2:  # 60 ms after its slot: starts at once, the next step stays on the grid
            time.sleep(max(0, nxt + 60_000_000 - time.monotonic_ns()) / 1e9)
        if i == 4:  # more than a period after its slot: the slots it missed are dropped
            time.sleep(max(0, nxt + PERIOD + 50_000_000 - time.monotonic_ns()) / 1e9)

    hooked = train(encoder(), batches(6), with_gate(plan, tmp_path, g.to_dict()), before_step=delay)
    assert_identical(plain(6), hooked)
    applier, times = hooked[2], hooked[3]
    expected = replay(g, times)
    for i in (2, 4):
        ready, started, _ = times[i]
        assert expected[i] == ready and applier.stats[i].gate_wait_ns == 0, f"late step {i} waited"
        assert started - ready <= TOL
    # Step 3 keeps to the grid of step 2's slot, step 5 to the grid again.
    for i in (3, 5):
        ready, started, _ = times[i]
        assert expected[i] > ready and (expected[i] - g.epoch_ns - PHASE) % PERIOD == 0
        assert expected[i] - 1_000_000 <= started <= expected[i] + TOL
    assert expected[3] - expected[1] == 2 * PERIOD  # step 2 started late, but its slot was expected[1] + PERIOD
    assert expected[5] - times[4][0] < PERIOD  # not expected[3] + 2 periods, which had passed


def test_a_new_plan_keeps_the_same_gates_slots_and_places_another_ones_afresh(plan, tmp_path):
    g = gate(PERIOD, PHASE, time.monotonic_ns())
    same = with_gate(plan, tmp_path, g.to_dict(), name="same.json")
    other = with_gate(plan, tmp_path, gate(PERIOD, PHASE + 50_000_000, g.epoch_ns).to_dict(), name="other.json")
    free = with_gate(plan, tmp_path, name="free.json")
    plans = {1: same, 2: other, 3: free}
    seen = []  # (next slot before the switch, after it, the clock's gate after it)

    def switch(i, applier):
        if i in plans:
            before = applier.gate_clock.next_ns
            applier.use_plan(plans[i], job_id=1)
            clock = applier.gate_clock
            seen.append((before, clock and clock.next_ns, clock and clock.gate))

    hooked = train(encoder(), batches(5), same, before_step=switch)
    applier = hooked[2]
    kept, replaced, freed = seen
    assert kept[0] is not None and kept[1:] == (kept[0], g), "the same gate must keep its slots"
    assert replaced[0] is not None and replaced[1:] == (None, Gate.from_dict(other.plan["gate"])), "another gate places them afresh"
    assert freed[1:] == (None, None) and applier.gate_clock is None
    assert applier.stats[4].gate_wait_ns == 0


def test_a_pace_holds_ops_back_without_entering_the_reported_latencies(plan, plain, tmp_path):
    s = Schedule(plan)
    pace_ns = 150_000_000
    pace = [0] * s.backward_start + [pace_ns] * (s.n_ops - s.backward_start)
    hooked = train(encoder(), batches(3), with_gate(plan, tmp_path, pace=pace))
    assert_identical(plain(3), hooked)
    applier, times = hooked[2], hooked[3]
    for i, (stats, (_, _, backward_done)) in enumerate(zip(applier.stats, times)):
        # The backward's ops started no earlier than planned.
        assert stats.paced_ns > 0 and stats.gate_wait_ns == 0, i
        assert backward_done - stats.start_ns >= pace_ns, f"step {i}: the backward ended before its planned start"
    # The reported latencies are the ops', not the waits before them.
    last = applier.measurements(-1)
    assert len(last["op_latency_s"]) == s.n_ops
    assert last["op_latency_s"][s.backward_start] < pace_ns / 2e9 and last["stall_s"] < pace_ns / 2e9
    assert sum(last["op_latency_s"]) < pace_ns / 1e9


@pytest.mark.parametrize(
    "gate_doc, pace, message, in_file",
    [
        ({"period_ns": 0, "phase_ns": 0, "epoch_ns": 0}, None, "the plan's gate period 0 ns is not in 1 ns to 1 hour",
         "gate: gate period 0 ns is not in 1 ns to 1 hour"),
        ({"period_ns": 10, "phase_ns": 10, "epoch_ns": 0}, None, "the plan's gate phase 10 ns is not less than its period 10 ns",
         "gate: gate phase 10 ns is not less than its period 10 ns"),
        (None, [0, 1, 2], "the plan's prediction.op_start_ns: 3 op starts for a graph of", "prediction: 3 op starts for a graph of"),
        (None, "decreasing", "the plan's prediction.op_start_ns: op 1 starts before op 0", "prediction: op 1 starts before op 0"),
    ],
)
def test_a_plan_with_a_bad_gate_or_pace_is_refused_before_training(plan, tmp_path, gate_doc, pace, message, in_file):
    if pace == "decreasing":
        pace = [5, 4] + [4] * (len(plan.ops) - 2)
    # As a file: the plan format refuses it when it is read.
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(gated_doc(plan, gate_doc, pace)))
    with pytest.raises(tensile.PlanError, match=in_file):
        tensile.load_plan(plan.graph_path, path)
    # Made some other way: the hook refuses it before training.
    bad = tensile.Plan(plan.graph, gated_doc(plan, gate_doc, pace))
    model = encoder()
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(tensile.PlanApplyError) as e:
        tensile.apply(bad, model, optimizer).__enter__()
    assert message in str(e.value)
    # And as a new plan mid-run: refused, the plan in use kept.
    with tensile.apply(plan, model, optimizer) as applier:
        with pytest.raises(tensile.PlanApplyError, match="the new plan's"):
            applier.use_plan(bad)
    assert applier.plan is plan and applier.gate_clock is None


# -- the memory budget ---------------------------------------------------------


def node_need(s: Schedule) -> int:
    """The most saved bytes one backward node reads: what one op needs resident."""
    saved = s.saved_storages()
    need = 0
    for k in range(s.backward_start, s.optimizer_start):
        first, last = s.node_span(k)
        roots = set().union(*(s.op_roots[i] for i in range(first, last + 1))) & saved.keys()
        need = max(need, sum(s.bytes[r] for r in roots))
    return need


@pytest.mark.parametrize("in_flight", [0, 3], ids=["copies_at_once", "copies_in_flight"])
def test_a_budget_below_the_plans_peak_holds_and_changes_nothing(plan, plain, in_flight):
    s = Schedule(plan)
    predicted = max(s.predicted_saved_curve())
    budget_mb = 0.6 * predicted / 1e6
    budget = int(budget_mb * 1e6)
    assert node_need(s) < budget, "the budget must leave room for one op for this test"
    hooked = train(encoder(), batches(3), plan, budget_mb=budget_mb, copies_complete_after=in_flight)
    assert_identical(plain(3), hooked)
    applier = hooked[2]
    assert applier.budget_bytes == budget
    for i, stats in enumerate(applier.stats):
        assert 0 < stats.peak_saved_bytes <= budget, (i, stats.peak_saved_bytes, budget)
        assert stats.max_saved_bytes <= budget, (i, stats.max_saved_bytes, budget)
        assert stats.guard_evictions + stats.held_back > 0, f"step {i}: the guard never acted"
    # The report's peak is the bytes the hook held (parameters and optimizer
    # state with the saved activations), beyond the saved bytes the budget bounds.
    assert applier.measurements(-1)["peak_bytes"] == applier.stats[-1].device_peak_bytes >= budget
    assert applier.engine.pool.in_use_bytes == 0, "a host buffer was never given back"
    assert all(res.on_device and res.copy is None for res in applier.persist.values())


def test_without_a_budget_the_same_run_passes_it(plan, plain):
    """The control: the same plan without budget_mb keeps more resident than
    the budget the test above holds, and the guard never acts."""
    budget = int(0.6 * max(Schedule(plan).predicted_saved_curve()))
    hooked = train(encoder(), batches(2), plan)
    applier = hooked[2]
    assert applier.budget_bytes is None
    assert max(s.peak_saved_bytes for s in applier.stats) > budget
    assert all(s.guard_evictions == 0 and s.held_back == 0 for s in applier.stats)


def test_a_budget_below_one_ops_need_is_a_clear_error(plan):
    model = encoder()
    optimizer = torch.optim.Adam(model.parameters())
    inputs, target = batches(1)[0]
    with pytest.raises(tensile.BudgetError) as e:
        with tensile.apply(plan, model, optimizer, budget_mb=0.001) as applier:
            F.cross_entropy(model(inputs), target).backward()
    message = str(e.value)
    assert "\n" not in message
    assert "budget of 1000 bytes (budget_mb=0.001), below what one op needs" in message, message
    head = message.split(":")[0]
    assert head.startswith("before op ") and "needs" in message and "saving '" in message, message
    # Leaving the block put every planned tensor back; the hook is stopped.
    assert all(res.on_device for res in applier.persist.values())
    assert applier.broken == message


@pytest.mark.parametrize("budget_mb", [0, -1, True, "10", float("nan"), 1e-7])
def test_a_bad_budget_is_refused(plan, budget_mb):
    model = encoder()
    with pytest.raises(tensile.PlanApplyError, match="budget_mb"):
        tensile.apply(plan, model, torch.optim.Adam(model.parameters()), budget_mb=budget_mb).__enter__()
