"""Metrics on hand-made timelines whose answers are known exactly."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsbench.measurement import metrics

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


def _span(rank, step, name, kind, start_ms, dur_ms, cpu_ms=None, runq_ms=0.0):
    return {"rank": rank, "step": step, "warmup": False, "name": name, "kind": kind,
            "start_ns": int(start_ms * MS), "dur_ns": int(dur_ms * MS),
            "cpu_ns": int((dur_ms if cpu_ms is None else cpu_ms) * MS),
            "runq_ns": int(runq_ms * MS)}


def test_the_bubble_splits_into_four_causes_that_sum_to_it():
    """T = 100 ms. Rank 0: waits 10 ms for input, computes 60 (of which 5 ms blocked in a
    collective inside backward), waits 20 in an explicit comm span, then 10 ms
    uncovered. Rank 1 starts 4 ms late (barrier skew), computes 30, then waits 66 in comm
    (the slow rank: 30 ms of that is the straggler gap)."""
    spans = [
        _span(0, 0, "step", "step", 0, 100), _span(0, 0, "input", "input", 0, 10),
        _span(0, 0, "forward", "compute", 10, 25), _span(0, 0, "backward", "compute", 35, 35, 30),
        _span(0, 0, "comm", "comm", 70, 20, 0),
        _span(1, 0, "step", "step", 4, 96), _span(1, 0, "forward", "compute", 4, 30),
        _span(1, 0, "comm", "comm", 34, 66, 0),
    ]
    row = metrics.step_metrics(pd.DataFrame(spans)).iloc[0]
    cap = 200.0
    busy0, busy1 = 55.0, 30.0
    assert row["bubble_ratio"] == pytest.approx((100 - busy0 + 100 - busy1) / cap)
    assert row["straggler_bubble_ratio"] == pytest.approx((busy0 - busy1) / cap)
    # rank 0: comm 5 (blocked) + 20; rank 1: comm 66 - 25 (straggler taken from comm)
    assert row["exposed_comm_ratio"] == pytest.approx((25 + 41) / cap)
    assert row["input_stall_ratio"] == pytest.approx(10 / cap)
    # rank 0: 10 ms uncovered; rank 1: 4 ms before its step span
    assert row["other_idle_ratio"] == pytest.approx((10 + 4) / cap)
    parts = sum(row[k] for k in ("straggler_bubble_ratio", "exposed_comm_ratio",
                                 "input_stall_ratio", "other_idle_ratio"))
    assert parts == pytest.approx(row["bubble_ratio"], abs=1e-12)


def test_run_queue_wait_inside_compute_is_not_communication():
    spans = [_span(0, 0, "step", "step", 0, 100, runq_ms=20),
             _span(0, 0, "forward", "compute", 0, 100, cpu_ms=80, runq_ms=20)]
    row = metrics.step_metrics(pd.DataFrame(spans)).iloc[0]
    assert row["exposed_comm_ratio"] == pytest.approx(0.0)
    assert row["other_idle_ratio"] == pytest.approx(0.2)
    assert row["cpu_wait_ratio"] == pytest.approx(0.2)


def test_spans_outside_the_step_span_are_not_counted():
    spans = [_span(0, 0, "barrier", "wait", 0, 50, 0), _span(0, 0, "step", "step", 50, 100),
             _span(0, 0, "forward", "compute", 50, 100)]
    row = metrics.step_metrics(pd.DataFrame(spans)).iloc[0]
    assert row["bubble_ratio"] == pytest.approx(0.0)
    assert row["exposed_comm_ratio"] == pytest.approx(0.0)


def test_summary_ratios_are_totals_not_medians_of_ratios():
    """Two light steps without bubble and one heavy step with a large one: the median of
    per-step ratios says 0, the total says what the ranks really lost."""
    spans = []
    for step, (t, busy1) in enumerate([(100, 100), (100, 100), (1000, 200)]):
        spans += [_span(0, step, "step", "step", step * 2000, t),
                  _span(0, step, "forward", "compute", step * 2000, t),
                  _span(1, step, "step", "step", step * 2000, t),
                  _span(1, step, "forward", "compute", step * 2000, busy1),
                  _span(1, step, "comm", "comm", step * 2000 + busy1, t - busy1, 0)]
    stats = pd.DataFrame([{"rank": r, "step": s, "loss": 0.1, "num_samples": 4, "num_targets": 10}
                          for s in range(3) for r in range(2)])
    out = metrics.summarize(pd.DataFrame(spans), stats)
    assert out["bubble_ratio_p50"] == pytest.approx(0.0)
    assert out["bubble_ratio"] == pytest.approx(800 / (2 * 1200))
    assert out["straggler_bubble_ratio"] == pytest.approx(800 / 2400)
    assert out["samples_per_s"] == pytest.approx(24 / 1.2)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100)),
                min_size=1, max_size=8), st.floats(0, 50))
def test_causes_sum_to_each_ranks_idle_time(ranks, extra):
    busy = np.array([r[0] for r in ranks])
    t = float(busy.max() + extra)
    parts = metrics.rank_causes(t, busy, np.array([r[1] for r in ranks]), np.array([r[2] for r in ranks]))
    total = parts["straggler"] + parts["exposed_comm"] + parts["input_stall"] + parts["other_idle"]
    np.testing.assert_allclose(total, t - busy, atol=1e-9)
    for key in ("exposed_comm", "input_stall"):
        assert (parts[key] >= -1e-12).all()


def test_comm_overlap_ratio_counts_only_busy_compute():
    from fsbench.measurement.metrics import comm_overlap_ratio

    def rec(name, kind, start, dur, cpu=0):
        return {"rank": 0, "step": 1, "warmup": False, "name": name, "kind": kind,
                "start_ns": start, "dur_ns": dur, "cpu_ns": cpu, "runq_ns": 0, "nested": False}
    spans = pd.DataFrame([
        rec("forward", "compute", 0, 100, cpu=100),      # fully busy
        rec("wait", "comm", 100, 50),
        rec("backward", "compute", 150, 100, cpu=50),    # half blocked
        rec("a", "flight", 50, 100),   # 50 under forward, 50 under the wait: 50 hidden
        rec("b", "flight", 150, 100),  # under the half-busy backward: 50 hidden
    ])
    assert comm_overlap_ratio(spans) == pytest.approx(100 / 200)
    assert comm_overlap_ratio(spans[spans["kind"] != "flight"]) is None


# --- Blocked time inside compute: communication only while a collective is in flight ---

def _blocked_backward(*flights_ms):
    """One rank, T = 100 ms: a backward span blocked 40 of its 100 ms (60 ms of CPU), and
    the rank's flights (start, duration), which may lie outside the step."""
    spans = [_span(0, 0, "step", "step", 0, 100),
             _span(0, 0, "backward", "compute", 0, 100, cpu_ms=60)]
    spans += [_span(0, 0, "allreduce", "flight", start, dur, cpu_ms=0) for start, dur in flights_ms]
    return metrics.step_metrics(pd.DataFrame(spans)).iloc[0]


