"""From flags to runs: the workload (`build_workload`, `--set` pairs: `parse_sets`), the
evaluation (`eval_config`) and a factory of RunConfigs (`make_run_factory`), everything
validated before any rank starts; shared by the run commands (fsbench.cli.runs) and the
scaling commands (fsbench.cli.scaling)."""
from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict

from fsbench.config import ConfigError, EvalConfig, RunConfig, WorkloadConfig
from fsbench.config_io import override_all
from fsbench.running import memory
from fsbench.table import note
from fsbench.training.trainer import TRAINERS, check_run, resolve_trainer_class, trainer_options
from fsbench.workloads import make_batch_source

# --target-hr10 without --eval-every: evaluate every this many steps (a few seconds on
# MovieLens-100K; far more often would make evaluation outweigh training on small runs).
DEFAULT_EVAL_EVERY = 10


def parse_sets(pairs: list[str]) -> tuple[list[tuple[str, str]], dict[str, dict[str, str]]]:
    """Split `--set k=v` into workload overrides and per-trainer options (`<trainer>.<k>`)."""
    workload_sets, trainer_sets = [], defaultdict(dict)
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set lengths=yelp")
        head, dot, rest = key.partition(".")
        if head in TRAINERS and dot:
            trainer_sets[head][rest] = value
        else:
            workload_sets.append((key, value))
    return workload_sets, dict(trainer_sets)


def pop_batch_per_rank(args: argparse.Namespace, default: int = 128) -> int:
    """Take `--set batch_per_rank=N` (samples per rank: the global batch then grows with
    the world size) out of `args.set`; the default when absent."""
    given = [k.split("=", 1)[1] for k in args.set if k.split("=", 1)[0] == "batch_per_rank"]
    args.set = [k for k in args.set if k.split("=", 1)[0] != "batch_per_rank"]
    if not given:
        return default
    try:
        value = int(given[-1])
    except ValueError:
        raise ConfigError(f"--set batch_per_rank={given[-1]!r}: expected an integer") from None
    if value < 1:
        raise ConfigError(f"--set batch_per_rank={value} must be >= 1")
    return value


def build_workload(args: argparse.Namespace) -> WorkloadConfig:
    from fsbench.workloads.presets import get_workload

    workload = get_workload(args.workload)
    sets, _ = parse_sets(args.set)
    # Step counts change how long a run is measured, not what a step does: they do not
    # rename the workload. All changes are applied at once and checked together after
    # (warmup < steps whatever the order of the flags).
    counts = [(k, str(v)) for k, v in (("steps", args.steps), ("warmup", args.warmup)) if v is not None]
    for key, value in counts:  # one value per count: else the run id and the run disagree
        clash = [v for k, v in sets if k == key and v.strip().lstrip("0") != value.lstrip("0")]
        if clash:
            raise ConfigError(f"--{key} {value} and --set {key}={clash[0]} disagree; give one "
                              f"of them (--{key} N)")
    workload = override_all(workload, sets + counts)
    if sets:
        # A changed workload is a different workload: its name says how, so that stored
        # runs of `small` and of `small+lengths=yelp` are never grouped together.
        name = f"{args.workload}+" + ",".join(f"{k}={v}" for k, v in sets)
        workload = dataclasses.replace(workload, name=name)
    return workload


def eval_config(args: argparse.Namespace) -> EvalConfig:
    """--eval / --eval-every / --target-hr10 (either of the last two implies --eval)."""
    every, target = getattr(args, "eval_every", None), getattr(args, "target_hr10", None)
    if every is not None and every < 1:
        raise ConfigError(f"--eval-every={every} must be >= 1")
    if target is not None and not 0 < target <= 1:
        raise ConfigError(f"--target-hr10={target} must be in (0, 1]")
    on = bool(getattr(args, "eval", False)) or every is not None or target is not None
    if every is None:
        every = DEFAULT_EVAL_EVERY if target is not None else 0
    return EvalConfig(on=on, every=every, target_hr10=target)


def make_run_factory(args: argparse.Namespace, trainers: list[str]):
    """Validate everything up front (before any rank starts), then return a factory."""
    workload = build_workload(args)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible "
                              "(torch.cuda.is_available() is False); use --device cpu")
        gpus, largest = torch.cuda.device_count(), max(args.world_sizes)
        if largest > gpus:
            raise ConfigError(f"--device cuda: world size {largest} needs one GPU per local "
                              f"rank and {gpus} are visible; use world sizes up to {gpus} "
                              "(more ranks: launch across nodes, docs/multinode.md)")
    _, trainer_sets = parse_sets(args.set)
    for name in trainer_sets:
        if name not in trainers:
            raise ConfigError(f"--set {name}.*: trainer {name!r} is not part of this run "
                              f"(trainers: {', '.join(trainers)})")
    options = {t: trainer_options(t, trainer_sets.get(t, {})) for t in trainers}
    evaluation = eval_config(args)
    if workload.compute == "emulated":
        ensure_cost_fit(workload, args.store, args.device, args.threads)

    def make(trainer: str, world_size: int) -> RunConfig:
        return RunConfig(workload=workload, trainer=trainer, world_size=world_size,
                         seed=args.seed, device=args.device, threads_per_rank=args.threads,
                         trainer_options=options[trainer], input_workers=args.input_workers,
                         eval=evaluation)

    # Real data is read here once, as every rank will read it: a file that cannot be used
    # (empty, a wrong header, a bad field, more items than item_vocab) fails in one line
    # before a rank starts, not inside one.
    make_batch_source(workload, args.seed, held_out=make(trainers[0], 1).held_out_items)
    for t in trainers:  # RunConfig's own checks (world size vs batch, ...) fail here, early
        for n in args.world_sizes:
            run = make(t, n)
            check_run(run)
            if run.eval.on:
                from fsbench.training.evaluate import check_trainer

                check_trainer(run, resolve_trainer_class(t))
            memory.check(run, force=args.force)  # refuses a run that cannot fit, in one line
    return make


def ensure_cost_fit(workload: WorkloadConfig, store: str, device: str, threads: int) -> None:
    """compute=emulated waits for the calibrated cost of the encoder: make sure the store
    holds a fit for this model on this device (as the ranks will look it up)."""
    import torch

    from fsbench.costmodel.calibrate import calibrate
    from fsbench.costmodel.fit import load_fit
    from fsbench.table import progress

    torch.set_num_threads(threads)  # part of the fit's key: the ranks' thread count
    if load_fit(store, workload, device) is None:
        note(f"compute=emulated: no cost fit for this model in {store}/calibrations/; "
             "calibrating it first (fsbench calibrate)")
        calibrate(dataclasses.replace(workload, compute="model"), store, device=device,
                  progress=lambda lengths: progress(lengths, "calibrating", "length"))
