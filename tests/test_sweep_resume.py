"""A sweep stopped with Ctrl-C keeps every finished run; run again, it runs only what is
missing; `--rerun` runs everything again."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fsbench.cli import main

pytestmark = pytest.mark.dist

ARGS = ["sweep", "--workload", "tiny", "--trainers", "ddp", "--world-sizes", "1",
        "--repeats", "2", "--steps", "3", "--warmup", "1"]


def statuses(out):
    found = {}
    for d in sorted(out.iterdir()) if out.exists() else []:
        if (d / "manifest.json").exists():  # written atomically: never half a file
            found[d.name] = json.loads((d / "manifest.json").read_text())["status"]
    return found


def test_interrupted_sweep_resumes_without_redoing_finished_runs(tmp_path, capsys):
    out = tmp_path / "store"
    # Ctrl-C in a terminal reaches the whole foreground process group: so here too.
    proc = subprocess.Popen([sys.executable, "-m", "fsbench.cli", *ARGS, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if "complete" in statuses(out).values() and len(statuses(out)) >= 2:
            break  # one run finished and the next one started
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    before = statuses(out)
    finished = {name for name, s in before.items() if s == "complete"}
    assert len(finished) == 1, before
    assert "interrupted" in before.values(), before

    assert main([*ARGS, "--out", str(out)]) == 0
    assert "resuming: 1 of 2 runs" in capsys.readouterr().err
    after = statuses(out)
    new = set(after) - set(before)
    assert len(new) == 1  # only the missing repeat ran
    assert sum(s == "complete" for s in after.values()) == 2
    assert all(after[name] == "complete" for name in finished)  # untouched

    assert main([*ARGS, "--out", str(out)]) == 0  # nothing left to do
    assert "resuming: 2 of 2 runs" in capsys.readouterr().err
    assert statuses(out) == after
    assert main([*ARGS, "--out", str(out), "--rerun"]) == 0
    assert sum(s == "complete" for s in statuses(out).values()) == 4


def test_sweep_over_two_workloads(tmp_path, capsys):
    args = ["sweep", "--workload", "tiny,small", "--trainers", "ddp", "--world-sizes", "1",
            "--steps", "3", "--warmup", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert any(" tiny " in r for r in rows) and any(" small " in r for r in rows), table
    assert sorted(json.loads((d / "manifest.json").read_text())["workload"]
                  for d in tmp_path.iterdir() if (d / "manifest.json").exists()) == ["small", "tiny"]
