"""`fsbench run | summarize | sweep | validate | overhead | micro`: the commands that start
runs (or, summarize, complete one), over fsbench.running.runner and friends; fsbench.cli
dispatches here through `COMMANDS`. Building runs from flags: fsbench.cli.run_config."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from fsbench.cli.args import add_format, add_store
from fsbench.cli.run_config import DEFAULT_EVAL_EVERY, make_run_factory
from fsbench.columns import EVAL_VIEW, FLAGS, RUN_VIEW
from fsbench.config import ConfigError
from fsbench.table import dumps, format_table, note, records, warn
from fsbench.training.trainer import trainer_options

RUN_COLUMNS = ["trainer", "world_size", *RUN_VIEW, *FLAGS]
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="small",
                   help="workload preset (fsbench list shows them; sweep takes a comma-separated "
                        "list)")
    p.add_argument("--steps", type=int, help="steps per run, warm-up included; default: the workload's")
    p.add_argument("--warmup", type=int, help="leading steps that are run but not measured; "
                                               "default: the workload's")
    p.add_argument("--seed", type=int, default=0, help="data and weight seed")
    add_store(p, "the store of runs: run directories go here (and compute=emulated's cost "
                 "fits are looked up here)", old="--out")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where ranks compute")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per rank (OMP_NUM_THREADS)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload field (e.g. lengths=yelp, model.dim=32, "
                        "lengths=hist:PATH) or a trainer switch (<trainer>.<key>=value)")
    p.add_argument("--force", action="store_true",
                   help="start even when the memory estimate says a rank will not fit")
    p.add_argument("--eval", action="store_true",
                   help="real data only: hold each user's last item out of training, then report "
                        "HR@10 and NDCG@10 over all items (fsbench.training.evaluate)")
    p.add_argument("--eval-every", type=int, metavar="K",
                   help="also evaluate after every K-th step (implies --eval); default with "
                        f"--target-hr10: {DEFAULT_EVAL_EVERY}")
    p.add_argument("--target-hr10", type=float, metavar="X",
                   help="time to quality: store the summed step time until HR@10 first reaches "
                        "X (implies --eval)")
    p.add_argument("--input-workers", type=int, default=1,
                   help="data-loader worker processes per rank preparing inputs ahead "
                        "(0: prepare inline, all of it input stall)")
    add_format(p)


def add_parsers(sub, _csv: Callable) -> None:
    """The run commands' sub-parsers; `_csv` parses a comma-separated flag (fsbench.cli's)."""
    p = sub.add_parser("run", help="one training run; prints and stores its summary",
                       description="Train one workload with one trainer on N local ranks "
                                   "and write DIR/<run_id>/ (manifest, timelines, summary).")
    _common(p)
    p.add_argument("--trainer", default="ddp", help="trainer name")
    p.add_argument("--world-size", type=int, default=None,
                   help="number of ranks; default: 1, or under torchrun/srun the launcher's")

    p = sub.add_parser("summarize", help="summarize a run whose ranks finished (multi-node runs)",
                       description="Compute and write RUN_DIR/summary.json from the ranks' files "
                                   "and mark the run complete: for a run launched by torchrun or "
                                   "srun whose rank 0 did not summarize it.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    add_format(p)

    p = sub.add_parser("sweep", help="every trainer x world size, repeated; one comparison table",
                       description="Run every (trainer, world size) combination, repeats "
                                   "interleaved, and print medians with ratios to the first trainer.")
    _common(p)
    p.add_argument("--trainers", type=_csv(str), default=["ddp"],
                   help="comma-separated trainer names; the first is the baseline for ratios")
    p.add_argument("--world-sizes", type=_csv(int), default=[1, 2],
                   help="comma-separated world sizes")
    p.add_argument("--repeats", type=int, default=1, help="runs per combination")
    p.add_argument("--rerun", action="store_true",
                   help="run again what the store (--store) already holds complete; by default a "
                        "sweep resumes: an interrupted sweep run again skips its finished runs")

    p = sub.add_parser("validate", help="check the harness against closed-form ground truth",
                       description="Run synthetic workloads with known per-token cost, an injected "
                                   "slow rank and a delayed collective; compare every measured ratio "
                                   "with its closed-form value (tolerance 0.03).")
    p.add_argument("--world-size", type=int, default=2, help="ranks of every case")
    add_store(p, "the store the synthetic runs go to", old="--out")
    add_format(p)

    p = sub.add_parser("overhead", help="instrumentation cost: spans + monitor vs a bare loop",
                       description="Step time with timeline spans and the monitor against the same "
                                   "trainer with both off, in alternating blocks, in one process.")
    p.add_argument("--workload", default="small", help="workload preset")
    p.add_argument("--trainer", default="ddp", help="trainer name")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks (first 2 warm-up)")
    p.add_argument("--steps-per-block", type=int, default=6, help="steps timed per block")
    add_format(p)


def check_writable_dir(path: str, flag: str = "--store") -> None:
    from fsbench.running.output_paths import check_writable_dir as check

    check(path, flag)


def print_run(args: argparse.Namespace, run_dir: Path, summary: dict, columns: list[str]) -> None:
    """What `run` and `summarize` print: the run's row, or its summary as JSON."""
    if summary.get("non_finite"):
        diverged = " (the loss diverged: lower lr?)" if any(
            k.startswith("loss") for k in summary["non_finite"]) else ""
        warn(f"{run_dir}: {', '.join(summary['non_finite'])} went NaN or infinite{diverged}; "
             "summary.json holds null there and lists them under non_finite")
    if args.format == "json":
        print(dumps({"run_dir": run_dir, "summary": summary}))
        return
    import pandas as pd

    quality = list(EVAL_VIEW) if summary.get("hr_at_10") is not None else []
    print(format_table(pd.DataFrame([summary]), columns + quality))


