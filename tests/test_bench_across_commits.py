"""Benchmarks across commits, on a throwaway repository of two commits whose second makes
the benchmark five times slower.

asv (asv.conf.json): `asv continuous BASE HEAD` builds and installs each revision into one
virtualenv and measures it, with this repository's environment settings (environment
type, build, install and uninstall commands) and a requirement matrix cut to the
throwaway package's (torch would take a minute to install).
pytest-benchmark (scripts/bench_compare.sh): the base's results saved, the change compared
and failed on its regression."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.dist  # builds a virtualenv and two wheels: 20-40 s

PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "slowpkg"
version = "0.1"
"""


def _git(repo: Path, *args: str) -> str:
    ident = ("-c", "user.name=fsbench-test", "-c", "user.email=test@fsbench")
    return subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _throwaway(tmp_path: Path) -> Path:
    from asv.util import load_json

    repo = tmp_path / "repo"
    (repo / "slowpkg").mkdir(parents=True)
    (repo / "benchmarks").mkdir()
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "slowpkg" / "__init__.py").write_text("import time\n\ndef work():\n    time.sleep(0.002)\n")
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "bench.py").write_text("import slowpkg\n\ndef time_work():\n    slowpkg.work()\n")
    (repo / "benchmarks" / "test_bench.py").write_text(
        "import slowpkg\n\ndef test_work(benchmark):\n    benchmark(slowpkg.work)\n")
    conf = load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    assert conf["environment_type"] == "virtualenv"  # what this test is about
    conf.update(project="slowpkg", matrix={"req": {"setuptools": [""]}})
    (repo / "asv.conf.json").write_text(json.dumps(conf, indent=1))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    init = repo / "slowpkg" / "__init__.py"
    init.write_text(init.read_text().replace("0.002", "0.010"))
    _git(repo, "commit", "-q", "-am", "five times slower")
    return repo


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_asv_continuous_builds_each_commit_and_reports_the_slowed_one(tmp_path):
    repo = _throwaway(tmp_path)
    # asv finds python3.X and virtualenv on PATH and keeps its machine file in HOME.
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    asv = [str(BIN / "asv")]
    subprocess.run(asv + ["machine", "--yes", "--machine", "throwaway"], cwd=repo, env=env,
                   check=True, capture_output=True)
    done = subprocess.run(asv + ["continuous", "HEAD~1", "HEAD", "--factor", "1.5",
                                 "--machine", "throwaway", "--show-stderr"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "PERFORMANCE DECREASED" in out
    (row,) = [line for line in out.splitlines() if "bench.time_work" in line and "|" in line]
    assert row.split("|")[1].strip() == "+"
    assert float(row.split("|")[4]) > 3  # 2 ms -> 10 ms
    # Each commit was built as a wheel and installed into the one environment.
    assert out.count("Building ") >= 2 and "Installing" in out


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_bench_compare_saves_the_base_and_fails_the_slowed_change(tmp_path):
    repo = _throwaway(tmp_path)
    script = ROOT / "scripts" / "bench_compare.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(script), "HEAD~1", "median:50%"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "Performance has regressed" in out and "test_work" in out
    saved = list((repo / ".benchmarks").rglob("*base.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["commit_info"]["id"] == _git(repo, "rev-parse", "HEAD~1")
    assert _git(repo, "worktree", "list").count("\n") == 0  # the base's worktree removed
    same = subprocess.run(["bash", str(script), "HEAD", "median:50%"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, (same.stdout + same.stderr)[-3000:]
    bad = subprocess.run(["bash", str(script), "nope"], cwd=repo, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a commit" in bad.stderr
