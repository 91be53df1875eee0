"""scripts/gpu_check.sh, the one script a lent GPU machine runs in one call of at most
600 s, cannot rot: its dry run takes the same steps on CPU (GPU-only ones listed as
skipped, the self-tests as not run), writes its report and leaves nothing in the
checkout; its budgets add up under its deadline and docs/gpu.md lists the same; and the
report is written on any exit, also when a step fails or the check is killed."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = pytest.mark.parallel_safe

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
DEADLINE_S, RESERVE_S = 540, 25


def budgets() -> dict[str, int]:
    """The script's BUDGET table."""
    block = re.search(r"declare -A BUDGET=\((.*?)\n\)", SCRIPT.read_text(), re.S).group(1)
    return {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", block)}


def test_the_step_budgets_add_up_under_the_deadline_and_the_docs_list_them():
    text = SCRIPT.read_text()
    assert f'GPU_CHECK_DEADLINE_S:-{DEADLINE_S}' in text and f"GPU_CHECK_RESERVE_S:-{RESERVE_S}" in text
    b = budgets()
    order = re.search(r"ORDER=\((.*?)\)", text, re.S).group(1).split()
    assert order[:2] == ["preflight", "selftests"] and set(order) == set(b)
    assert sum(b.values()) <= DEADLINE_S - RESERVE_S, sum(b.values())
    doc = (ROOT / "docs" / "gpu.md").read_text()
    for name, seconds in b.items():
        assert re.search(rf"\| `{name}` \| {seconds} \|", doc), f"docs/gpu.md lacks `{name}` | {seconds}"
    assert re.search(rf"\| total \| {sum(b.values())} \|", doc)


def _git_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT,
                          capture_output=True, text=True).stdout


