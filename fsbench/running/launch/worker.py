"""Per-rank main: join the world, run the steps, write timeline and stats, leave.

The local launcher starts it as `python -m fsbench.running.launch.worker RUN_DIR`; across nodes
the same command runs under torchrun (`torchrun --nnodes=.. --nproc-per-node=8 -m
fsbench.running.launch.worker RUN_DIR`) with RUN_DIR on shared storage, holding the
`run_spec.json` that `fsbench.running.store.create_run_dir` writes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch

from fsbench.training import dist as fsdist
from fsbench.measurement.clock import measure_offset, now_ns
from fsbench.config_io import run_from_dict
from fsbench.training.evaluate import Evaluator
from fsbench.measurement.host_syncs import HostSyncCounter
from fsbench.measurement.monitor import RankMonitor
from fsbench.running.pacing import Pacer
from fsbench.measurement.speed_probe import PROBE_SPAN, SpeedProbe
from fsbench.running.store import write_json_atomic
from fsbench.measurement.schedstat import cpu_steal_ticks, threads_schedstat, threads_since
from fsbench.measurement.timeline import Timeline, set_current
from fsbench.training.inputs import InputPipeline, MeteredSource
from fsbench.training.trainer import (measured_steps, profiled_window, profiler_start_step,
                                      resolve_trainer_class, trainer_options)
from fsbench.workloads import make_batch_source


def run_rank(ctx: fsdist.RankContext, run, run_dir: Path) -> None:
    """The measured loop. Step k: barrier, then the timed step, in which the trainer pulls
    its prepared input from the pipeline (prepared ahead, in a loader worker) and trains."""
    ctx.run_dir = run_dir
    # Before anything is stamped: this rank's clock against rank 0's (other hosts' clocks
    # have other zeros; fsbench.measurement.clock).
    write_json_atomic(run_dir / f"clock-rank-{ctx.rank}.json",
                      measure_offset(ctx.rank, ctx.world_size, ctx.barrier_group))
    emulated = run.workload.compute == "emulated"
    if emulated:  # before the trainer builds its model: the encoder waits instead of computing
        activate_emulation(run, run_dir)
    timeline = Timeline(run_dir / f"rank-{ctx.rank}.jsonl", rank=ctx.rank, device=ctx.device,
                        emulated=emulated)
    set_current(timeline)
    # --eval: every trainer trains without each user's last item (fsbench.training.evaluate).
    source = MeteredSource(make_batch_source(run.workload, run.seed, held_out=run.held_out_items),
                           run.workload.synthetic.input_delay_ms)
    cls = resolve_trainer_class(run.trainer)
    trainer = cls()
    trainer.options = parse_options(cls, run.trainer, run.trainer_options)
    trainer.setup(ctx, run, source)
    if ctx.is_main and hasattr(trainer, "describe"):  # what really ran (e.g. a transport)
        write_json_atomic(run_dir / "trainer-ran.json", trainer.describe())
    evaluator = Evaluator(run, ctx, run_dir) if run.eval.on else None
    align = getattr(trainer, "step_alignment", 1)
    measured = measured_steps(run.workload.warmup, run.workload.steps, align)
    profiled = profiled_window(measured, align, cuda=ctx.device.type == "cuda")
    inputs = InputPipeline(trainer.make_preparer(), run.workload.steps, ctx.device,
                           workers=run.input_workers, source=source)
    # Samples SM occupancy (GPU) or CPU utilization and RSS during the timed steps: the
    # measured steps after the profiled window (empty on CPU: then all of them).
    monitor = RankMonitor(ctx.device)
    profiler = GpuKernelRecord(ctx, run_dir, profiled)
    profiler_start = profiler_start_step(profiled)
    syncs = HostSyncCounter(ctx.device.type == "cuda", timeline.open_spans)
    # The machine over the measured window: CPU steal, and the run-queue wait of every
    # thread of this rank and of its loader workers (what decides `contended`).
    steal0 = steal1 = threads0 = threads1 = None
    start_ns = end_ns = 0
    # CPU runs: the CPU's own speed, timed before each step's barrier (step_time_norm).
    probe = SpeedProbe() if ctx.device.type == "cpu" else None
    # Under `fsbench gate`: take turns with the other version's run (fsbench.running.pacing).
    pacer = Pacer(ctx.rank, run_dir, run.workload.steps)
    try:
        with open(run_dir / f"steps-rank-{ctx.rank}.jsonl", "a") as stats_file:
            for step in range(run.workload.steps):
                if step == profiler_start:  # one warm-up step before the profiled window
                    profiler.start()
                if step == measured.start:
                    steal0, threads0, start_ns = cpu_steal_ticks(), threads_schedstat(), now_ns()
                if step == profiled.stop:  # the timed steps begin (measured.start without a window)
                    profiler.stop()  # exports the trace: between steps, in no step's span
                    monitor.start()
                if step == measured.stop:
                    monitor.stop()
                    profiler.stop()
                    steal1, threads1, end_ns = cpu_steal_ticks(), threads_schedstat(), now_ns()
                pacer.before_step(step)  # before the barrier: parked time is in no step
                timeline.begin_step(step, warmup=step not in measured, profiled=step in profiled)
                # The start barrier (its own group): every rank enters the timed step
                # together, so step time measures the step and not the ranks' skew in
                # reaching it.
                with timeline.span("barrier"):
                    ctx.barrier()
                if probe is not None:  # every rank at once, as in compute (fsbench.measurement.speed_probe)
                    with timeline.span(PROBE_SPAN, kind="probe"):
                        probe.run()
                with timeline.span("step"), profiler.step(step):
                    with syncs.step() as counted:  # CUDA: host syncs, ours below left out
                        stats = trainer.step(inputs)
                    end_of_step_sync(ctx.device)
                if stats.step is not None and stats.step != step:
                    raise RuntimeError(f"trainer trained step {stats.step} at harness step {step}")
                stats_file.write(json.dumps({"rank": ctx.rank, "step": step, "loss": stats.loss,
                                             "num_samples": stats.num_samples,
                                             "num_targets": stats.num_targets,
                                             **(counted or {}), **(stats.extra or {})}) + "\n")
                stats_file.flush()
                timeline.flush()
                if evaluator is not None and evaluator.after_step(step, trainer):
                    break  # early stopping (eval.patience): every rank stops at this step
        if steal1 is None:  # the measured window ran to the last step
            steal1, threads1, end_ns = cpu_steal_ticks(), threads_schedstat(), now_ns()
        pacer.before_step(run.workload.steps)  # the other side's last block runs undisturbed
        monitor.stop()
        profiler.stop()
        if evaluator is not None:  # the final model, after the measured window closed
            evaluator.after_training(trainer)
        # None, None: no schedstat on this machine, contention unknown
        wait, helper_cpu = threads_since(threads0, threads1) or (None, None)
        write_json_atomic(run_dir / f"machine-rank-{ctx.rank}.json",
                          {"steal_ticks": steal1[0] - steal0[0], "total_ticks": steal1[1] - steal0[1],
                           "threads_runq_ns": wait, "helper_cpu_ns": helper_cpu,
                           "window_ns": end_ns - start_ns})
        write_json_atomic(run_dir / f"input-rank-{ctx.rank}.json",
                          {"input_workers": run.input_workers, "step_alignment": align,
                           "batches_generated_in_rank": source.generated,
                           "worker_cpu_ns": inputs.worker_cpu_ns,
                           "stage_cpu_ns": inputs.stage_cpu_ns})
        write_json_atomic(run_dir / f"memory-rank-{ctx.rank}.json", peak_memory(ctx.device))
        write_json_atomic(run_dir / f"monitor-rank-{ctx.rank}.json",
                          {"summary": monitor.summary(), "samples": monitor.samples(),
                           "errors": [str(e) for e in monitor.errors]})
    finally:
        monitor.stop()
        inputs.close()
        trainer.close()


def end_of_step_sync(device: torch.device) -> None:
    """CUDA: wait for the step's kernels and collectives inside its span, so that a step's
    time is the device's as well as the host's and no GPU work of step k runs in step k+1's
    window (fsbench.measurement.kineto relies on it). On CPU the step is done when the
    trainer returns. NOT YET RUN ON A GPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    """This rank's peak memory so far: the process's peak RSS (Linux reports KiB), and on
    CUDA the caching allocator's peak of allocated tensors (what the model really held)."""
    import resource

    out = {"cpu_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["cuda_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


class GpuKernelRecord:
    """CUDA runs: the profiler's (Kineto) record of the profiled window of the measured
    steps (fsbench.training.trainer.profiled_window), each step inside a `fsbench.step.<k>`
    annotation, exported as kineto-rank-<r>.json.gz; busy time in those steps is then the
    union of the rank's compute kernels (fsbench.measurement.kineto). A no-op on CPU.
    NOT YET RUN ON A GPU."""

    def __init__(self, ctx: fsdist.RankContext, run_dir: Path, profiled: range = range(0)) -> None:
        self.on = ctx.device.type == "cuda"
        self.path = run_dir / f"kineto-rank-{ctx.rank}.json.gz"
        self.profiled = profiled
        self.prof = None

    def start(self) -> None:
        if self.on and self.prof is None:
            from torch.profiler import ProfilerActivity, profile

            # CPU activity too: the step annotations are CPU-side user annotations.
            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def step(self, k: int):
        # The profiler's warm-up step runs under it unannotated: the metrics never read it.
        if self.prof is None or k not in self.profiled:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"fsbench.step.{k}")

    def stop(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(self.path))


