"""`fsbench micro sm-contention | planner | input-stage`: micro-benchmarks that isolate one
effect (SM contention on one GPU; the input stage's planner, and the whole input stage,
on one CPU core). Thin over fsbench.scaling.micro, planner_micro and input_stage_micro."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from fsbench.cli.args import add_format
from fsbench.cli.run_config import build_workload
from fsbench.cli.runs import check_writable_dir
from fsbench.config import ConfigError
from fsbench.table import dumps, note

DEFAULT_MICRO_OUT = "runs/micro"


def add_parsers(sub) -> None:
    p = sub.add_parser("micro", help="micro-benchmarks: sm-contention (one GPU), planner and input-stage (CPU)",
                       description="Micro-benchmarks that isolate one effect: SM contention "
                                   "on one GPU, the input stage's planner and the whole input "
                                   "stage on one CPU core.")
    micro = p.add_subparsers(dest="benchmark", required=True)
    p = micro.add_parser(
        "sm-contention", help="does communication overlapped with compute steal GPU SMs?",
        description="Time a large bf16 GEMM (CUDA events, warm-up discarded, median of "
                    "--repeats) alone; beside an SM copy of --bytes on a second stream "
                    "(torch.add(src, 0, out=dst): an elementwise kernel whose thread blocks "
                    "occupy SMs, as NCCL's do); and beside the copies CUDA issues as DMA, "
                    "copy-engine copies by their call (cudaMemcpyAsync device-to-device, "
                    "pinned host-to-device, and GPU-to-GPU when a peer GPU exists), each "
                    "labelled by GPM SM utilization sampled while it runs alone: the driver "
                    "may run a same-GPU copy on SMs. "
                    "Prints GEMM TFLOP/s, the slowdown of each condition against the GEMM "
                    "alone and the copies' bandwidth; stores a JSON record in --out DIR. "
                    "Needs one NVIDIA GPU.")
    p.add_argument("--gemm-size", type=int, default=8192, metavar="N",
                   help="GEMM of N x N by N x N in bf16")
    p.add_argument("--bytes", type=int, default=256 * 2**20, metavar="B",
                   help="bytes per copy, a multiple of 4; default: %(default)s (256 MiB)")
    p.add_argument("--repeats", type=int, default=20,
                   help="timed GEMMs per condition (median)")
    p.add_argument("--out", default=DEFAULT_MICRO_OUT, metavar="DIR",
                   help="where the JSON record goes (a folder of records, not a store of runs)")
    add_format(p)
    p = micro.add_parser(
        "planner", help="how long the input stage's planner takes at cluster sizes (CPU)",
        description="Time the trainer's planners (FreeScale: each partitioner alone and "
                    "with the look-ahead window) on --samples lengths drawn from the "
                    "workload's length distribution, onto --ranks ranks, on one core: "
                    "median and p90 over --repeats timed runs after 2 untimed, and the "
                    "plan's max rank cost over the lower bound max(total/ranks, largest "
                    "sample). Runs on a laptop CPU; nothing is stored.")
    p.add_argument("--workload", default="small", help="preset whose lengths and cost model are used")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="workload override, e.g. --set lengths=yelp or lengths=hist:FILE")
    p.add_argument("--samples", type=int, default=8192, help="samples in one global batch")
    p.add_argument("--ranks", type=int, default=64, help="ranks the batch is split onto")
    p.add_argument("--window", type=int, default=4,
                   help="look-ahead window in batches (1: the single-batch planners only)")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per planner")
    p.add_argument("--seed", type=int, default=0, help="seed of the length draws")
    p.add_argument("--trainer", default="freescale", help="the trainer whose planners are timed")
    p.set_defaults(steps=None, warmup=None)
    add_format(p)
    p = micro.add_parser(
        "input-stage", help="one rank's whole input stage per step at cluster sizes (CPU)",
        description="Time one rank's input stage per step at each of --ranks ranks with "
                    "batch_per_rank samples each (the global batch grows with the ranks), on "
                    "one core, thread CPU time: the plan (the partitioner over the global "
                    "batch's lengths), the read (the rank's samples taken from the global "
                    "batch), the route (the loader worker's routing) and the prep (the rank "
                    "thread's exchange preparation), median and p90 over --repeats steps "
                    "after one untimed, with the routing's growth against the smallest "
                    "world size. The global batches are generated before each clock starts. "
                    "Large sizes take a while to set up (1,024 ranks of medium: about a "
                    "minute). Nothing is stored.")
    p.add_argument("--workload", default="small", help="preset whose lengths, tables and cost model are used")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="batch_per_rank=N (samples per rank; default 128), a workload field "
                        "(e.g. lengths=hist:FILE), or a trainer switch (freescale.chunks=4)")
    p.add_argument("--ranks", default="8,64,256", type=_ranks, metavar="N,N,...",
                   help="world sizes (default: %(default)s)")
    p.add_argument("--routing", default="auto", metavar="R,R,...",
                   help="auto (the trainer's rule at each size), host, exchanged, or several "
                        "comma-separated (host routing at 1,024 ranks takes seconds a step)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per size (median, p90)")
    p.add_argument("--seed", type=int, default=0, help="seed of the global batches")
    p.add_argument("--trainer", default="freescale", help="the trainer whose input stage is timed")
    p.set_defaults(steps=None, warmup=None)
    add_format(p)


def _ranks(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected world sizes like 8,64,256") from None


def cmd_micro(args: argparse.Namespace) -> int:
    if args.benchmark == "input-stage":
        return cmd_micro_input_stage(args)
    if args.benchmark == "planner":
        return cmd_micro_planner(args)
    from fsbench.scaling import micro

    micro.check_args(args.gemm_size, args.bytes, args.repeats)  # only sm-contention so far
    import torch
    if not torch.cuda.is_available():
        raise ConfigError("micro sm-contention: no CUDA GPU is visible "
                          "(torch.cuda.is_available() is False), so this benchmark cannot run here")
    check_writable_dir(args.out, "--out")
    try:
        record = micro.sm_contention(torch, args.gemm_size, args.bytes, args.repeats)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"--gemm-size={args.gemm_size} --bytes={args.bytes}: out of GPU "
                          "memory; choose smaller sizes") from None
    path = micro.write_record(record, args.out)
    print(dumps({"path": path, "record": record}) if args.format == "json"
          else micro.format_table(record))
    note(f"record stored in {path}")
    return 0



def cmd_micro_planner(args: argparse.Namespace) -> int:
    from fsbench.scaling import planner_micro as pm
    from fsbench.training.trainer import resolve_trainer_class

    pm.check_args(args.samples, args.ranks, args.repeats, args.window)
    declare = getattr(resolve_trainer_class(args.trainer), "planners", None)
    if declare is None:
        raise ConfigError(f"--trainer {args.trainer}: it declares no planner to time "
                          "(freescale does)")
    workload = build_workload(args)
    lengths = pm.draw_lengths(workload, args.samples, args.window, args.seed)
    with pm.one_core() as core:
        rows = pm.time_planners(declare(workload, args.window), lengths, args.ranks, args.repeats)
    record = {"workload": workload.name, "lengths": workload.lengths, "trainer": args.trainer,
              "samples": args.samples, "ranks": args.ranks, "window": args.window,
              "repeats": args.repeats, "warmup": 2, "core": core, "rows": rows}
    print(dumps(record) if args.format == "json" else pm.format_table(record))
    return 0


def cmd_micro_input_stage(args: argparse.Namespace) -> int:
    from fsbench.cli.run_config import build_workload, parse_sets, pop_batch_per_rank
    from fsbench.scaling import input_stage_micro as ism
    from fsbench.scaling import planner_micro as pm
    from fsbench.training.trainer import resolve_trainer_class, trainer_options

    batch_per_rank = pop_batch_per_rank(args)
    ism.check_args(args.ranks, batch_per_rank, args.repeats)
    declare = getattr(resolve_trainer_class(args.trainer), "input_stage", None)
    if declare is None:
        raise ConfigError(f"--trainer {args.trainer}: it declares no input stage to time "
                          "(freescale does)")
    routings = [r for r in args.routing.split(",") if r]
    bad = [r for r in routings if r not in ("auto", "host", "exchanged")]
    if bad or not routings:
        raise ConfigError(f"--routing={args.routing!r}: allowed: auto, host, exchanged (comma-separated)")
    _, trainer_sets = parse_sets(args.set)
    options = trainer_options(args.trainer, trainer_sets.get(args.trainer, {}))
    workload = build_workload(args)
    rows = []
    with pm.one_core() as core:
        for n in args.ranks:
            sized = dataclasses.replace(workload, global_batch_size=n * batch_per_rank)
            for routing in routings:
                used, steps = declare(sized, options, n, routing, args.repeats, args.seed)
                rows.append(ism.summarize(n, used, steps))
                print(f"input-stage: {n} ranks, {used} routing: done", file=sys.stderr, flush=True)
    record = {"workload": workload.name, "lengths": workload.lengths, "trainer": args.trainer,
              "batch_per_rank": batch_per_rank, "ranks": args.ranks, "repeats": args.repeats,
              "core": core, "rows": ism.with_growth(rows)}
    print(dumps(record) if args.format == "json" else ism.format_table(record))
    return 0


COMMANDS = {"micro": cmd_micro}
