"""`fsbench micro planner`: the input stage's planner timed at a given size, with the
plan's quality beside the time."""
import json
import os

import pytest

from fsbench.cli import main


def _json(argv, capsys):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_every_planner_is_timed_with_its_plan_quality(capsys):
    before = os.sched_getaffinity(0)
    doc = _json(["micro", "planner", "--samples", "1024", "--ranks", "32", "--window", "2",
                 "--repeats", "3", "--format", "json"], capsys)
    assert os.sched_getaffinity(0) == before  # pinned only while timing
    names = [r["planner"] for r in doc["rows"]]
    assert names == ["lpt", "lpt window=2", "kk", "kk window=2", "best_of", "best_of window=2"]
    for r in doc["rows"]:
        windowed = "window" in r["planner"]
        assert r["samples"] == 1024 * (2 if windowed else 1) and r["ranks"] == 32
        assert 0 < r["median_ms"] <= r["p90_ms"]
        assert r["median_ms_per_batch"] == pytest.approx(r["median_ms"] / (2 if windowed else 1))
        # No plan beats the bound; these partitioners come within a few percent of it.
        assert 1.0 - 1e-12 <= r["ratio_to_bound"] < 1.05
    assert doc["lengths"] == "movielens-100k" and doc["repeats"] == 3


def test_lengths_follow_the_workload_and_its_overrides(capsys):
    doc = _json(["micro", "planner", "--samples", "256", "--ranks", "8", "--window", "1",
                 "--repeats", "1", "--set", "lengths=yelp", "--format", "json"], capsys)
    assert doc["lengths"] == "yelp" and [r["planner"] for r in doc["rows"]] == ["lpt", "kk", "best_of"]


@pytest.mark.parametrize("argv, expected", [
    (["--samples", "10", "--ranks", "64"], "--samples=10 must be >= --ranks=64"),
    (["--repeats", "0"], "--repeats=0 must be >= 1"),
    (["--trainer", "ddp"], "declares no planner"),
    (["--set", "lengths=nope"], "lengths"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    assert main(["micro", "planner", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]


def test_one_core_runs_one_torch_thread_and_restores_both():
    """The input stage's micro-benchmarks run as the stage does: one CPU, one torch thread
    (two OpenMP threads pinned to one core waited for each other: 3.6x the stage's time)."""
    import torch

    from fsbench.scaling.planner_micro import one_core

    threads, cpus = torch.get_num_threads(), os.sched_getaffinity(0)
    torch.set_num_threads(2)
    try:
        with one_core() as where:
            assert torch.get_num_threads() == 1
            assert where.startswith("not pinned") or len(os.sched_getaffinity(0)) == 1
        assert torch.get_num_threads() == 2 and os.sched_getaffinity(0) == cpus
    finally:
        torch.set_num_threads(threads)
