"""`fsbench cluster`: what a cluster model predicts for collectives, and, with `--compare`,
how it holds against nccl-tests logs (a user's check of a cluster model on their own
cluster before they trust a simulation on it)."""
from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from fsbench.cli.args import add_format, add_store
from fsbench.errors import ConfigError
from fsbench.table import dumps, grid, note

ALIASES = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_to_all": "all_to_all",
           "alltoall": "all_to_all", "all_gather": "all_gather", "allgather": "all_gather",
           "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter"}
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20,
         "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
# The band a cluster model's prediction must keep to against a measured point (0.75-1.33x).
BAND = (0.75, 4 / 3)


def byte_size(text: str) -> int:
    """'32MiB', '1GiB', '8M', '4096' -> bytes; a one-line error naming the units."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: a number with an optional unit "
                                         f"(B, KiB, MiB, GiB, KB, MB, GB; K/M/G are KiB/MiB/GiB)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def collective_name(text: str) -> str:
    name = ALIASES.get(text.strip().lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"collective {text!r}: allowed: all_reduce, all_to_all "
                                         f"(alltoall), all_gather, reduce_scatter")
    return name


def add_parsers(sub, csv: Callable, default_store: str) -> None:
    from fsbench.scaling.sim_inputs import CLUSTERS

    p = sub.add_parser(
        "cluster", help="a cluster model's collective times; --compare: against nccl-tests logs",
        description="Print what a cluster model predicts for collectives (the times fsbench "
                    "simulate books), one row per collective, world size and message size; with "
                    "--compare, every point of the given nccl-tests logs predicted at its own "
                    "world size and GPUs per node, beside the measured time (out-of-place) and "
                    "their ratio. The model: fsbench/scaling/collectives.py. Presets: "
                    + "; ".join(f"{c.name}: {c.description}" for c in CLUSTERS.values()))
    p.add_argument("--cluster", default="h100", metavar="NAME|FILE",
                   help=f"a preset ({', '.join(sorted(CLUSTERS))}; local: the store's comm fit, "
                        "from fsbench calibrate --comm [--from-nccl-tests]) or a cluster file")
    p.add_argument("--collectives", type=csv(collective_name), default=["all_reduce", "all_to_all", "all_gather"],
                   help="comma-separated: all_reduce, all_to_all, all_gather, reduce_scatter")
    p.add_argument("--world-sizes", type=csv(int), default=[8, 16, 64, 256, 1024], help="comma-separated")
    p.add_argument("--gpus-per-node", type=int, help="default: the cluster's")
    p.add_argument("--bytes", type=csv(byte_size), default=[1 << 20, 32 << 20, 1 << 30],
                   help="message sizes (a rank's buffer, as nccl-tests' size column): 32MiB,1GiB,...")
    p.add_argument("--compare", nargs="+", metavar="LOG",
                   help="nccl-tests logs (all_reduce_perf, alltoall_perf, all_gather_perf, "
                        "reduce_scatter_perf output; COLLECTIVE=LOG where neither the log nor its "
                        "name says which ran): predict each of their points and show the ratio; "
                        "`published`: the committed published runs the h100 model is checked on "
                        "and never fitted on (multi-node all-reduce below 32 MiB)")
    p.add_argument("--min-bytes", type=byte_size, default=0, help="--compare: points from this size")
    p.add_argument("--max-bytes", type=byte_size, help="--compare: points up to this size (default: all)")
    add_store(p, "where --cluster local finds its comm fit (STORE/calibrations/)", default=default_store)
    add_format(p)


def predictor(spec: str, store: str):
    """(cluster description, its GPUs a node (None: every rank on one host),
    predict(collective, N, G, bytes) -> seconds)."""
    from fsbench.scaling.collectives import collective_s
    from fsbench.scaling.commcal import comm_fit_path, load_comm_fits
    from fsbench.scaling.sim_inputs import assumptions, load_cluster

    cluster = load_cluster(spec)
    if cluster.compute != "fit":
        return (assumptions(cluster), cluster.gpus_per_node,
                lambda c, n, g, b: collective_s(cluster, c, n, b, g))
    fits = load_comm_fits(store)
    path = comm_fit_path(store)
    if fits is None:
        raise ConfigError(f"--cluster local: no comm fit at {path}: run fsbench calibrate --comm "
                          f"[--from-nccl-tests LOG...] --store {store}")

    def predict(c: str, n: int, g: int, nbytes: float) -> float:
        if c not in fits:
            raise ConfigError(f"--cluster local: the comm fit {path} has no {c} "
                              f"(it holds {', '.join(sorted(fits))})")
        return fits[c].seconds(n, nbytes, g)
    gpus = next(iter(fits.values())).gpus_per_node  # None: gloo's ranks, all on this host
    return f"local: the comm fit {path}", gpus, predict


def cmd_cluster(args: argparse.Namespace) -> int:
    from fsbench.scaling.collectives import bus_factor

    described, gpus, predict = predictor(args.cluster, args.store)
    gpn_default = args.gpus_per_node or gpus
    if args.compare:
        return _compare(args, described, predict)
    rows = []
    for c in args.collectives:
        for n in args.world_sizes:
            g = min(n, gpn_default) if gpn_default else n  # fewer ranks than a node holds: one node
            for nbytes in args.bytes:
                s = predict(c, n, g, nbytes)
                rows.append({"collective": c, "world_size": n, "gpus_per_node": g, "bytes": nbytes,
                             "ms": s * 1e3, "busbw_gbs": bus_factor(c, n) * nbytes / s / 1e9 if s > 0 else None})
    if args.format == "json":
        print(dumps({"cluster": args.cluster, "model": described, "rows": rows}))
        return 0
    print(described)
    print(grid(["collective", "ranks", "GPUs a node", "bytes", "ms", "bus GB/s"],
               [[r["collective"], str(r["world_size"]), str(r["gpus_per_node"]), _size(r["bytes"]),
                 f"{r['ms']:.4g}", "-" if r["busbw_gbs"] is None else f"{r['busbw_gbs']:.1f}"] for r in rows],
               align=["left", *["right"] * 5]))
    return 0


def _compare(args, described: str, predict) -> int:
    from fsbench.scaling.collectives import published_points
    from fsbench.scaling.nccl_tests import read_logs

    logs = [spec for spec in args.compare if spec != "published"]
    points = [p for run in read_logs(logs) for p in run.points] if logs else []
    if "published" in args.compare:  # the committed runs the model is checked on, never fitted on
        points += published_points("checked")
    rows = []
    for p in points:
        if p.bytes < args.min_bytes or (args.max_bytes is not None and p.bytes > args.max_bytes):
            continue
        if p.collective not in ALIASES.values():
            continue  # sendrecv: no collective of the simulator's
        predicted = predict(p.collective, p.world_size, p.gpus_per_node, p.bytes) * 1e3
        measured = p.time_us / 1e3
        rows.append({"collective": p.collective, "world_size": p.world_size,
                     "gpus_per_node": p.gpus_per_node, "bytes": p.bytes, "predicted_ms": predicted,
                     "measured_ms": measured, "ratio": predicted / measured, "source": p.source})
    if not rows:
        raise ConfigError("--compare: no point of the logs lies within --min-bytes/--max-bytes")
    inside = sum(BAND[0] <= r["ratio"] <= BAND[1] for r in rows)
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    if args.format == "json":
        print(dumps({"cluster": args.cluster, "model": described, "rows": rows,
                     "band": list(BAND), "within_band": inside, "points": len(rows),
                     "worst_ratio": worst["ratio"]}))
    else:
        print(described)
        print(grid(["collective", "ranks", "GPUs a node", "bytes", "predicted ms", "measured ms", "ratio"],
                   [[r["collective"], str(r["world_size"]), str(r["gpus_per_node"]), _size(r["bytes"]),
                     f"{r['predicted_ms']:.4g}", f"{r['measured_ms']:.4g}", f"{r['ratio']:.2f}"]
                    for r in rows], align=["left", *["right"] * 6]))
        print(f"{inside} of {len(rows)} points within {BAND[0]:.2f}-{BAND[1]:.2f}x; the worst: "
              f"{worst['ratio']:.2f}x ({worst['collective']}, {worst['world_size']} ranks, "
              f"{_size(worst['bytes'])})")
    note(f"compared {len(rows)} points of {len({r['source'] for r in rows})} source(s)")
    return 0


def _size(nbytes: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k and nbytes % k == 0:
            return f"{nbytes // k} {unit}"
    return f"{nbytes} B"


COMMANDS = {"cluster": cmd_cluster}
