"""FreeScale's input stage reports the CPU time it spent planning each step (`plan_ms`),
and a run's summary carries it beside the step time (issue: the planner at cluster
scale, item 3)."""
import time

import pandas as pd

from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import get_workload
from freescale_impl import partition
from freescale_impl.balance import analytical_cost
from freescale_impl.balanced_share import BalancedShare
from freescale_impl.trainer import FreeScaleOptions
from fsbench.measurement.run_summary import plan_accuracy

SPIN_MS = 30


def _slow_lpt(costs, n, **kw):
    """LPT after SPIN_MS of this thread's CPU time: a planner known to take that long."""
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < SPIN_MS * 1e6:
        pass
    return partition.lpt(costs, n, **kw)


def _share(window: int, micro: int = 1) -> BalancedShare:
    w = get_workload("tiny")
    opts = FreeScaleOptions.parse({"window": str(window), "micro_batches": str(micro),
                                   "tables": "replicated"}, prefix="freescale")
    share = BalancedShare(make_batch_source(w, 0), 0, 2, analytical_cost(w), opts, steps=8)
    share.partitioner = _slow_lpt
    return share


def test_each_step_reports_its_own_planning_time():
    share = _share(window=1)
    times = [share(k).extra["plan_ms"] for k in range(3)]
    assert all(SPIN_MS <= t < SPIN_MS * 20 for t in times), times


def test_a_window_is_planned_at_its_first_step_and_micro_batches_are_counted():
    share = _share(window=4)
    times = [share(k).extra["plan_ms"] for k in range(8)]
    # The window's re-packing calls the partitioner once per batch and once for the pool.
    assert times[0] >= 5 * SPIN_MS and times[4] >= 5 * SPIN_MS, times
    assert all(t < SPIN_MS for t in times[1:4] + times[5:]), times
    with_micro = _share(window=1, micro=2)
    # The step's plan, then one per micro-batch split.
    assert with_micro(0).extra["plan_ms"] >= 2 * SPIN_MS


def test_the_summary_gives_the_mean_planning_time_of_the_measured_steps():
    spans = pd.DataFrame([
        {"step": s, "rank": r, "name": name, "kind": kind, "cpu_ns": 1_000_000,
         "start_ns": s * 10_000_000 + start, "dur_ns": dur, "warmup": s == 0, "gpu_ns": None}
        for s in range(3) for r in range(2)
        for name, kind, start, dur in (("step", "step", 0, 9_000_000),
                                       ("forward", "compute", 1, 1_000_000),
                                       ("backward", "compute", 2_000_000, 1_000_000))])
    stats = pd.DataFrame([
        {"step": s, "rank": r, "predicted_cost": 1.0, "plan_max": 1.0, "plan_mean": 1.0,
         "plan_lower_bound": 1.0, "cost_unit": "flop", "plan_ms": [50.0, 4.0, 2.0][s]}
        for s in range(3) for r in range(2)])
    out = plan_accuracy(spans, stats)
    assert out["plan_ms_per_step"] == 3.0  # steps 1 and 2: step 0 is warm-up
    assert "plan_ms_per_step" not in plan_accuracy(spans, stats.drop(columns="plan_ms"))


def test_a_window_that_leaves_a_rank_no_sample_gives_it_an_empty_batch():
    """`large` at a sample a rank with a window of 4: the window packs its whales apart and
    some rank gets no sample of some step. Its input stage gives it an empty batch (it
    used to fail joining no parts); every step still trains its batch's samples once."""
    import dataclasses

    w = dataclasses.replace(get_workload("large"), global_batch_size=8)
    opts = FreeScaleOptions.parse({"window": "4"}, prefix="freescale")
    share = BalancedShare(make_batch_source(w, 0), 0, 8, analytical_cost(w), opts, steps=4)
    sizes = [[share.share(k, r)[0].batch_size for r in range(8)] for k in range(4)]
    assert any(0 in row for row in sizes), sizes  # the case under test happens
    assert [sum(row) for row in sizes] == [8] * 4