def parse_options(cls: type, name: str, given: dict[str, str]):
    """The trainer's switches as its typed Options (or the plain dict it declares)."""
    merged = trainer_options(name, given)
    return cls.Options.parse(merged, prefix=name) if hasattr(cls, "Options") else merged


def activate_emulation(run, run_dir: Path) -> None:
    """compute=emulated: the cost fit the CLI made sure the store holds (fsbench.models.emulation)."""
    from fsbench.models import emulation
    from fsbench.costmodel.fit import load_fit

    fit = load_fit(run_dir.parent, run.workload, run.device)
    if fit is None:
        raise RuntimeError(f"compute=emulated needs a cost fit in {run_dir.parent}/calibrations/ "
                           f"(fsbench calibrate --workload {run.workload.name} --store {run_dir.parent})")
    emulation.activate(fit)


def record_failure(run_dir: Path, rank: int, error: BaseException, ctx) -> None:
    """The failing rank's error (the launcher reads it to name the rank) and its memory
    peak up to the crash (what an out-of-memory failure needs to be diagnosed)."""
    (run_dir / f"error-rank-{rank}.txt").write_text(
        f"{first_line(error)}\n\n{traceback.format_exc()}")
    with contextlib.suppress(Exception):  # never mask the error being reported
        if ctx is not None:
            write_json_atomic(run_dir / f"memory-rank-{rank}.json",
                              {**peak_memory(ctx.device), "crashed": True})


def first_line(error: BaseException) -> str:
    """The error in one line. An error in a loader worker reaches the rank as "Caught X in
    DataLoader worker process 0." with the worker's traceback below it: its last line
    is the error itself."""
    text = str(error)
    if "Original Traceback" in text:
        return text.strip().splitlines()[-1]
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fsbench per-rank worker (started by a launcher)")
    parser.add_argument("run_dir", type=Path, help="run directory holding run_spec.json")
    args = parser.parse_args(argv)
    with open(args.run_dir / "run_spec.json") as f:
        run = run_from_dict(json.load(f))
    torch.set_num_threads(run.threads_per_rank)
    rank = int(os.environ.get("RANK", "0"))
    ctx = None
    try:
        ctx = fsdist.init_distributed(run.resolved_backend, run.device)
        run_rank(ctx, run, args.run_dir)
    except BaseException as e:  # noqa: BLE001 - report every failure, then re-raise
        record_failure(args.run_dir, rank, e, ctx)
        raise
    finally:
        fsdist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
