"""The paper's scaling table, SIMULATED: FreeScale against the sharded baseline and ddp
at 8 to 1024 H100s.

For each real-shaped GPU preset (`medium`: MovieLens-1M lengths, `large`: KuaiRand-1K
lengths, `medium-short`: Amazon-Beauty lengths) and per-rank batch (32, 128, 512; weak
scaling), `fsbench.scaling.simulate` projects the sharded baseline, ddp, each of
FreeScale's techniques alone, FreeScale in full and with a look-ahead window of 4 onto
cluster `h100` (its figures are ASSUMED, printed in the output). Columns: bubble ratio,
bubble reduction against the sharded baseline (then ddp) at the same point, throughput,
scaling efficiency (throughput per GPU against the same configuration at 8 GPUs), and
the whole-sample lower bound on the straggler bubble, marked where FreeScale's straggler
bubble sits on it (only splitting samples could go lower). Then the headline's
sensitivity to each assumed figure.

Writes results/scaling_simulated_h100.md, .csv, _sensitivity.csv and .png. Nothing here
is measured on a GPU.

    python scripts/paper_table.py [--steps 12] [--presets medium,large,medium-short] [--from-csv --commit SHA]
        [--before SHA] [--batches 32,128,512]
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fsbench.config import RunConfig  # noqa: E402
from fsbench.scaling.sensitivity import sensitivity  # noqa: E402
from fsbench.scaling.sim_inputs import CLUSTERS, assumptions  # noqa: E402
from fsbench.scaling.simulate import scaled_workload, simulate_run  # noqa: E402
from fsbench.table import progress  # noqa: E402
from fsbench.training.trainer import trainer_options  # noqa: E402
from fsbench.workloads.presets import get_workload  # noqa: E402
from paper_limits import exposed_parts, limits_section  # noqa: E402  (scripts/, beside this one)

HERE = Path(__file__).resolve().parent.parent
# The sharded-table baseline is TorchRec's profile (baselines.torchrec_trainer.sim_profile:
# contiguous split, row-wise sharded tables, blocking all-to-all on NCCL's SMs, ids routed on
# the device in the pipeline's previous-step slot), the baseline people run at scale: the
# headline compares with it first. Each technique "alone" is FreeScale's trainer with its
# sharded baseline's switches plus that one switch: those pay FreeScale's own input stage
# (its routing, timed). The SM-free transport changes nothing without an overlapped
# exchange (a blocking one slows no compute), so its own effect is "overlap + SM-free"
# against "overlap alone".
SHARDED = {"balance": "off", "tables": "sharded", "overlap": "off", "priority": "off",
           "transport": "collective"}
FULL = {"balance": "on", "tables": "sharded", "overlap": "on", "priority": "on",
        "transport": "sm_free", "a2a": "auto"}
CONFIGS = {
    "sharded baseline": ("torchrec", {"sharding": "row_wise"}),
    "ddp": ("ddp", {}),
    "balance alone": ("freescale", {**SHARDED, "balance": "on"}),
    "overlap alone": ("freescale", {**SHARDED, "overlap": "on"}),
    "prioritized a2a alone": ("freescale", {**SHARDED, "overlap": "on", "priority": "on"}),
    "overlap + SM-free": ("freescale", {**SHARDED, "overlap": "on", "transport": "sm_free"}),
    "two-hop a2a alone": ("freescale", {**SHARDED, "a2a": "hierarchical"}),
    "freescale": ("freescale", FULL),
    "freescale window=4": ("freescale", {**FULL, "window": "4"}),
}
# Every configuration runs at every size: beyond one node the SM-free transport moves a
# node's own rows on copy engines and the other nodes' over NCCL with its CTAs capped
# (freescale_impl.node_transport), as the simulator books it (`sm_free_nodes`); with
# a2a=auto (FreeScale in full) the chunk rule's replay chooses, with the count, whether every
# row goes in two hops instead, inside the node on copy engines, then along the rails over
# NCCL, CTAs capped (freescale_impl.rail_transport).

# Long histories, where stragglers exist (MovieLens-1M and KuaiRand-1K lengths), and a
# short-history one where communication dominates (`medium` with Amazon-Beauty lengths).
PRESETS = {"medium": {}, "large": {}, "medium-short": {"base": "medium", "lengths": "amazon-beauty"}}
WORLD_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
BATCHES = (32, 128, 512)
PAPER_REDUCTION_256 = 90.3  # MLSys 2026: computational bubbles, 256 H100s


def workload_of(preset: str, steps: int):
    spec = PRESETS.get(preset, {})
    w = get_workload(spec.get("base", preset))
    if "lengths" in spec:
        w = dataclasses.replace(w, name=preset, lengths=spec["lengths"])
    return dataclasses.replace(w, steps=steps, warmup=4)


def simulate_all(presets: list[str], steps: int, batches: tuple[int, ...] = BATCHES) -> pd.DataFrame:
    cluster = CLUSTERS["h100"]
    points = [(p, b, n, c) for p in presets for b in batches for n in WORLD_SIZES for c in CONFIGS]
    rows = []
    for preset, batch, n, name in progress(points, "simulating", "point"):
        trainer, sets = CONFIGS[name]
        w = scaled_workload(workload_of(preset, steps), n, "weak", batch)
        run = RunConfig(workload=w, trainer=trainer, world_size=n,
                        trainer_options=trainer_options(trainer, sets))
        s, steps_ = simulate_run(run, cluster, store=HERE / "runs")  # h100: no calibration read
        # The step alone: without the waits for an input stage that outlasts it (the
        # techniques' own effect; the input stage is this implementation's, timed here).
        m = pd.DataFrame(steps_)
        m = m[m["step"] >= w.warmup]
        stall = (n * m["plan_stall_ms"]).sum()
        alone_s = (m["step_time_ms"] - m["plan_stall_ms"]).sum() / 1e3
        rows.append({"preset": preset, "batch_per_rank": batch, "gpus": n, "config": name,
                     "transport": sets.get("transport", ""),
                     "bubble": s["bubble_ratio"], "straggler": s["straggler_bubble_ratio"],
                     "exposed_comm": s["exposed_comm_ratio"], "other_idle": s["other_idle_ratio"],
                     "samples_per_s": s["samples_per_s"],
                     "bound": s["whole_sample_bound_bubble"],
                     "plan_ms": s["plan_ms_per_step"], "route_ms": s["route_ms_per_step"],
                     "route_extrapolated": s["route_extrapolated"], "step_ms": s["step_time_ms_median"],
                     "step_alone_ms": float((m["step_time_ms"] - m["plan_stall_ms"]).median()),
                     "bubble_step_alone": float((m["idle_ms"].sum() - stall) / (m["capacity_ms"].sum() - stall)),
                     "samples_per_s_step_alone": float(m["num_samples"].sum() / alone_s),
                     "exposed_parts": exposed_parts(m)})
    return with_reductions(pd.DataFrame(rows))


def with_reductions(df: pd.DataFrame) -> pd.DataFrame:
    """Reductions against ddp and the sharded baseline at the same point, and scaling
    efficiency against 8 GPUs: as implemented, and for the step alone (`_alone`)."""
    key = ["preset", "batch_per_rank", "gpus"]
    point = df.set_index(key).index
    config = df.set_index(["preset", "batch_per_rank", "config"]).index
    for suffix, bubble, speed in (("", "bubble", "samples_per_s"),
                                  ("_alone", "bubble_step_alone", "samples_per_s_step_alone")):
        if bubble not in df:  # a CSV written before the input stage was timed
            continue
        ddp = df[df["config"] == "ddp"].set_index(key)[bubble]
        sharded = df[df["config"] == "sharded baseline"].set_index(key)[bubble]
        df["reduction" + suffix] = 1 - df[bubble] / point.map(ddp).to_numpy()
        df["reduction_vs_sharded" + suffix] = 1 - df[bubble] / point.map(sharded).to_numpy()
        base = df[df["gpus"] == WORLD_SIZES[0]].set_index(["preset", "batch_per_rank", "config"])
        per_gpu8 = base[speed] / WORLD_SIZES[0]
        df["scaling_eff" + suffix] = (df[speed] / df["gpus"]) / config.map(per_gpu8).to_numpy()
    return df


def markdown(df: pd.DataFrame, sens: pd.DataFrame | None, steps: int, sha: str,
             before: tuple[pd.DataFrame, str] | None = None) -> str:
    timed = "bubble_step_alone" in df  # a CSV from before the input stage was timed: as it was
    alone = "_alone" if timed else ""
    fs = df[df["config"] == "freescale"]
    at256 = fs[fs["gpus"] == 256]
    lines = [
        "# Scaling to 1024 GPUs: SIMULATED (not measured)\n",
        f"Every number below comes from `fsbench.scaling.simulate` on cluster preset `h100`: "
        f"{CLUSTERS['h100'].description}. Weak scaling, {steps} steps (4 warm-up) of each "
        f"preset's real-shaped sampled batches, seed 0. Commit `{sha}`. Command: "
        "`python scripts/paper_table.py`.\n",
        "The figures of `h100` the numbers rest on: its collectives MEASURED (fitted on "
        "published nccl-tests results of H100 clusters: results/cluster_h100_nccl_tests.md), "
        f"the rest ASSUMED: {assumptions(CLUSTERS['h100'])}. How far the headline moves when "
        "each assumed figure is halved or doubled is in the last section.\n",
        "The step is FreeScale's as built (fsbench.scaling.simulate): each chunk of the "
        "embedding exchange is an all-to-all of its own; the forward runs sub-batch by sub-batch, "
        "each after its own chunk (the rows it is the first to read), the backward likewise, the last "
        "sub-batch first: each gradient chunk's all-to-all leaves as its sub-batch's backward makes it, "
        "but chunk 0's (the shared negatives), which follows DDP's last bucket; with priority, the next step's final rows fly during the backward "
        "and its fresh rows after the update; the requests of later steps travel in one control "
        "all-to-all a step, read at the next step's start (the step's one host sync, booked); and "
        "beyond one node FreeScale in full may move every row in two hops (`a2a=auto`: its chunk rule's "
        "replay chooses flat or two hops with the count, the route in each summary's "
        "`exchange_chunks_why`; freescale_impl.rail_transport): to the node-mate on the destination's rail on copy engines "
        "(no host sync: each receiver's slot is at a known place), then one all-to-all along the "
        "rail, one GPU a node, over NCCL with its CTAs capped, their SMs booked: M - 1 + G - 1 peers "
        "a rank where a flat all-to-all has N - 1, the same bytes across nodes (`overlap + SM-free` "
        "alone splits each exchange by node instead: the node's rows on copy engines, the other "
        "nodes' in one capped all-to-all). Every configuration all-reduces "
        f"its dense gradients in buckets of {get_workload('medium').dense_bucket_mb:g} MiB "
        "(`dense_bucket_mb`, one default for every trainer; DDP's own is 25), each an NCCL call "
        "with its own latency: the last bucket is made as the backward ends and is exposed "
        "(docs/simulation.md, \"Dense buckets\"). Every bubble of a technique has its throughput against the sharded baseline "
        "beside it (`1.31x`): SM contention counts as busy time, so a technique that removes "
        "it can read a larger bubble while it is faster.\n",
        "Configurations: the `sharded baseline` (TorchRec-like: sharded tables, a contiguous "
        "split, a blocking all-to-all on SMs), the baseline people run at this scale, which "
        "the headline compares FreeScale with first; `ddp` (replicated tables, all-reduced), "
        "second: its bubble is mostly the exposed all-reduce of its replicated tables' "
        "gradients across nodes, so a reduction against it credits sharding as much as "
        "FreeScale. Each technique alone on top of the sharded baseline: the balanced plan; "
        "the overlapped all-to-all; the prioritized overlapped all-to-all; the SM-free "
        "transport with the overlap it needs (`overlap + SM-free` against `overlap alone` is "
        "SM-free's own effect: a blocking exchange slows no compute); the two-hop all-to-all "
        "(`a2a=hierarchical` at every size, blocking, on SMs). FreeScale in full (all three, the "
        "exchange's route chosen) and with a look-ahead window of 4. Presets: `medium` (MovieLens-1M lengths) "
        "and `large` (KuaiRand-1K lengths), long histories where stragglers exist, and "
        "`medium-short` (`medium` with Amazon-Beauty lengths), short histories where "
        "communication dominates. `reduction`: 1 - bubble / the other's bubble at the same "
        "point; per world size, `change vs sharded` is minus the reduction against the sharded "
        "baseline (+: a larger bubble). `scaling eff`: throughput per GPU against the same "
        "configuration at 8 GPUs. `bound`: no split of whole samples has a smaller straggler "
        "bubble; **bold** where FreeScale's straggler bubble is within 10% of it.\n",
    ]
    if timed:
        lines.append(
            "**As implemented** and **the step alone.** The sharded baseline is TorchRec's "
            "profile: ids routed on the GPUs in its pipeline's previous-step slot (a split "
            "all-to-all of lengths and ids, booked at the links' cost, hidden under compute), "
            "nothing routed on the host. Every other configuration but ddp is this repository's "
            "FreeScale trainer with switches set, so each has FreeScale's input stage: the "
            "balanced plan (where balancing is on) and its routing, exchanged from 2 ranks on "
            "(each rank's loader worker builds its own request; the step exchanges counts, ids "
            "and fresh masks, pipelined over the steps before, booked at the links' cost). The "
            "simulator times the stage at each point's size on this machine's CPU (one thread of "
            "the 2-core VM; beyond four million tokens on the line through two smaller global "
            "batches), spreads the loader worker's part over `input_workers` workers at "
            "`host_cpu_speed` (both assumed), and books what outlasts the step as input stall: "
            "`as implemented`. `step alone` leaves the input stage out (`fsbench simulate "
            "--planner-time off`): what each technique does to the step.\n")
    if before is not None:
        lines += before_after_section(df, *before)
    lines += [f"## At 256 GPUs, beside the paper's {PAPER_REDUCTION_256}%\n"]
    at = df[df["gpus"] == 256].set_index(["config", "preset", "batch_per_rank"])
    if timed:
        lines += ["| preset | batch/rank | freescale loader stage ms (plan + route, one worker) | freescale step "
                  "alone ms | as implemented: sharded bubble | freescale bubble | reduction vs "
                  "sharded | ddp bubble | reduction vs ddp | step alone: sharded bubble | freescale "
                  "bubble | reduction vs sharded | reduction vs ddp | window=4 vs sharded |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for _, r in at256.iterrows():
            k = (r["preset"], r["batch_per_rank"])
            lines.append(
                f"| {k[0]} | {k[1]} | {r['plan_ms'] + r['route_ms']:.1f} | {r['step_alone_ms']:.2f} | "
                f"{100 * at.loc[('sharded baseline', *k), 'bubble']:.1f}% | {100 * r['bubble']:.1f}% | "
                f"{100 * r['reduction_vs_sharded']:.1f}% | {100 * at.loc[('ddp', *k), 'bubble']:.1f}% | "
                f"{100 * r['reduction']:.1f}% | "
                f"{100 * at.loc[('sharded baseline', *k), 'bubble_step_alone']:.1f}% | "
                f"{100 * r['bubble_step_alone']:.1f}% | {100 * r['reduction_vs_sharded_alone']:.1f}% | "
                f"{100 * r['reduction_alone']:.1f}% | "
                f"{100 * at.loc[('freescale window=4', *k), 'reduction_vs_sharded_alone']:.1f}% |")
    else:
        lines += ["| preset | batch/rank | sharded baseline bubble | freescale bubble | "
                  "reduction vs sharded baseline | ddp bubble | reduction vs ddp | window=4 vs sharded |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for _, r in at256.iterrows():
            k = (r["preset"], r["batch_per_rank"])
            lines.append(f"| {k[0]} | {k[1]} | {100 * at.loc[('sharded baseline', *k), 'bubble']:.1f}% | "
                         f"{100 * r['bubble']:.1f}% | {100 * r['reduction_vs_sharded']:.1f}% | "
                         f"{100 * at.loc[('ddp', *k), 'bubble']:.1f}% | {100 * r['reduction']:.1f}% | "
                         f"{100 * at.loc[('freescale window=4', *k), 'reduction_vs_sharded']:.1f}% |")
    lines.append("")
    label = " (step alone)" if timed else ""
    for (preset, batch), g in df.groupby(["preset", "batch_per_rank"], sort=False):
        lines += [f"## {preset}, {batch} samples per GPU\n",
                  "| config | " + " | ".join(str(n) for n in WORLD_SIZES) + " |",
                  "|---|" + "--:|" * len(WORLD_SIZES)]
        speed = "samples_per_s_step_alone" if timed else "samples_per_s"
        base_speed = g[g["config"] == "sharded baseline"].set_index("gpus")[speed]
        for name in CONFIGS:
            c = g[g["config"] == name].set_index("gpus")
            cells = []
            for n in WORLD_SIZES:
                if n not in c.index:
                    cells.append("n/a")  # not simulated there
                    continue
                r = c.loc[n]
                cell = f"{100 * r['bubble' + ('_step' + alone if timed else '')]:.1f}%"
                if name != "sharded baseline":  # a bubble larger than the baseline's: +
                    cell += f" ({-100 * r['reduction_vs_sharded' + alone]:+.0f}%)"
                    # throughput beside the bubble: SM contention is booked as busy time, so a
                    # technique that removes it can read a larger bubble while it is faster
                    cell += f" {r[speed] / base_speed[n]:.2f}x"
                cells.append(cell)
            lines.append(f"| {name}{label}: bubble (change vs sharded) throughput vs sharded | "
                         + " | ".join(cells) + " |")
        for name in ("sharded baseline", "ddp", "freescale", "freescale window=4"):
            c = g[g["config"] == name].set_index("gpus")
            lines.append(f"| {name}{label}: samples/s | " + " | ".join(
                f"{c.loc[n, speed]:,.0f}" for n in WORLD_SIZES) + " |")
            lines.append(f"| {name}{label}: scaling eff | " + " | ".join(
                f"{100 * c.loc[n, 'scaling_eff' + alone]:.0f}%" for n in WORLD_SIZES) + " |")
        c = g[g["config"] == "freescale"].set_index("gpus")
        cells = []
        for n in WORLD_SIZES:
            b, s = c.loc[n, "bound"], c.loc[n, "straggler"]
            cell = f"{100 * b:.1f}% / {100 * s:.1f}%"
            cells.append(f"**{cell}**" if s <= 1.1 * b + 1e-4 else cell)
        lines.append("| bound / freescale straggler | " + " | ".join(cells) + " |")
        if timed:
            lines.append("| freescale: loader stage ms (plan + route, one worker) / step alone ms | " + " | ".join(
                f"{c.loc[n, 'plan_ms'] + c.loc[n, 'route_ms']:.1f} / {c.loc[n, 'step_alone_ms']:.2f}"
                + ("*" if c.loc[n, "route_extrapolated"] else "") for n in WORLD_SIZES) + " |")
            for name in ("sharded baseline", "ddp", "freescale"):
                c = g[g["config"] == name].set_index("gpus")
                lines.append(f"| {name} as implemented: bubble | " + " | ".join(
                    f"{100 * c.loc[n, 'bubble']:.1f}%" for n in WORLD_SIZES) + " |")
        lines.append("")
    if timed:
        lines += ["`*`: the routing followed on the line through two smaller global batches "
                  "(beyond four million tokens).\n"]
        lines += stage_limits_section(df)
        lines += limits_section(df)
    else:
        lines += planner_section(df)
    if sens is not None:
        lines += sensitivity_section(sens)
    return "\n".join(lines) + "\n"


WHY_IT_MOVED = (
    "Why it moved (against the table of `d40647f`): FreeScale in full may move its rows in two "
    "hops beyond one node (`freescale.a2a=auto`: the chunk rule's replay chooses flat or two hops "
    "with the count; freescale_impl.rail_transport): to the node-mate on the destination's rail "
    "over NVLink, then one all-to-all among one GPU a node. "
    "An all-to-all pays each peer (`a2a_peer_s`, fitted on nccl-tests all-to-all logs of 2 to 80 "
    "ranks, 10 nodes of one GPU among them, a rail's layout; scaled down with the message "
    "below 32 MiB as the model assumes), so at 256 GPUs an "
    "exchange pays 31 + 7 peers instead of 255; the bytes across nodes are the same, and the two "
    "hops follow each other, so at a few nodes, and for large messages, flat is faster and is "
    "chosen (`two-hop a2a alone`, forced at every size, shows where each wins). Nothing "
    "else moved: the sharded baseline and every technique alone run as before, and `two-hop a2a "
    "alone` is new. The input stage's plan and routing ran on one pinned core with one torch "
    "thread (`OMP_NUM_THREADS=1 taskset -c 1`), as before.\n")
"""The last regeneration's reason, rendered under the before/after table: rewrite it with
each regeneration that gives --before."""


def before_after_section(df: pd.DataFrame, before: pd.DataFrame, commit: str) -> list[str]:
    """The headline cells at 256 GPUs (the step alone) against those of an earlier table's
    CSV, and why they moved."""
    old = with_reductions(before)
    key = ["config", "preset", "batch_per_rank"]
    a, b = old[old["gpus"] == 256].set_index(key), df[df["gpus"] == 256].set_index(key)
    h = CLUSTERS["h100"]
    lines = [f"## The headline before and after (256 GPUs, the step alone; before: `{commit}`)\n",
             WHY_IT_MOVED,
             "| preset | batch/rank | sharded bubble | freescale bubble | reduction vs sharded | "
             "ddp bubble | reduction vs ddp |", "|---|--:|--:|--:|--:|--:|--:|"]

    def cell(frame, config, k, col):
        return frame.loc[(config, *k), col]

    for preset, batch in b.loc["freescale"].index:
        k = (preset, batch)
        if ("freescale", *k) not in a.index:
            continue
        pairs = [("sharded baseline", "bubble_step_alone"), ("freescale", "bubble_step_alone"),
                 ("freescale", "reduction_vs_sharded_alone"), ("ddp", "bubble_step_alone"),
                 ("freescale", "reduction_alone")]
        lines.append(f"| {preset} | {batch} | " + " | ".join(
            f"{100 * cell(a, c, k, col):.1f}% -> {100 * cell(b, c, k, col):.1f}%" for c, col in pairs) + " |")
    return lines + [""]


def stage_limits_section(df: pd.DataFrame, points: float = 2.0) -> list[str]:
    """Where `as implemented` is more than `points` above `step alone`: the input stage
    outlasts the step there, and what it spends (plan, route) against the step."""
    gap = 100 * (df["bubble"] - df["bubble_step_alone"])
    slow = df[gap > points].assign(gap=gap[gap > points]).sort_values(["preset", "batch_per_rank", "gpus", "config"])
    lines = ["## Where the input stage sets the pace\n"]
    if slow.empty:
        return lines + [f"Nowhere: `as implemented` is within {points:g} points of `step alone` at every point.\n"]
    sizes = sorted(set(zip(slow["gpus"], slow["batch_per_rank"])))
    lines += [f"`as implemented` is within {points:g} points of `step alone` everywhere but these "
              f"{len(slow)} points ({', '.join(f'{n} GPUs x {b}' for n, b in sizes)} samples a GPU). "
              "What limits them: where balancing is on, the plan, the partitioner over the whole "
              "global batch's lengths (O(global samples): 524,288 samples at 1,024 x 512), against "
              "steps of a few milliseconds; with `input_workers` loader workers (assumed 4) the "
              "stage keeps up while (plan + route) / 4 stays under the step. Where it is off "
              "(`overlap + SM-free`, `prioritized a2a alone` on `medium` at 1,024 x 512), the rank "
              "thread's exchange preparation, which is not in these columns and was followed on a "
              "line from global batches 22 times smaller: rerun alone at `87262dd` (`fsbench "
              "simulate --workload medium --trainers freescale --world-sizes 1024 --set "
              "batch_per_rank=512 --set steps=12 --set warmup=4 --set freescale.balance=off --set "
              "freescale.transport=sm_free --set freescale.priority=off`), `overlap + SM-free` "
              "there read 3.3 ms of preparation (`exchange_prep_ms_per_step`) against its 8.2 ms "
              "step and no stall, so that line was noisy on this shared machine.\n",
              "| preset | batch/rank | GPUs | config | plan ms | route ms | step alone ms | as implemented - step alone |",
              "|---|--:|--:|---|--:|--:|--:|--:|"]
    for _, r in slow.iterrows():
        lines.append(f"| {r['preset']} | {r['batch_per_rank']} | {r['gpus']} | {r['config']} | "
                     f"{r['plan_ms']:.1f} | {r['route_ms']:.1f} | {r['step_alone_ms']:.2f} | {r['gap']:.1f} pts |")
    return lines + [""]


def planner_section(df: pd.DataFrame) -> list[str]:
    """(CSVs from before the routing was timed.) The points where FreeScale's planning
    takes at least half its step: there it is input stall, or close to it."""
    if "plan_ms" not in df:  # a CSV written before the planner was timed
        return []
    fs = df[df["config"].str.startswith(("freescale", "balance")) & (df["plan_ms"] >= 0.5 * df["step_ms"])]
    lines = ["## Where the planner sets the pace\n",
             "The balanced plan is computed by each rank's input stage ahead of its step; the "
             "simulator times it at each point's size on this machine's CPU and books it as "
             "input stall where it outlasts the step.\n",
             "| preset | batch/rank | GPUs | config | planning ms/step | step ms | bubble |",
             "|---|--:|--:|---|--:|--:|--:|"]
    for _, r in fs.sort_values(["preset", "batch_per_rank", "gpus"]).iterrows():
        lines.append(f"| {r['preset']} | {r['batch_per_rank']} | {r['gpus']} | {r['config']} | "
                     f"{r['plan_ms']:.2f} | {r['step_ms']:.2f} | {100 * r['bubble']:.1f}% |")
    return lines + [""]


SENSITIVITY_POINT = ("medium", 128, 256)  # preset, samples per GPU, GPUs


def sensitivity_rows() -> pd.DataFrame:
    """FreeScale's reduction against the sharded baseline with each assumed figure of
    `h100` at half and twice its value (fsbench.scaling.sensitivity), at one point."""
    preset, batch, n = SENSITIVITY_POINT
    runs = [(CONFIGS[name][0], trainer_options(*CONFIGS[name])) for name in ("sharded baseline", "freescale")]
    # As implemented: the input stage is timed once, at x1, and charged alike at every
    # variant, so input_workers and host_cpu_speed show what they do to it.
    rows = sensitivity(CLUSTERS["h100"], workload_of(preset, 12), runs, [n], batch, HERE / "runs",
                       progress=lambda it: progress(it, "sensitivity", "point"), planner_time=True)
    return pd.DataFrame(rows)


def sensitivity_section(sens: pd.DataFrame) -> list[str]:
    preset, batch, n = SENSITIVITY_POINT
    lines = [f"## Sensitivity: the headline against each assumed figure ({preset}, {batch} per GPU, "
             f"{n} GPUs)\n",
             "FreeScale's bubble reduction against the sharded baseline with one figure of `h100` "
             "halved, as assumed, and doubled, the rest held, as implemented (the input stage timed "
             "once, at x1, and charged alike: `input_workers` and `host_cpu_speed` set how it keeps "
             "up; `fsbench simulate --sensitivity` computes the same for any two configurations). "
             "`swing`: the largest minus the smallest of the three.\n",
             "| figure | assumed value | x0.5 | x1 | x2 | swing |", "|---|--:|--:|--:|--:|--:|"]
    for _, r in sens.iterrows():
        unit = r["unit"] if isinstance(r["unit"], str) else ""  # empty: NaN from a CSV
        lines.append(f"| {r['figure']} | {r['value']:g} {unit} | {100 * r['reduction_x0.5']:.1f}% | "
                     f"{100 * r['reduction_x1']:.1f}% | {100 * r['reduction_x2']:.1f}% | "
                     f"{100 * r['swing']:.1f} pts |")
    return lines + [""]


def plot(df: pd.DataFrame, path: Path) -> None:
    presets = list(dict.fromkeys(df["preset"]))
    batches = sorted(set(df["batch_per_rank"]))
    fig, axes = plt.subplots(len(presets), len(batches), figsize=(4.2 * len(batches), 3.4 * len(presets)),
                             squeeze=False, sharex=True)
    for i, preset in enumerate(presets):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            g = df[(df["preset"] == preset) & (df["batch_per_rank"] == batch)]
            alone = "bubble_step_alone" if "bubble_step_alone" in g else "bubble"
            for name in CONFIGS:
                c = g[g["config"] == name].sort_values("gpus")
                ax.plot(c["gpus"], 100 * c[alone], "--o", mfc="none",
                        label=name + (" (step alone)" if alone != "bubble" else ""))
            if alone != "bubble":  # FreeScale with its input stage, as implemented
                c = g[g["config"] == "freescale"].sort_values("gpus")
                ax.plot(c["gpus"], 100 * c["bubble"], ":x", color="black", label="freescale as implemented")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{preset}, {batch}/GPU", fontsize=9)
            ax.set_ylabel("bubble % (SIMULATED)" if j == 0 else "")
            ax.set_xlabel("GPUs (h100 preset)" if i == len(presets) - 1 else "")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("SIMULATED bubble ratio against world size (hollow markers, dashed: not measured)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    help="samples per GPU (weak scaling), comma-separated")
    ap.add_argument("--out", default="results/scaling_simulated_h100")
    ap.add_argument("--from-csv", action="store_true",
                    help="re-render OUT.md and OUT.png from OUT.csv (no simulation); "
                         "give --steps and --commit of the run that wrote it")
    ap.add_argument("--commit", help="commit the CSV was simulated at; default: HEAD")
    ap.add_argument("--before", metavar="SHA",
                    help="add a section with the headline before and after: OUT.csv at that commit")
    args = ap.parse_args()
    out = Path(args.out)
    sha = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, cwd=HERE).stdout.strip()
    sens_csv = out.with_name(out.name + "_sensitivity.csv")
    if args.from_csv:
        df = with_reductions(pd.read_csv(out.with_suffix(".csv")))
        sens = pd.read_csv(sens_csv) if sens_csv.exists() else None
    else:
        df = simulate_all(args.presets.split(","), args.steps, tuple(int(b) for b in args.batches.split(",")))
        df.to_csv(out.with_suffix(".csv"), index=False)
        sens = sensitivity_rows()
        sens.to_csv(sens_csv, index=False)
    before = None
    if args.before:
        import io

        old = subprocess.run(["git", "show", f"{args.before}:{out.with_suffix('.csv')}"], capture_output=True,
                             text=True, cwd=HERE, check=True).stdout
        before = (pd.read_csv(io.StringIO(old)), args.before)
    out.with_suffix(".md").write_text(markdown(df, sens, args.steps, sha, before))
    plot(df, out.with_suffix(".png"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
