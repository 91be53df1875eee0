"""The chunk counts FreeScale's embedding exchange takes on a cluster model, per workload
preset and world size: at 128 samples a GPU (the paper table's weak scaling) and at the
preset's own global batch. Each cell: the count FreeScale in full takes (its step program
replayed at each count on the cluster's costs, fsbench.scaling.chunk_replay: the rule the
trainer and the simulator share), its predicted step against one chunk's, and the count
the links alone would give (fsbench.scaling.chunking's rule, where no encoder cost is
known). Deterministic: nothing here is timed.

    python scripts/chunk_counts.py [--cluster h100] [--out results/chunk_counts_h100.md]
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from fsbench.scaling.chunk_replay import COUNTS, GROWTHS, TIE, candidate_name
from fsbench.scaling.chunking import CAP, a2a_model, choose_chunks
from fsbench.scaling.simulate import scaled_workload
from fsbench.table import grid
from fsbench.workloads.presets import get_workload
from freescale_impl.trainer import FreeScaleOptions, exchange_chunks

from paper_table import FULL  # noqa: E402  (scripts/, beside this one: FreeScale in full)

WORKLOADS = ("medium", "large", "comm-heavy", "small")
WORLD_SIZES = (2, 8, 64, 256, 1024)


def cell(workload, n: int, a2a, name: str) -> str:
    if workload.global_batch_size < n:
        return "-"
    opts = FreeScaleOptions.parse({**FULL, "chunk_cluster": name})
    c = exchange_chunks(opts, workload, n, "cuda", None)
    links = choose_chunks(workload, n, a2a, name).chunks
    if c.why != "replay":
        return f"**{c.chunks}** ({c.why})"
    name = candidate_name(c.chunks, c.growth)
    return f"**{name}** ({c.predicted_ms[name]:.3g} ms; 1: {c.predicted_ms['1']:.3g}; links: {links})"


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
        f"FreeScale in full (its switches as in the paper table). A cell: **the count** (x the "
        f"cut's growth, where not equal) whose replayed step is shortest among "
        f"{', '.join(map(str, COUNTS))} at each cut of {', '.join(f'{g:g}' for g in GROWTHS)} (up "
        f"to a rank's samples; within {TIE:.1%} of the shortest, the fewest chunks, then the "
        f"evener cut), then its predicted step and one chunk's, "
        f"ms, and the count the links' rule alone gives (at most {CAP}). Each sub-batch is a pass "
        "of the encoder that launches every layer again, so where a pass's kernels take less "
        "than its launches one chunk wins (fsbench/scaling/chunk_replay.py; "
        "docs/simulation.md#how-many-chunks). `-`: fewer samples than GPUs.", "",
        table(args.cluster)])
    if args.out:
        args.out.write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
