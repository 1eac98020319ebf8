"""The GPU check's own arithmetic (scripts/gpu_check): the joint peak of
co-located workers from their memory traces, and the tensors-only
prediction the worker's storages are compared with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu_check"))

import worker  # noqa: E402


def test_the_joint_peak_holds_each_worker_at_its_last_traced_figure(tmp_path):
    a, b = tmp_path / "a.trace", tmp_path / "b.trace"
    a.write_text("1.0,100000000\n3.0,300000000\n5.0,0\n")
    b.write_text("2.0,200000000\n4.0,50000000\n")
    # At 3.0 a holds 300 MB and b still its 200 MB from 2.0.
    assert worker.joint_peak_mb([a, b]) == 500.0
    # b frees before a peaks: the most held at once is 300 + 50 at 4.0,
    # below the sum of the two peaks (500).
    b.write_text("2.0,200000000\n2.5,0\n4.0,50000000\n")
    assert worker.joint_peak_mb([a, b]) == 350.0


def test_a_missing_or_empty_trace_gives_no_joint_peak(tmp_path):
    a = tmp_path / "a.trace"
    a.write_text("1.0,100\n")
    assert worker.joint_peak_mb([a, tmp_path / "none.trace"]) is None
    (tmp_path / "empty.trace").write_text("1.0,\n")
    assert worker.joint_peak_mb([a, tmp_path / "empty.trace"]) is None


def test_the_prediction_is_compared_without_the_profiles_base():
    base = worker.base_mb("h100")
    assert base == pytest.approx(671.1)
    row = {"predicted_peak_mb": 3760.9, "measured_peak_mb": 3089.8}
    worker.predict_tensors(row, "h100")
    assert row["predicted_tensors_mb"] == pytest.approx(3760.9 - base)
    assert row["peak_vs_predicted"] == pytest.approx(1.0, abs=1e-3)
    cpu = {"predicted_peak_mb": 426.1, "measured_peak_mb": 426.1}
    worker.predict_tensors(cpu, "cpu")
    assert cpu["predicted_base_mb"] == 0.0 and cpu["peak_vs_predicted"] == 1.0


def test_the_colocated_budget_is_one_process_as_the_gpu_saw_it():
    # nvidia-smi saw the vanilla process at 3764 MiB, its storages at 3089.8 MB.
    b = worker.colocate_budget({"smi_peak_mib": 3764, "measured_peak_mb": 3089.8}, 3_760_900_000, "h100")
    assert b["base_source"] == "measured"
    assert b["budget_mb"] == 3946  # 3764 MiB, in MB, rounded down
    assert b["base_mb"] == 857  # 3946 - 3089.8, rounded up
    assert b["storage_budget_mb"] == 3946 - 2 * 857
    # No nvidia-smi figure (a dry run): the plan's peak and the profile's base.
    p = worker.colocate_budget({"smi_peak_mib": None, "measured_peak_mb": 10.0}, 3_760_900_000, "h100")
    assert (p["base_source"], p["budget_mb"], p["base_mb"]) == ("profile", 3761, 672)
    assert p["storage_budget_mb"] == 3761 - 2 * 672
    # Bases larger than half the budget leave no room: 1 MB, and the
    # scheduler queues the second job rather than run over.
    assert worker.colocate_budget(None, 1_000_000, "h100")["storage_budget_mb"] == 1
    # One process training both copies pays its base once.
    one = worker.colocate_budget({"smi_peak_mib": 3764, "measured_peak_mb": 3089.8}, 3_760_900_000, "h100",
                                 processes=1)
    assert (one["base_mb"], one["storage_budget_mb"]) == (857, 3946 - 857)


def test_nvidia_smi_polls_give_each_process_its_peak_and_both_theirs_together():
    import proc

    smi = proc.SmiSampler()
    smi.pids = {11, 12}
    smi.take("11, 3000\n12, 500\n99, 7000\n")  # 99 is not ours
    smi.take("11, 1000\n12, 3200\n")
    smi.take("garbage\n12, [N/A]\n")
    assert smi.peak_mib == {11: 3000, 12: 3200}
    # Their peaks came at different polls: together they held 4200 at most,
    # not the 6200 their peaks add up to.
    assert smi.joint_peak_mib == 4200
