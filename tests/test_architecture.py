"""Architectural rules, as tests."""
import subprocess
import sys


def test_importing_fsbench_imports_no_trainer_or_framework():
    code = (
        "import sys, fsbench, fsbench.cli, fsbench.config, fsbench.metrics, fsbench.runner, "
        "fsbench.store, fsbench.timeline, fsbench.trainer, fsbench.workloads, fsbench.models, "
        "fsbench.workloads.presets, fsbench.report, fsbench.trace, fsbench.monitor, "
        "fsbench.calibrate, fsbench.groundtruth, fsbench.overhead, fsbench.dp\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torchrec', 'deepspeed', 'freescale_impl', 'baselines', 'fbgemm_gpu')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
