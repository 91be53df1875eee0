"""`fsbench quality`: train each trainer on real data to convergence and hold its model
against DDP's (fsbench.quality.convergence); fsbench.cli dispatches here through `COMMANDS`.

Exit codes: 0 every trainer equivalent to the baseline; 1 one is NOT equivalent (it
trains another function, or a worse model); 3 one is inconclusive (and why), or cannot run
the protocol (its row says why)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from fsbench.cli.args import add_format, add_store, path_arg
from fsbench.cli.run_config import parse_sets
from fsbench.config import ConfigError
from fsbench.quality.time_to_quality import (STORED_BEFORE, TARGET_FRACTION, cells, check_fraction,
                                             describe_target)
from fsbench.table import dumps, note, progress

DEFAULT_STORE = "runs/quality"


def add_parsers(sub, _csv: Callable) -> None:
    p = sub.add_parser(
        "quality", help="train to convergence on real data; quality per trainer vs DDP's",
        description="Train every trainer on real interaction data, epoch by epoch (every "
                    "training target once per epoch), with RecBole's leave-one-out protocol: "
                    "each user's second-to-last item validates (picks the epoch), the last "
                    "tests; all items ranked, seen items kept. Prints HR@10 and NDCG@10 per "
                    "trainer (mean over seeds, 95% interval over users), time to quality (training "
                    "seconds, evaluation excluded, and samples until validation NDCG@10 first "
                    "reaches a fraction of the baseline's best), and whether each trainer is "
                    "equivalent to the baseline: the "
                    "same losses over the first epoch (the same function) and a test HR@10 "
                    "within the margin (paired over users). Exit 0 all equivalent, 1 one is "
                    "not, 3 inconclusive or a trainer that cannot run the protocol (its row "
                    "says why).")
    p.add_argument("--data", required=True, metavar="KIND:PATH",
                   help="interaction data: recbole:PATH (a RecBole .inter file), sasrec:PATH "
                        "or otto:PATH")
    p.add_argument("--trainers", type=_csv(str), default=["ddp", "freescale"],
                   help="comma-separated trainers; the first is the baseline the others are "
                        "held against")
    p.add_argument("--world-sizes", type=_csv(int), default=[2], help="comma-separated world sizes")
    p.add_argument("--model", default="sasrec", choices=["sasrec", "hstu"], help="encoder family")
    p.add_argument("--epochs", type=int,
                   help="train exactly this many epochs (no early stopping); the reported test "
                        "score is still the best-validation epoch's")
    p.add_argument("--patience", type=int, default=10,
                   help="stop a run as RecBole stops: after this many epochs without a better "
                        "validation NDCG@10 (the reported test score is the best-validation epoch's)")
    p.add_argument("--max-epochs", type=int, default=200, help="the cap of an early-stopped run")
    p.add_argument("--seeds", type=_csv(int), default=[0, 1, 2],
                   help="comma-separated seeds (weights and batch order); each is a run per "
                        "trainer and world size")
    p.add_argument("--workload", default="small",
                   help="preset the protocol starts from (its other fields)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload field (after the protocol: max_seq_len=50, "
                        "model.dim=64, 2 layers, 2 heads, model.user_features=false, Adam "
                        "lr 0.001 on the dense part and the tables, 16 windows a step, "
                        "model.dropout=0.2, "
                        "model.loss=full up to 50,000 items) or a trainer switch "
                        "(<trainer>.<key>=value)")
    p.add_argument("--target-fraction", type=float, default=TARGET_FRACTION,
                   help="time to quality: the target validation NDCG@10 is this fraction, in "
                        "(0, 1], of the baseline's best at the same world size (each seed's "
                        "best, averaged over seeds; default %(default)s)")
    p.add_argument("--margin", type=float, default=0.1,
                   help="equivalence margin on test HR@10, relative to the baseline's")
    add_store(p, "the store the runs go to (a stopped quality run resumes from it)",
              default=DEFAULT_STORE)
    p.add_argument("--out", metavar="DIR", type=path_arg,
                   help="write quality.md and learning_curves.png here (default: STORE/quality)")
    p.add_argument("--no-plots", action="store_true", help="no learning-curve PNG")
    add_format(p)


def cmd_quality(args: argparse.Namespace) -> int:
    import functools

    from fsbench.quality.convergence import (LOSS_RTOL, analyze, quality_runs, quality_workload,
                                         read_run, run_all)
    from fsbench.quality.rounding_probe import baseline_departure
    from fsbench.training.trainer import check_run, resolve_trainer_class, trainer_options
    from fsbench.training.evaluate import check_trainer
    from fsbench.running.output_paths import check_writable_dir

    check_fraction(args.target_fraction)
    if args.margin <= 0:
        raise ConfigError(f"--margin={args.margin} must be > 0")
    if not args.seeds or not args.world_sizes or not args.trainers:
        raise ConfigError("--trainers, --world-sizes and --seeds each need at least one value")
    sets, trainer_sets = parse_sets(args.set)
    if args.patience < 1:
        raise ConfigError(f"--patience={args.patience} must be >= 1 (or give --epochs N for a fixed count)")
    early = args.epochs is None  # RecBole's early stopping, unless a fixed count is asked for
    epochs = args.max_epochs if early else args.epochs
    workload, per_epoch = quality_workload(args.workload, args.data, args.model, epochs, sets)
    options = {t: trainer_options(t, trainer_sets.get(t, {})) for t in args.trainers}
    runs = quality_runs(workload, per_epoch, args.trainers, args.world_sizes, args.seeds, options,
                        patience=args.patience if early else 0)
    # Every check before any rank. A trainer that cannot run the protocol (TorchRec's CPU
    # tables have no Adam) is left out with its reason, in the table and the exit code;
    # the baseline must run, or nothing can be compared.
    not_run: dict[str, str] = {}
    for run in runs[:len(args.trainers) * len(args.world_sizes)]:
        try:
            check_run(run)
            check_trainer(run, resolve_trainer_class(run.trainer))
        except ConfigError as e:
            if run.trainer == args.trainers[0]:
                raise
            not_run.setdefault(run.trainer, str(e))
    runs = [r for r in runs if r.trainer not in not_run]
    # Where the runs and the report go, before the first run: not after hours of training.
    check_writable_dir(args.store, "--store")
    out = check_writable_dir(args.out or Path(args.store) / "quality", "--out" if args.out else "--store")
    stopping = (f"up to {epochs} epochs, each run stopped after {args.patience} without a better "
                f"validation NDCG@10" if early else f"{epochs} epochs")
    note(f"{workload.name}: {per_epoch} steps an epoch, {stopping}, "
         f"{len(runs)} runs (model.loss={workload.model.loss})")
    from fsbench.table import progress_lines_wanted

    done = [read_run(*d) for d in run_all(runs, args.store,
                                           lambda todo: progress(todo, "quality runs", "run"),
                                           epoch_lines=progress_lines_wanted(), steps_per_epoch=per_epoch)]
    baseline_runs = {r.seed: r for r in runs if r.trainer == args.trainers[0]}
    result = analyze(done, per_epoch, baseline=args.trainers[0],
                     target_fraction=args.target_fraction, margin=args.margin,
                     rounding=functools.cache(lambda seed, steps: baseline_departure(
                         baseline_runs[seed], steps, LOSS_RTOL)))
    result.update(workload=workload.name, epochs=epochs, patience=args.patience if early else None,
                  seeds=args.seeds, store=args.store,
                  data=args.data, model=args.model, loss=workload.model.loss, not_run=not_run)
    text = markdown(result)
    (out / "quality.md").write_text(text + "\n")
    (out / "quality.json").write_text(dumps(result) + "\n")
    if not args.no_plots:
        (out / "learning_curves.png").write_bytes(learning_curves(done))
    print(dumps(result) if args.format == "json" else text)
    note(f"runs in {args.store}/, report in {out}/")
    verdicts = [r["equivalent"] for r in result["rows"] if r["equivalent"] != "(baseline)"]
    if any(v.startswith("NOT") for v in verdicts):
        return 1
    return 3 if not_run or any(v.startswith("inconclusive") for v in verdicts) else 0


def markdown(result: dict) -> str:
    """The quality table; a result stored before time to quality (no targets) says so in
    those columns."""
    def ci(pair) -> str:
        return f"[{pair[0]:.4f}, {pair[1]:.4f}]"

    targets = result.get("target_valid_ndcg_at_10")
    quality = (STORED_BEFORE if targets is None else
               describe_target(result["target_fraction"], result["baseline"],
                               {int(n): t for n, t in targets.items()}))
    lines = [
        f"Quality on {result['data']} ({result['model']}, model.loss={result['loss']}, "
        + (f"up to {result['epochs']} epochs of {result['steps_per_epoch']} steps, each run stopped "
           f"after {result['patience']} epochs without a better validation NDCG@10"
           if result.get("patience") else f"{result['epochs']} epochs of {result['steps_per_epoch']} steps")
        + ", seeds "
        f"{','.join(map(str, result['seeds']))}); test scores at each run's best-validation "
        f"epoch; {quality}.", "",
        "| trainer | ranks | HR@10 | 95% interval | NDCG@10 | 95% interval | epoch picked (of trained) "
        "| train s to quality | samples to quality | loss vs baseline (max rel.) | equivalent to "
        f"{result['baseline']} |",
        "|---|--:|--:|---|--:|---|---|--:|--:|--:|---|",
    ]
    for r in result["rows"]:
        time, samples = cells(r)
        lines.append(
            f"| {r['trainer']} | {r['world_size']} | {r['hr_at_10']:.4f} | {ci(r['hr_at_10_ci'])} "
            f"| {r['ndcg_at_10']:.4f} | {ci(r['ndcg_at_10_ci'])} | "
            f"{','.join(f'{e} ({t})' for e, t in zip(r['epochs_selected'], r.get('epochs_trained', r['epochs_selected'])))}"
            f" | {time} | {samples} "
            f"| {r['loss_max_rel_diff']:.1e} | {r['equivalent']} |")
    for trainer, reason in (result.get("not_run") or {}).items():  # absent before: none
        lines.append(f"| {trainer} | | | | | | | | | | not run: {reason} |")
    return "\n".join(lines)


def learning_curves(results) -> bytes:
    """The report's learning-curve plot (fsbench.reporting.plots) of these runs."""
    from fsbench.reporting.plots import plot_learning_curves, png

    return png(plot_learning_curves({f"{r.trainer} n={r.world_size} seed {r.seed}": r.curve
                                     for r in results}))


COMMANDS = {"quality": cmd_quality}