@pytest.mark.dist
def test_the_dry_run_passes_on_cpu_writes_its_report_and_leaves_the_checkout_as_it_was(tmp_path):
    out = tmp_path / "out"
    before = _git_state()
    env = {**os.environ, "OUT": str(out), "PY": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _git_state() == before, "the dry run wrote into the checkout"
    # What comes back from a device call: at most 8 files, none in a folder.
    assert sorted(p.name for p in out.iterdir()) == ["check.log", "steps.tsv", "summary.json",
                                                     "summary.md", "work.tar.gz"]
    doc = json.loads((out / "summary.json").read_text())
    ran = {s["step"]: s["exit_code"] for s in doc["steps"] if s["skipped"] is None}
    skipped = {s["step"] for s in doc["steps"] if s["skipped"]}
    assert set(ran) | skipped == set(budgets())
    assert all(code == 0 for code in ran.values()), ran
    assert {"freescale-sm-free", "sm-contention"} == skipped
    assert doc["ok"] and doc["complete"] and doc["device"] == "cpu" and doc["dry_run"]
    assert doc["elapsed_s"] <= DEADLINE_S and doc["preflight"]["missing"] == []
    assert {t["name"] for t in doc["selftests"]} == {
        "flight_of_known_delay", "compute_span_of_known_kernels", "planted_host_sync_counted_once",
        "kineto_busy_of_known_sequence", "sleep_lengths_match_nominal", "sm_occupancy_busy_and_idle",
        "copies_on_copy_engines", "sm_free_copies_are_communication", "sm_free_exchange_never_syncs",
        "sm_free_pull_sm_util", "ground_truth_on_cuda"}
    assert all(t["passed"] is None for t in doc["selftests"])  # no CUDA: not run, said so
    assert sorted(r["options"] for r in doc["runs"]) == [
        "defaults", "defaults", "overlap=off, priority=off", "priority=off"]
    assert all(r["status"] == "complete" and r["samples_per_s"] > 0 for r in doc["runs"])
    assert all("sm_occupancy_reason" in r and r["sm_occupancy_reason"] for r in doc["runs"])
    md = (out / "summary.md").read_text()
    assert "| run-ddp | exit 0 |" in md and "## Not checked on one GPU" in md
    assert "dry run" in md.splitlines()[0]
    gpu = doc["preflight"]["gpu"]  # the probes ran (on CPU), and no GPM is the environment's
    assert gpu["collective"]["ok"] and gpu["kernel"]["ok"] and gpu["gpm"]["environment"]
    assert all(r["checks"] and all(c["verdict"] != "FAILED" for c in r["checks"]) for r in doc["runs"])


def _stub_python(tmp_path: Path, body: str, preflight: str | None = None,
                 selftests: str | None = None) -> Path:
    """A `PY` that runs the real python, except for the fsbench CLI, which does `body`, and
    with `preflight` the preflight script (its record's path is its first argument), with
    `selftests` the self-tests' script."""
    stub = tmp_path / "py"
    pre = "".join(f"if [ \"$1\" = scripts/{script} ]; then shift; {stand_in}; fi\n"
                  for script, stand_in in (("gpu_preflight.py", preflight), ("gpu_selftests.py", selftests))
                  if stand_in)
    stub.write_text(f"#!/usr/bin/env bash\nif [ \"$1\" = -m ] && [ \"$2\" = fsbench.cli ]; then {body}; fi\n"
                    f"{pre}exec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    return stub


@pytest.mark.dist  # wall-clock deadlines: run in the tier that starts after CI's background builds
def test_a_hung_step_is_cut_at_the_deadline_and_the_report_is_still_written(tmp_path):
    """Every fsbench command hangs (as an sm_free barrier might): with a 20 s deadline (10 s
    of it kept for the report) the first run is cut when the time is up, every later step
    is listed as not run for lack of time, and the trap writes the report (not ok) and
    packs the logs."""
    out = tmp_path / "out"
    # The preflight and the self-tests answer at once: their work (torch's imports, a gloo
    # all-reduce, a kernel) is not what this is about (the dry run above runs it), and
    # beside a busy neighbour it could outlast the 10 s this deadline leaves the steps.
    stub = _stub_python(tmp_path, "sleep 600", preflight='echo "{}" > "$1"; exit 0', selftests="exit 0")
    env = {**os.environ, "OUT": str(out), "PY": str(stub),
           "GPU_CHECK_DEADLINE_S": "20", "GPU_CHECK_RESERVE_S": "10"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and time.monotonic() - t0 < 60
    doc = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in doc["steps"]}
    assert steps["preflight"]["exit_code"] == 0
    assert steps["run-ddp"]["timed_out"]
    assert "no time left" in steps["report"]["not_run"]
    assert not doc["ok"] and doc["complete"]
    assert (out / "work.tar.gz").exists() and not (out / "work").exists()


@pytest.mark.dist  # wall-clock waits: as above
def test_a_killed_check_still_leaves_its_report(tmp_path):
    """SIGTERM in the middle of a step: the trap writes the report of what ran."""
    out, work = tmp_path / "out", tmp_path / "work"
    # The steps before the hung run answer at once (the hard kill's test below and the dry
    # run run them for real).
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_WORK": str(work),
           "PY": str(_stub_python(tmp_path, "sleep 600", preflight='echo "{}" > "$1"; exit 0',
                                  selftests="exit 0"))}
    proc = subprocess.Popen(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "run-ddp" not in _ran_steps(work):
        time.sleep(0.5)  # until the preflight and self-tests are done and run-ddp hangs
    time.sleep(1)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)  # at once: not after run-ddp's 40 s budget
    assert proc.returncode == 1
    doc = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in doc["steps"]] == ["preflight", "selftests", "run-ddp"]
    assert doc["steps"][2]["exit_code"] == 143, "the step cut by the signal is recorded"
    assert doc["complete"] and not doc["ok"] and (out / "work.tar.gz").exists()


@pytest.mark.dist  # wall-clock waits: as above
def test_the_work_folder_stays_outside_out_and_a_hard_kill_leaves_the_summary(tmp_path):
    """SIGKILL (no trap runs) while run-ddp hangs: $OUT holds only the report so far, the
    steps and the log, never the work tree of logs, runs and traces (before: work/ inside
    $OUT until packed, which the device tool's file-count limit could cut, the summary
    with it)."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_WORK": str(work),
           "PY": str(_stub_python(tmp_path, "sleep 600"))}
    proc = subprocess.Popen(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "run-ddp" not in _ran_steps(work):
            time.sleep(0.5)
        time.sleep(1)
        assert sorted(p.name for p in out.iterdir()) == ["check.log", "steps.tsv", "summary.json", "summary.md"]
        assert (work / "preflight.json").exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the check, its step and the step's children
        proc.wait(timeout=30)
    doc = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in doc["steps"]] == ["preflight", "selftests"]
    assert doc["preflight"]["gpu"]["collective"]["ok"] and "dry run" in (out / "summary.md").read_text()


def _ran_steps(work: Path) -> str:
    """The steps started so far: their logs exist in the work folder."""
    logs = work / "logs"
    return " ".join(p.stem for p in logs.glob("*.log")) if logs.is_dir() else ""
