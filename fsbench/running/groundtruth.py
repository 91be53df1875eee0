"""Ground-truth validation: run synthetic workloads whose every metric is known in closed
form, and compare what the harness measures with it (`fsbench validate`).

Each case runs the DDP baseline with `compute=synthetic` (fsbench.models.synthetic): a
per-token CPU cost, optionally one slower rank, a delayed gradient collective, a slow
input source and a sleep in the optimizer step with no collective in flight. The closed
form treats the harness itself as free; on a 2-core VM with gloo it is not, and all of it
is bubble by definition: the start barrier releases ranks up to ~1.5 ms apart, the
(one-element) all-reduce with its wake-ups costs 1-2 ms, the inline input stage ~1 ms,
and the ranks' compute threads wait ~1-1.5% of the time for a CPU that the run's own
threads (monitor, gloo) took. Steps of ~530 ms keep the fixed parts under
1%; measured worst bubble error 0.02-0.03 on a quiet VM (results/measurement_cpu.md).

Cases run with `input_workers=0` (each rank prepares its input inline, at the step's
pull): on the 2-core VM a loader process per rank competes with the two spinning ranks
for the cores (~1.7% run-queue wait, counted as other idle), which the closed form does
not model; inline, the input stage is exactly the (sleeping) input delay plus ~0.3 ms.

A run is evidence in proportion to how quiet the machine was: each case reports its
`cpu_wait_ratio` (mean over ranks) and `cpu_wait_max_rank_ratio`. Time a rank waits for
a CPU is idle time the closed form does not know (it lands in other idle), and the
measured bubble error tracks it one for one: 0.011-0.029 at 0.6-1.4% CPU wait, 0.033 at
3.5% (a neighbour compiling). Hence each row's `budget` (`error_budget`):
- load imbalance is busy time (thread CPU time), which waiting does not change: always
  `TOLERANCE`;
- a wall-clock ratio on a quiet run (mean wait <= `TRUTH_MAX_CPU_WAIT`): `TOLERANCE`;
- on a louder run: `TOLERANCE` plus the slowest-waiting rank's wait, the most a wait can
  move a ratio (it adds to that rank's idle time and, when it makes the step later, to the
  others' wait for it), so the budget says what it absorbed rather than hiding it;
- on a contended run (mean wait > `metrics.CONTENDED_CPU_WAIT`): not judged (`budget`
  NaN, `judged` False): the truth is then mostly about the neighbour.
Callers retry a loud run first and report which budget they judged with.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from fsbench.config import RunConfig, SyntheticComputeConfig, WorkloadConfig
from fsbench.measurement.metrics import CONTENDED_CPU_WAIT, rank_step_table
from fsbench.models.synthetic import expected_ratios
from fsbench.measurement.timeline import read_timelines
from fsbench.workloads import contiguous_split, make_batch_source
from fsbench.workloads.presets import tiny

RATIOS = ("bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio",
          "other_idle_ratio", "load_imbalance")
TOLERANCE = 0.03
TRUTH_MAX_CPU_WAIT = 0.02  # above it, CPU wait alone can use up most of the tolerance
BUSY_TIME_RATIOS = ("load_imbalance",)  # from thread CPU time: waiting does not move them
# At one rank these compare 0 with 0 whatever the harness does (no other rank to be
# slower than): rows of them are "not checked", never passes.
ONE_RANK_NOT_CHECKED = ("straggler_bubble_ratio", "load_imbalance")


def error_budget(metric: str, cpu_wait: float, cpu_wait_max_rank: float) -> float | None:
    """The largest abs error a correct harness can show for `metric` on a run whose ranks
    waited `cpu_wait` (mean) and `cpu_wait_max_rank` (the most-waiting rank) of their step
    time for a CPU; None when the run is too contended to judge (module docstring)."""
    if metric in BUSY_TIME_RATIOS or cpu_wait <= TRUTH_MAX_CPU_WAIT:
        return TOLERANCE
    if cpu_wait > CONTENDED_CPU_WAIT:
        return None
    return TOLERANCE + cpu_wait_max_rank


def synthetic_workload(lengths: str = "fixed:8", batch: int = 8, **synthetic) -> WorkloadConfig:
    return dataclasses.replace(
        tiny(), compute="synthetic", lengths=lengths, global_batch_size=batch, steps=8,
        warmup=2, synthetic=SyntheticComputeConfig(us_per_token=16000.0, **synthetic))


# name -> workload; with fixed lengths every step has the same expected ratios.
CASES: dict[str, WorkloadConfig] = {
    "balanced": synthetic_workload(),
    "rank1_computes_50pct_more": synthetic_workload(slow_rank=1, slow_factor=0.5),
    "contiguous_split_of_7_samples": synthetic_workload(batch=7),
    "collective_delayed_120ms": synthetic_workload(comm_delay_ms=120.0),
    "rank0_30pct_more_and_delayed_80ms": synthetic_workload(slow_rank=0, slow_factor=0.3,
                                                            comm_delay_ms=80.0),
    "input_delayed_60ms": synthetic_workload(input_delay_ms=60.0),
    # Blocked with no collective in flight (a host sync, a file read): other idle, and
    # exposed communication stays ~0.
    "optimizer_sleeps_100ms": synthetic_workload(optimizer_sleep_ms=100.0),
}

# On one GPU (compute=synthetic is device time there: fsbench.models.synthetic): the cases
# that still differ at one rank, with a cheaper token (~128 ms of compute per step, where
# the CPU cases take ~530 ms to dwarf a 2-core VM's harness costs): every case runs in a
# few seconds, inside the device check's budget.
CUDA_US_PER_TOKEN = 2000.0
ONE_RANK_CASES = ("balanced", "collective_delayed_120ms", "rank0_30pct_more_and_delayed_80ms",
                  "input_delayed_60ms", "optimizer_sleeps_100ms")


def cuda_cases() -> dict[str, WorkloadConfig]:
    return {name: dataclasses.replace(CASES[name], synthetic=dataclasses.replace(
        CASES[name].synthetic, us_per_token=CUDA_US_PER_TOKEN)) for name in ONE_RANK_CASES}


def expected_for_step(workload: WorkloadConfig, world_size: int, step: int,
                      seed: int = 0) -> dict[str, float]:
    """Closed-form metrics of `step` under the baselines' contiguous split."""
    batch = make_batch_source(workload, seed).global_batch(step)
    shares = contiguous_split(batch.batch_size, world_size)
    return expected_ratios([int(batch.lengths[idx].sum()) for idx in shares], workload.synthetic)


