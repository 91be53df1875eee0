"""`fsbench bisect GOOD BAD`: the search (fast tier, with a judge that knows the answer)
and the command on a throwaway repository with one planted slow commit (dist tier: real
gates, paired runs)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fsbench.gates import bisect

ROOT = Path(__file__).resolve().parents[1]


def judge_for(first_bad: int | None, commits: list[str], inconclusive: set[int] = frozenset()):
    calls = []

    def judge(sha: str) -> bisect.Step:
        i = commits.index(sha)
        calls.append(i)
        outcome = ("inconclusive" if i in inconclusive else
                   "regressed" if first_bad is not None and i >= first_bad else "unchanged")
        return bisect.Step(sha, f"commit {i}", outcome, "", "", 3)
    return judge, calls


@pytest.mark.parametrize("n, first_bad", [(1, 0), (2, 0), (2, 1), (7, 3), (8, 0), (8, 7), (33, 17)])
def test_search_finds_the_first_bad_commit_in_log2_gates(n, first_bad):
    commits = [f"c{i}" for i in range(n)]
    judge, calls = judge_for(first_bad, commits)
    found = bisect.search(commits, judge)
    assert found.first_bad == commits[first_bad] and found.outcome == "regressed"
    assert calls[0] == n - 1  # BAD first
    assert len(calls) <= 1 + max(1, (n - 1).bit_length())


def test_nothing_to_find_when_bad_did_not_regress():
    commits = [f"c{i}" for i in range(5)]
    judge, calls = judge_for(None, commits)
    found = bisect.search(commits, judge)
    assert found.nothing and found.outcome == "unchanged" and calls == [4]


def test_an_inconclusive_gate_stops_the_search_naming_the_candidates():
    commits = [f"c{i}" for i in range(8)]
    judge, calls = judge_for(5, commits, inconclusive={3})
    found = bisect.search(commits, judge)
    assert found.outcome == "inconclusive" and found.first_bad is None
    assert found.candidates == commits and calls == [7, 3]  # the middle of (-1, 7] is 3
    assert "inconclusive" in bisect.report(found, "g" * 40)


def test_the_report_lists_a_gate_that_was_rerun_beside_its_rerun():
    step = bisect.Step("b" * 40, "the change", "unchanged", "fsbench: **unchanged** (exit 0)",
                       "store/02-bbbb", 6, earlier=[(3, "fsbench: **inconclusive** (exit 3)", "store/01-bbbb")])
    text = bisect.report(bisect.Found(steps=[step], nothing=True), "g" * 40)
    rows = [line for line in text.splitlines() if line.startswith("| bbbb")]
    assert len(rows) == 2 and "inconclusive, rerun" in rows[0] and "store/01-bbbb" in rows[0]
    assert "| unchanged " in rows[1] and "store/02-bbbb" in rows[1]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _throwaway(tmp_path: Path, commits: int, slow_at: int | None) -> tuple[Path, list[str]]:
    """A git repository of this checkout's files (as they are now), `commits` commits on top
    of one; commit `slow_at` makes the DDP trainer's step 10 ms slower."""
    repo = tmp_path / "repo"
    for rel in _git(ROOT, "ls-files").splitlines():
        src = ROOT / rel
        if src.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    _git(repo, "init", "-q")
    commit = ("-c", "user.name=fsbench-test", "-c", "user.email=test@fsbench", "commit", "-q", "-m")
    _git(repo, "add", "-A")
    _git(repo, *commit, "good")
    shas = [_git(repo, "rev-parse", "HEAD")]
    dp = repo / "fsbench" / "training" / "dp.py"
    for i in range(1, commits + 1):
        (repo / "BISECT_MARK").write_text(f"{i}\n")
        if i == slow_at:
            text = dp.read_text()
            marker = "        prepared: StepInput = next(inputs)\n"
            assert marker in text
            dp.write_text(text.replace(marker, marker + "        import time\n        time.sleep(0.01)  # planted\n"))
        _git(repo, "add", "-A")
        _git(repo, *commit, f"change {i}" + (" (slow)" if i == slow_at else ""))
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return repo, shas


def test_commits_between_refuses_unrelated_or_equal_commits(tmp_path):
    from fsbench.errors import ConfigError

    repo, shas = _throwaway(tmp_path, 2, None)
    assert bisect.commits_between(repo, shas[0], shas[2]) == shas[1:]
    with pytest.raises(ConfigError, match="not an ancestor"):
        bisect.commits_between(repo, shas[2], shas[0])
    with pytest.raises(ConfigError, match="same commit"):
        bisect.commits_between(repo, shas[1], shas[1])


# nightly: 50 s of real gates over real commits. Every push checks the search itself (the
# tests above, with planted gates) and a real gate of HEAD against its parent (.ci/run).
@pytest.mark.dist
@pytest.mark.nightly
def test_bisect_finds_the_planted_slow_commit(tmp_path, capsys, monkeypatch):
    """Seven commits after GOOD, the fourth makes every step 10 ms slower: found in four
    gates (BAD, then three halvings), each against GOOD, tiny at 1 rank, 2 pairs. The
    thresholds are wide (20% for times, 50% for memory, which 2 values a side cannot bound
    to 5%): the planted change is +100% or more, identical code moves by a few percent."""
    from fsbench.cli import main

    repo, shas = _throwaway(tmp_path, 7, slow_at=4)
    monkeypatch.chdir(repo)
    store = tmp_path / "bisect"
    code = main(["bisect", shas[0], shas[-1], "--workload", "tiny", "--trainers", "ddp",
                 "--world-size", "1", "--steps", "20", "--warmup", "2", "--pairs", "2",
                 "--threshold", "time=0.2", "--threshold", "ratio=0.2", "--threshold", "memory=0.5",
                 "--store", str(store), "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["outcome"] == "regressed", out
    assert out["first_bad"] == shas[4]
    assert [s["sha"] for s in out["steps"]] == [shas[7], shas[3], shas[5], shas[4]]
    assert [s["outcome"] for s in out["steps"]] == ["regressed", "unchanged", "regressed", "regressed"]
    assert (store / "bisect.md").read_text().startswith(f"fsbench bisect: **first bad commit {shas[4][:12]}**")
    assert all((Path(s["store"]) / "compare.junit.xml").exists() for s in out["steps"])