def test_blocked_compute_with_a_collective_in_flight_is_exposed_communication():
    row = _blocked_backward((20, 80))  # in flight over 80 ms of the span: covers the 40 blocked
    assert row["exposed_comm_ratio"] == pytest.approx(0.4)
    assert row["other_idle_ratio"] == pytest.approx(0.0)


def test_blocked_compute_with_no_collective_in_flight_is_other_idle():
    """A sleep, a host sync, a lock: the rank's only flight is in the next step."""
    row = _blocked_backward((150, 10))
    assert row["exposed_comm_ratio"] == pytest.approx(0.0)
    assert row["other_idle_ratio"] == pytest.approx(0.4)


def test_blocked_compute_partly_under_a_flight_splits():
    """In flight for the span's last 15 ms (two overlapping flights, counted once):
    at most 15 of its 40 blocked ms are communication, the rest other idle."""
    row = _blocked_backward((85, 10), (90, 10))
    assert row["exposed_comm_ratio"] == pytest.approx(0.15)
    assert row["other_idle_ratio"] == pytest.approx(0.25)
    assert row["exposed_comm_ratio"] + row["other_idle_ratio"] == pytest.approx(row["bubble_ratio"])


def test_another_ranks_flight_does_not_make_a_rank_wait_on_communication():
    spans = [_span(0, 0, "step", "step", 0, 100), _span(0, 0, "backward", "compute", 0, 100, cpu_ms=60),
             _span(1, 0, "step", "step", 0, 100), _span(1, 0, "backward", "compute", 0, 100, cpu_ms=60),
             _span(1, 0, "allreduce", "flight", 0, 100, cpu_ms=0)]
    row = metrics.step_metrics(pd.DataFrame(spans)).iloc[0]
    assert row["exposed_comm_ratio"] == pytest.approx(40 / 200)  # rank 1's only
    assert row["other_idle_ratio"] == pytest.approx(40 / 200)


