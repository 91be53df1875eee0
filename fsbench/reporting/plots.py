"""The report's plots, and the pure functions that feed them.

Data functions (no matplotlib, tested on their own): `cause_bars` (the bubble's four
causes per report row), `relative_scaling` (the scaling plot's values), `step_timeline`
(one step's per-rank spans for a Gantt chart), `median_step_busy_idle`. Drawing functions
return a matplotlib Figure on the Agg canvas, without pyplot's global state; `render_plots`
draws every plot a report holds and returns them as PNG bytes, which `fsbench.reporting.report`
writes beside the table or embeds in the page.

Marks, the same in every plot: simulated points and bars are hollow or hatched and joined by
dashed lines; wall-clock values of oversubscribed or contended runs (which measure
time-sharing, not training) carry a cross; emulated points a diamond ring.
"""
from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsbench.measurement import metrics
from fsbench.running import store
from fsbench.config import ConfigError

CAUSES = ("straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio")
CAUSE_LABELS = ("straggler (imbalance)", "exposed communication", "input stall", "other idle")
# Span kinds in a rank's step partition (fsbench.measurement.metrics.rank_step_table): `wait` is waiting
# on communication; `data` is what the input stage was called in older timelines. `step`,
# `flight` (a collective in flight, not the thread's time) and `probe` are not drawn.
TIMELINE_KINDS = {"compute": "compute", "comm": "comm", "wait": "comm", "input": "input", "data": "input"}
CAUSE_COLORS = {"straggler_bubble_ratio": "C3", "exposed_comm_ratio": "C1",
                "input_stall_ratio": "C2", "other_idle_ratio": "C7", "unsplit": "lightgray"}
TIMELINE_STYLE = {"compute": ("C0", "compute (busy)"), "comm": ("C3", "communication wait"),
                  "input": ("C2", "input stall")}


@dataclass(frozen=True, slots=True)
class Plot:
    file: str
    caption: str


PLOTS = {
    "bubble": Plot("bubble_vs_world_size.png", "Bubble ratio against world size."),
    "causes": Plot("bubble_causes.png", "The bubble split into its four causes, per trainer and "
                   "world size; the stacked height is the bubble ratio."),
    "throughput": Plot("throughput_vs_world_size.png", "Throughput against world size."),
    "scaling": Plot("scaling_efficiency_vs_world_size.png",
                    "Scaling efficiency, throughput(N) / (N x throughput(1)), against world size; "
                    "a line without a 1-rank run is drawn relative to its smallest world size N0, "
                    "throughput(N) / ((N / N0) x throughput(N0)), as its label says."),
    "busy_idle": Plot("rank_busy_idle.png", "One step's busy and idle time per rank (the step with "
                      "the median step time)."),
    "timeline": Plot("step_timeline.png", "One step per trainer, rank by rank: compute, "
                     "communication wait and input stall inside each rank's step span."),
}


# ---------------------------------------------------------------------------- data

def _flag(rows: pd.DataFrame, col: str) -> pd.Series:
    return rows[col].fillna(False).astype(bool) if col in rows else pd.Series(False, index=rows.index)


def cause_bars(table: pd.DataFrame) -> pd.DataFrame:
    """One stacked bar per report row: the bubble's four causes, summing to its bubble_ratio.

    A report row holds medians over repeats, and the causes' medians need not sum to the
    median bubble; the bar keeps the median bubble's height and splits it in proportion to
    the causes' medians (with one repeat, the causes exactly as measured). A row without
    causes (runs from before the bubble was split) is one `unsplit` segment.

    Returns the row keys and flags, bubble_ratio, and one column per cause plus `unsplit`
    (fractions of capacity)."""
    keys = [c for c in ("workload", "trainer", "world_size", "simulated", "emulated",
                        "oversubscribed", "contended") if c in table]
    bubble = pd.to_numeric(table["bubble_ratio"], errors="coerce").fillna(0.0).to_numpy(dtype=float)
    causes = np.column_stack([pd.to_numeric(table[c], errors="coerce").fillna(0.0).to_numpy(dtype=float)
                              if c in table else np.zeros(len(table)) for c in CAUSES])
    causes = causes.clip(min=0.0)  # `other` can dip below 0 by clock granularity
    total = causes.sum(axis=1)
    split = total > 0
    scale = np.divide(bubble, total, out=np.zeros_like(bubble), where=split)
    out = table[keys].reset_index(drop=True).copy()
    out["bubble_ratio"] = bubble
    for i, c in enumerate(CAUSES):
        out[c] = causes[:, i] * scale
    out["unsplit"] = np.where(split, 0.0, bubble)
    return out