def cmd_run(args: argparse.Namespace) -> int:
    from fsbench.running.runner import run_once

    from fsbench.running.launch.external import external_world, run_external

    world = external_world()  # torchrun or srun started this process as one rank
    if world is not None and args.world_size is None:
        args.world_size = world["world_size"]
    args.world_size = args.world_size or 1
    args.world_sizes = [args.world_size]
    make = make_run_factory(args, [args.trainer])
    check_writable_dir(args.store)
    if world is None:
        run_dir, summary = run_once(make(args.trainer, args.world_size), args.store)
    else:
        run_dir, summary = run_external(make(args.trainer, args.world_size), args.store)
        if summary is None:  # not rank 0: rank 0 summarizes and prints
            return 0
    print_run(args, run_dir, summary, RUN_COLUMNS)
    note(f"run stored in {run_dir}")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    """Complete a run whose ranks finished but were not summarized (a multi-node run whose
    rank 0 stopped early, or files gathered by hand)."""
    from fsbench.running.runner import finish_run, status_after, summarize_run
    from fsbench.running.store import read_manifest

    run_dir = Path(args.run_dir)
    manifest = read_manifest(run_dir)
    if manifest.get("simulated"):
        raise ConfigError(f"{run_dir}: a simulated run (fsbench simulate wrote its summary); "
                          "it has no rank files to summarize")
    missing = [r for r in range(manifest["world_size"])
               if not all((run_dir / f"{kind}-{r}.jsonl").exists() for kind in ("rank", "steps-rank"))]
    if missing:
        raise ConfigError(f"{run_dir}: no files of rank(s) {', '.join(map(str, missing))}; "
                          "copy every node's rank files into it first")
    try:
        summary = summarize_run(run_dir)
    except ValueError as e:  # e.g. stopped before its first measured step
        raise ConfigError(f"{run_dir}: cannot be summarized: {e}") from None
    status = status_after(manifest, summary)
    summary = finish_run(run_dir, status, summary)
    print_run(args, run_dir, summary, RUN_COLUMNS)
    if status != "complete":
        warn(f"{run_dir}: the run is {status} ({summary['steps']} of "
             f"{summary.get('steps_planned', summary['steps'])} steps recorded); it stays "
             f"{status}, so reports and gates leave it out")
    note(f"summary written to {run_dir / 'summary.json'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fsbench.reporting.report import report_table
    from fsbench.running.runner import sweep
    from fsbench.table import progress

    if args.repeats < 1:
        raise ConfigError(f"--repeats={args.repeats} must be >= 1")
    if not args.world_sizes:
        raise ConfigError("--world-sizes is empty; give e.g. 1,2")
    names = [w for w in args.workload.split(",") if w.strip()]
    # Every workload's runs are validated (and their memory checked) before any starts.
    factories = {w: make_run_factory(argparse.Namespace(**{**vars(args), "workload": w}), args.trainers)
                 for w in names}
    check_writable_dir(args.store)

    def skipped(n: int, total: int) -> None:
        if n:
            note(f"resuming: {n} of {total} runs are already complete in {args.store} "
                 "(--rerun runs them again)")

    runs = sweep(lambda t, n, w: factories[w](t, n), args.trainers, args.world_sizes,
                 args.repeats, args.store, lambda plan: progress(plan, "runs", "run"),
                 workloads=names, rerun=args.rerun, on_skip=skipped)
    baseline = args.trainers[0]
    table = report_table(runs, baseline)
    steps = {w: factories[w](baseline, 1).workload.steps for w in names}
    many = ["workload"] if len(names) > 1 else []
    evaluated = "hr_at_10" in runs and runs["hr_at_10"].notna().any()  # --eval: quality, run by run
    quality = [*many, "trainer", "world_size", "repeat", *EVAL_VIEW]
    # How to read the flag columns: footnotes of the table (in JSON, beside it).
    notes = []
    if table["oversubscribed"].any():
        notes.append("oversub=yes: more busy threads than cores; step time, bubble and throughput "
                     "measure time-sharing there, load imbalance stays valid.")
    if table["contended"].any():
        notes.append("contended=yes: another process took CPU time during the run (cpu wait); "
                     "wall-clock columns measure it too. Rerun on a quiet machine.")
    if args.format == "json":
        doc = {"workloads": names, "steps": steps, "repeats": args.repeats, "baseline": baseline,
               "table": records(table), "notes": notes, "store": args.store}
        if evaluated:
            doc["quality"] = records(runs, quality)
        print(dumps(doc))
    else:
        print(f"workload={args.workload} steps={', '.join(f'{w}: {n}' for w, n in steps.items())} "
              f"repeats={args.repeats} (medians over measured steps, then over repeats)")
        spread = ["samples_per_s_spread"] if args.repeats > 1 else []
        print(format_table(table, [*many, "trainer", "world_size", "repeats", *RUN_VIEW,
                                   f"throughput_vs_{baseline}", *spread, *FLAGS]))
        if evaluated:
            print(format_table(runs, quality))
        for line in notes:
            print(line)
    note(f"runs stored in {args.store}/")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0 when every judged row is within its budget, 1 when one is not, 3 when a case
    was too contended to judge its wall-clock ratios (fsbench.running.groundtruth)."""
    from fsbench.running.groundtruth import TOLERANCE, TRUTH_MAX_CPU_WAIT, validate

    check_writable_dir(args.store)
    table = validate(args.store, world_size=args.world_size)
    judged = table[table["judged"]]
    worst = float(judged["abs_error"].max()) if len(judged) else float("nan")
    loud = list(table[table["cpu_wait_ratio"] > TRUTH_MAX_CPU_WAIT]["case"].unique())
    # Rows that cannot differ at this world size are not evidence, nor inconclusive.
    unjudged = list(table[~table["judged"] & table["not_checked"].isna()]["case"].unique())
    ok = bool(judged["ok"].all())
    if args.format == "json":
        print(dumps({"ok": ok, "inconclusive": bool(unjudged), "worst_abs_error": worst,
                     "tolerance": TOLERANCE, "cases": records(table), "cpu_waited": loud,
                     "not_judged": unjudged}))
    else:
        fixed = {c: table[c].map(lambda v: f"{v:.4f}")
                 for c in ("measured", "expected", "abs_error", "budget")}
        print(format_table(table.assign(**fixed)))
        print(f"worst absolute error {worst:.4f} (tolerance {TOLERANCE} on a quiet run)")
    widened = [case for case in loud if case not in unjudged]  # the rest: not judged, below
    if widened:
        warn(f"ranks waited for a CPU more than {TRUTH_MAX_CPU_WAIT:.0%} of their step "
             f"time in {', '.join(widened)}: another process was busy; their wall-clock ratios "
             "were judged against the tolerance plus the most-waiting rank's wait (column budget)")
    if not ok:
        return 1
    if unjudged:
        warn(f"inconclusive: {', '.join(unjudged)} ran on a contended machine; their "
             "wall-clock ratios were not judged (rerun on a quiet machine)")
        return 3
    return 0


def cmd_overhead(args: argparse.Namespace) -> int:
    from fsbench.running.overhead import measure_overhead
    from fsbench.table import grid
    from fsbench.workloads.presets import get_workload

    if args.blocks < 3 or args.steps_per_block < 1:
        raise ConfigError("--blocks must be >= 3 and --steps-per-block >= 1")
    trainer_options(args.trainer, {})  # validates the name before any work
    out = measure_overhead(get_workload(args.workload), args.trainer, args.blocks, args.steps_per_block)
    if args.format == "json":
        print(dumps(out))
    else:
        print(grid(["quantity", "value"],
                   [[k, f"{v:.4f}" if isinstance(v, float) else str(v)] for k, v in out.items()],
                   align=["left", "right"]))
    return 0


COMMANDS = {"run": cmd_run, "summarize": cmd_summarize, "sweep": cmd_sweep,
            "validate": cmd_validate, "overhead": cmd_overhead}
