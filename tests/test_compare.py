"""fsbench compare / gate / history / reference: the statistics, the verdict rule, and the
commands on real runs."""
import json

import numpy as np
import pytest

from fsbench.gates import compare
from fsbench.gates import compare_sides
from fsbench.gates import gate
from fsbench import stats
from fsbench.gates import history
from fsbench.cli import main
from fsbench.config import RunConfig
from fsbench.running.runner import run_once
from fsbench.workloads.presets import tiny


def test_holm_adjusts_monotonically():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5]) == [0.5]


@pytest.mark.parametrize("kind, better, effect, ci, p, want", [
    ("time", "lower", 1.10, (1.04, 1.2), 0.001, "regressed"),    # slower, significant, beyond 5%
    ("time", "lower", 1.03, (1.01, 1.04), 0.001, "unchanged"),   # real but within the threshold
    ("time", "lower", 1.03, (1.01, 1.07), 0.001, "inconclusive"),  # could be 7%: cannot tell
    ("time", "lower", 1.10, (0.98, 1.2), 0.001, "inconclusive"),   # interval spans no change
    ("time", "lower", 1.10, (1.04, 1.2), 0.2, "inconclusive"),     # not significant
    ("time", "lower", 1.00, (0.99, 1.01), 0.9, "unchanged"),       # evidence of no change
    ("time", "higher", 0.90, (0.85, 0.95), 0.001, "regressed"),    # throughput down
    ("ratio", "lower", 0.05, (0.03, 0.07), 0.001, "regressed"),    # +5 bubble points
    ("ratio", "lower", -0.05, (-0.07, -0.03), 0.001, "improved"),
    ("ratio", "lower", 0.01, (0.005, 0.015), 0.001, "unchanged"),  # 1 point < 2 points
    # significant, all on the better side, reaching past the threshold: an improvement of
    # about the threshold's size (a gate measured -1.5 pp [-2.1, -1.0]); the same reach on
    # the worse side stays inconclusive (above: could be 7% slower)
    ("ratio", "lower", -0.015, (-0.021, -0.010), 0.0007, "improved"),
    ("time", "higher", 1.04, (1.029, 1.051), 0.0007, "improved"),
    ("ratio", "lower", 0.015, (0.010, 0.021), 0.0007, "inconclusive"),
    ("ratio", "lower", -0.015, (-0.021, -0.010), 0.2, "inconclusive"),  # not significant
])
def test_verdict_calls_unchanged_only_on_an_interval_within_the_threshold(kind, better, effect, ci, p, want):
    assert stats.verdict(kind, better, effect, ci, p, 0.01, compare.DEFAULT_THRESHOLDS[kind]) == want


def _steps(values, start=4):
    import pandas as pd

    v = np.asarray(values, dtype=float)
    return pd.DataFrame({"step": np.arange(start, start + len(v)), "step_time_ms": v, "one": 1.0,
                         "step_s": v / 1e3, "num_samples": 32.0})


def _paired(pairs, blocks):
    design, frames = compare.paired_design(pairs, blocks, compare.units_needed(8, 0.01))
    sums = [*compare.unit_sums(frames, "step_time_ms", "_b"), *compare.unit_sums(frames, "step_time_ms", "_n")]
    return design, sums


def test_blocks_cancel_drift_that_runs_cannot():
    """The machine's speed drifts block to block by +-20%; NEW is 10% slower. Paired by
    block (both sides ran each block a second apart) the drift cancels and the change is
    found with a tight interval; two whole runs a side cannot reach alpha at all."""
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(2):
        drift = np.repeat(np.exp(rng.normal(0, 0.2, 15)), 4)  # per 4-step block
        data = rng.uniform(150, 250, 60)                       # the batches: same both sides
        noise = lambda: np.exp(rng.normal(0, 0.03, 60))        # noqa: E731
        pairs.append((_steps(data * drift * noise()), _steps(1.10 * data * drift * noise())))
    design, sums = _paired(pairs, [4, 4])
    assert design == "blocks of 4 steps" and len(sums[0]) == 30
    effect = stats.total_effect("time", *sums)
    lo, hi = stats.interval("time", *sums, paired=True)
    p, floor = stats.paired_test("time", *sums)
    assert 1.07 < lo < effect < hi < 1.13 and p < 1e-3 and floor * 8 < 0.01
    assert stats.verdict("time", "lower", effect, (lo, hi), p * 8, 0.01, 0.05) == "regressed"
    runs = [compare.unit_sums([f.assign(unit=i)], "step_time_ms", s)
            for i, f in enumerate(compare._paired_frames(pairs)) for s in ("_b", "_n")]
    two = [np.r_[runs[0][j], runs[2][j]] if k == 0 else np.r_[runs[1][j], runs[3][j]]
           for k in (0, 1) for j in (0, 1)]
    assert stats.paired_test("time", *two)[1] == 0.5  # two pairs: p can never be < 0.5