def test_timelines_without_any_flight_keep_blocked_time_as_communication():
    """Runs recorded before trainers recorded flights: nothing tells a sleep from a
    collective there, so they read as they did when written."""
    row = _blocked_backward()
    assert row["exposed_comm_ratio"] == pytest.approx(0.4)


def test_in_flight_time_is_the_overlap_with_the_union_of_the_ranks_flights():
    spans = pd.DataFrame([_span(0, 0, "a", "compute", 0, 100), _span(0, 0, "b", "compute", 100, 50),
                          _span(1, 0, "c", "compute", 0, 100)])
    flights = pd.DataFrame([_span(0, 0, "f", "flight", 10, 30), _span(0, 0, "g", "flight", 20, 10),
                            _span(0, 0, "h", "flight", 90, 20), _span(0, 0, "i", "flight", 140, 100)])
    np.testing.assert_allclose(metrics.in_flight_ns(spans, flights) / MS, [30 + 10, 10 + 10, 0])


# --- Contention: unknown without schedstat, never quiet ---

def _summary(**kwargs):
    spans = [_span(r, 0, "step", "step", 0, 100, runq_ms=1) for r in range(2)]
    spans += [_span(r, 0, "forward", "compute", 0, 100, runq_ms=1) for r in range(2)]
    stats = pd.DataFrame([{"rank": r, "step": 0, "loss": 0.1, "num_samples": 4, "num_targets": 10}
                          for r in range(2)])
    return metrics.summarize(pd.DataFrame(spans), stats, **kwargs)


def test_contended_counts_every_thread_of_the_ranks():
    """The compute threads waited 1%; all threads 6%, of which twice the helpers' 2% of
    CPU is the run's own (quiet); 17% with the same helpers: a neighbour."""
    quiet = _summary(threads_runq=[(6 * MS, 2 * MS, 100 * MS), (6 * MS, 2 * MS, 100 * MS)])
    assert quiet["contended"] is False
    assert (quiet["cpu_wait_all_threads_ratio"], quiet["helper_cpu_ratio"]) == pytest.approx((0.06, 0.02))
    loud = _summary(threads_runq=[(17 * MS, 2 * MS, 100 * MS), (17 * MS, 2 * MS, 100 * MS)])
    assert loud["contended"] is True and loud["cpu_wait_ratio"] == pytest.approx(0.01)


def test_contended_is_unknown_without_schedstat():
    out = _summary(threads_runq=[(None, None, 100 * MS), (None, None, 100 * MS)])
    assert out["contended"] is None and out["cpu_wait_all_threads_ratio"] is None


def test_contended_of_older_runs_comes_from_the_spans_unless_they_never_waited():
    assert _summary()["contended"] is False  # 1% run-queue wait recorded
    spans = [_span(0, 0, "step", "step", 0, 100), _span(0, 0, "forward", "compute", 0, 100)]
    stats = pd.DataFrame([{"rank": 0, "step": 0, "loss": 0.1, "num_samples": 4, "num_targets": 10}])
    assert metrics.summarize(pd.DataFrame(spans), stats)["contended"] is None  # 0 ns: no schedstat


def test_tables_show_an_unknown_contended_as_unknown():
    from fsbench.table import cell

    assert (cell("contended", None), cell("contended", True), cell("contended", False)) == (
        "unknown", "yes", "no")
    assert cell("cpu_wait_ratio", None) == "n/a"


def test_without_a_profiled_window_every_measured_step_counts_for_both():
    spans = _spans(0, 0, 0, 1000, 1000, warmup=True)
    for s, t in [(1, 100), (2, 300)]:
        spans += _spans(s, 0, s * 1000, t, t // 2)
    stats = pd.DataFrame([{"rank": 0, "step": s, "loss": 0.5, "num_samples": 8, "num_targets": 40}
                          for s in range(3)])
    out = metrics.summarize(pd.DataFrame(spans), stats)
    assert (out["steps_measured"], out["steps_profiled"], out["steps_timed"]) == (2, 0, 2)
    assert out["step_time_ms_mean"] == pytest.approx(200)
    assert out["bubble_ratio"] == pytest.approx(0.5)