def relative_scaling(table: pd.DataFrame) -> pd.DataFrame:
    """The scaling plot's values: `table` with, per (workload, trainer, simulated) line, its
    smallest world size N0 (`base_world_size`) and `relative_efficiency` = throughput(N) /
    ((N / N0) x throughput(N0)). Where N0 = 1 that is the table's scaling efficiency; a
    line without a 1-rank row (a store of 2-rank runs, simulated runs from 8 GPUs up) has
    none (n/a in the table), and its plot is drawn relative to N0, labelled so."""
    keys = ["workload", "trainer", "simulated"]
    first = table.loc[table.groupby(keys, sort=False)["world_size"].idxmin()].set_index(keys)
    lines = pd.MultiIndex.from_frame(table[keys])
    out = table.copy()
    out["base_world_size"] = first["world_size"].reindex(lines).to_numpy()
    base = first["samples_per_s"].reindex(lines).to_numpy()
    out["relative_efficiency"] = out["samples_per_s"] / (out["world_size"] / out["base_world_size"] * base)
    return out


def median_step(spans: pd.DataFrame) -> int:
    """The measured step with the median step time (the lower median, so a real step)."""
    steps = metrics.step_metrics(spans)
    measured = steps[~steps["warmup"]].sort_values(["step_time_ms", "step"])
    if measured.empty:
        raise ConfigError("no measured steps in the run's timelines")
    return int(measured.iloc[(len(measured) - 1) // 2]["step"])


def median_step_busy_idle(spans: pd.DataFrame) -> tuple[int, float, pd.DataFrame]:
    """The median measured step (`median_step`), its T in ms, and per rank busy_ms and
    idle_ms = T - busy (clipped at 0: thread CPU time can exceed wall time by clock
    granularity)."""
    step = median_step(spans)
    per_rank = metrics.rank_step_busy(spans)
    per_rank = per_rank[per_rank["step"] == step].sort_values("rank")
    t_ns = float(per_rank["end_ns"].max() - per_rank["start_ns"].min())
    out = pd.DataFrame({"rank": per_rank["rank"].to_numpy(),
                        "busy_ms": per_rank["busy_ns"].to_numpy() / 1e6,
                        "idle_ms": (t_ns - per_rank["busy_ns"].to_numpy()).clip(min=0) / 1e6})
    return step, t_ns / 1e6, out


def step_timeline(spans: pd.DataFrame, step: int | None = None) -> tuple[int, pd.DataFrame, pd.DataFrame]:
    """One step's per-rank spans, as the metrics partition it, for a Gantt chart.

    Args:
        spans: a run's timelines (fsbench.measurement.timeline.read_timelines).
        step: the step to show; default the median measured step (`median_step`).
    Returns:
        (step, windows, segments). windows: one row per rank, its step span's start_ms and
        end_ms. segments: rank, kind (compute | comm | input), name, start_ms, end_ms and,
        for compute, busy_ms (thread CPU time, the emulated time on emulated runs, CUDA
        time where recorded; the rest of a compute span is blocked time, which the
        metrics count as communication wait). Only the spans the metrics count: not
        nested, of a drawn kind, wholly inside the rank's step span. Times in ms from the
        first rank's step start.
    """
    step = median_step(spans) if step is None else int(step)
    here = spans[spans["step"] == step]
    bounds = here[here["kind"] == "step"].groupby("rank").agg(start_ns=("start_ns", "min"),
                                                              dur_ns=("dur_ns", "max"))
    if bounds.empty:
        raise ConfigError(f"step {step} has no step spans in the run's timelines")
    t0 = bounds["start_ns"].min()
    bounds["end_ns"] = bounds["start_ns"] + bounds["dur_ns"]
    windows = pd.DataFrame({"rank": bounds.index.to_numpy(),
                            "start_ms": (bounds["start_ns"].to_numpy() - t0) / 1e6,
                            "end_ms": (bounds["end_ns"].to_numpy() - t0) / 1e6})
    nested = here["nested"].eq(True) if "nested" in here else pd.Series(False, index=here.index)
    seg = here[here["kind"].isin(list(TIMELINE_KINDS)) & ~nested]
    seg = seg.join(bounds[["start_ns", "end_ns"]].rename(columns=lambda c: f"{c}_step"), on="rank")
    end = seg["start_ns"] + seg["dur_ns"]
    seg = seg[(seg["start_ns"] >= seg["start_ns_step"]) & (end <= seg["end_ns_step"])]
    busy = seg["cpu_ns"].astype(float)
    if "gpu_ns" in seg:  # CUDA runs: the device's time, as the metrics take it
        busy = seg["gpu_ns"].astype(float).where(seg["gpu_ns"].notna(), busy)
    kind = seg["kind"].map(TIMELINE_KINDS)
    segments = pd.DataFrame({
        "rank": seg["rank"].to_numpy(), "kind": kind.to_numpy(), "name": seg["name"].to_numpy(),
        "start_ms": (seg["start_ns"].to_numpy() - t0) / 1e6,
        "end_ms": ((seg["start_ns"] + seg["dur_ns"]).to_numpy() - t0) / 1e6,
        "busy_ms": np.where(kind == "compute", np.minimum(busy, seg["dur_ns"]) / 1e6, np.nan)})
    return step, windows, segments.sort_values(["rank", "start_ms"]).reset_index(drop=True)


def step_run_candidates(runs: pd.DataFrame, trainer: str, others: bool = True) -> list[str]:
    """Measured complete runs in the order the per-rank plots try them: `trainer`'s, largest
    world size first (ties: the last run directory by name), then (`others`) the other
    trainers' in the same order."""
    measured = runs[~_flag(runs, "simulated")]
    if "status" in measured:
        measured = measured[measured["status"] == "complete"]
    measured = measured.assign(_own=measured["trainer"] == trainer)
    if not others:
        measured = measured[measured["_own"]]
    order = measured.sort_values(["_own", "world_size", "run_dir"], ascending=False)
    return [str(d) for d in order["run_dir"]]


def choose_step_run(runs: pd.DataFrame, trainer: str) -> str | None:
    """The measured run of `trainer` at its largest world size (any trainer's if it has no
    measured run); ties go to the last run directory by name."""
    return next(iter(step_run_candidates(runs, trainer)), None)


def run_spans(run_dir: str | os.PathLike) -> pd.DataFrame:
    """A run's timelines, checked for what the per-rank plots need: spans of every rank of
    its world size and a measured step. ConfigError saying what is missing or damaged."""
    from fsbench.measurement.timeline import read_timelines

    spans = read_timelines(run_dir)  # a damaged file: ConfigError naming it
    if spans.empty:
        raise ConfigError("no timelines (rank-*.jsonl)")
    world = _manifest(run_dir).get("world_size")
    missing = sorted(set(range(world)) - set(spans["rank"])) if isinstance(world, int) else []
    if missing:  # a plot of the other ranks would look like a smaller world
        raise ConfigError(f"no timeline of rank(s) {', '.join(map(str, missing))}")
    median_step(spans)  # ConfigError without a measured step
    return spans


def _manifest(run_dir: str | os.PathLike) -> dict:
    """The run's manifest for a plot's labels; {} where it is unreadable (the spans suffice)."""
    try:
        return store.read_object(Path(run_dir) / "manifest.json")
    except ConfigError:
        return {}


# ---------------------------------------------------------------------------- drawing

def _figure(nrows: int = 1, ncols: int = 1, width: float = 5.0, height: float = 3.8, sharex=False):
    """A matplotlib Figure on the Agg canvas, without pyplot's global state, and its axes
    as a flat list."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install -e '.[report]' (or pass --no-plots)")
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(nrows, ncols, squeeze=False, sharex=sharex).ravel())


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()


def plot_vs_world_size(table: pd.DataFrame, column: str, ylabel: str, scale: float, ideal: float | None = None):
    """One panel per workload, a line per trainer and kind: measured solid with filled
    circles, simulated dashed with hollow squares. Crosses on oversubscribed or contended
    points (wall clock measures time-sharing), diamond rings on emulated ones. `ideal`
    draws a reference line (100 for scaling efficiency in %). A line whose rows carry a
    `base_world_size` other than 1 (`relative_scaling`) says so in its label; a panel
    without any value says n/a."""
    workloads = list(dict.fromkeys(table["workload"]))
    colors = {t: f"C{i % 10}" for i, t in enumerate(dict.fromkeys(table["trainer"]))}
    fig, axes = _figure(1, len(workloads))
    for ax, workload in zip(axes, workloads):
        rows = table[table["workload"] == workload]
        labels = {"flagged": "oversubscribed / contended", "emulated": "emulated compute"}
        for (trainer, sim), g in rows.groupby(["trainer", "simulated"], sort=False):
            g = g.sort_values("world_size")
            color = colors[trainer]  # a trainer keeps its colour, measured or simulated
            base = int(g["base_world_size"].iloc[0]) if "base_world_size" in g else 1
            ax.plot(g["world_size"], g[column] * scale, "--" if sim else "-", marker="s" if sim else "o",
                    mfc="white" if sim else color, mec=color, color=color,
                    label=trainer + (" (simulated)" if sim else "")
                    + (f", relative to {base} ranks" if base != 1 else ""))
            flagged = g[_flag(g, "oversubscribed") | _flag(g, "contended")]
            if len(flagged):
                ax.plot(flagged["world_size"], flagged[column] * scale, "x", color="black", ms=9,
                        label=labels.pop("flagged", None))
            emulated = g[_flag(g, "emulated")]
            if len(emulated):
                ax.plot(emulated["world_size"], emulated[column] * scale, "D", mfc="none", mec="black",
                        ms=11, label=labels.pop("emulated", None))
        if ideal is not None:
            ax.axhline(ideal, color="gray", lw=0.8, ls=":", label="ideal")
        if not np.isfinite(pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)).any():
            ax.text(0.5, 0.5, "n/a: no run has this value", transform=ax.transAxes, ha="center")
        sizes = sorted(rows["world_size"].unique())
        # Limits from the world sizes, not the data: a panel with no finite value has no
        # data limits, and a log axis cannot start at matplotlib's default 0.
        ax.set_xlim(sizes[0] / 1.5, sizes[-1] * 1.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set(title=workload, xlabel="world size (ranks)", ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def plot_scaling(table: pd.DataFrame):
    """Scaling efficiency against world size (`relative_scaling`), 100% ideal."""
    return plot_vs_world_size(relative_scaling(table), "relative_efficiency", "scaling efficiency %",
                              100, ideal=100)


def plot_bubble_causes(table: pd.DataFrame):
    """Stacked bars of the bubble's causes (`cause_bars`), one panel per workload, one bar
    per trainer and world size; simulated bars hatched and pale; † / ‡ under bars of
    oversubscribed / contended rows, ¶ under emulated ones."""
    bars = cause_bars(table)
    workloads = list(dict.fromkeys(bars["workload"]))
    widest = int(bars.groupby("workload").size().max())
    fig, axes = _figure(1, len(workloads), width=max(5.0, 0.55 * widest + 2))
    for ax, workload in zip(axes, workloads):
        rows = bars[bars["workload"] == workload].reset_index(drop=True)
        x, ticks, prev = [], [], None
        for _, r in rows.iterrows():  # a gap between (simulated, trainer) groups
            group = (r["simulated"], r["trainer"])
            x.append((x[-1] + 1 if x else 0) + (0.6 if x and group != prev else 0))
            prev = group
            marks = "".join(m for f, m in (("oversubscribed", "†"), ("contended", "‡"), ("emulated", "¶"))
                            if bool(r.get(f, False)))
            ticks.append(f"{r['trainer']}\nN={r['world_size']}" + ("\nsim" if r["simulated"] else "") + marks)
        x = np.array(x)
        sim = rows["simulated"].astype(bool).to_numpy()
        bottom = np.zeros(len(rows))
        for col, label in [*zip(CAUSES, CAUSE_LABELS), ("unsplit", "not split (older runs)")]:
            h = rows[col].to_numpy() * 100
            if col == "unsplit" and not h.any():
                continue
            color = CAUSE_COLORS[col]
            ax.bar(x[~sim], h[~sim], bottom=bottom[~sim], color=color, label=label, width=0.8)
            ax.bar(x[sim], h[sim], bottom=bottom[sim], color=color, alpha=0.45, hatch="//",
                   edgecolor="white", width=0.8)
            bottom += h
        ax.set_xticks(x, ticks, fontsize="small")
        ax.set(title=workload, ylabel="bubble % (of N x T)")
        ax.grid(axis="y", alpha=0.3)
    legend = {}  # one legend for every panel, below them: never over a bar
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if bars["simulated"].astype(bool).any():
        from matplotlib.patches import Patch

        legend["simulated (hatched)"] = Patch(facecolor="white", edgecolor="gray", hatch="//")
    fig.legend(legend.values(), legend.keys(), fontsize="small", loc="outside lower center", ncols=3)
    return fig


def plot_rank_busy_idle(run_dir: str | os.PathLike, spans: pd.DataFrame | None = None):
    """One step's busy and idle time per rank, stacked to T. `spans`: the run's timelines
    when already read (`run_spans`)."""
    run_dir = Path(run_dir)
    spans = run_spans(run_dir) if spans is None else spans
    step, t_ms, per_rank = median_step_busy_idle(spans)
    fig, (ax,) = _figure()
    ax.bar(per_rank["rank"], per_rank["busy_ms"], label="busy (compute CPU time)")
    ax.bar(per_rank["rank"], per_rank["idle_ms"], bottom=per_rank["busy_ms"], label="idle (T - busy)",
           color="lightgray", hatch="//", edgecolor="gray")
    ax.axhline(t_ms, color="black", lw=0.8, ls=":", label=f"T = {t_ms:.2f} ms")
    ax.set_xticks(per_rank["rank"], [str(r) for r in per_rank["rank"]])
    over = _manifest(run_dir).get("oversubscribed")
    title = f"{run_dir.name}\nstep {step} (median step time)"
    if over:  # the idle bars then include waiting for a core, not only for other ranks
        title += ", oversubscribed: idle includes time-sharing"
    ax.set(xlabel="rank", ylabel="ms", title=title)
    ax.title.set_fontsize("small")
    fig.legend(fontsize="small", loc="outside lower center", ncols=3)  # never over the bars
    return fig


def plot_step_timelines(runs: dict[str, tuple[str, pd.DataFrame]]):
    """A panel per trainer (shared time axis): its run's median step, one row per rank,
    with the spans of `step_timeline`. `runs`: trainer -> (run_dir, its timelines as
    `run_spans` returns them). A compute span's busy time is drawn solid from its start and
    the rest of it (blocked, e.g. DDP's last all-reduce inside backward) pale; where inside
    the span the blocked time fell is not recorded."""
    shown = {trainer: (Path(run_dir).name, *step_timeline(spans))
             for trainer, (run_dir, spans) in runs.items()}
    heights = [1.4 + 0.35 * len(w) for _, _, w, _ in shown.values()]
    fig, axes = _figure(len(shown), 1, width=9.0, height=float(np.mean(heights)), sharex=True)
    for ax, (trainer, (name, step, windows, segments)) in zip(axes, shown.items()):
        for _, w in windows.iterrows():
            ax.barh(w["rank"], w["end_ms"] - w["start_ms"], left=w["start_ms"], height=0.8,
                    color="none", edgecolor="gray", lw=0.8)
        for kind, (color, label) in TIMELINE_STYLE.items():
            s = segments[segments["kind"] == kind]
            if s.empty:
                continue
            if kind == "compute":
                ax.barh(s["rank"], s["busy_ms"], left=s["start_ms"], height=0.6, color=color, label=label)
                rest = s["end_ms"] - s["start_ms"] - s["busy_ms"]
                ax.barh(s["rank"], rest, left=s["start_ms"] + s["busy_ms"], height=0.6, color=color,
                        alpha=0.3, label="compute span, not busy (blocked or waiting for a core)")
            else:
                ax.barh(s["rank"], s["end_ms"] - s["start_ms"], left=s["start_ms"], height=0.6,
                        color=color, label=label)
        ranks = windows["rank"].tolist()
        ax.set_yticks(ranks, [str(r) for r in ranks])
        ax.invert_yaxis()
        ax.set(ylabel="rank", title=f"{trainer}: {name}, step {step} (median step time)")
        ax.title.set_fontsize("small")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms from the step's start (gray outline: each rank's step span; "
                        "blank inside it: no span, other idle)")
    legend = {}  # every kind any panel drew, once
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), fontsize="small", loc="outside lower center", ncols=4)
    return fig


def _first_drawable(candidates: list[str], read: dict) -> tuple[str, pd.DataFrame] | None:
    """The first candidate run whose timelines the per-rank plots can draw (`run_spans`),
    with them. `read` keeps what was read (None: not drawable), so a run is read once and
    one left out is named on stderr once, with why, while the report goes on."""
    for run_dir in candidates:
        if run_dir not in read:
            try:
                read[run_dir] = run_spans(run_dir)
            except ConfigError as e:
                read[run_dir] = None
                print(f"fsbench: warning: left out of the per-rank plots: {Path(run_dir).name}: {e}",
                      file=sys.stderr)
        if read[run_dir] is not None:
            return run_dir, read[run_dir]
    return None


def render_plots(table: pd.DataFrame, runs: pd.DataFrame, baseline: str,
                 step_run: str | None = None) -> dict[str, bytes]:
    """Every plot of a report as PNG bytes, keyed by PLOTS' keys, in PLOTS' order.

    The per-rank plots draw the baseline's largest measured run (`step_run` if given) and
    one run per trainer: a run whose timelines are missing or damaged is named on stderr
    and the next candidate drawn; without any drawable run (all simulated, or all damaged)
    those plots are left out. A given `step_run` that cannot be drawn is refused."""
    out = {
        "bubble": png(plot_vs_world_size(table, "bubble_ratio", "bubble %", 100)),
        "causes": png(plot_bubble_causes(table)),
        "throughput": png(plot_vs_world_size(table, "samples_per_s", "samples/s", 1)),
        "scaling": png(plot_scaling(table)),
    }
    read: dict[str, pd.DataFrame | None] = {}
    if step_run is not None:
        try:
            first = str(step_run), run_spans(step_run)
        except ConfigError as e:
            raise ConfigError(f"--step-run {step_run}: {e}") from None
    else:
        first = _first_drawable(step_run_candidates(runs, baseline), read)
    if first is None:
        if read:  # measured runs there were, none drawable
            print("fsbench: warning: no measured run has usable timelines: the per-rank plots "
                  "are left out", file=sys.stderr)
        return out
    out["busy_idle"] = png(plot_rank_busy_idle(*first))
    measured = runs[~_flag(runs, "simulated")]
    panels = {t: got for t in dict.fromkeys(measured["trainer"])
              if (got := _first_drawable(step_run_candidates(runs, t, others=False), read))}
    if step_run is not None or not panels:  # a given run replaces its trainer's choice
        panels[_manifest(first[0]).get("trainer") or "?"] = first
    out["timeline"] = png(plot_step_timelines(panels))
    return out
