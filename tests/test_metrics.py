"""Metrics on hand-made timelines whose answers are known exactly."""
import pandas as pd
import pytest

from fsbench import metrics

MS = 1_000_000


def _spans(step, rank, start_ms, step_ms, busy_ms, warmup=False):
    return [
        {"rank": rank, "step": step, "warmup": warmup, "name": "step", "kind": "step",
         "start_ns": start_ms * MS, "dur_ns": step_ms * MS, "cpu_ns": step_ms * MS},
        {"rank": rank, "step": step, "warmup": warmup, "name": "forward", "kind": "compute",
         "start_ns": start_ms * MS, "dur_ns": busy_ms * MS, "cpu_ns": busy_ms * MS},
        {"rank": rank, "step": step, "warmup": warmup, "name": "comm", "kind": "comm",
         "start_ns": (start_ms + busy_ms) * MS, "dur_ns": (step_ms - busy_ms) * MS, "cpu_ns": 0},
    ]


def test_bubble_straggler_and_exposed_comm_follow_the_definitions():
    # Two ranks; T = 100 ms. Rank 0 computes 80 ms, rank 1 computes 40 ms.
    df = pd.DataFrame(_spans(0, 0, 0, 100, 80) + _spans(0, 1, 0, 100, 40))
    row = metrics.step_metrics(df).iloc[0]
    assert row["step_time_ms"] == pytest.approx(100)
    assert row["bubble_ratio"] == pytest.approx((20 + 60) / 200)
    assert row["straggler_bubble_ratio"] == pytest.approx((0 + 40) / 200)
    assert row["exposed_comm_ratio"] == pytest.approx(0.4 - 0.2)
    assert row["load_imbalance"] == pytest.approx(40 / (2 * 80))
    assert row["busy_skew"] == pytest.approx(80 / 60)


def test_step_time_spans_from_first_start_to_last_end_across_ranks():
    df = pd.DataFrame(_spans(0, 0, 10, 50, 50) + _spans(0, 1, 12, 70, 70))
    row = metrics.step_metrics(df).iloc[0]
    assert row["step_time_ms"] == pytest.approx(72)


def test_summary_uses_only_measured_steps_and_global_counts():
    spans = _spans(0, 0, 0, 1000, 1000, warmup=True) + _spans(0, 1, 0, 1000, 1000, warmup=True)
    for s, t in [(1, 100), (2, 200), (3, 300)]:
        spans += _spans(s, 0, s * 1000, t, t) + _spans(s, 1, s * 1000, t, t)
    stats = pd.DataFrame([{"rank": r, "step": s, "loss": 0.5, "num_samples": 8, "num_targets": 40}
                          for s in range(4) for r in range(2)])
    out = metrics.summarize(pd.DataFrame(spans), stats)
    assert out["steps_measured"] == 3
    assert out["step_time_ms_median"] == pytest.approx(200)
    assert out["samples_per_s"] == pytest.approx(16 / 0.2)
    assert out["tokens_per_s"] == pytest.approx(80 / 0.2)
    assert out["bubble_ratio"] == pytest.approx(0.0)
    assert out["losses"] == [1.0, 1.0, 1.0, 1.0]


def test_busy_is_gpu_stream_time_when_compute_spans_carry_it():
    """CUDA runs: busy comes from the CUDA events (gpu_ns), not from the host thread."""
    spans = _spans(0, 0, 0, 100, 10) + _spans(0, 1, 0, 100, 10)
    for rec, gpu_ms in zip([s for s in spans if s["kind"] == "compute"], (90, 60)):
        rec["gpu_ns"] = gpu_ms * MS
    row = metrics.step_metrics(pd.DataFrame(spans)).iloc[0]
    assert row["busy_max_ms"] == pytest.approx(90)
    assert row["straggler_bubble_ratio"] == pytest.approx(30 / 200)
