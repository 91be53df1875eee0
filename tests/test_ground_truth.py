"""The harness's numbers mean what they say: measured ratios against closed-form truth
(fsbench.running.groundtruth). Every ratio a run reports (totals over its measured steps) must
be within its error budget of its expected value: 0.03 (absolute) on a quiet machine, plus
the measured CPU wait on a louder one (groundtruth.error_budget)."""
import os
import warnings

import pytest
from timing import judged_under_contention

from fsbench.running.groundtruth import (CASES, TOLERANCE, TRUTH_MAX_CPU_WAIT, error_budget,
                                 expected_for_step, synthetic_workload, validate)
from fsbench.measurement.metrics import CONTENDED_CPU_WAIT, step_metrics
from fsbench.running.runner import run_once
from fsbench.config import RunConfig
from fsbench.measurement.timeline import read_timelines

pytestmark = pytest.mark.dist


TRIES = 3  # a loud run is tried this many times; then the quietest try is judged


def judged_validation(tmp_path, case: str):
    """The case's validation table (fsbench.running.groundtruth.validate: each row's error budget
    follows the run's CPU wait). A run whose ranks waited more than TRUTH_MAX_CPU_WAIT is
    retried; after TRIES the quietest try is judged with its (wider, stated) budget, and
    on a contended machine only the busy-time ratio is: a warning says which."""
    tries = []
    for attempt in range(TRIES):
        table = validate(tmp_path / str(attempt), world_size=2, cases={case: CASES[case]})
        if table["cpu_wait_ratio"].max() <= TRUTH_MAX_CPU_WAIT:
            return table
        tries.append(table)
    table = min(tries, key=lambda t: t["cpu_wait_ratio"].max())
    waits = ", ".join(f"{t['cpu_wait_ratio'].max():.1%}" for t in tries)
    if not table["judged"].all():
        judged_under_contention(
            f"ranks waited for a CPU {waits} of their step time (contended above "
            f"{CONTENDED_CPU_WAIT:.0%}): {case}'s wall-clock ratios not judged, only "
            f"{', '.join(table[table['judged']]['metric'])}")
    else:
        warnings.warn(f"{case}: ranks waited for a CPU {waits} of their step time in "
                      f"{TRIES} tries (quiet is <= {TRUTH_MAX_CPU_WAIT:.0%}): judged the "
                      f"quietest with budget {table['budget'].max():.3f} instead of {TOLERANCE}")
    return table


def out_of_budget(table):
    return table[table["judged"] & ~table["ok"]]


SLEEP_CASE = "optimizer_sleeps_100ms"  # its own test below


@pytest.mark.parametrize("case", [c for c in CASES if c != SLEEP_CASE])
def test_reported_ratios_match_closed_form_at_2_ranks(case, tmp_path):
    table = judged_validation(tmp_path, case)
    assert not table["oversubscribed"].any()
    assert table.set_index("metric")["judged"]["load_imbalance"]  # busy time, always judged
    bad = out_of_budget(table)
    assert bad.empty, bad.to_string()


def test_a_sleep_with_no_collective_in_flight_is_other_idle_not_communication(tmp_path):
    """Every rank sleeps 100 ms in its optimizer step, long after DDP's all-reduce
    completed: blocked time inside a compute span with nothing in flight. Booked as
    communication (the rule before flights decided it) it would read ~0.16 exposed
    communication; it is other idle, and every other ratio stays true."""
    table = judged_validation(tmp_path, SLEEP_CASE)
    bad = out_of_budget(table)
    assert bad.empty, bad.to_string()
    truth = table.set_index("metric")["expected"]
    assert truth["other_idle_ratio"] > 0.15 and truth["exposed_comm_ratio"] == 0.0


def test_the_error_budget_grows_by_the_measured_wait_and_stops_at_contention():
    assert error_budget("bubble_ratio", 0.015, 0.03) == TOLERANCE
    assert error_budget("bubble_ratio", 0.023, 0.03) == pytest.approx(TOLERANCE + 0.03)
    assert error_budget("exposed_comm_ratio", CONTENDED_CPU_WAIT + 0.01, 0.2) is None
    assert error_budget("load_imbalance", 0.5, 0.6) == TOLERANCE


def test_load_imbalance_of_every_step_stays_true_at_4_oversubscribed_ranks(tmp_path):
    """4 ranks on 2 cores: wall-clock ratios measure time-sharing, but busy time (thread
    CPU time) still gives each step's load imbalance, and the run flags oversubscription."""
    workload = synthetic_workload(lengths="uniform:1-16", slow_rank=2, slow_factor=0.4)
    run_dir, summary = run_once(RunConfig(workload=workload, trainer="ddp", world_size=4),
                                tmp_path, timeout_s=120)
    if len(os.sched_getaffinity(0)) < 4:
        assert summary["oversubscribed"] is True
    table = step_metrics(read_timelines(run_dir))
    for _, row in table[~table["warmup"]].iterrows():
        expected = expected_for_step(workload, 4, int(row["step"]))["load_imbalance"]
        assert abs(row["load_imbalance"] - expected) <= TOLERANCE, (row["step"], row["load_imbalance"], expected)


def test_expected_ratios_follow_the_definitions():
    from fsbench.config import SyntheticComputeConfig
    from fsbench.models.synthetic import expected_ratios

    cfg = SyntheticComputeConfig(us_per_token=1000.0, slow_rank=1, slow_factor=0.5, comm_delay_ms=12.0)
    out = expected_ratios([24, 24], cfg)  # busy 24 and 36 ms, T = 48 ms
    assert out["step_time_ms"] == pytest.approx(48)
    assert out["bubble_ratio"] == pytest.approx((24 + 12) / 96)
    assert out["straggler_bubble_ratio"] == pytest.approx(12 / 96)
    assert out["exposed_comm_ratio"] == pytest.approx(24 / 96)
    assert out["load_imbalance"] == pytest.approx(12 / 72)
    # An inline input delay lengthens the step and is input stall, on every rank.
    cfg = SyntheticComputeConfig(us_per_token=1000.0, input_delay_ms=16.0)
    out = expected_ratios([24, 24], cfg)  # T = 16 + 24 ms
    assert out["input_stall_ratio"] == pytest.approx(16 / 40)
    assert out["bubble_ratio"] == pytest.approx(out["input_stall_ratio"])
    # A sleep in the optimizer lengthens the step and is other idle, on every rank.
    cfg = SyntheticComputeConfig(us_per_token=1000.0, optimizer_sleep_ms=8.0)
    out = expected_ratios([24, 24], cfg)  # T = 24 + 8 ms
    assert out["other_idle_ratio"] == pytest.approx(8 / 32)
    assert out["bubble_ratio"] == pytest.approx(out["other_idle_ratio"])
    assert out["exposed_comm_ratio"] == 0.0
