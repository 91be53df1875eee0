"""A published HSTU training step, predicted: NVIDIA recsys-examples' end-to-end benchmark
(2 nodes of 8 H100; workload preset `hstu-e2e`) against `fsbench simulate` on the `h100`
preset (collectives fitted on published nccl-tests results), SIMULATED.

Their MFU is the input (the encoder's share of peak, `--cluster-set mfu=`); what the
simulator predicts is the rest:
  shuffler   their workload-balanced shuffler against the unbalanced baseline, Triton
             attention: MFU 7.65% -> 11.70% (1.53x). Here FreeScale's balanced plan against
             a contiguous split, both exchanging rows the blocking way (their embeddings
             are model-parallel, looked up before the encoder), at the shuffler's MFU.
  CUTLASS    a fixed 2,048-item history (4,099 tokens) with CUTLASS kernels: a 187 ms step
             at 34.54% MFU, exposed NCCL 1.58% and GPU idle 3.34% of the window.
Published figures: github.com/NVIDIA/recsys-examples, examples/hstu/training/benchmark/
E2E_BENCHMARK.md and PERF_ANALYSIS.md (commit a84ae58).

    python scripts/hstu_e2e.py [--steps 8] [--out results/hstu_e2e_h100.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
from pathlib import Path

from fsbench.config import RunConfig
from fsbench.scaling.sim_costs import encoder_flops
from fsbench.scaling.sim_inputs import assumptions, load_cluster
from fsbench.scaling.simulate import simulate_run
from fsbench.training.trainer import trainer_options
from fsbench.workloads.distributions import parse_length_spec
from fsbench.workloads.generator import step_rng
from fsbench.workloads.presets import get_workload

GPUS = 16
BLOCKING = {"tables": "sharded", "overlap": "off", "priority": "off"}
PUBLISHED = {"speedup": 11.70 / 7.65, "step_ms": 187.0, "mfu": 0.3454, "exposed_nccl": 0.0158, "gpu_idle": 0.0334}


def simulate(workload, mfu: float, balance: str) -> dict:
    cluster = load_cluster("h100", [f"mfu={mfu}"])
    run = RunConfig(workload=workload, trainer="freescale", world_size=GPUS,
                    trainer_options=trainer_options("freescale", {**BLOCKING, "balance": balance}))
    summary, _ = simulate_run(run, cluster, ".", planner_time=False)
    # MFU as they count it: the model's FLOPs over the step's time at peak, every GPU.
    dist = parse_length_spec(workload.lengths)
    flops = sum(encoder_flops(workload, dist.sample(step_rng(run.seed, k), workload.global_batch_size,
                                                    workload.max_seq_len)).sum()
                for k in range(workload.warmup, workload.steps)) / (workload.steps - workload.warmup)
    summary["mfu"] = flops / (summary["step_time_ms_mean"] / 1e3 * cluster.peak_tflops * 1e12 * GPUS)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="measured steps a point (after 2 warm-up)")
    ap.add_argument("--out", default="results/hstu_e2e_h100.md")
    args = ap.parse_args()
    w = dataclasses.replace(get_workload("hstu-e2e"), steps=args.steps + 2, warmup=2)
    triton = 11.70 / 100
    base, shuffled = simulate(w, triton, "off"), simulate(w, triton, "on")
    fixed = simulate(dataclasses.replace(w, lengths="fixed:4099"), PUBLISHED["mfu"], "off")
    speedup = shuffled["samples_per_s"] / base["samples_per_s"]
    idle = fixed["bubble_ratio"] - fixed["exposed_comm_ratio"]
    rows = [
        ("shuffler speedup (Triton)", f"{PUBLISHED['speedup']:.2f}x", f"{speedup:.2f}x",
         speedup / PUBLISHED["speedup"]),
        ("  unbalanced: MFU", "7.65%", f"{100 * base['mfu']:.2f}%", None),
        ("  balanced: MFU", "11.70%", f"{100 * shuffled['mfu']:.2f}%", None),
        ("  unbalanced: straggler bubble", "", f"{100 * base['straggler_bubble_ratio']:.1f}%", None),
        ("  balanced: straggler bubble", "", f"{100 * shuffled['straggler_bubble_ratio']:.1f}%", None),
        ("CUTLASS step, S = 2,048", f"{PUBLISHED['step_ms']:.0f} ms", f"{fixed['step_time_ms_mean']:.1f} ms",
         fixed["step_time_ms_mean"] / PUBLISHED["step_ms"]),
        ("  MFU (ours counted)", "34.54%", f"{100 * fixed['mfu']:.2f}%", None),
        ("  exposed NCCL, of the window", "1.58%", f"{100 * fixed['exposed_comm_ratio']:.2f}%", None),
        ("  GPU idle, of the window", "3.34%", f"{100 * idle:.2f}%", None),
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# A published HSTU training step, predicted (SIMULATED)", "",
        f"`python scripts/hstu_e2e.py --steps {args.steps}` at `{commit}`: workload `hstu-e2e` "
        f"(HSTU 1024 wide, 8 layers, 4 heads; tables of 50M rows of 128; 32 samples a GPU; "
        f"S Zipf(1.2) on [1, 4096], 2 S + 3 tokens), {GPUS} GPUs on cluster `h100`, "
        "FreeScale's trainer with blocking row exchange (`overlap=off`), balance off (their "
        "baseline) and on (their shuffler). Their MFU is the input: the encoder runs at "
        "11.70% of peak in the shuffler rows, 34.54% in the CUTLASS rows. Published: NVIDIA "
        "recsys-examples, examples/hstu/training/benchmark/E2E_BENCHMARK.md and "
        "PERF_ANALYSIS.md (a84ae58).", "",
        "| figure | published | predicted | predicted / published |", "|---|--:|--:|--:|"]
    for name, pub, pred, ratio in rows:
        lines.append(f"| {name} | {pub} | {pred} | {'' if ratio is None else f'{ratio:.2f}'} |")
    implied = PUBLISHED["mfu"] * load_cluster("h100").peak_tflops * 1e12 * PUBLISHED["step_ms"] / 1e3
    ours = fixed["mfu"] * load_cluster("h100").peak_tflops * 1e12 * fixed["step_time_ms_mean"] / 1e3
    lines += [
        "", "## Where the prediction misses, and which part", "",
        f"- **Step time** ({fixed['step_time_ms_mean']:.0f} ms against 187): within 20%. With their "
        f"MFU as the input the step is set by the FLOPs counted: theirs imply {implied / 1e12:.1f} "
        f"TFLOP a GPU and step, `encoder_flops` counts {ours / 1e12:.1f} (the ranking heads, "
        "the embedding MLPs and the attention's bias terms are not counted here).",
        f"- **Shuffler speedup** ({speedup:.2f}x against 1.53x): within 20%. Here it is straggler "
        "removal alone, planned with whole samples on FLOPs over the global batch; their "
        "shuffler also keeps 32 samples on every GPU (ours may move counts), and every "
        "sample runs at one MFU here, whatever its length.",
        f"- **Exposed NCCL** ({100 * fixed['exposed_comm_ratio']:.2f}% against 1.58%): missed, "
        "about a third of theirs. The simulator sends each GPU's unique rows (deduplicated, "
        "fp32, 128 wide) and the dense gradients as DDP's buckets; their embedding exchange "
        "sends a row per token and feature (DynamicEmb's jagged all-to-all), and their "
        "breakdown counts NCCL kernels of the whole window (the optimizer's included).",
        f"- **GPU idle** ({100 * idle:.2f}% against 3.34%): missed. On a GPU preset the "
        "simulator books no host-side gaps: kernel launch gaps, Python between kernels, "
        "data loading and the optimizer's launches are not modelled (`layer_overhead_ms` "
        "is booked as compute). This part needs a measured GPU trace (the device check's "
        "profiled steps) to calibrate.",
        "", f"Cluster figures (mfu replaced per row, as above): {assumptions(load_cluster('h100'))}", ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
