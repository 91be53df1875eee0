"""The report's plots. What they show comes from fsbench.reporting.plot_data (pure
functions, tested without matplotlib). Drawing functions
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
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fsbench.config import ConfigError
from fsbench.reporting.plot_data import (CAUSES, cause_bars, flag_column, run_manifest,
                                         median_step_busy_idle, relative_scaling, run_spans,
                                         simulated_assumptions, step_run_candidates, step_timeline)

CAUSE_LABELS = ("straggler (imbalance)", "exposed communication", "input stall", "other idle")
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
    "learning": Plot("learning_curves.png", "Quality against training time: HR@10 of every "
                     "evaluation of each evaluated run (fsbench quality: the test item)."),
    "busy_idle": Plot("rank_busy_idle.png", "One step's busy and idle time per rank (the step with "
                      "the median step time)."),
    "timeline": Plot("step_timeline.png", "One step per trainer, rank by rank: compute, "
                     "communication wait and input stall inside each rank's step span."),
}


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


def _set_title(ax, text: str, size: str = "large") -> None:
    """A panel's title, each line wrapped to the panel's width: a long workload or run name
    (a `data=recbole:PATH` workload's path) would run past the figure's edge and be cut.
    Width per character: 0.62 em, above DejaVu Sans' average, so a wrapped line fits."""
    from matplotlib.font_manager import FontProperties

    fig = ax.get_figure()
    inches = ax.get_position().width * fig.get_figwidth()
    chars = max(16, int(inches * 72 / (0.62 * FontProperties(size=size).get_size_in_points())))
    lines = [textwrap.fill(line, chars, break_on_hyphens=False) for line in text.splitlines()]
    ax.set_title("\n".join(lines), fontsize=size)


PNG_DPI = 240  # twice the 120 a page shows them at (report_page halves their width): sharp on HiDPI


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI)
    return buf.getvalue()


def _legend_below(fig, axes, extra: dict | None = None, ncols: int = 3) -> None:
    """One legend for every panel, below them (never over a bar or a line's points): each
    label any panel drew, once, then `extra` (label -> handle)."""
    legend = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    legend.update(extra or {})
    fig.legend(legend.values(), legend.keys(), fontsize="small", loc="outside lower center", ncols=ncols)


def _assumptions_on(fig, assumed: list[str]):
    """A figure with simulated points says, above its panels, what their clusters assume
    (a PNG travels without the report's notes)."""
    if assumed:
        chars = int(fig.get_figwidth() * 17)  # x-small text: about 17 characters per inch
        text = "SIMULATED points: " + "; ".join(assumed)
        fig.suptitle("\n".join(textwrap.wrap(text, chars)), fontsize="x-small", color="dimgray")
    return fig


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
            flagged = g[flag_column(g, "oversubscribed") | flag_column(g, "contended")]
            if len(flagged):
                ax.plot(flagged["world_size"], flagged[column] * scale, "x", color="black", ms=9,
                        label=labels.pop("flagged", None))
            emulated = g[flag_column(g, "emulated")]
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
        ax.set(xlabel="world size (ranks)", ylabel=ylabel)
        _set_title(ax, workload)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _legend_below(fig, axes)
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
        x, ticks, prev, groups = [], [], None, []
        for _, r in rows.iterrows():  # a gap between (simulated, trainer) groups
            group = (r["simulated"], r["trainer"])
            x.append((x[-1] + 1 if x else 0) + (0.6 if x and group != prev else 0))
            if group != prev:
                groups.append((group, []))
            groups[-1][1].append(x[-1])
            prev = group
            marks = "".join(m for f, m in (("oversubscribed", "†"), ("contended", "‡"), ("emulated", "¶"))
                            if bool(r.get(f, False)))
            ticks.append(f"N={r['world_size']}{marks}")
        # The trainer once per group, under its bars' world sizes: a name per bar would run
        # into its neighbours' at four trainers x four world sizes.
        for (simulated, trainer), xs in groups:
            ax.annotate(f"{trainer}{' (sim)' if simulated else ''}", (float(np.mean(xs)), 0),
                        xycoords=("data", "axes fraction"), xytext=(0, -22),
                        textcoords="offset points", ha="center", va="top", fontsize="small",
                        fontweight="bold")
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
        ax.set(ylabel="bubble % (of N x T)")
        _set_title(ax, workload)
        ax.grid(axis="y", alpha=0.3)
    extra = {}
    if bars["simulated"].astype(bool).any():
        from matplotlib.patches import Patch

        extra["simulated (hatched)"] = Patch(facecolor="white", edgecolor="gray", hatch="//")
    _legend_below(fig, axes, extra)
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
    over = run_manifest(run_dir).get("oversubscribed")
    title = f"{run_dir.name}\nstep {step} (median step time)"
    if over:  # the idle bars then include waiting for a core, not only for other ranks
        title += ", oversubscribed: idle includes time-sharing"
    ax.set(xlabel="rank", ylabel="ms")
    _set_title(ax, title, "small")
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
        ax.set(ylabel="rank")
        _set_title(ax, f"{trainer}: {name}, step {step} (median step time)", "small")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms from the step's start (gray outline: each rank's step span; "
                        "blank inside it: no span, other idle)")
    _legend_below(fig, axes, ncols=4)
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


