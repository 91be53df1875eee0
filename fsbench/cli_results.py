"""`fsbench trace | report | list`: the commands that read what is stored or registered
(runs, presets, trainers) and write tables, plots and traces; fsbench.cli wires them in."""
from __future__ import annotations

import argparse
import json


def add_parsers(sub, csv, default_out: str) -> None:
    """The sub-commands; `csv` parses a comma-separated flag (fsbench.cli's)."""
    DEFAULT_OUT = default_out  # noqa: N806 - the name the help strings use
    p = sub.add_parser("trace", help="merge a run's rank timelines into one Chrome/Perfetto trace",
                       description="Write the run's spans as Chrome Trace Event JSON: a process "
                                   "per rank, a track per span kind (compute, comm, wait, data, "
                                   "step). Open it in ui.perfetto.dev or chrome://tracing.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", metavar="FILE", help="default: RUN_DIR/trace.json")

    p = sub.add_parser("report", help="result table (md/latex/csv/html) and plots over stored runs",
                       description="Tabulate complete runs (medians over repeats per workload, "
                                   "trainer and world size) and plot bubbles and their causes, "
                                   "throughput and scaling efficiency, and one step's per-rank "
                                   "busy/idle time and timeline. html: one self-contained "
                                   "report.html with the plots embedded and the runs' machine and "
                                   "commands; other formats: PNGs beside the table.")
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                   help="run directories to report (default: every complete run under --runs)")
    p.add_argument("--runs", default=DEFAULT_OUT, help="where run directories are; default: %(default)s")
    p.add_argument("--workload", help="only runs of this workload")
    p.add_argument("--trainers", type=csv(str), help="only runs of these trainers (comma-separated)")
    p.add_argument("--baseline",
                   help="trainer for throughput ratios; default: ddp if present, else the first")
    p.add_argument("--format", default="md",
                   help="md | latex (booktabs) | csv | html (one self-contained page); "
                        "default: %(default)s")
    p.add_argument("--out", default="report", metavar="DIR", help="output directory; default: %(default)s")
    p.add_argument("--step-run", metavar="RUN_DIR",
                   help="run for the per-rank busy/idle plot (and its trainer's step timeline); "
                        "default: the baseline's largest world size")
    p.add_argument("--no-plots", action="store_true", help="write the table only (no matplotlib needed)")

    p = sub.add_parser("list", help="list workload presets, length presets and trainers",
                       description="Workload presets, history-length presets and trainers. "
                                   "--format json gives every workload field, each length "
                                   "preset's targets and each trainer's switches with their "
                                   "defaults and allowed values, for scripts and CI jobs.")
    p.add_argument("--format", default="text", choices=["text", "json"],
                   help="text (default) or json")


def cmd_trace(args: argparse.Namespace) -> int:
    from fsbench.trace import write_trace

    path, n = write_trace(args.run_dir, args.out)
    print(f"trace of {n} spans written to {path} (open in ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fsbench.report import check_format, render, select_runs, write_report

    check_format(args.format)  # before reading any run
    runs = select_runs(args.run_dirs, args.runs, args.workload, args.trainers)
    table, written = write_report(runs, args.baseline, args.format, args.out, args.step_run,
                                  plots=not args.no_plots)
    print(render(table, "md"), end="")
    print("written: " + ", ".join(str(p) for p in written))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from fsbench.trainer import TRAINERS, trainer_names
    from fsbench.workloads.distributions import LENGTH_PRESETS
    from fsbench.workloads.presets import WORKLOADS

    if args.format == "json":
        from fsbench.listing import listing

        print(json.dumps(listing(), indent=1))
        return 0
    print("workloads:")
    for name, make in WORKLOADS.items():
        w = make()
        print(f"  {name:8} {w.model.family} dim={w.model.dim} layers={w.model.num_layers} "
              f"batch={w.global_batch_size} max_len={w.max_seq_len} lengths={w.lengths} "
              f"items={w.item_vocab:,} steps={w.steps} (v{w.version})")
    print("length presets (--set lengths=NAME):")
    for name, preset in LENGTH_PRESETS.items():
        print(f"  {name:15} {preset.describe()}")
    print("trainers:")
    for name in trainer_names():
        print(f"  {name:10} {TRAINERS[name][2]}")
    return 0


COMMANDS = {"trace": cmd_trace, "report": cmd_report, "list": cmd_list}
