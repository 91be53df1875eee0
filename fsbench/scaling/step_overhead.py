"""Each trainer's per-step work that the `local` simulator's model does not see, measured
by real 1-rank runs at the calibration seed and stored in the cost fit
(`fsbench calibrate --overhead`), where fsbench.scaling.simulate reads it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fsbench.config import RunConfig, WorkloadConfig
from fsbench.errors import ConfigError
from fsbench.scaling.sim_costs import OVERHEAD_KEYS, expected_tokens
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import simulate_run


def measure_step_overhead(workload: WorkloadConfig, trainer: str, store: str | Path,
                          compute: str = "model", steps: int = 16, repeats: int = 3) -> dict[str, float]:
    """A trainer's per-step work this model does not see, on this machine, in this
    compute mode (model or emulated): a real 1-rank run at the calibration seed (no
    validation run's batches) against the `local` simulation of the same run without
    overhead, per step (medians): the wall time beyond it, the part of that which was the
    rank's own thread CPU (so time-shares at N ranks; the rest, such as waiting for
    input, does not), the part the metrics counted busy, the input wait, and the loader
    worker's CPU (its own process, on a spare core at 1 rank).

    It is a difference of two large numbers, and this machine's speed drifts between
    minutes (one 1-rank comm-heavy ddp run gave 47 ms, three more gave 0): `repeats`
    runs, and the one with the median wall overhead is kept."""
    found = sorted((_one_step_overhead(workload, trainer, store, compute, steps) for _ in range(repeats)),
                   key=lambda o: o["wall_ms"])
    return found[len(found) // 2]


def calibration_run(workload: WorkloadConfig, trainer: str, store: str | Path, compute: str,
                    steps: int, ranks: int = 1):
    """(run, its summary, its spans): a real run at the calibration seed, in a scratch
    store that holds a copy of this store's fit (an emulated rank reads its fit beside
    its run)."""
    import shutil
    import tempfile

    from fsbench.costmodel.fit import fit_path
    from fsbench.costmodel.timing import CALIBRATION_SEED
    from fsbench.running.runner import run_once
    from fsbench.measurement.timeline import read_timelines
    from fsbench.training.trainer import trainer_options

    w = dataclasses.replace(workload, steps=steps, warmup=4, compute=compute)
    run = RunConfig(workload=w, trainer=trainer, world_size=ranks, seed=CALIBRATION_SEED,
                    trainer_options=trainer_options(trainer, {}))
    with tempfile.TemporaryDirectory(prefix="fsbench-calibration-") as tmp:
        if compute == "emulated":
            target = fit_path(tmp, w, "cpu")
            target.parent.mkdir(parents=True)
            shutil.copy(fit_path(store, w, "cpu"), target)
        run_dir, measured = run_once(run, tmp)
        return run, measured, read_timelines(run_dir)


def _one_step_overhead(workload: WorkloadConfig, trainer: str, store: str | Path, compute: str,
                       steps: int) -> dict[str, float]:
    run, measured, spans = calibration_run(workload, trainer, store, compute, steps)
    w = run.workload
    # The real encoder's speed now against the fit's (an emulated rank only waits the fit's
    # cost): without it, this host's drift between the calibration and this run lands
    # whole in the overhead (set 10's fit held 0.6 ms for FreeScale at a quarter batch,
    # set 9's 6.6 ms: results/sim_validation_heldback_set10_cpu.md, _set9_cpu.md).
    drift_ms, drift = encoder_drift(w, run.seed, store) if compute == "model" else (0.0, 1.0)
    steps_ = spans[(spans["kind"] == "step") & ~spans["warmup"]]
    # The rank's real thread CPU per step (an emulated span books it as overhead_ns).
    cpu_ms = float((steps_["overhead_ns"] if compute == "emulated" else steps_["cpu_ns"]).median()) / 1e6
    summary, rows = simulate_run(run, CLUSTERS["local"], store, step_overhead=False)
    sim = [r for r in rows if r["step"] >= w.warmup]
    wall = max(0.0, measured["step_time_ms_median"] - summary["step_time_ms_median"] - drift_ms)
    cpu = min(wall, max(0.0, cpu_ms - float(np.median([r["cpu_mean_ms"] for r in sim])) - drift_ms))
    busy_ms = (1 - measured["bubble_ratio"]) * measured["step_time_ms_mean"]
    busy = min(cpu, max(0.0, busy_ms - float(np.median([r["busy_mean_ms"] for r in sim])) - drift_ms))
    input_ms = min(wall - cpu, measured["input_stall_ratio"] * measured["step_time_ms_mean"])
    # The loader worker's CPU: on this 1-rank run it had a core of its own, so none of
    # the above; with as many ranks as cores it takes theirs (fsbench.scaling.simulate).
    # Its planning and routing are timed by the simulator at every size (here: 1 rank):
    # they grow with the ranks and the batch, so they are kept out of what is followed.
    stage = summary["plan_ms_per_step"] + summary["route_ms_per_step"]
    worker = measured.get("input_worker_cpu_ratio", 0.0) * measured["step_time_ms_mean"]
    return {"wall_ms": wall, "cpu_ms": cpu, "busy_ms": busy, "input_ms": input_ms,
            "worker_ms": max(0.0, worker - stage), "stage_ms": stage, "encoder_drift": drift}


def encoder_drift(workload: WorkloadConfig, seed: int, store: str | Path, batches: int = 4,
                  repeats: int = 3) -> tuple[float, float]:
    """(ms per step, ratio): how much longer than the stored fit says the real encoder
    takes right now on the run's own batches (the first `batches` after its warm-up),
    per step, and the ratio of the two."""
    from fsbench.models import build_model
    from fsbench.costmodel.fit import load_fit
    from fsbench.costmodel.timing import time_encoder_ms
    from fsbench.workloads.generator import SyntheticBatches

    fit = load_fit(store, workload, "cpu")
    model = build_model(workload, seed=0)
    source = SyntheticBatches(workload, seed=seed)
    timed = predicted = 0.0
    for k in range(workload.warmup, workload.warmup + batches):
        batch = source.global_batch(k)
        timed += time_encoder_ms(model, batch, repeats, warmup=1)
        predicted += fit.encoder_ms(batch.lengths.numpy())
    return (timed - predicted) / batches, timed / predicted


def store_step_overheads(workload: WorkloadConfig, trainers: list[str], store: str | Path,
                         progress=lambda it: it) -> dict[str, dict[str, float]]:
    """Measure (measure_step_overhead) what the stored fit lacks of these trainers'
    overheads in both compute modes, and store them in the fit; returns all it holds."""
    from fsbench.costmodel.fit import fit_path, load_fit
    from fsbench.running.store import write_json_atomic

    fit = load_fit(store, workload, "cpu")
    if fit is None:
        raise ConfigError(f"no cost fit for {workload.name} in {store}: run fsbench calibrate first")
    held = dict(fit.step_overhead or {})
    # Each at the workload's batch and at a quarter of it, with the global batch's expected
    # tokens (the simulator follows a batch's tokens along the line through the two). An
    # entry from before a part was measured (the loader worker's CPU, the tokens) is
    # measured again.
    sizes = sorted({workload.global_batch_size, max(1, workload.global_batch_size // 4)})
    missing = [(t, c, b) for t in trainers for c in ("model", "emulated") for b in sizes
               if not {*OVERHEAD_KEYS, "tokens"} <= set(held.get(overhead_key(t, c, b, workload), {}))]
    for trainer, compute, batch in progress(missing):
        w = dataclasses.replace(workload, global_batch_size=batch)
        held[overhead_key(trainer, compute, batch, workload)] = {
            **measure_step_overhead(w, trainer, store, compute), "tokens": expected_tokens(w)}
        # stored after each: a Ctrl-C keeps what was measured. The time-sharing efficiency
        # was solved against the overheads held before (fsbench.scaling.timeshare): it goes.
        write_json_atomic(fit_path(store, workload, "cpu"), dataclasses.asdict(
            dataclasses.replace(fit, step_overhead=held, timeshare=None)))
    return held


def overhead_key(trainer: str, compute: str, batch: int, workload: WorkloadConfig) -> str:
    """The fit's key for an overhead measured at `batch` samples: "trainer/compute" at the
    workload's own batch, "trainer/compute@batch" at another."""
    return f"{trainer}/{compute}" + ("" if batch == workload.global_batch_size else f"@{batch}")
