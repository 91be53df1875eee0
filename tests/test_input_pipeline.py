"""Trainers pull prepared input: the input stage runs ahead, in a loader worker, for every
trainer alike; the step's wait for it is measured; no trainer generates data in its step."""
import dataclasses
import importlib.util
import json

import pytest
from timing import judged_under_contention
import torch

from fsbench.cli import main
from fsbench.config import RunConfig
from fsbench.running.groundtruth import synthetic_workload
from fsbench.training.inputs import InputPipeline
from fsbench.measurement.metrics import CONTENDED_CPU_WAIT
from fsbench.running.runner import run_once
from fsbench.measurement.timeline import read_timelines
from fsbench.training.trainer import StepInput, measured_steps, profiled_window, profiler_start_step


class Square:
    """A picklable preparer: step k -> a StepInput carrying k*k."""

    def __call__(self, step: int) -> StepInput:
        return StepInput(step, [], step * step, 0)


class SquareByThree(Square):
    """Prepared three steps at a time (as a look-ahead window of 3 is)."""
    steps_per_item = 3


@pytest.mark.parametrize("workers,prepare", [(0, Square()), (1, Square()), (2, Square()),
                                             (2, SquareByThree()), (3, SquareByThree())])
def test_pipeline_yields_every_step_once_in_order_then_stops(workers, prepare):
    pipe = InputPipeline(prepare, 5, torch.device("cpu"), workers=workers)
    got = [(x.step, x.num_samples) for x in pipe]
    assert got == [(k, k * k) for k in range(5)]
    with pytest.raises(StopIteration):
        next(pipe)
    pipe.close()


def test_several_workers_plan_a_window_once_in_the_worker_that_prepares_it(monkeypatch):
    """FreeScale's window of 4: one item of the loader is the window's 4 steps, so the worker
    that prepares it plans the window once (K workers used to plan it K times)."""
    from fsbench.training.inputs import _Steps
    from fsbench.workloads.generator import SyntheticBatches
    from fsbench.workloads.presets import tiny
    from freescale_impl import balanced_share
    from freescale_impl.balance import analytical_cost
    from freescale_impl.balanced_share import BalancedShare
    from freescale_impl.trainer import FreeScaleOptions

    planned = []
    real = balanced_share.lookahead_window
    monkeypatch.setattr(balanced_share, "lookahead_window",
                        lambda *a, **k: planned.append(1) or real(*a, **k))
    w = dataclasses.replace(tiny(), steps=8)
    share = BalancedShare(SyntheticBatches(w, 0), 0, 2, analytical_cost(w),
                          FreeScaleOptions(window=4), steps=8)
    steps = _Steps(share, 8)
    assert len(steps) == 2
    second = steps[1]  # as the worker that gets the second window prepares it
    assert [x.step for x in second] == [4, 5, 6, 7] and planned == [1]


def test_cuda_runs_profile_the_first_quarter_of_the_measured_steps_in_whole_windows():
    assert profiled_window(range(5, 30)) == range(5, 11)
    assert profiled_window(range(4, 44), align=4) == range(4, 12)
    assert profiled_window(range(4, 12), align=4) == range(4, 8)  # one window at least
    assert not profiled_window(range(4, 8), align=4)  # nothing left to time
    assert not profiled_window(range(5, 30), cuda=False)


def test_the_profiler_warms_up_in_the_last_warm_up_step_before_its_window():
    """The profiler's first step (CUPTI's set-up) is no measured step: it starts one step
    before the profiled window, which begins the measured steps (so that step is a warm-up
    step). Before, it started at the window's first step, which it then measured."""
    measured = measured_steps(4, 40)
    window = profiled_window(measured)
    assert profiler_start_step(window) == 3 and 3 not in measured
    assert profiler_start_step(profiled_window(measured_steps(0, 40))) == 0  # nothing before
    assert profiler_start_step(profiled_window(measured, cuda=False)) is None


