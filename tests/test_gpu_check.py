"""scripts/gpu_check.sh, the one script a lent GPU machine runs, cannot rot: its dry run
takes the same steps on CPU (GPU-only steps listed as skipped) and must write its summary
with every step that ran at exit 0."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.dist


def test_the_device_check_dry_run_passes_on_cpu_and_writes_its_summary(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": sys.executable}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    ran = {s["step"]: s["exit_code"] for s in doc["steps"] if s["skipped"] is None}
    skipped = {s["step"] for s in doc["steps"] if s["skipped"]}
    assert ran and all(code == 0 for code in ran.values()), ran
    assert {"run ddp", "run freescale", "freescale collective", "calibrate", "simulate with the fit",
            "report"} <= set(ran)
    assert {"gpu", "gpu tests", "freescale sm_free", "sm-contention"} <= skipped
    assert doc["ok"] and doc["device"] == "cpu"
    assert sorted(r["trainer"] for r in doc["runs"]) == ["ddp", "freescale", "freescale"]
    assert all(r["status"] == "complete" and r["samples_per_s"] > 0 for r in doc["runs"])
    assert "| run ddp | exit 0 |" in (tmp_path / "out" / "summary.md").read_text()