def learning_curves(runs: pd.DataFrame) -> dict[str, list[dict]]:
    """Evaluated runs' learning curves (summary `quality_curve`), by a label naming the
    trainer, world size and seed; runs without one (no --eval, older runs) are left out."""
    import json

    out = {}
    if "hr_at_10" not in runs or "run_dir" not in runs:
        return out
    for _, row in runs[pd.to_numeric(runs["hr_at_10"], errors="coerce").notna()].iterrows():
        try:
            curve = json.loads((Path(row["run_dir"]) / "summary.json").read_text()).get("quality_curve")
        except (OSError, ValueError):
            continue
        if curve:
            out[f"{row['trainer']} n={row['world_size']} seed {row.get('seed', '?')}"] = curve
    return out


def plot_learning_curves(curves: dict[str, list[dict]]):
    """Test HR@10 against training time (each run's summed step times), one line a run."""
    fig, (ax,) = _figure()
    for label, curve in sorted(curves.items()):
        points = [(e["train_s"], e["hr_at_10"]) for e in curve if e.get("train_s") is not None]
        if points:
            ax.plot(*zip(*points), marker=".", label=label)
    ax.set(xlabel="training time s (summed step times)", ylabel="HR@10")
    _legend_below(fig, [ax])
    return fig


def render_plots(table: pd.DataFrame, runs: pd.DataFrame, baseline: str,
                 step_run: str | None = None) -> dict[str, bytes]:
    """Every plot of a report as PNG bytes, keyed by PLOTS' keys, in PLOTS' order.

    The per-rank plots draw the baseline's largest measured run (`step_run` if given) and
    one run per trainer: a run whose timelines are missing or damaged is named on stderr
    and the next candidate drawn; without any drawable run (all simulated, or all damaged)
    those plots are left out. A given `step_run` that cannot be drawn is refused."""
    assumed = simulated_assumptions(table)
    out = {
        "bubble": png(_assumptions_on(plot_vs_world_size(table, "bubble_ratio", "bubble %", 100), assumed)),
        "causes": png(_assumptions_on(plot_bubble_causes(table), assumed)),
        "throughput": png(_assumptions_on(plot_vs_world_size(table, "samples_per_s", "samples/s", 1), assumed)),
        "scaling": png(_assumptions_on(plot_scaling(table), assumed)),
    }
    curves = learning_curves(runs)
    if curves:
        out["learning"] = png(plot_learning_curves(curves))
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
    measured = runs[~flag_column(runs, "simulated")]
    panels = {t: got for t in dict.fromkeys(measured["trainer"])
              if (got := _first_drawable(step_run_candidates(runs, t, others=False), read))}
    if step_run is not None or not panels:  # a given run replaces its trainer's choice
        panels[run_manifest(first[0]).get("trainer") or "?"] = first
    out["timeline"] = png(plot_step_timelines(panels))
    return out
