import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests must not flake on a busy 2-core CI machine: no per-example deadline
# (timing is for benchmarks), and a fixed example sequence (a failure reproduces).
settings.register_profile("fsbench", deadline=None, derandomize=True)
settings.load_profile("fsbench")

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))


@pytest.fixture
def rank_pythonpath(monkeypatch):
    """Let spawned ranks import the test-only trainers in tests/support."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(SUPPORT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


@pytest.fixture
def no_corun_measurement(monkeypatch):
    """For a test that calibrates in this process and reads nothing of the co-run slowdown
    (one rank, or emulated compute): calibrate's two co-run measurements time 12
    processes forked from the warm server (~4 s of a `tiny` calibration on 2 cores), so
    here they return 1.0 (no slowdown) at once. Measured for real on every push: the measurement by
    test_simulate.py::test_corun_slowdown_is_measured_in_real_processes, the whole
    `fsbench calibrate` with it by the gpu_check dry run (test_gpu_check.py)."""
    from fsbench.costmodel import calibrate

    monkeypatch.setattr(calibrate, "measure_corun_slowdown",
                        lambda workload, processes=None, **kw: (1.0, processes or os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A real sweep, made once per session for the tests that only read it: `tiny`, ddp and
    freescale at 1 and 2 ranks."""
    from fsbench.cli import main

    out = tmp_path_factory.mktemp("tiny_sweep")
    assert main(["sweep", "--workload", "tiny", "--trainers", "ddp,freescale", "--world-sizes",
                 "1,2", "--store", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def loss_runs(tmp_path_factory):
    """The deterministic loss gate's runs (fsbench.gates.reference.loss_runs: every installed
    trainer on `tiny` at 2 ranks, seed 0, 4 steps), made once per session: the gate checks
    their losses, other tests read them. Name -> run directory (None: not installed)."""
    from fsbench.gates import reference

    return reference.loss_runs(tmp_path_factory.mktemp("loss_runs"))


@pytest.fixture(scope="session")
def big_table_runs(tmp_path_factory):
    """ddp and freescale at 2 ranks on `tiny` with 400k x 64 item rows, 3 steps: tables, their
    gradients and Adagrad's state dominate a rank's memory (98 MiB per copy of the item
    table). Trainer -> (run directory, summary); made once, for the memory tests."""
    import dataclasses

    from fsbench.config import RunConfig
    from fsbench.running.runner import run_once
    from fsbench.workloads.presets import tiny

    workload = dataclasses.replace(tiny(), item_vocab=400_000, steps=3, warmup=1,
                                   model=dataclasses.replace(tiny().model, dim=64))
    out = tmp_path_factory.mktemp("big_tables")
    return {trainer: run_once(RunConfig(workload=workload, trainer=trainer, world_size=2), out,
                              timeout_s=240) for trainer in ("ddp", "freescale")}


# Programs that start ranks: the local launcher's worker, the CLI's commands that launch
# runs, and torchrun. A test that starts them belongs to the dist tier.
RANK_STARTERS = ("fsbench.running.launch.worker", "torchrun")
LAUNCHING_COMMANDS = {"run", "sweep", "gate", "bisect", "validate", "overhead", "calibrate"}


def _starts_ranks(argv) -> bool:
    words = [str(a) for a in (argv if isinstance(argv, (list, tuple)) else [argv])]
    if any(any(s in w for s in RANK_STARTERS) for w in words):
        return True
    return "fsbench.cli" in words and bool(LAUNCHING_COMMANDS & set(words))


# The test being set up, run or torn down (its fixtures of every scope included): a
# fixture of a wider scope is set up inside its first user's setup.
_CURRENT: list = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _CURRENT[0] = item


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    _CURRENT[0] = None


class _RankGuard(subprocess.Popen):
    """The fast tier (`make test`, `-m "not dist"`) must stay fast: a process that starts
    ranks while an unmarked test (or a fixture set up for it, whatever its scope) runs
    fails here, naming what it started."""

    def __init__(self, args, *rest, **kwargs):
        item = _CURRENT[0]
        if item is not None and not item.get_closest_marker("dist") and _starts_ranks(args):
            raise RuntimeError(f"{item.nodeid} starts ranks ({' '.join(map(str, args))[:120]}) "
                               "but is not marked dist: add @pytest.mark.dist (make test-all runs it)")
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = _RankGuard  # the whole session: every caller of subprocess.Popen goes through it
