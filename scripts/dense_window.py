"""What the dense all-reduce's exposure depends on, SIMULATED: FreeScale in full at one size
(default `medium`, 256 GPUs, 128 a GPU, cluster h100), its chunk count swept. With C chunks
every dense gradient is made in the last sub-batch's backward (1/C of it), so if the
window were what limits the dense all-reduce, one chunk (the whole backward) would hide
it. The table shows how much of it each count exposes, beside each bucket's time alone,
and the sharded baseline's exposure of its own buckets at the same point.

    python scripts/dense_window.py [--preset medium] [--gpus 256] [--batch 128] [--chunks 1,2,4,8]
        [--out results/dense_window_h100.md]
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pandas as pd

from fsbench.config import RunConfig
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import scaled_workload, simulate_run
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import get_workload

from paper_table import FULL  # noqa: E402  (scripts/, beside this one: FreeScale in full)

HERE = Path(__file__).resolve().parent.parent
DENSE = "exposed_ms:ddp.allreduce"


def one(preset: str, gpus: int, batch: int, trainer: str, sets: dict) -> dict:
    """One simulated point: its summary and the measured steps' mean exposure per kind."""
    w = scaled_workload(get_workload(preset), gpus, "weak", batch)
    run = RunConfig(workload=w, trainer=trainer, world_size=gpus, trainer_options=trainer_options(trainer, sets))
    summary, rows = simulate_run(run, CLUSTERS["h100"], store=HERE / "runs", planner_time=False)
    steps = pd.DataFrame(rows)
    steps = steps[steps["step"] >= w.warmup]
    exposed = {c.split(":", 1)[1]: float(steps[c].fillna(0.0).mean())
               for c in steps if c.startswith("exposed_ms:")}
    return {"summary": summary, "exposed": exposed, "step_ms": float(steps["step_time_ms"].mean())}


def by_kind(exposed: dict) -> str:
    """'kind ms, ...', largest first, the ones above half a microsecond."""
    return ", ".join(f"{k} {v:.3f}" for k, v in sorted(exposed.items(), key=lambda kv: -kv[1]) if v > 5e-4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="medium")
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128, help="samples a GPU (weak scaling)")
    ap.add_argument("--chunks", default="1,2,4,8", help="comma-separated chunk counts")
    ap.add_argument("--out", default=None, help="write the table here (markdown) as well")
    args = ap.parse_args()
    counts = [int(c) for c in args.chunks.split(",") if c]
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                         text=True).stdout.strip() or "unknown"
    base = one(args.preset, args.gpus, args.batch, "torchrec", {"sharding": "row_wise"})
    lines = [f"# The dense all-reduce against the chunk count (SIMULATED, h100)\n",
             f"`python scripts/dense_window.py --preset {args.preset} --gpus {args.gpus} --batch "
             f"{args.batch} --chunks {args.chunks}` at `{sha}` (planner time off: nothing here "
             "depends on this CPU). FreeScale in full; ms a step, means over the measured steps.\n",
             f"The sharded baseline (TorchRec's profile, the same dense buckets, waited at its "
             f"backward's end): step {base['step_ms']:.2f} ms, bubble "
             f"{100 * base['summary']['bubble_ratio']:.1f}%, exposed by kind: {by_kind(base['exposed'])} "
             "(`tr.dense`: its dense all-reduce).\n",
             "| chunks | step ms | bubble | exposed comm | reduction vs sharded | dense all-reduce exposed | the rest exposed, by kind |",
             "|--:|--:|--:|--:|--:|--:|---|"]
    for c in counts:
        r = one(args.preset, args.gpus, args.batch, "freescale", {**FULL, "chunks": str(c)})
        s, ex = r["summary"], dict(r["exposed"])
        dense = ex.pop("ddp.allreduce", 0.0)
        rest = by_kind(ex)
        reduction = 1 - s["bubble_ratio"] / base["summary"]["bubble_ratio"]
        lines.append(f"| {c} | {r['step_ms']:.2f} | {100 * s['bubble_ratio']:.1f}% | "
                     f"{100 * s['exposed_comm_ratio']:.1f}% | {100 * reduction:.1f}% | {dense:.3f} | {rest or 'none'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
