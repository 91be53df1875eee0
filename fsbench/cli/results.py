"""`fsbench trace | report | list`: the commands that read what is stored or registered
(runs, presets, trainers) and write tables, plots and traces; fsbench.cli wires them in."""
from __future__ import annotations

import argparse

from fsbench.cli.args import add_format, add_store, path_arg, rename
from fsbench.table import dumps, grid, note

# The tracks `fsbench trace` writes per rank (fsbench.reporting.trace.TRACK_ORDER; a test keeps the
# two equal): named here so that `--help` does not import the trace writer.
TRACKS = "step, compute, comm, flight, wait, input, probe"


def add_parsers(sub, csv, default_store: str) -> None:
    """The sub-commands; `csv` parses a comma-separated flag (fsbench.cli's)."""
    p = sub.add_parser("trace", help="merge a run's rank timelines into one Chrome/Perfetto trace",
                       description="Write the run's spans as Chrome Trace Event JSON: a process "
                                   f"per rank, a track per span kind ({TRACKS}). Open it in "
                                   "ui.perfetto.dev or chrome://tracing.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", metavar="FILE", type=path_arg,
                   help="where the trace goes; default: RUN_DIR/trace.json")

    p = sub.add_parser("report", help="result table (md/latex/csv/html/json) and plots over stored runs",
                       description="Tabulate complete runs (medians over repeats per workload, "
                                   "trainer and world size) and plot bubbles and their causes, "
                                   "throughput and scaling efficiency, and one step's per-rank "
                                   "busy/idle time and timeline. html: one self-contained "
                                   "report.html with the plots embedded and the runs' machine and "
                                   "commands; other formats: PNGs beside the table. stdout gets "
                                   "the markdown table (json: the table as one JSON document).")
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                   help="run directories to report (default: every complete run in --store)")
    add_store(p, "the store of runs to report", default=default_store)
    rename(p, "--runs", "--store", "store")
    p.add_argument("--workload", help="only runs of this workload")
    p.add_argument("--trainers", type=csv(str), help="only runs of these trainers (comma-separated)")
    p.add_argument("--baseline",
                   help="trainer for throughput ratios; default: ddp if present, else the first")
    add_format(p, ("md", "latex", "csv", "html", "json"),
               help="md | latex (booktabs) | csv | html (one self-contained page) | json "
                    "(the table's raw values)")
    p.add_argument("--out", default="report", metavar="DIR", type=path_arg,
                   help="the folder report.<format> and the plots go to")
    p.add_argument("--step-run", metavar="RUN_DIR",
                   help="run for the per-rank busy/idle plot (and its trainer's step timeline); "
                        "default: the baseline's largest world size")
    p.add_argument("--no-plots", action="store_true", help="write the table only (no matplotlib needed)")
    p.add_argument("--title", default="fsbench report", help="the html page's title")

    p = sub.add_parser("list", help="list workload presets, length presets and trainers",
                       description="Workload presets, history-length presets and trainers. "
                                   "--format json gives every workload field, each length "
                                   "preset's targets and each trainer's switches with their "
                                   "defaults and allowed values, for scripts and CI jobs.")
    add_format(p)


def cmd_trace(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fsbench.reporting.trace import write_trace
    from fsbench.running.output_paths import check_output_file

    # Checked before the timelines are read: a bad --out costs nothing.
    check_output_file(args.out or Path(args.run_dir) / "trace.json", "--out")
    path, n = write_trace(args.run_dir, args.out)
    # The file is trace's result: where it is goes to stdout (a script opens it next).
    print(f"trace of {n} spans written to {path} (open in ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fsbench.reporting.report import footnotes, render, select_runs, write_report

    runs = select_runs(args.run_dirs, args.store, args.workload, args.trainers)
    table, written = write_report(runs, args.baseline, args.format, args.out, args.step_run,
                                  plots=not args.no_plots, title=args.title,
                                  command=getattr(args, "command_line", None))
    if args.format == "json":
        print(dumps({"table": table, "notes": footnotes(table), "written": written}))
    else:
        print(render(table, "md"), end="")
    note("written: " + ", ".join(str(p) for p in written))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from fsbench.training.trainer import TRAINERS, trainer_names
    from fsbench.workloads.distributions import LENGTH_PRESETS
    from fsbench.workloads.presets import WORKLOADS

    if args.format == "json":
        from fsbench.reporting.listing import listing

        print(dumps(listing()))
        return 0
    rows = []
    for name, make in WORKLOADS.items():
        w = make()
        rows.append([name, w.model.family, str(w.model.dim), str(w.model.num_layers),
                     str(w.global_batch_size), str(w.max_seq_len), str(w.lengths),
                     f"{w.item_vocab:,}", str(w.steps), str(w.version)])
    print("workloads:")
    print(grid(["workload", "model", "dim", "layers", "batch", "max len", "lengths", "items",
                "steps", "version"], rows, align=["left", "left", *["right"] * 4, "left",
                                                  *["right"] * 3]))
    print("\nlength presets (--set lengths=NAME):")
    print(grid(["preset", "lengths"], [[n, p.describe()] for n, p in LENGTH_PRESETS.items()],
               align="left"))
    print("\ntrainers (--trainer NAME):")
    print(grid(["trainer", "what"], [[n, TRAINERS[n][2]] for n in trainer_names()], align="left"))
    return 0


COMMANDS = {"trace": cmd_trace, "report": cmd_report, "list": cmd_list}