@pytest.mark.parametrize("every, slow, seeds, verdicts", [
    (8, 2.0, 3, {"regressed"}),                   # the default gate: three seeds
    (8, 2.0, 2, {"regressed", "inconclusive"}),  # CI's two seeds: 15 stalls, near alpha/8
    (16, 3.0, 4, {"regressed"}),
    (16, 3.0, 2, {"regressed", "inconclusive"}),  # 7-8 stalls: sign flips cannot reach alpha/8
])
def test_an_intermittent_stall_counts_as_the_totals_count_it(every, slow, seeds, verdicts):
    """One step in `every` `slow` times as slow on NEW, the versions taking turns every
    step: the effect is the ratio of totals (about +(slow-1)/every), not a median of
    per-step changes (~0); the gate calls it a regression, or, with too few stalls to
    tell them from noise, inconclusive -- never unchanged."""
    rng = np.random.default_rng(every)
    pairs = []
    for _ in range(seeds):
        data, drift = rng.uniform(150, 250, 60), np.exp(rng.normal(0, 0.2, 60))
        noise = lambda: np.exp(rng.normal(0, 0.11, 60))  # noqa: E731  (measured A/A sd per step)
        stall = np.where(np.arange(4, 64) % every == 0, slow, 1.0)
        pairs.append((_steps(data * drift * noise()), _steps(data * drift * noise() * stall)))
    design, sums = _paired(pairs, [1] * seeds)
    effect = stats.total_effect("time", *sums)
    truth = sum((n["step_time_ms"].sum()) for _, n in pairs) / sum(b["step_time_ms"].sum() for b, _ in pairs)
    assert effect == pytest.approx(truth) and effect > 1 + 0.5 * (slow - 1) / every
    lo, hi = stats.interval("time", *sums, paired=True)
    p, floor = stats.paired_test("time", *sums)
    assert stats.verdict("time", "lower", effect, (lo, hi), min(1.0, 8 * p), 0.01, 0.05) in verdicts


def test_unpaced_runs_fall_back_to_batches_of_steps_that_can_reject():
    """One run a side (same seed, not paced), NEW 15% slower: whole runs would be one unit
    (p >= 1); batches of steps reach alpha, and the design says which it used."""
    rng = np.random.default_rng(3)
    data = rng.uniform(150, 250, 60)
    pair = (_steps(data * np.exp(rng.normal(0, 0.1, 60))), _steps(1.15 * data * np.exp(rng.normal(0, 0.1, 60))))
    design, sums = _paired([pair], [None])
    assert design.startswith("batches of") and "not paced" in design
    p, floor = stats.paired_test("time", *sums)
    assert floor * 8 < 0.01 and p * 8 < 0.01
    assert stats.total_effect("time", *sums) == pytest.approx(
        pair[1]["step_time_ms"].sum() / pair[0]["step_time_ms"].sum())


def test_batch_size_grows_with_autocorrelation():
    rng = np.random.default_rng(4)
    white = [rng.normal(0, 1, 60)]
    drifting = [np.repeat(rng.normal(0, 1, 10), 6) + rng.normal(0, 0.1, 60)]
    assert stats.batch_size(white, 12) == 1
    assert stats.batch_size(drifting, 4) >= 4
    assert stats.batch_size(drifting, 40) is None  # too few steps for their correlation


