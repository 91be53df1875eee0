"""scripts/quality_vs_recbole.py: fsbench's quality against RecBole's seeds; the interval
of the difference and a verdict that says inconclusive while the reference cannot tell."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("quality_vs_recbole",
                                               ROOT / "scripts" / "quality_vs_recbole.py")
qvr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qvr)


def quality(hr=(0.11, 0.10, 0.12)):
    return {"rows": [{"trainer": "ddp", "world_size": 2, "seed_list": [0, 1, 2],
                      "hr_at_10_per_seed": list(hr), "ndcg_at_10_per_seed": [0.05] * len(hr)}]}


def recbole(hr=(0.12, 0.125, 0.118), stopped=True, in_progress=()):
    return {"runs": [{"seed": i, "test_hit@10": h, "test_ndcg@10": 0.055, "epochs_trained": 40,
                      "stopped_early": stopped} for i, h in enumerate(hr)],
            "in_progress": [{"seed": s} for s in in_progress]}


def test_the_interval_is_the_pooled_t_interval():
    a, b = [0.11, 0.10, 0.12], [0.12, 0.125, 0.118]
    diff, lo, hi = qvr.pooled_interval(a, b)
    t = stats.ttest_ind(a, b, equal_var=True)
    want = t.confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / 3 - sum(b) / 3)
    assert (lo, hi) == pytest.approx((want.low, want.high))


def test_verdicts_met_missed_and_inconclusive():
    assert qvr.compare(quality(), recbole(), 0.9)[0]["verdict"] == "met"  # 0.11 / 0.121 = 0.91
    assert qvr.compare(quality((0.09, 0.1, 0.1)), recbole(), 0.9)[0]["verdict"] == "missed"
    two = recbole((0.12, 0.125), in_progress=[2])
    assert qvr.compare(quality(), two, 0.9)[0]["verdict"] == (
        "inconclusive: RecBole has 2 finished seed(s) of 3 (seeds [2] still training)")
    capped = recbole(stopped=False)
    assert qvr.compare(quality(), capped, 0.9)[0]["verdict"].startswith("inconclusive: RecBole seed(s)")
    # short of the target against a capped (lower-bound) reference: missed all the same
    assert qvr.compare(quality((0.09, 0.1, 0.1)), capped, 0.9)[0]["verdict"].startswith("missed")
    one = {"rows": [{**quality()["rows"][0], "hr_at_10_per_seed": [0.11], "ndcg_at_10_per_seed": [0.05]}]}
    assert "fsbench has 1 seed" in qvr.compare(one, recbole(), 0.9)[0]["verdict"]


def test_the_command_prints_the_table_and_exits_by_verdict(tmp_path):
    (tmp_path / "q.json").write_text(json.dumps(quality()))
    (tmp_path / "r.json").write_text(json.dumps(recbole((0.12,), stopped=True)))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "quality_vs_recbole.py"),
                           "--quality", str(tmp_path / "q.json"), "--recbole", str(tmp_path / "r.json")],
                          capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert "| ddp | 2 | HR@10 | 0.1100, 0.1000, 0.1200 | 0.1200 | 0.917 |" in done.stdout
    assert "RecBole has 1 finished seed(s) of 3" in done.stdout


def test_seeds_to_tell_two_fractions_apart_follow_the_pooled_spread():
    """2 (z_0.975 + z_0.8)^2 s^2 / delta^2 seeds a side; RecBole's own spread (0.016) at a
    mean of 0.134 needs dozens to tell 0.95x from 0.9x, a spread ten times smaller a few."""
    wide = [0.1177, 0.1495, 0.1347]
    n = qvr.seeds_to_tell([0.1220, 0.1220, 0.1188], wide, 0.95, 0.9)
    a, b = [0.1220, 0.1220, 0.1188], wide
    mean = lambda x: sum(x) / len(x)  # noqa: E731
    var = (sum((x - mean(a)) ** 2 for x in a) + sum((x - mean(b)) ** 2 for x in b)) / 4
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert n == pytest.approx(2 * z * z * var / (0.05 * mean(b)) ** 2)
    assert 20 < n < 60
    narrow = [mean(b) + (x - mean(b)) / 10 for x in b]
    assert qvr.seeds_to_tell(a, narrow, 0.95, 0.9) < n / 10
    assert qvr.seeds_to_tell(a, [], 0.95, 0.9) != qvr.seeds_to_tell(a, [], 0.95, 0.9)  # nan: no reference
