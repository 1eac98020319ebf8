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