def test_randomization_tests_know_their_smallest_p():
    ones = np.ones(3)
    assert stats.paired_test("time", ones, ones, 2 * ones, ones) == (pytest.approx(0.25), pytest.approx(0.25))
    p, floor = stats.unpaired_test("time", np.ones(2), np.ones(2), 2 * np.ones(2), np.ones(2))
    assert floor == pytest.approx(2 / 6) and p == pytest.approx(2 / 6)
    # A big design: Monte Carlo, floor 1 / (draws + 1).
    p, floor = stats.paired_test("ratio", np.full(40, 0.2), np.ones(40), np.full(40, 0.3), np.ones(40))
    assert floor == pytest.approx(1 / (stats.DRAWS + 1)) and p == floor


def test_memory_test_exact_and_noisy():
    assert stats.memory_test(np.array([100.0, 102.0]), np.array([110.0, 112.2]), True)[3] == 0.0
    assert stats.memory_test(np.array([100.0, 100.0]), np.array([100.0, 100.0]), False)[3] == 1.0
    eff, lo, hi, p, _ = stats.memory_test(np.array([100.0, 101, 99, 100]),
                                               np.array([110.0, 111, 109, 110.5]), True)
    assert p < 0.01 and lo > 1.05


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


@pytest.mark.dist
def test_paced_runs_take_turns_block_by_block(tmp_path):
    """The gate's real turn-taking: two runs of this checkout, blocks of 2 steps. In every
    block the two sides' step spans do not overlap in time (one ran, the other waited),
    and compare pairs them by block."""
    from fsbench.measurement.timeline import read_timelines

    sides = (gate.Side("base", gate.repo_root()), gate.Side("new", gate.repo_root()))
    sweep = gate.Sweep(workload="tiny", trainers=("ddp",), steps=8, warmup=2, block_steps=2)
    gate.run_paced(sides, sweep, "ddp", tmp_path, seed=0, rng=__import__("random").Random(0))
    spans = {}
    for side in ("base", "new"):
        (run_dir,) = [d for d in (tmp_path / side).iterdir() if d.is_dir()]
        assert compare_sides.pace_of(run_dir)[1] == 2
        tl = read_timelines(run_dir)
        steps = tl[tl["name"] == "step"].assign(end_ns=lambda t: t["start_ns"] + t["dur_ns"])
        spans[side] = steps.groupby(steps["step"] // 2).agg(start=("start_ns", "min"), end=("end_ns", "max"))
    b, n = spans["base"], spans["new"]
    assert len(b) == len(n) == 4
    assert ((b["end"] <= n["start"]) | (n["end"] <= b["start"])).all()
    rows, _ = compare.compare(*(compare_sides.load_side(tmp_path / s).assign(contended=False)
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
    assert main(["history", "--store", str(tmp_path / "a"), "--out", str(tmp_path / "h")]) == 0
    page = (tmp_path / "h" / "history.html").read_text()
    assert page.count("<img") == len(history.METRICS) and "data:image/png;base64," in page
    capsys.readouterr()
    code = main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json",
                 "--out", str(tmp_path / "cmp.json")])
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert code == result["exit_code"] == {"regressed": 1, "inconclusive": 3, "unchanged": 0}[result["outcome"]]
    # Contended runs are left out, each named: beside a busy neighbour a side can be empty,
    # and then the comparison says inconclusive (never unchanged).
    assert sum("contended" in n and "left out" in n for n in result["notes"]) == contended
    timed = [r for r in result["rows"] if r["metric"] != "*"]
    if not timed:
        assert contended and code == 3
        return
    assert {r["metric"] for r in timed} == set(compare.METRICS)
    # A row with no units to test (its runs, or their partners, left out as contended) is
    # inconclusive, never unchanged; on a quiet machine every row has units on both sides.
    assert all(r["verdict"] == "inconclusive" for r in timed if not (r["n_base"] and r["n_new"]))
    if not contended:
        assert all(r["n_base"] > 0 and r["n_new"] > 0 for r in timed)


@pytest.mark.parametrize("argv, expected", [
    (["compare", "/no/such", "/no/such"], "not a run directory or a store of runs"),
    (["gate", "--base", "no-such-rev-xyz"], "--base 'no-such-rev-xyz': not a commit"),
    (["gate", "--base", "HEAD", "--pairs", "0"], "--pairs=0 must be >= 1"),
    (["compare", ".", ".", "--threshold", "speed=1"], "--threshold 'speed=1': expected NAME=VALUE"),
    (["reference", "check", "--only", "nope"], "--only nope: unknown"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_planner_loads_match_the_reference_exactly():
    from fsbench.gates import reference

    moved, notes = reference.check(["planner_loads"])
    assert moved == [] and notes == []


@pytest.mark.dist
def test_trainer_losses_match_the_reference(loss_runs):
    """The deterministic gate on losses (exact on the reference's torch and CPU ISA), on
    the session's runs of the gate (`fsbench reference check` makes the same runs)."""
    from fsbench.gates import reference

    moved, notes = reference.check(["losses"], computed={"losses": reference.losses_of(loss_runs)})
    assert moved == [], (moved, notes)


def test_simulator_outputs_match_the_reference_and_a_change_to_them_is_named(tmp_path):
    """The deterministic gate on `fsbench simulate` (h100 preset: no fit, pure code)."""
    import json

    from fsbench.gates import reference

    moved, notes = reference.check(["simulated"])
    assert moved == [], (moved, notes)
    ref = json.loads((reference.REFERENCE_DIR / "simulated.json").read_text())
    ref["values"]["ddp@8"]["step_time_ms"][2] *= 1.001  # as if the model had moved
    (tmp_path / "simulated.json").write_text(json.dumps(ref))
    moved, _ = reference.check(["simulated"], tmp_path)
    assert moved and all("ddp@8/step_time_ms[2]" in m for m in moved)


# ---------------------------------------------------------------------------
# The command on stores as users make them (run directories written from known step times:
# tests/support/written_runs.py), one outcome each.

def _steps_ms(rng, n=40, scale=1.0, every=0):
    times = scale * rng.uniform(150, 250, n) * np.exp(rng.normal(0, 0.05, n))
    if every:
        times[np.arange(n) % every == 0] *= 2
    return times


def _compare(capsys, *argv):
    code = main(["compare", *map(str, argv), "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_one_run_per_side_fifteen_percent_slower_is_a_regression(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(0)
    data = rng.uniform(150, 250, 40)
    write_run(tmp_path / "a", "r1", data * np.exp(rng.normal(0, 0.05, 40)))
    write_run(tmp_path / "b", "r1", 1.15 * data * np.exp(rng.normal(0, 0.05, 40)))
    code, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    step = next(r for r in result["rows"] if r["metric"] == "step_time_ms")
    assert code == 1 and result["outcome"] == "regressed" and step["verdict"] == "regressed"
    assert step["pairing"].startswith("batches of") and step["effect"] == pytest.approx(1.15, abs=0.03)


def test_an_intermittent_stall_in_paced_runs_is_a_regression(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(1)
    for seed in (0, 1):
        data = rng.uniform(150, 250, 64)
        stall = np.where(np.arange(64) % 8 == 0, 2.0, 1.0)
        write_run(tmp_path / "a", f"s{seed}", data * np.exp(rng.normal(0, 0.1, 64)), seed=seed, block_steps=1)
        write_run(tmp_path / "b", f"s{seed}", stall * data * np.exp(rng.normal(0, 0.1, 64)), seed=seed,
                  block_steps=1)
    code, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    step = next(r for r in result["rows"] if r["metric"] == "step_time_ms")
    assert step["pairing"] == "blocks of 1 steps" and step["units"] == 124
    assert code == 1 and step["verdict"] == "regressed" and step["effect"] > 1.09


def test_all_contended_sides_are_inconclusive_with_the_reason(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(2)
    for side in ("a", "b"):
        for seed in (0, 1):
            write_run(tmp_path / side, f"s{seed}", _steps_ms(rng), seed=seed, contended=True)
    code, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    assert code == 3 and result["outcome"] == "inconclusive"
    assert "contended" in result["rows"][0]["reason"] and "quiet machine" in result["rows"][0]["remedy"]
    assert sum("contended" in n for n in result["notes"]) == 4
    main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])  # the markdown says it too
    assert capsys.readouterr().out.startswith("fsbench: **inconclusive** (exit 3) | 0 regressed, 1 inconclusive")


def test_a_key_on_one_side_only_is_inconclusive(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(3)
    data = rng.uniform(150, 250, 40)
    write_run(tmp_path / "a", "r1", data)
    write_run(tmp_path / "a", "r2", data, trainer="freescale")
    write_run(tmp_path / "b", "r1", data * 1.001)
    code, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    only = [r for r in result["rows"] if r["metric"] == "*"]
    assert code == 3 and [(r["trainer"], r["reason"]) for r in only] == [("freescale", "only BASE has runs of this key")]


def test_runs_from_two_machines_are_inconclusive_unless_allowed(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(4)
    data = rng.uniform(150, 250, 40)
    write_run(tmp_path / "a", "r1", data)
    write_run(tmp_path / "b", "r1", data * 1.2, host={"hostname": "other", "cpu_model": "cpu", "cpus": 8,
                                                      "cuda_available": False})
    code, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    assert code == 3 and "different machines" in result["rows"][0]["reason"]
    assert "hostname box vs other" in result["rows"][0]["reason"] and "cpus 2 vs 8" in result["rows"][0]["reason"]
    code = main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json", "--allow-cross-machine"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and any("machines differ" in n for n in result["notes"])
    # Each side's machine is stated, whatever the verdict.
    assert any(n.startswith("BASE machine: hostname=box, cpu_model=cpu, cpus=2, accelerator=none")
               for n in result["notes"])
    assert any(n.startswith("NEW machine: hostname=other") for n in result["notes"])


@pytest.mark.parametrize("damage", ["garbage", "empty", "missing", "one rank's garbage"])
def test_unreadable_rank_files_are_named_not_a_crash_nor_a_verdict(tmp_path, capsys, damage):
    """Also when one rank's files alone are damaged: a one-line garbage file reads as a
    cut last line (no records), and the other rank's steps alone would look sound (no
    straggler) and give a verdict."""
    from written_runs import write_run

    rng = np.random.default_rng(5)
    write_run(tmp_path / "a", "r1", _steps_ms(rng))
    run = write_run(tmp_path / "b", "r1", _steps_ms(rng))
    files = [*run.glob("rank-*.jsonl"), *run.glob("steps-rank-*.jsonl")]
    if damage == "one rank's garbage":
        files = [run / "rank-1.jsonl"]
    for f in files:
        if damage == "missing":
            f.unlink()
        else:
            f.write_text("" if damage == "empty" else "\x00garbage{\n")
    code, result, err = _compare(capsys, tmp_path / "a", tmp_path / "b")
    assert code not in (0, 1) and "Traceback" not in err
    assert any("rank files unreadable" in n for n in result["notes"])


def test_unknown_contention_is_kept_and_said(tmp_path, capsys):
    from written_runs import write_run

    rng = np.random.default_rng(6)
    data = rng.uniform(150, 250, 40)
    write_run(tmp_path / "a", "r1", data, contended=None)
    write_run(tmp_path / "b", "r1", data)
    _, result, _ = _compare(capsys, tmp_path / "a", tmp_path / "b")
    assert any("contention unknown" in n for n in result["notes"])
    assert all(r["metric"] != "*" for r in result["rows"])


def test_an_internal_error_exits_4_in_one_line(monkeypatch, tmp_path, capsys):
    from written_runs import write_run

    write_run(tmp_path / "a", "r1", np.full(10, 100.0))
    write_run(tmp_path / "b", "r2", np.full(10, 100.0))

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(compare, "compare", broken)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: RuntimeError: a bug" in err[0] and "fsbench-error-" in err[0]
    assert main(["--debug", "compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 4
    assert "Traceback" in capsys.readouterr().err


def test_a_regression_reads_as_a_failing_junit_case_and_heads_the_comment(tmp_path, capsys):
    """One stalled side: the JUnit (parsed by a real XML parser) fails its step-time case;
    the Markdown's first line names the regression; --only-changed leaves unchanged rows
    out of the table but not out of the counts."""
    import xml.etree.ElementTree as ET

    from written_runs import write_run

    rng = np.random.default_rng(8)
    for seed in (0, 1, 2):
        data = rng.uniform(150, 250, 64)
        write_run(tmp_path / "a", f"s{seed}", data * np.exp(rng.normal(0, 0.05, 64)), seed=seed, block_steps=1)
        write_run(tmp_path / "b", f"s{seed}", 1.3 * data * np.exp(rng.normal(0, 0.05, 64)), seed=seed,
                  block_steps=1)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert main(["compare", a, b, "--format", "junit"]) == 1
    root = ET.fromstring(capsys.readouterr().out)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert root.tag == "testsuites" and int(root.get("failures")) >= 1
    assert cases["step_time_ms"].find("failure").get("message").startswith("regressed: +3")
    assert int(root.get("tests")) == len(cases) == len(compare.METRICS)
    for c in cases.values():  # every case passes, fails or is skipped with its reason
        skipped = c.find("skipped")
        assert skipped is None or "To settle it:" in skipped.get("message")
    assert main(["compare", a, b]) == 1
    md = capsys.readouterr().out
    first = md.splitlines()[0]
    assert first.startswith("fsbench: **regressed** (exit 1): tiny ddp 2 ranks step_time_ms +3"), first
    assert main(["compare", a, b, "--only-changed"]) == 1
    short = capsys.readouterr().out
    unchanged = sum(1 for line in md.splitlines() if line.rstrip().endswith("| unchanged |"))
    assert short.splitlines()[0] == first
    assert not any(line.rstrip().endswith("| unchanged |") for line in short.splitlines())
    assert (f"{unchanged} unchanged row(s) left out" in short) == (unchanged > 0)


def test_junit_of_an_inconclusive_key_skips_with_the_reason():
    import xml.etree.ElementTree as ET

    from fsbench.gates import compare_output

    rows = [compare._nan_row(("small", "v1", "ddp", 2), "*", "every BASE run of this key is contended",
                             "rerun on a quiet machine")]
    root = ET.fromstring(compare_output.junit(rows, ["BASE run r1: contended"]))
    (case,) = root.iter("testcase")
    assert case.get("name") == "every metric" and root.get("skipped") == "1" and root.get("failures") == "0"
    assert case.find("skipped").get("message") == ("inconclusive: every BASE run of this key is contended. "
                                                   "To settle it: rerun on a quiet machine.")
    assert "contended" in root.find("testsuite/system-out").text
    assert compare_output.summary_line(rows).startswith("fsbench: **inconclusive** (exit 3) | 0 regressed, 1 inconclusive")


def test_a_trainer_whose_pair_stayed_contended_keeps_no_verdict():
    """A gate whose pair of one trainer stayed contended after its reruns: that trainer's
    verdicts from the pairs kept (which the neighbour may have slowed below the flag's
    threshold) become inconclusive, "unchanged" too, with the reason; another trainer's
    stand; a row names the contended seeds."""
    def row(trainer, metric, verdict):
        return compare.Row("small", trainer, 2, metric, 1.0, 1.06, 1.06, 1.02, 1.1, 0.01, 0.02,
                           60, 60, verdict)

    rows = [row("freescale", "step_time_ms", "regressed"), row("freescale", "bubble_ratio", "unchanged"),
            row("ddp", "step_time_ms", "regressed"), row("freescale", "peak_memory_mb", "inconclusive")]
    out = gate.contended_rows(gate.Sweep(), rows, [("freescale", 1, ["base", "new"])], retries=2)
    by = {(r.trainer, r.metric): r for r in out}
    assert by["freescale", "step_time_ms"].verdict == "inconclusive"
    assert by["freescale", "step_time_ms"].reason.startswith("regressed on the pairs kept")
    assert "seed 1 (base/new) stayed contended in 3 tries" in by["freescale", "bubble_ratio"].reason
    assert by["freescale", "bubble_ratio"].verdict == "inconclusive"
    assert by["ddp", "step_time_ms"].verdict == "regressed"
    assert by["freescale", "peak_memory_mb"].reason == ""  # already inconclusive: its own reason
    assert by["freescale", "*"].verdict == "inconclusive" and len(out) == len(rows) + 1
