"""One registry of reported columns: name, header with unit, format, and how it behaves.

Every place that shows or checks a metric derives from `COLUMNS`: the keys every run's
summary must carry (`SUMMARY_KEYS`), the terminal and report tables' headers and
formats (fsbench.table), which columns reports take the median of over repeats and which
depend on wall-clock time (fsbench.reporting.report), and the run/sweep table (`RUN_VIEW`). A new
metric is one entry here (plus the function in fsbench.measurement.metrics that computes it).
Ratios are stored as fractions and shown as percentages.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def _yes(v: object) -> str:
    return "yes" if v else "no"


def _or_text(v: object, spec: str) -> str:
    return v if isinstance(v, str) else format(v, spec)


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    header: str
    fmt: Callable[[object], str] = str
    summary: bool = False
    """A key of every measured run's summary.json."""
    median: bool = False
    """Reports combine repeats by their median (numeric metrics)."""
    wall_clock: bool = False
    """Depends on wall-clock T: marked in oversubscribed or contended rows."""
    flag: bool = False
    """A per-run boolean that marks a report row when any of its repeats has it."""
    missing: str = "n/a"
    """How a missing value (None, NaN) reads."""


COLUMNS: tuple[Column, ...] = (
    Column("workload", "workload", summary=True),
    Column("trainer", "trainer", summary=True),
    Column("world_size", "ranks", summary=True),
    Column("repeats", "repeats"),
    Column("steps", "steps", summary=True),
    Column("step_time_ms_median", "step ms", lambda v: f"{v:.1f}", True, True, True),
    Column("samples_per_s", "samples/s", lambda v: f"{v:.1f}", True, True, True),
    Column("samples_per_s_spread", "samples/s spread %", _pct),
    Column("tokens_per_s", "tokens/s", lambda v: f"{v:.0f}", True, True, True),
    Column("bubble_ratio", "bubble %", _pct, True, True, True),
    Column("straggler_bubble_ratio", "straggler %", _pct, True, True, True),
    Column("exposed_comm_ratio", "exposed comm %", _pct, True, True, True),
    Column("input_stall_ratio", "input stall %", _pct, True, True, True),
    Column("other_idle_ratio", "other idle %", _pct, True, True, True),
    # CUDA (None on CPU): the bubble with the timed steps' median time as denominator (the
    # profiled bubble's steps are stretched by the profiler), and the share of the
    # profiled steps spent in memory copies and sets (fsbench.measurement.profiled).
    Column("bubble_ratio_timed", "bubble % (timed steps)", _pct, summary=True),
    Column("memcpy_ratio", "memcpy %", _pct, summary=True),
    # Share of collectives' flight time hidden under compute (HTA's comm/compute overlap);
    # n/a for runs without flight records (recorded before trainers recorded them).
    Column("comm_overlap_ratio", "comm hidden %", _pct, True, True),
    Column("load_imbalance", "imbalance %", _pct, True, True),
    Column("cpu_wait_ratio", "cpu wait %", _pct, True, True),
    Column("input_worker_cpu_ratio", "loader cpu %", _pct, True, True),
    # The input stage's CPU per step (plan, routing, exchange preparation; the data's
    # reading left out): fsbench.measurement.run_summary.input_stage_cpu. None in runs
    # recorded before it was timed.
    Column("input_ms_per_step", "input ms/step", lambda v: f"{v:.2f}", True, True),
    Column("cpu_steal_ratio", "cpu steal %", _pct, True, True),
    Column("sm_occupancy", "SM occ %", _pct, True, True),
    # CUDA: device-to-host syncs per step (busiest rank), and those inside forward and
    # backward (fsbench.measurement.host_syncs); None on CPU.
    Column("host_syncs_per_step", "host syncs/step", lambda v: f"{v:.1f}", summary=True),
    Column("host_syncs_fwd_bwd_per_step", "syncs in fwd+bwd/step", lambda v: f"{v:.1f}", summary=True),
    # The largest rank's peak (process RSS on CPU, allocated tensors on CUDA).
    Column("peak_memory_mb", "peak MiB", lambda v: f"{v:.0f}", True, True),
    # Quality beside speed (fsbench.training.evaluate): None in runs without --eval. Not yet in
    # report tables (median=False): a report of speed alone stays as it was.
    Column("hr_at_10", "HR@10", lambda v: f"{v:.4f}", summary=True),
    Column("ndcg_at_10", "NDCG@10", lambda v: f"{v:.4f}", summary=True),
    # The same with popularity-boosted scores (+ log q: fsbench.training.evaluate).
    Column("hr_at_10_logq", "HR@10 logq", lambda v: f"{v:.4f}", summary=True),
    Column("ndcg_at_10_logq", "NDCG@10 logq", lambda v: f"{v:.4f}", summary=True),
    Column("eval_users", "eval users", summary=True),
    Column("time_to_target_s", "time to HR@10 target s", lambda v: f"{v:.2f}", summary=True),
    # Time to quality (fsbench.quality.time_to_quality): a number where every seed reached
    # the target, else the reason as text ("not reached (best X)", "2/3 seeds; ...").
    Column("target_valid_ndcg_at_10", "val NDCG@10 target", lambda v: _or_text(v, ".4f")),
    Column("time_to_quality_s", "train s to quality", lambda v: _or_text(v, ".1f")),
    Column("samples_to_quality", "samples to quality", lambda v: _or_text(v, ".0f")),
    Column("scaling_efficiency", "scaling eff %", _pct, wall_clock=True),
    Column("simulated", "simulated", _yes),
    Column("emulated", "emulated", _yes, summary=True, flag=True),
    Column("oversubscribed", "oversub", _yes, summary=True, flag=True),
    # None where the machine has no schedstat: nobody knows, which is not "no".
    Column("contended", "contended", _yes, summary=True, flag=True, missing="unknown"),
)
BY_KEY: dict[str, Column] = {c.key: c for c in COLUMNS}

SUMMARY_KEYS: tuple[str, ...] = tuple(c.key for c in COLUMNS if c.summary)
MEDIANS: tuple[str, ...] = tuple(c.key for c in COLUMNS if c.median)
WALL_CLOCK: tuple[str, ...] = tuple(c.key for c in COLUMNS if c.wall_clock)
FLAGS: tuple[str, ...] = tuple(c.key for c in COLUMNS if c.flag)
# What `fsbench run` and `fsbench sweep` print.
RUN_VIEW: tuple[str, ...] = (
    "step_time_ms_median", "samples_per_s", "bubble_ratio", "straggler_bubble_ratio",
    "exposed_comm_ratio", "comm_overlap_ratio", "input_stall_ratio", "other_idle_ratio",
    "load_imbalance",
    "cpu_wait_ratio", "sm_occupancy", "peak_memory_mb")
# What `fsbench run --eval` prints beside RUN_VIEW.
EVAL_VIEW: tuple[str, ...] = ("hr_at_10", "ndcg_at_10", "hr_at_10_logq", "ndcg_at_10_logq",
                               "eval_users", "time_to_target_s")
