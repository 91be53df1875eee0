"""The chunk counts FreeScale's embedding exchange takes on a cluster model
(fsbench.scaling.chunking, the rule the trainer and the simulator share), per workload
preset and world size: at 128 samples a GPU (the paper table's weak scaling) and at the
preset's own global batch. Each cell: the count, then a chunk's bytes, its transfer and its
fixed cost (at one chunk where even one is latency-bound). Deterministic: nothing here is
timed.

    python scripts/chunk_counts.py [--cluster h100] [--out results/chunk_counts_h100.md]
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from fsbench.scaling.chunking import CAP, MARGIN, a2a_model, choose_chunks
from fsbench.scaling.simulate import scaled_workload
from fsbench.table import grid
from fsbench.workloads.presets import get_workload

WORKLOADS = ("medium", "large", "comm-heavy", "small")
WORLD_SIZES = (2, 8, 64, 256, 1024)


def cell(workload, n: int, a2a, name: str) -> str:
    if workload.global_batch_size < n:
        return "-"
    c = choose_chunks(workload, n, a2a, name)
    return (f"**{c.chunks}** ({c.chunk_bytes / 1e6:.3g} MB, {c.transfer_us:.3g} / "
            f"{c.latency_us:.3g} us)").replace("e+03", "e3")


def table(cluster: str) -> str:
    a2a, name = a2a_model(cluster, "cuda", None)
    lines = []
    for label, per_rank in (("128 samples a GPU", 128), ("the preset's global batch", None)):
        rows = []
        for wl in WORKLOADS:
            preset = get_workload(wl)
            rows.append([f"{wl}"] + [cell(scaled_workload(preset, n, "weak", per_rank) if per_rank else preset,
                                          n, a2a, name) for n in WORLD_SIZES])
        lines += [f"### {label}", "", grid(["workload", *[f"{n} GPUs" for n in WORLD_SIZES]], rows,
                                           align=["left", *["right"] * len(WORLD_SIZES)]), ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="h100", help="a preset or a cluster file")
    p.add_argument("--out", type=Path, help="write the Markdown page here (default: print it)")
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    page = "\n".join([
        f"# Chunks of FreeScale's embedding exchange on `{args.cluster}`", "",
        f"`python scripts/chunk_counts.py --cluster {args.cluster}` at {commit or 'an unknown commit'}: "
        f"the largest count up to {CAP} to which each more chunk saves the forward at least "
        f"{MARGIN:g} x the link time it adds (fsbench/scaling/chunking.py; "
        "docs/simulation.md#how-many-chunks). A cell: **count** (a chunk's bytes, its transfer "
        "/ the rest of its time at that count); `-`: fewer samples than GPUs.", "",
        table(args.cluster)])
    if args.out:
        args.out.write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
