"""fsbench compare / gate / history / reference: the statistics, the verdict rule, and the
commands on real runs."""
import json

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
    sweep = gate.Sweep(trainers=("ddp", "freescale"), pairs=6, seed=3)
    order = gate.plan(sweep, ("base", "new"))
    assert order == gate.plan(sweep, ("base", "new"))
    assert [(p, t) for p, t, _ in order] == [(p, t) for p in range(6) for t in ("ddp", "freescale")]
    assert {o for _, _, o in order} == {("base", "new"), ("new", "base")}  # both go first


def _steps(values, start=4):
    import pandas as pd

    return pd.DataFrame({"step": np.arange(start, start + len(values)), "step_time_ms": values})


def test_blocks_cancel_drift_that_runs_cannot():
    """The machine's speed drifts block to block by +-20%; NEW is 10% slower. Paired by
    block (both sides ran each block a second apart) the drift cancels and the change is
    found with a tight interval; paired by whole runs (two runs) nothing can be said."""
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(2):
        drift = np.repeat(np.exp(rng.normal(0, 0.2, 15)), 4)  # per 4-step block
        data = rng.uniform(150, 250, 60)                       # the batches: same both sides
        noise = lambda: np.exp(rng.normal(0, 0.03, 60))        # noqa: E731
        pairs.append((_steps(data * drift * noise()), _steps(1.10 * data * drift * noise())))
    by_block = compare.paired_units("time", "step_time_ms", [(b, n, 4) for b, n in pairs])
    by_run = compare.paired_units("time", "step_time_ms", [(b, n, None) for b, n in pairs])
    assert len(by_block) == 30 and len(by_run) == 2
    effect, lo, hi, p = compare.paired_test("time", by_block)
    assert 1.08 < lo < effect < hi < 1.12 and p < 1e-5
    assert compare.verdict("time", "lower", effect, (lo, hi), p, 0.01, 0.05) == "regressed"
    assert compare.paired_test("time", by_run)[3] > 0.01  # one degree of freedom: untestable


def test_paired_test_on_ratios_and_degenerate_units():
    rng = np.random.default_rng(1)
    units = 0.05 + rng.normal(0, 0.01, 20)
    effect, lo, hi, p = compare.paired_test("ratio", units)
    assert lo < 0.05 < hi and effect == pytest.approx(0.05, abs=0.005) and p < 1e-4
    # A unit stretched by a neighbour's burst barely moves the estimate (Hodges-Lehmann).
    assert compare.paired_test("ratio", np.r_[units, 0.9])[0] == pytest.approx(effect, abs=0.003)
    # No change, with noise: signs are coin flips, nothing significant.
    assert compare.paired_test("ratio", rng.normal(0, 0.01, 20))[3] > 0.01
    assert compare.paired_test("ratio", np.array([0.0, 0.0, 0.0]))[3] == 1.0
    assert compare.paired_test("time", np.array([np.log(1.2)] * 3))[3] == 0.0  # exact change
    assert compare.paired_test("time", np.array([0.1]))[3] == 1.0  # one unit: no test
    assert compare.paired_test("memory", np.log([1.10, 1.11, 1.09, 1.10]))[3] < 0.01  # 4 units
    mem = compare.paired_memory([np.array([100.0, 102.0])], [np.array([110.0, 112.2])])
    assert np.exp(mem) == pytest.approx([1.1, 1.1])


@pytest.mark.dist
def test_paced_runs_take_turns_block_by_block(tmp_path):
    """The gate's real turn-taking: two runs of this checkout, blocks of 2 steps. In every
    block the two sides' step spans do not overlap in time (one ran, the other waited),
    and compare pairs them by block."""
    from fsbench.timeline import read_timelines

    sides = (gate.Side("base", gate.repo_root()), gate.Side("new", gate.repo_root()))
    sweep = gate.Sweep(workload="tiny", trainers=("ddp",), steps=8, warmup=2, block_steps=2)
    gate.run_paced(sides, sweep, "ddp", tmp_path, seed=0, rng=__import__("random").Random(0))
    spans = {}
    for side in ("base", "new"):
        (run_dir,) = [d for d in (tmp_path / side).iterdir() if d.is_dir()]
        assert compare.pace_of(run_dir)[1] == 2
        tl = read_timelines(run_dir)
        steps = tl[tl["name"] == "step"].assign(end_ns=lambda t: t["start_ns"] + t["dur_ns"])
        spans[side] = steps.groupby(steps["step"] // 2).agg(start=("start_ns", "min"), end=("end_ns", "max"))
    b, n = spans["base"], spans["new"]
    assert len(b) == len(n) == 4
    assert ((b["end"] <= n["start"]) | (n["end"] <= b["start"])).all()
    rows, _ = compare.compare(*(compare.load_side(tmp_path / s).assign(contended=False)
                                for s in ("base", "new")))
    timed = [r for r in rows if r.metric != "peak_memory_mb"]
    assert {(r.pairing, r.units) for r in timed} == {("blocks of 2 steps", 3)}  # steps 2..7


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


def test_simulator_outputs_match_the_reference_and_a_change_to_them_is_named(tmp_path):
    """The deterministic gate on `fsbench simulate` (h100 preset: no fit, pure code)."""
    import json

    from fsbench import reference

    moved, notes = reference.check(["simulated"])
    assert moved == [], (moved, notes)
    ref = json.loads((reference.REFERENCE_DIR / "simulated.json").read_text())
    ref["values"]["ddp@8"]["step_time_ms"][2] *= 1.001  # as if the model had moved
    (tmp_path / "simulated.json").write_text(json.dumps(ref))
    moved, _ = reference.check(["simulated"], tmp_path)
    assert moved and all("ddp@8/step_time_ms[2]" in m for m in moved)
