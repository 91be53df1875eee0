"""fsbench compare / gate / history / reference: the statistics, the verdict rule, and the
commands on real runs."""
import json
import subprocess
import sys

import numpy as np
import pytest

from fsbench import compare, gate, history
from fsbench.cli import main
from fsbench.config import RunConfig
from fsbench.runner import run_once
from fsbench.workloads.presets import tiny


def test_holm_adjusts_monotonically():
    assert compare.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert compare.holm([0.5]) == [0.5]


@pytest.mark.parametrize("kind, better, effect, ci, p, want", [
    ("time", "lower", 1.10, (1.04, 1.2), 0.001, "regressed"),   # slower, significant, beyond 5%
    ("time", "lower", 1.03, (1.01, 1.05), 0.001, "unchanged"),  # within the threshold
    ("time", "lower", 1.10, (0.98, 1.2), 0.001, "unchanged"),   # one run drifting: CI spans 1
    ("time", "lower", 1.10, (1.04, 1.2), 0.2, "unchanged"),     # not significant
    ("time", "higher", 0.90, (0.85, 0.95), 0.001, "regressed"),  # throughput down
    ("ratio", "lower", 0.05, (0.03, 0.07), 0.001, "regressed"),  # +5 bubble points
    ("ratio", "lower", -0.05, (-0.07, -0.03), 0.001, "improved"),
    ("ratio", "lower", 0.01, (0.005, 0.02), 0.001, "unchanged"),  # 1 point < 2 points
])
def test_verdict_needs_significance_threshold_and_run_level_interval(kind, better, effect, ci, p, want):
    assert compare.verdict(kind, better, effect, ci, p, 0.01, compare.DEFAULT_THRESHOLDS[kind]) == want


def test_run_bootstrap_sees_between_run_spread():
    rng = np.random.default_rng(0)
    tight = [rng.normal(10, 0.1, 20) for _ in range(4)]
    # each run has its own offset: the run-level interval must be much wider than the
    # per-step noise suggests
    drifting = [rng.normal(10 + off, 0.1, 20) for off in (-1, 1, -0.5, 0.5)]
    lo, hi = compare.run_bootstrap("time", tight, drifting)
    assert hi - lo > 0.05
    lo2, hi2 = compare.run_bootstrap("time", tight, [t.copy() for t in tight])
    assert hi2 - lo2 < 0.02


def test_change_points_find_a_step():
    x = np.r_[np.full(8, 10.0), np.full(8, 12.0)] + np.random.default_rng(1).normal(0, 0.1, 16)
    assert history.change_points(x) == [8]
    assert history.change_points(np.random.default_rng(2).normal(10, 0.1, 16)) == []


def test_gate_plan_alternates_sides_reproducibly():
    sweep = gate.Sweep(trainers=("ddp",), pairs=6, seed=3)
    order = gate.plan(sweep, ("base", "new"))
    assert order == gate.plan(sweep, ("base", "new"))
    firsts = [order[2 * i][1] for i in range(6)]
    assert set(firsts) == {"base", "new"}  # both sides go first in some pair
    assert all({order[2 * i][1], order[2 * i + 1][1]} == {"base", "new"} for i in range(6))


@pytest.mark.dist
def test_compare_history_on_real_runs(tmp_path, capsys):
    import dataclasses

    workload = dataclasses.replace(tiny(), steps=8, warmup=2)
    contended = 0
    for side in ("a", "b"):
        for seed in (0, 1):
            _, summary = run_once(RunConfig(workload=workload, trainer="ddp", world_size=2,
                                            seed=seed), tmp_path / side, timeout_s=240)
            contended += bool(summary["contended"])
    assert main(["history", "--runs", str(tmp_path / "a"), "--out", str(tmp_path / "h")]) == 0
    page = (tmp_path / "h" / "history.html").read_text()
    assert page.count("<img") == len(history.METRICS) and "data:image/png;base64," in page
    capsys.readouterr()
    code = main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json",
                 "--out", str(tmp_path / "cmp.json")])
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert code == (1 if result["regressions"] else 0)
    # Contended runs are left out, each named: beside a busy neighbour a side can be empty.
    assert sum("contended, left out" in n for n in result["not_compared"]) == contended
    if not result["rows"]:
        pytest.skip(f"{contended} of 4 runs contended (a neighbour took the cores): left out "
                    "and named, nothing left to compare")
    metrics = {r["metric"] for r in result["rows"]}
    assert metrics == set(compare.METRICS)
    assert all(r["n_base"] > 0 and r["n_new"] > 0 for r in result["rows"])


@pytest.mark.parametrize("argv, expected", [
    (["compare", "/no/such", "/no/such"], "not a run directory or a store of runs"),
    (["gate", "--base", "no-such-rev-xyz"], "--base 'no-such-rev-xyz': not a commit"),
    (["gate", "--base", "HEAD", "--pairs", "1"], "--pairs=1 must be >= 2"),
    (["compare", ".", ".", "--threshold", "speed=1"], "--threshold 'speed=1': expected NAME=VALUE"),
    (["reference", "check", "--only", "nope"], "--only nope: unknown"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_planner_loads_match_the_reference_exactly():
    from fsbench import reference

    moved, notes = reference.check(["planner_loads"])
    assert moved == [] and notes == []


@pytest.mark.dist
def test_trainer_losses_match_the_reference():
    """The deterministic gate on losses (exact on the reference's torch and CPU ISA)."""
    from fsbench import reference

    moved, notes = reference.check(["losses"])
    assert moved == [], (moved, notes)
