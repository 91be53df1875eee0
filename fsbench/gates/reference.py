"""Deterministic gates: quantities that must never move without intent, checked against
`results/reference/` on every CI run.

    fsbench reference check      # exit 1 naming every quantity that moved
    fsbench reference refresh    # rewrite the references (commit them with the change)

Quantities (resolved by name, like trainers, so fsbench imports no trainer's code):
  planner_loads  the partitioners' loads on fixed seeds (freescale_impl.reference): exact.
  losses         each trainer's per-step losses on `tiny` at 2 ranks, seed 0 (4 steps):
                 exact where the reference was made with the same torch and CPU
                 instruction set (floating-point kernels differ across ISAs), else
                 within 1e-5 relative, and the check says which.
  simulated      `fsbench simulate` on the `h100` preset (no measured fit in it: the
                 projection is a pure function of the code): ddp and freescale on `medium`
                 at 8 and 256 GPUs, 128 samples per GPU, 6 steps; per step the step time
                 and the bubble with its causes. Exact on the same fingerprint, like losses.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import platform
import tempfile
from pathlib import Path
from typing import Callable

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "results" / "reference"  # fsbench/gates/ -> repo
LOSS_TRAINERS = {"ddp": {}, "freescale": {}, "freescale_replicated": {"tables": "replicated"},
                 "torchrec": {}, "deepspeed": {}}
LOOSE_RTOL = 1e-5


def fingerprint() -> dict:
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def loss_runs(store: Path) -> dict[str, Path | None]:
    """Run every trainer of LOSS_TRAINERS into `store` (tiny at 2 ranks, seed 0, 4 steps):
    name -> its run directory, or None where its framework is not installed."""
    from fsbench.config import ConfigError, RunConfig
    from fsbench.running.runner import run_once
    from fsbench.training.trainer import resolve_trainer_class
    from fsbench.workloads.presets import tiny

    workload = dataclasses.replace(tiny(), steps=4, warmup=1)
    runs: dict[str, Path | None] = {}
    for name, options in LOSS_TRAINERS.items():
        trainer = name.split("_")[0]
        try:
            resolve_trainer_class(trainer)
        except ConfigError:
            runs[name] = None  # framework not installed here
            continue
        run = RunConfig(workload=workload, trainer=trainer, world_size=2, seed=0,
                        trainer_options=options)
        runs[name], _ = run_once(run, store, timeout_s=300)
    return runs


def losses_of(runs: dict[str, Path | None]) -> dict:
    """Per-step global losses of each run of `loss_runs` (None where it did not run)."""
    from fsbench.measurement.timeline import read_step_stats

    out = {}
    for name, run_dir in runs.items():
        losses = None if run_dir is None else read_step_stats(run_dir).groupby("step")["loss"].sum().sort_index()
        out[name] = None if losses is None else [float(x) for x in losses]
    return out


def trainer_losses() -> dict:
    """Per-step global losses of every installed trainer (a missing framework: None)."""
    with tempfile.TemporaryDirectory() as tmp:
        return losses_of(loss_runs(Path(tmp)))


def simulated_steps() -> dict:
    """Per (trainer, GPUs) and step: the h100 projection's step time and idle parts."""
    from fsbench.config import RunConfig
    from fsbench.scaling.sim_inputs import CLUSTERS
    from fsbench.scaling.simulate import scaled_workload, simulate_run
    from fsbench.workloads.presets import get_workload

    out = {}
    for trainer in ("ddp", "freescale"):
        for n in (8, 256):
            w = dataclasses.replace(scaled_workload(get_workload("medium"), n, "weak", 128),
                                    steps=6, warmup=1)
            # Without the planner's time measured on this CPU: the gate is exact.
            _, rows = simulate_run(RunConfig(workload=w, trainer=trainer, world_size=n),
                                   CLUSTERS["h100"], ".", planner_time=False)
            out[f"{trainer}@{n}"] = {k: [float(r[k]) for r in rows]
                                     for k in ("step_time_ms", "idle_ms", "straggler_ms", "exposed_comm_ms")}
    return out


QUANTITIES: dict[str, str] = {
    "planner_loads": "freescale_impl.reference:planner_loads",
    "losses": "fsbench.gates.reference:trainer_losses",
    "simulated": "fsbench.gates.reference:simulated_steps",
}


def _resolve(target: str) -> Callable[[], dict]:
    module, _, fn = target.partition(":")
    return getattr(importlib.import_module(module), fn)


def compute(name: str, values: dict | None = None) -> dict:
    """The quantity as stored: its values (computed now unless given) and the fingerprint."""
    return {"quantity": name, "fingerprint": fingerprint(),
            "values": _resolve(QUANTITIES[name])() if values is None else values}


def refresh(names: list[str], directory: Path = REFERENCE_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = directory / f"{name}.json"
        path.write_text(json.dumps(compute(name), indent=1, sort_keys=True) + "\n")
        paths.append(path)
    return paths


def check(names: list[str], directory: Path = REFERENCE_DIR,
          computed: dict[str, dict] | None = None) -> tuple[list[str], list[str]]:
    """(what moved, notes): one line per value that differs from its reference. `computed`:
    name -> values already computed on this machine (e.g. from `loss_runs` a caller keeps)."""
    moved, notes = [], []
    for name in names:
        path = directory / f"{name}.json"
        if not path.exists():
            moved.append(f"{name}: no reference at {path}; run `fsbench reference refresh`")
            continue
        ref = json.loads(path.read_text())
        now = compute(name, (computed or {}).get(name))
        exact = name == "planner_loads" or ref["fingerprint"] == now["fingerprint"]
        if not exact:
            notes.append(f"{name}: reference made on {ref['fingerprint']}, here {now['fingerprint']}: "
                         f"compared within {LOOSE_RTOL:g} relative, not exactly")
        moved += [f"{name}/{line}" for line in diff(ref["values"], now["values"], exact)]
    return moved, notes


def diff(ref, now, exact: bool, path: str = "") -> list[str]:
    """Lines naming where `now` differs from `ref` (nested dicts and lists of numbers)."""
    if isinstance(ref, dict) and isinstance(now, dict):
        out = [f"{path}{k}: missing now" for k in ref if k not in now]
        out += [f"{path}{k}: new (not in the reference)" for k in now if k not in ref]
        for k in ref:
            if k in now:
                out += diff(ref[k], now[k], exact, f"{path}{k}/")
        return out
    if isinstance(ref, list) and isinstance(now, list) and len(ref) == len(now):
        bad = [i for i, (a, b) in enumerate(zip(ref, now)) if not _same(a, b, exact)]
        return [f"{path.rstrip('/')}[{i}]: {ref[i]!r} -> {now[i]!r}" for i in bad[:3]] + (
            [f"{path.rstrip('/')}: {len(bad) - 3} more"] if len(bad) > 3 else [])
    return [] if _same(ref, now, exact) else [f"{path.rstrip('/')}: {ref!r} -> {now!r}"]


def _same(a, b, exact: bool) -> bool:
    if exact or not (isinstance(a, float) and isinstance(b, float)):
        return a == b
    return abs(a - b) <= LOOSE_RTOL * max(abs(a), abs(b))
