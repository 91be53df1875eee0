"""What limits FreeScale at 256 GPUs in the paper table (scripts/paper_table.py): its
exposed communication against the 8% target on `medium`, split by what the step waits
for (the simulator's exposure of each kind of collective, fsbench.scaling.step_engine
`Replay.exposed_by_kind`), beside its bubble reduction against the targets."""
from __future__ import annotations

import pandas as pd

EXPOSED_TARGET = 0.08  # issue 50: FreeScale's exposed communication on `medium` at 256 GPUs
REDUCTION_TARGETS = {"medium": 0.70, "large": 0.903}  # bubble reduction vs the sharded baseline
WHAT = {
    "ddp.allreduce": "dense all-reduce (DDP's buckets; the last made as the backward ends)",
    "emb.fetch": "rows (the next step's fresh rows, sent after the update, before its forward)",
    "emb.fetch_final": "final rows (the next step's rows this update cannot change)",
    "emb.grad": "row gradients (chunk 0's made as the backward ends)",
    "emb.control": "control (the requests of later steps)",
    "host_sync": "host syncs (the device drains its queue)",
}
# Beyond one node an exchange has a part inside the node (copy engines: sm_free's node rows,
# or the two-hop exchange's first hop) and one across nodes over NCCL (the other nodes'
# rows, or the hop along the rails).
WHERE = {".nodes": ", its part across nodes, over NCCL", ".node": ", its part inside the node, on copy engines"}


def what(kind: str) -> str:
    """A kind of collective (Replay.exposed_by_kind) in words: `emb.fetch.nodes` is the
    rows' part between nodes."""
    for suffix, part in WHERE.items():
        if kind.endswith(suffix) and kind[:-len(suffix)] in WHAT:
            base = WHAT[kind[:-len(suffix)]]
            return base[:-1] + part + ")" if base.endswith(")") else base + part
    return WHAT.get(kind, kind)


def exposed_parts(steps: pd.DataFrame) -> str:
    """The measured steps' exposure per kind, ms a step, largest first: `kind=ms;...`."""
    cols = [c for c in steps if c.startswith("exposed_ms:")]
    means = {c.split(":", 1)[1]: float(steps[c].fillna(0.0).mean()) for c in cols}
    if "host_sync_ms" in steps:
        means["host_sync"] = float(steps["host_sync_ms"].mean())
    return ";".join(f"{k}={v:.3f}" for k, v in sorted(means.items(), key=lambda kv: -kv[1]) if v > 5e-4)


def limits_section(df: pd.DataFrame, gpus: int = 256) -> list[str]:
    """A table per preset of FreeScale in full at `gpus`: step, exposed share against the
    target, the reduction against its target, and the exposure's parts."""
    lines = [f"## What limits FreeScale at {gpus} GPUs\n",
             f"Its exposed communication (the share of its step blocked on a collective; target at "
             f"most {EXPOSED_TARGET:.0%} on `medium`) and its bubble reduction against the sharded "
             "baseline (targets: " + ", ".join(f"`{p}` {t:.1%}" for p, t in REDUCTION_TARGETS.items())
             + "), with what the step waits for, ms a step on the fastest rank, and its launch "
             "gaps (other idle: each pass of the encoder launches every layer, `layer_overhead_ms` "
             "per layer, ASSUMED; where a pass's kernels take less, the GPU idles the rest, in "
             "FreeScale's step and the baseline's alike, and no exchange schedule removes it). "
             "The chunk count and the cut are the trainer's replayed choice (each sub-batch is a "
             "pass; results/chunk_counts_h100.md gives each size's). Every "
             "dense gradient is made in the last sub-batch's backward (1/C of it with C chunks), "
             "and its last bucket can leave only when that backward ends, with nothing after it "
             "but the table update to hide under; how much of the dense all-reduce a wider window "
             "(fewer chunks) would hide is in results/dense_window_h100.md "
             "(scripts/dense_window.py). The next step's fresh rows leave only after the update "
             "they carry, and its forward waits for the first chunk of them.\n",
             "| preset | batch/rank | step ms | exposed comm | launch gaps | reduction vs sharded (target) | exposed, by what it waits for (ms a step) |",
             "|---|--:|--:|--:|--:|--:|---|"]
    if "exposed_parts" not in df:
        return lines[:1] + ["(A CSV from before the exposure was split: regenerate the table.)\n"]
    at = df[(df["config"] == "freescale") & (df["gpus"] == gpus)]
    for _, r in at.sort_values(["preset", "batch_per_rank"]).iterrows():
        target = REDUCTION_TARGETS.get(r["preset"])
        reached = "" if target is None else f" ({target:.1%}: {'met' if r['reduction_vs_sharded_alone'] >= target else 'missed'})"
        parts = str(r["exposed_parts"]) if isinstance(r["exposed_parts"], str) else ""
        named = ", ".join(f"{what(k)} {float(v):.3f}" for k, v in
                          (p.split("=") for p in parts.split(";") if p))
        exposed = f"{100 * r['exposed_comm']:.1f}%"
        if r["preset"] == "medium":
            exposed += f" ({'met' if r['exposed_comm'] <= EXPOSED_TARGET else 'missed'})"
        gaps = f"{100 * r['other_idle']:.1f}%" if "other_idle" in r and r["other_idle"] == r["other_idle"] else "n/a"
        lines.append(f"| {r['preset']} | {r['batch_per_rank']} | {r['step_alone_ms']:.2f} | {exposed} | {gaps} | "
                     f"{100 * r['reduction_vs_sharded_alone']:.1f}%{reached} | {named or 'none'} |")
    return lines + [""]