def test_measured_steps_cover_whole_windows_after_warmup():
    assert measured_steps(3, 14, 4) == range(4, 12)
    assert measured_steps(2, 10, 1) == range(2, 10)
    with pytest.raises(ValueError, match="no whole window"):
        measured_steps(2, 6, 4)


def test_a_window_that_cannot_be_measured_is_refused_before_any_rank_starts(tmp_path, capsys):
    code = main(["run", "--workload", "tiny", "--trainer", "freescale", "--steps", "6",
                 "--warmup", "2", "--set", "freescale.window=4", "--store", str(tmp_path)])
    assert code == 2
    assert "no whole window of 4 steps" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


TRAINERS = ["ddp", "freescale"] + [t for t, pkg in (("torchrec", "torchrec"),
                                                     ("deepspeed", "deepspeed"))
                                   if importlib.util.find_spec(pkg)]


@pytest.mark.dist
@pytest.mark.parametrize("trainer", TRAINERS)
def test_no_trainer_generates_data_in_its_training_process(trainer, loss_runs):
    """On the loss gate's runs (tests/conftest.py: every trainer, `tiny` at 2 ranks)."""
    run_dir = loss_runs[trainer]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = json.loads((run_dir / "manifest.json").read_text())["config"]["workload"]["steps"]
    assert summary["batches_generated_in_rank"] == 0
    spans = read_timelines(run_dir)
    # `flight`: a collective's issue-to-completion record (DDP's all-reduce, embeddings)
    assert set(spans["kind"]) <= {"compute", "comm", "wait", "input", "step", "flight", "probe"}
    pulls = spans[spans["name"] == "input"].groupby("rank").size()
    # Each step's input pulled once; a read-ahead pipeline (TorchRec's) also tries one
    # pull past the last step, which ends its iteration.
    assert pulls.between(steps, steps + 1).all()
    causes = sum(summary[k] for k in ("straggler_bubble_ratio", "exposed_comm_ratio",
                                      "input_stall_ratio", "other_idle_ratio"))
    assert causes == pytest.approx(summary["bubble_ratio"], abs=1e-9)


@pytest.mark.dist
def test_prefetching_hides_a_slow_source_that_inline_input_exposes(tmp_path):
    """A source taking 40 ms per batch, steps of ~150 ms: the loader worker prepares step
    k+1 while step k trains, so the step barely waits; inline, every step waits 40 ms."""
    base = synthetic_workload(input_delay_ms=40.0)
    workload = dataclasses.replace(base, synthetic=dataclasses.replace(base.synthetic,
                                                                       us_per_token=18000.0))
    waits = []
    for attempt in range(3):
        out = {}
        for workers in (1, 0):
            _, out[workers] = run_once(RunConfig(workload=workload, trainer="ddp", world_size=2,
                                                 input_workers=workers), tmp_path / str(attempt))
        if not any(s["contended"] for s in out.values()):
            break
        waits.append(max(s["cpu_wait_ratio"] for s in out.values()))
    else:
        # What a neighbour cannot move: the inline source's 40 ms sleep can only last
        # longer, and the prefetching worker still hides most of it.
        judged_under_contention(f"CPU wait {', '.join(f'{w:.1%}' for w in waits)} (contended "
                                f"above {CONTENDED_CPU_WAIT:.0%}): the stall ratios' values "
                                "not judged, only inline >= 40 ms per step and prefetch < inline/2")
        stall_ms = out[0]["input_stall_ratio"] * out[0]["step_time_ms_mean"]
        assert stall_ms >= 40.0 * 0.97, stall_ms
        assert out[1]["input_stall_ratio"] < out[0]["input_stall_ratio"] / 2
        return
    t_inline = out[0]["step_time_ms_mean"]
    assert out[0]["input_stall_ratio"] == pytest.approx(40.0 / t_inline, abs=0.03)
    assert out[1]["input_stall_ratio"] < 0.03
