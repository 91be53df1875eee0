"""A sweep stopped with Ctrl-C keeps every finished run; run again, it runs only what is
missing; `--rerun` runs everything again."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
from foreground import sigint_default

from fsbench.cli import main

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]

ARGS = ["sweep", "--workload", "tiny", "--trainers", "ddp", "--world-sizes", "1",
        "--repeats", "3", "--steps", "3", "--warmup", "1"]


def statuses(out):
    found = {}
    for d in sorted(out.iterdir()) if out.exists() else []:
        if (d / "manifest.json").exists():  # written atomically: never half a file
            found[d.name] = json.loads((d / "manifest.json").read_text())["status"]
    return found


def _interrupt_after_the_first_run(out):
    """Start the sweep, Ctrl-C it once its first run is complete and the second started;
    the store's statuses afterwards, and what the sweep said."""
    # Ctrl-C in a terminal reaches the whole foreground process group: so here too. The
    # sweep gets SIGINT's default disposition, as a terminal's foreground job has: a suite
    # started in the background inherits it ignored (tests/support/foreground.py).
    proc = subprocess.Popen([sys.executable, "-m", "fsbench.cli", *ARGS, "--store", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=sigint_default)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if "complete" in statuses(out).values() and len(statuses(out)) >= 2:
            break  # one run finished and the next one started
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    sent = statuses(out)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return statuses(out), (f"at SIGINT: {sent}", proc.returncode, err[-2000:])


def test_interrupted_sweep_resumes_without_redoing_finished_runs(tmp_path, capsys):
    out = tmp_path / "store"
    before, said = _interrupt_after_the_first_run(out)
    if set(before.values()) == {"complete"} and len(before) == 3:
        # In one CI run (2026-12-05, through make) the signal changed nothing: all three
        # runs completed. Not reproduced in 5 runs of this test alone; a Ctrl-C that the
        # sweep loses every time still fails the second try below.
        warnings.warn(f"SIGINT had no effect on the first try ({said}); trying once more")
        out = tmp_path / "store-2"
        before, said = _interrupt_after_the_first_run(out)
    finished = {name for name, s in before.items() if s == "complete"}
    # On a busy machine the second run can finish before the signal lands (then the third
    # is interrupted, or not yet started); nothing is left marked running.
    assert 1 <= len(finished) <= 2, (before, said)
    assert set(before.values()) <= {"complete", "interrupted"}, before
    if len(finished) == 1:
        assert "interrupted" in before.values(), before

    assert main([*ARGS, "--store", str(out)]) == 0
    assert f"resuming: {len(finished)} of 3 runs" in capsys.readouterr().err
    after = statuses(out)
    new = set(after) - set(before)
    assert len(new) == 3 - len(finished)  # only the missing repeats ran
    assert sum(s == "complete" for s in after.values()) == 3
    assert all(after[name] == "complete" for name in finished)  # untouched

    assert main([*ARGS, "--store", str(out)]) == 0  # nothing left to do
    assert "resuming: 3 of 3 runs" in capsys.readouterr().err
    assert statuses(out) == after
    assert main([*ARGS, "--store", str(out), "--rerun"]) == 0
    assert sum(s == "complete" for s in statuses(out).values()) == 6


def test_sweep_over_two_workloads(tmp_path, capsys):
    args = ["sweep", "--workload", "tiny,small", "--trainers", "ddp", "--world-sizes", "1",
            "--steps", "3", "--warmup", "1", "--store", str(tmp_path)]
    assert main(args) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert any(" tiny " in r for r in rows) and any(" small " in r for r in rows), table
    assert sorted(json.loads((d / "manifest.json").read_text())["workload"]
                  for d in tmp_path.iterdir() if (d / "manifest.json").exists()) == ["small", "tiny"]
