"""`fsbench micro input-stage`: how long one rank's whole input stage takes per step at
cluster sizes (e.g. 8..1,024 ranks at 128 samples each), on one core.

A rank's input stage must keep ahead of its step: at 256 GPUs a step is a few
milliseconds, so a stage that grows with the world size sets the pace (ARCHITECTURE.md,
"The input stage, at scale"). The trainer declares what its stage does
(`input_stage(workload, options, n, routing, repeats, seed)`: FreeScale's plan, the read
of its samples, its routing and the owner's exchange preparation) and times it with its
real code on real global batches, generated before each clock starts; this module runs it
per world size on one pinned core and reports each part's median and p90 over the timed
steps, thread CPU time (a busy neighbour's turns are not counted).
"""
from __future__ import annotations

import numpy as np

from fsbench.errors import ConfigError
from fsbench.table import grid

PARTS = ("plan_ms", "read_ms", "route_ms", "prep_ms")
"""plan: the partitioner over the global batch's lengths; read: the rank's samples taken
from the global batch; route: the loader worker's routing; prep: the rank thread's
exchange preparation (counts, ids and masks received, the messages planned)."""


def check_args(ranks: list[int], batch_per_rank: int, repeats: int) -> None:
    if not ranks or min(ranks) < 1:
        raise ConfigError(f"--ranks={','.join(map(str, ranks))}: give world sizes >= 1, e.g. 8,64,256,1024")
    if batch_per_rank < 1:
        raise ConfigError(f"--set batch_per_rank={batch_per_rank} must be >= 1")
    if repeats < 1:
        raise ConfigError(f"--repeats={repeats} must be >= 1")


def summarize(n: int, routing: str, steps: list[dict]) -> dict:
    """One row: each part's median and p90 over the timed steps, the whole stage per step
    (plan + read + route + prep), and routing = route + prep."""
    row: dict = {"ranks": n, "routing": routing, "steps": len(steps),
                 "local_samples": int(np.median([s["local_samples"] for s in steps])),
                 "local_tokens": int(np.median([s["local_tokens"] for s in steps])),
                 "global_tokens": int(np.median([s["global_tokens"] for s in steps]))}
    columns = {p: np.array([s[p] for s in steps]) for p in PARTS}
    columns["routing_ms"] = columns["route_ms"] + columns["prep_ms"]
    columns["stage_ms"] = sum(columns[p] for p in PARTS)
    for name, values in columns.items():
        row[f"{name.removesuffix('_ms')}_median_ms"] = float(np.median(values))
        row[f"{name.removesuffix('_ms')}_p90_ms"] = float(np.quantile(values, 0.9))
    return row


def with_growth(rows: list[dict]) -> list[dict]:
    """Each row's routing and stage against the same routing's smallest world size."""
    first: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["ranks"]):
        base = first.setdefault(r["routing"], r)
        r["routing_vs_smallest"] = r["routing_median_ms"] / base["routing_median_ms"] if base["routing_median_ms"] else None
        r["stage_vs_smallest"] = r["stage_median_ms"] / base["stage_median_ms"] if base["stage_median_ms"] else None
    return rows


def format_table(record: dict) -> str:
    def ms(r, part):
        return f"{r[f'{part}_median_ms']:.2f} / {r[f'{part}_p90_ms']:.2f}"
    rows = [[str(r["ranks"]), r["routing"], str(r["local_tokens"]), ms(r, "plan"), ms(r, "read"),
             ms(r, "route"), ms(r, "prep"), ms(r, "stage"),
             "-" if r["routing_vs_smallest"] is None else f"{r['routing_vs_smallest']:.2f}x"]
            for r in record["rows"]]
    head = (f"input stage of one rank on {record['workload']} ({record['lengths']}), "
            f"{record['batch_per_rank']} samples a rank, median / p90 CPU ms per step over "
            f"{record['repeats']} steps after 1 untimed, {record['core']}")
    return head + "\n" + grid(
        ["ranks", "routing", "local tokens", "plan", "read", "route", "prep", "whole stage",
         "routing vs smallest"], rows, align=["right", "left"] + ["right"] * 7)