def validate(out_dir: str | Path, world_size: int = 2,
             cases: dict[str, WorkloadConfig] = CASES, device: str = "cpu") -> pd.DataFrame:
    """Run every case; one row per (case, metric): measured, expected, abs error, the
    run's error budget, judged and ok (module docstring). device="cuda": one GPU per rank
    (`cuda_cases` at one rank on one GPU)."""
    from fsbench.running.runner import run_once

    rows = []
    for name, workload in cases.items():
        run_dir, summary = run_once(RunConfig(workload=workload, trainer="ddp", device=device,
                                              world_size=world_size, input_workers=0),
                                    out_dir, timeout_s=300)
        expected = expected_for_step(workload, world_size, workload.warmup)
        # run-queue wait and hypervisor steal: time the closed form assumes each rank had
        # its core for
        steal = summary["cpu_steal_ratio"]
        wait = summary["cpu_wait_ratio"] + steal
        wait_max_rank = max_rank_cpu_wait(read_timelines(run_dir)) + steal
        for key in RATIOS:
            rows.append({"case": name, **judge(key, summary[key], expected[key], world_size,
                                               wait, wait_max_rank),
                         "oversubscribed": summary["oversubscribed"],
                         "cpu_wait_ratio": wait, "cpu_wait_max_rank_ratio": wait_max_rank,
                         "contended": summary["contended"]})
    return pd.DataFrame(rows)


def judge(metric: str, measured: float, expected: float, world_size: int, cpu_wait: float,
          cpu_wait_max_rank: float) -> dict:
    """One row of `validate`: the error, its budget, whether it was judged and passed.
    `not_checked` says why a row is not evidence at all (ONE_RANK_NOT_CHECKED at one
    rank); such a row is neither judged nor ok (ok None), and no caller may count it."""
    err = abs(measured - expected)
    if world_size == 1 and metric in ONE_RANK_NOT_CHECKED:
        return {"metric": metric, "measured": measured, "expected": expected, "abs_error": err,
                "budget": float("nan"), "judged": False, "ok": None,
                "not_checked": "one rank: nothing to compare it with (0 against 0)"}
    budget = error_budget(metric, cpu_wait, cpu_wait_max_rank)
    return {"metric": metric, "measured": measured, "expected": expected, "abs_error": err,
            "budget": float("nan") if budget is None else budget, "judged": budget is not None,
            "ok": budget is not None and err <= budget, "not_checked": None}


def max_rank_cpu_wait(spans: pd.DataFrame) -> float:
    """The most-waiting rank's run-queue wait over its measured step time."""
    table = rank_step_table(spans)
    per_rank = table[~table["warmup"].astype(bool)].groupby("rank")[["runq_ns", "span_ns"]].sum()
    per_rank = per_rank[per_rank["span_ns"] > 0]
    return float((per_rank["runq_ns"] / per_rank["span_ns"]).max()) if len(per_rank) else 0.0


def cuda_selftest(work_dir: str | Path) -> "SelfTest":  # noqa: F821
    """The ground-truth cases on one GPU (`cuda_cases`, world size 1) as a device-check
    self-test (`judge_cuda_table`). NOT YET RUN ON A GPU."""
    table = validate(Path(work_dir) / "groundtruth", world_size=1, cases=cuda_cases(), device="cuda")
    return judge_cuda_table(table)


def judge_cuda_table(table: pd.DataFrame) -> "SelfTest":  # noqa: F821
    """The one-rank table as a self-test: every row that can differ at one rank judged and
    within its budget; the rows that cannot (ONE_RANK_NOT_CHECKED) named as not checked."""
    from fsbench.measurement.selftests import SelfTest

    checkable = table[table["not_checked"].isna()]
    judged = checkable[checkable["judged"]]
    worst = float(judged["abs_error"].max()) if len(judged) else None
    failed = checkable[~checkable["ok"].fillna(False).astype(bool)]
    detail = "; ".join(f"{r.case} {r.metric}: {r.measured:.4f} vs {r.expected:.4f}"
                       for r in failed.itertuples()) or "every checked ratio within its budget"
    skipped = sorted(set(table.loc[table["not_checked"].notna(), "metric"]))
    if skipped:
        detail += f"; not checked at one rank: {', '.join(skipped)}"
    return SelfTest("ground_truth_on_cuda", f"fsbench validate's cases {', '.join(ONE_RANK_CASES)} "
                    "at one rank, compute as device time", worst, 0.0, "abs error of a ratio",
                    f"every checked ratio within {TOLERANCE} of closed form (wider only where CPU "
                    "wait was measured)", bool(len(checkable) and len(judged) == len(checkable)
                                               and judged["ok"].astype(bool).all()), detail)
