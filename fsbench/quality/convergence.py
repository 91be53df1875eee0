"""`fsbench quality`: a trainer that is fast because it is wrong shows here. Each trainer
trains on real data to convergence, and its model is held against DDP's.

Protocol (RecBole's sequential leave-one-out, `LS: valid_and_test`, full ranking):
- each user's last item is the test item and the second-to-last the validation item;
  training sees neither (`eval.split=valid_test`, fsbench.training.evaluate);
- an epoch trains every training target once (`data_order=epochs`,
  fsbench.workloads.realdata); after each epoch the model is scored on validation and on
  test, every item ranked, seen items not masked;
- a run's score is its test score at the epoch of its best validation NDCG@10 (early
  stopping's choice, as RecBole reports it);
- seeds repeat the whole run (initial weights and batch order).

Per trainer and world size: HR@10 and NDCG@10 (mean over seeds, 95% bootstrap interval
over users), the time and samples to quality (until validation NDCG@10 first reaches, by
default, 95% of the baseline's best: fsbench.quality.time_to_quality), and whether the
trainer is equivalent to DDP, by two checks:
- trajectory: every trainer computes the same function on the same global batch, so its
  per-step losses over the first epoch are DDP's up to float rounding (`LOSS_RTOL`). A
  trainer that trains on stale embeddings or drops a rank's gradients leaves them.
- quality: per user, the test hit (NDCG) minus DDP's, averaged over seeds; equivalent when
  the 90% interval of the mean lies within +-margin x DDP's HR@10 (two one-sided tests,
  fsbench.stats.equivalence), different when wholly outside it.
`equivalent` needs both; either finding a difference makes it `NOT equivalent`; anything
else is `inconclusive`, with the reason.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from fsbench.config import ConfigError, EvalConfig, RunConfig, WorkloadConfig
from fsbench.config_io import override_all
from fsbench.quality.time_to_quality import TARGET_FRACTION, rows_by_key

# RecBole's SASRec as the reference compares it (results/quality_ml100k_cpu.md): 50 items of
# history, width 64, 2 layers, 2 heads, no user features (the history alone). Adam at lr
# 0.001 on the dense part and on the tables, 16 windows of up to 50 targets a step, hidden
# dropout 0.2, 40 epochs (the CLI's default): on MovieLens-100K (ddp, 2 ranks) Adam on the
# tables validated higher than row-wise Adagrad at lr 0.01, 0.05 and 0.1, and dense Adam a
# hair above row-sparse Adam; dropout 0.2 over 40 epochs higher again than none over 20
# (mean best validation NDCG@10 over 3 seeds 0.0745 against 0.0666; docs/quality.md has
# the table). TorchRec's CPU tables run no Adam: it is left out, and says so.
PROTOCOL = (("max_seq_len", "50"), ("model.dim", "64"), ("model.num_layers", "2"),
            ("model.num_heads", "2"), ("model.user_features", "false"),
            ("optimizer", "adam"), ("lr", "0.001"), ("global_batch_size", "16"),
            ("model.dropout", "0.2"))
FULL_LOSS_MAX_ITEMS = 50_000
"""Catalogues up to this size train the softmax over every item (RecBole's CE); larger
ones the sampled softmax."""
LOSS_RTOL = 1e-3
"""Largest relative difference from DDP's loss at any step of the first epoch that float
rounding explains (docs/quality.md: what the real trainers show, and the broken ones)."""
DEPARTS = "departs at step "
"""How `trajectory` names a departure (the step follows)."""
SELECT_BY = "valid_ndcg_at_10"
"""The validation score that picks a run's epoch."""


def quality_workload(preset: str, data: str, family: str, epochs: int,
                     sets: list[tuple[str, str]]) -> tuple[WorkloadConfig, int]:
    """The workload `fsbench quality` trains (PROTOCOL on `preset`, sized to the data set,
    `sets` applied last) and its steps per epoch."""
    from fsbench.workloads.presets import get_workload
    from fsbench.workloads.realdata import RealDataBatches, load_histories

    if epochs < 1:
        raise ConfigError(f"--epochs={epochs} must be >= 1")
    histories = load_histories(data)
    loss = "full" if histories.num_items <= FULL_LOSS_MAX_ITEMS else "sampled"
    pairs = [("data", data), ("data_order", "epochs"), ("model.family", family),
             ("model.loss", loss), ("item_vocab", str(histories.num_items + 1)),
             ("user_vocab", str(histories.num_users + 1)), *PROTOCOL, *sets]
    w = override_all(get_workload(preset), pairs)
    if not w.model.user_features and not any(k == "user_vocab" for k, _ in sets):
        w = dataclasses.replace(w, user_vocab=2)  # the anonymous user's row alone
    steps_per_epoch = RealDataBatches(w, 0, histories, held_out=2).steps_per_epoch
    steps = epochs * steps_per_epoch
    name = f"{preset}+quality:{Path(data.partition(':')[2]).name},{family}" + "".join(
        f",{k}={v}" for k, v in sets)
    return dataclasses.replace(w, name=name, steps=steps, warmup=min(2, steps - 1)), steps_per_epoch


def quality_runs(workload: WorkloadConfig, steps_per_epoch: int, trainers: list[str],
                 world_sizes: list[int], seeds: list[int],
                 options: dict[str, dict[str, str]], patience: int = 0) -> list[RunConfig]:
    """Every (seed, world size, trainer) run, seeds outermost (drift hits all alike);
    `patience` > 0: each stops early as RecBole stops (eval.patience)."""
    evaluation = EvalConfig(on=True, every=steps_per_epoch, split="valid_test", patience=patience)
    return [RunConfig(workload=workload, trainer=t, world_size=n, seed=s,
                      trainer_options=options.get(t, {}), eval=evaluation)
            for s in seeds for n in world_sizes for t in trainers]


def run_all(runs: list[RunConfig], store: str | Path,
            progress: Callable[[Iterable], Iterable] = lambda it: it,
            epoch_lines: bool = False, steps_per_epoch: int = 1) -> list[tuple[RunConfig, Path, dict]]:
    """Run what the store does not hold complete yet (a stopped `fsbench quality` resumes);
    `epoch_lines`: a line per epoch on stderr (fsbench.quality.epoch_lines)."""
    import contextlib

    from fsbench.quality.epoch_lines import EpochLines

    import json

    from fsbench.config_io import to_dict
    from fsbench.running.runner import finished_runs, run_once

    done = finished_runs(store)
    out, todo = [], []
    for run in runs:
        key = (json.dumps(to_dict(run), sort_keys=True), 0)
        if key in done:
            out.append((run, *done[key]))
        else:
            todo.append(run)
    for i, run in enumerate(progress(todo), 1):
        label = f"run {i} of {len(todo)}, {run.trainer} at {run.world_size} ranks, seed {run.seed}"
        lines = (EpochLines(store, label, run.workload.steps // steps_per_epoch) if epoch_lines
                 else contextlib.nullcontext())
        with lines:
            out.append((run, *run_once(run, store, repeat=0)))
    return out


@dataclasses.dataclass
class RunQuality:
    """One run's outcome: its curve, the epoch validation picks and its test ranks there."""
    trainer: str
    world_size: int
    seed: int
    curve: list[dict]          # per evaluation: step, train_s, samples, test and validation scores
    selected: dict             # the evaluation with the best validation score
    ranks: np.ndarray          # (U,) test rank of each user's item at `selected`
    losses: list[float]        # per step, the global loss
    step_alignment: int = 1    # > 1: the trainer re-packs samples across that many steps


def read_run(run: RunConfig, run_dir: Path, summary: dict) -> RunQuality:
    from fsbench.training.evaluate import RANKS_DIR

    curve = summary.get("quality_curve") or []
    if not curve or SELECT_BY not in curve[0]:
        raise ConfigError(f"{run_dir}: no validation scores (a run of fsbench quality stores "
                          "them; delete the run directory to run it again)")
    best = max(curve, key=lambda e: (e[SELECT_BY], -e["step"]))  # ties: the earliest
    path = Path(run_dir) / RANKS_DIR / f"step-{best['step']}.npy"
    try:
        ranks = np.load(path)[0]
    except (OSError, ValueError, IndexError) as e:
        raise ConfigError(f"{path}: the selected evaluation's ranks cannot be read ({e}); "
                          "delete the run directory to run it again") from None
    return RunQuality(run.trainer, run.world_size, run.seed, curve, best, ranks,
                      list(summary.get("losses") or []), int(summary.get("step_alignment") or 1))


def _hits(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from fsbench.training.evaluate import per_user_hit_gain

    return per_user_hit_gain(ranks)


def trajectory(run: RunQuality, base: RunQuality, steps: int) -> tuple[str, float]:
    """(`same` | `departs at step K`, largest relative loss difference) over `steps`.
    A trainer that re-packs samples across steps (a look-ahead window) trains other
    batches at each step by design: its trajectory is not comparable, and says so."""
    if run.step_alignment > 1:
        return f"not comparable (re-packs samples across {run.step_alignment} steps)", math.nan
    n = min(steps, len(run.losses), len(base.losses))
    if n == 0:
        return "no losses", math.nan
    a, b = np.asarray(run.losses[:n]), np.asarray(base.losses[:n])
    rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-12)
    worst = float(rel.max())
    off = np.flatnonzero(~(rel <= LOSS_RTOL))
    return ("same" if len(off) == 0 else f"{DEPARTS}{int(off[0])}"), worst


def analyze(results: list[RunQuality], steps_per_epoch: int, baseline: str = "ddp",
            target_fraction: float = TARGET_FRACTION, margin: float = 0.1,
            rounding: Callable[[int, int], int | None] | None = None) -> dict:
    """The quality table (one row per trainer and world size) and its time-to-quality
    targets (`target_fraction` of the baseline's best validation NDCG@10, per world size).
    `rounding(seed, steps)`: the step (of `steps`) at which the baseline's own training
    departs from a rounding-sized perturbation of itself, or None
    (fsbench.quality.rounding_probe); asked only of a trainer's departure."""
    from fsbench.stats import equivalence, mean_interval

    groups: dict[tuple[str, int], list[RunQuality]] = {}
    for r in results:
        groups.setdefault((r.trainer, r.world_size), []).append(r)
    to_quality = rows_by_key({k: [r.curve for r in rs] for k, rs in groups.items()},
                             baseline, target_fraction)
    rows = []
    for (trainer, n), runs in groups.items():
        runs = sorted(runs, key=lambda r: r.seed)
        hit, gain = (np.mean(a, axis=0) for a in zip(*(_hits(r.ranks) for r in runs)))
        row = {"trainer": trainer, "world_size": n, "seeds": len(runs),
               "hr_at_10": float(hit.mean()), "hr_at_10_ci": mean_interval(hit),
               "ndcg_at_10": float(gain.mean()), "ndcg_at_10_ci": mean_interval(gain),
               # per seed, in seed order: what a comparison with another system's seeds needs
               "hr_at_10_per_seed": [float(_hits(r.ranks)[0].mean()) for r in runs],
               "ndcg_at_10_per_seed": [float(_hits(r.ranks)[1].mean()) for r in runs],
               "seed_list": [r.seed for r in runs],
               "epochs_selected": [r.selected["step"] // steps_per_epoch + 1 for r in runs],
               "epochs_trained": [r.curve[-1]["step"] // steps_per_epoch + 1 for r in runs],
               **to_quality[(trainer, n)],
               "train_s": _median([r.curve[-1]["train_s"] for r in runs])}
        row.update(_against(runs, groups.get((baseline, n), []), trainer == baseline,
                            steps_per_epoch, margin, equivalence, rounding))
        rows.append(row)
    rows.sort(key=lambda r: (r["world_size"], r["trainer"] != baseline, r["trainer"]))
    targets = {r["world_size"]: r["target_valid_ndcg_at_10"] for r in rows}
    return {"rows": rows, "target_valid_ndcg_at_10": targets, "target_fraction": target_fraction,
            "margin": margin, "baseline": baseline, "loss_rtol": LOSS_RTOL,
            "steps_per_epoch": steps_per_epoch}


def _amplified(path: str, seed: int, rounding) -> str | None:
    """A departure's reading when the baseline itself, perturbed by rounding, departs at or
    before the same step (no evidence of another function); None otherwise."""
    if rounding is None or not path.startswith(DEPARTS):
        return None
    own = rounding(seed, int(path[len(DEPARTS):]) + 1)  # None, or a step up to the departure
    if own is None:
        return None
    return (f"{path}, as the baseline perturbed by rounding does at step {own} (training "
            "amplifies rounding here: the trajectory cannot tell)")


def _against(runs: list[RunQuality], base: list[RunQuality], is_base: bool, steps_per_epoch: int,
             margin: float, equivalence, rounding=None) -> dict:
    """The equivalence columns of one trainer's row against the baseline's runs."""
    if is_base:
        return {"trajectory": "(baseline)", "loss_max_rel_diff": 0.0, "quality_vs_baseline": "(baseline)",
                "hr_diff_ci": (0.0, 0.0), "equivalent": "(baseline)"}
    paired = [(r, b) for r in runs for b in base if b.seed == r.seed]
    if not paired:
        return {"trajectory": "no baseline run", "loss_max_rel_diff": math.nan,
                "quality_vs_baseline": "no baseline run", "hr_diff_ci": (math.nan, math.nan),
                "equivalent": "inconclusive: no baseline run with the same seed"}
    paths = [trajectory(r, b, steps_per_epoch) for r, b in paired]
    # per seed: a departure that rounding alone makes is no evidence (read as `amplified`)
    readings = [_amplified(p, r.seed, rounding) for (p, _), (r, _) in zip(paths, paired)]
    amplified = [a for a in readings if a]
    departed = [p for (p, _), a in zip(paths, readings) if p.startswith(DEPARTS) and a is None]
    unlike = next((p for p, _ in paths if p.startswith("not comparable")), None)
    unchecked = next((p for p, _ in paths if p == "no losses"), None)
    worst = float(np.nanmax([w for _, w in paths])) if any(w == w for _, w in paths) else math.nan
    diff = np.mean([_hits(r.ranks)[0] - _hits(b.ranks)[0] for r, b in paired], axis=0)
    base_hr = float(np.mean([_hits(b.ranks)[0].mean() for _, b in paired]))
    # No margin around a baseline that hits nothing: nothing to be equivalent within.
    said, ci = (equivalence(diff, margin * base_hr) if base_hr > 0
                else ("inconclusive", (math.nan, math.nan)))
    if departed or said == "different":
        why = [f"trajectory {departed[0]} (loss off by {worst:.1e} relative)"] if departed else []
        why += [f"test HR@10 differs beyond {margin:.0%} of the baseline's"] if said == "different" else []
        verdict = "NOT equivalent: " + "; ".join(why)
    elif unchecked:
        verdict = "inconclusive: a run stored no losses, so its trajectory cannot be compared"
    elif base_hr == 0:
        verdict = "inconclusive: the baseline's HR@10 is 0, no margin to be equivalent within"
    elif amplified:
        verdict = (f"inconclusive: trajectory {amplified[0]}; test HR@10 "
                   + ("equivalent" if said == "equivalent" else "not shown equivalent")
                   + f" within +-{margin * base_hr:.4f}")
    elif said == "equivalent":
        verdict = "equivalent" if unlike is None else f"equivalent in quality; trajectory {unlike}"
    else:
        verdict = (f"inconclusive: {'trajectory ' + unlike if unlike else 'same trajectory'}, but "
                   f"the HR@10 difference's 90% interval "
                   f"[{ci[0]:+.4f}, {ci[1]:+.4f}] is not within +-{margin * base_hr:.4f}; more seeds narrow it")
    return {"trajectory": departed[0] if departed else (unlike or unchecked or
                                                        (amplified[0] if amplified else "same")),
            "loss_max_rel_diff": worst,
            "quality_vs_baseline": said, "hr_diff_ci": ci, "equivalent": verdict}


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if len(known) == len(values) and known else None
