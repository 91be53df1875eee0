"""Result tables (markdown / LaTeX / CSV / HTML) and plots over stored runs.

`report_table` is the one way to build a comparison table (`fsbench sweep` and
`fsbench report` both use it): one row per (workload, trainer, world size, simulated),
medians over repeated runs, plus scaling efficiency and the throughput ratio to a
baseline trainer. Simulated rows are a separate group, so a projection is never pooled
with a measurement, and both scaling efficiency and baseline ratios compare measured with
measured and simulated with simulated only.

Wall-clock columns of oversubscribed runs (more busy threads than cores) measure
time-sharing, not training: renderings mark those cells with a dagger and a footnote.
"""
from __future__ import annotations

import html
import os
from pathlib import Path

import pandas as pd

from fsbench import columns, metrics, store
from fsbench.config import ConfigError
from fsbench.table import formatted, markdown, progress

FORMATS = {"md": "md", "latex": "tex", "csv": "csv", "html": "html"}
KEYS = ["workload", "trainer", "world_size", "simulated"]
# Medians over repeats of every numeric metric; wall-clock columns (T is in every one of
# them, the straggler bubble included, via its denominator) are marked in flagged rows.
MEDIANS = list(columns.MEDIANS)
WALL_CLOCK = columns.WALL_CLOCK
PROGRESS_MIN_RUNS = 20  # below this, reading runs is instant and a bar is only noise
PLOTS = ("bubble_vs_world_size.png", "throughput_vs_world_size.png", "rank_busy_idle.png")


def default_baseline(runs: pd.DataFrame) -> str:
    """`ddp` if present (the common reference), else the first trainer present."""
    trainers = list(dict.fromkeys(runs["trainer"]))
    return "ddp" if "ddp" in trainers else trainers[0]


def _normalized(runs: pd.DataFrame) -> pd.DataFrame:
    """Complete runs only, with the columns report_table needs in usable dtypes (sweep
    rows have no `simulated`; the runs table stores a missing SM occupancy as None)."""
    runs = runs.copy()
    if "status" in runs:
        runs = runs[runs["status"] == "complete"]
    for col, default in (("simulated", False), *((f, False) for f in columns.FLAGS)):
        runs[col] = runs[col].fillna(default).astype(bool) if col in runs else default
    for col in MEDIANS:
        runs[col] = pd.to_numeric(runs[col], errors="coerce") if col in runs else float("nan")
    runs["world_size"] = runs["world_size"].astype(int)
    return runs


def _lookup(table: pd.DataFrame, rows: pd.Series, keys: list[str]) -> pd.Series:
    """samples/s of the `rows` subset, looked up for every row of `table` by `keys`."""
    values = table[rows].set_index(keys)["samples_per_s"]
    return values.reindex(pd.MultiIndex.from_frame(table[keys])).to_numpy()


def report_table(runs: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Medians over repeats per (workload, trainer, world size, simulated); one row each.

    scaling_efficiency = samples/s(N) / (N * samples/s(1)), same workload and trainer
    (NaN without a 1-rank row); throughput_vs_<baseline> = samples/s over the baseline's
    at the same workload and world size (NaN where the baseline has no such row).
    """
    runs = _normalized(runs)
    if runs.empty:
        raise ConfigError("no complete runs to tabulate")
    baseline = baseline or default_baseline(runs)
    trainers = list(dict.fromkeys(runs["trainer"]))
    if baseline not in trainers:
        raise ConfigError(f"baseline {baseline!r} has no runs here; trainers present: {', '.join(trainers)}")
    g = runs.groupby(KEYS, sort=False)
    table = g[MEDIANS].median()
    table["repeats"] = g.size()
    # Spread of throughput over repeats, (max - min) / median: how far to trust a ratio.
    table["samples_per_s_spread"] = (g["samples_per_s"].max() - g["samples_per_s"].min()) / table["samples_per_s"]
    for flag in columns.FLAGS:  # a row is flagged when any of its repeats is
        table[flag] = g[flag].any()
    table = table.reset_index()
    table["scaling_efficiency"] = table["samples_per_s"] / (
        table["world_size"] * _lookup(table, table["world_size"] == 1, ["workload", "trainer", "simulated"]))
    table[f"throughput_vs_{baseline}"] = table["samples_per_s"] / _lookup(
        table, table["trainer"] == baseline, ["workload", "world_size", "simulated"])
    # Measured before simulated, baseline first, then trainers and workloads as they came.
    order = {t: i for i, t in enumerate(dict.fromkeys([baseline, *trainers]))}
    wl = {w: i for i, w in enumerate(dict.fromkeys(table["workload"]))}
    table = table.assign(_w=table["workload"].map(wl), _t=table["trainer"].map(order))
    table = table.sort_values(["_w", "simulated", "_t", "world_size"], kind="stable")
    cols = KEYS + ["repeats"] + MEDIANS + ["samples_per_s_spread", "scaling_efficiency",
                                           f"throughput_vs_{baseline}", *columns.FLAGS]
    return table[cols].reset_index(drop=True)


# ---------------------------------------------------------------------------- rendering

def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is unknown; choose one of: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def footnotes(table: pd.DataFrame) -> list[str]:
    ratio = next(c for c in table.columns if c.startswith("throughput_vs_"))
    notes = [f"Medians over measured steps, then over repeats. scaling eff = throughput(N) / "
             f"(N x throughput(1)), same trainer and workload; {ratio.replace('_', ' ')} = "
             f"samples/s ratio at the same world size; n/a = not available."]
    if table["oversubscribed"].any():
        notes.append("† oversubscribed (ranks x threads > cores): step time, throughput, bubble, "
                     "straggler, exposed comm and the ratios built on them measure time-sharing, "
                     "not training; load imbalance (busy time only) stays valid.")
    if table["contended"].any():
        notes.append(f"‡ contended (ranks waited for a CPU > {metrics.CONTENDED_CPU_WAIT:.0%} of "
                     "their step time: another process took cores): wall-clock cells measure "
                     "that neighbour too; load imbalance stays valid.")
    if table["simulated"].any():
        notes.append("simulated = yes: projected by the cost model, not measured; kept apart "
                     "from measured rows.")
    return notes


def _cells(table: pd.DataFrame, dagger: str, escape=lambda s: s) -> pd.DataFrame:
    """Display strings, escaped for the target format, with `dagger` on the wall-clock
    cells of oversubscribed rows and a double dagger on those of contended rows."""
    cells = formatted(table).map(escape)
    cells.columns = [escape(c) for c in cells.columns]
    flagged = [i for i, c in enumerate(table.columns)
               if c in WALL_CLOCK or c.startswith("throughput_vs_")]
    marks = {"oversubscribed": dagger, "contended": dagger.replace("dag", "ddag").replace("†", "‡")}
    for flag, mark in marks.items():
        for row in table.index[table[flag]]:
            for i in flagged:
                if cells.iat[row, i] != "n/a":
                    cells.iat[row, i] += mark
    return cells


def _latex_escape(text: str) -> str:
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
               "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
               "^": r"\textasciicircum{}", "†": r"\dag{}", "‡": r"\ddag{}"}
    return "".join(special.get(ch, ch) for ch in text)


def render(table: pd.DataFrame, fmt: str) -> str:
    """The report table as md | latex | csv | html. CSV keeps raw numbers (fractions, not
    percentages) and the flags as boolean columns, for machines."""
    check_format(fmt)
    table = table.reset_index(drop=True)
    notes = footnotes(table)
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "md":
        return markdown(_cells(table, "†")) + "".join(f"\n\n{n}" for n in notes) + "\n"
    if fmt == "html":
        body = _cells(table, "†").to_html(index=False, escape=True, border=0)
        return body + "\n" + "".join(f"<p>{html.escape(n)}</p>\n" for n in notes)
    # LaTeX: cells are escaped here, so pandas must not escape again (it would mangle \dag).
    cells = _cells(table, r"\textsuperscript{\dag}", _latex_escape)
    body = cells.to_latex(index=False, escape=False, column_format="l" * 2 + "r" * (cells.shape[1] - 2))
    return body + "".join(f"\\par\\noindent{{\\footnotesize {_latex_escape(n)}}}\n" for n in notes)


# ---------------------------------------------------------------------------- selection

def select_runs(run_dirs: list[str], runs_root: str | os.PathLike, workload: str | None = None,
                trainers: list[str] | None = None) -> pd.DataFrame:
    """Explicit run dirs (each must be a complete run), or every complete run under
    `runs_root`; then filtered by workload and trainers. Raises ConfigError if none."""
    if len(run_dirs) == 1 and _is_store(Path(run_dirs[0])):
        run_dirs, runs_root = [], run_dirs[0]  # a store given as RUN_DIR: report it
    if run_dirs:
        dirs = [Path(d) for d in run_dirs]
        for d in dirs:
            if not (d / "manifest.json").is_file():
                raise ConfigError(f"{d} is not a run directory (no manifest.json); to report "
                                  "a store use --runs DIR")
    else:
        root = Path(runs_root)
        if not root.is_dir():
            raise ConfigError(f"--runs {root}: no such directory")
        dirs = sorted(d for d in root.iterdir() if d.is_dir())
    rows = []
    for d in progress(dirs, "reading runs", "run", min_items=PROGRESS_MIN_RUNS):
        row = store.run_row(d)
        if row is None and run_dirs:
            raise ConfigError(f"{d} is not a run directory (unreadable manifest.json)")
        if row and row["status"] != "complete" and run_dirs:
            raise ConfigError(f"{d}: status is {row['status']!r}; only complete runs are reported")
        if row and row["status"] == "complete":
            rows.append(row)
    runs = pd.DataFrame(rows)
    if len(runs) and workload:
        runs = runs[runs["workload"] == workload]
    if len(runs) and trainers:
        runs = runs[runs["trainer"].isin(trainers)]
    if runs.empty:
        where = "the given run directories" if run_dirs else str(runs_root)
        filters = ", ".join(f"{k}={v}" for k, v in (("workload", workload),
                            ("trainers", ",".join(trainers or []))) if v)
        raise ConfigError(f"no complete runs matched in {where}" + (f" ({filters})" if filters else ""))
    return runs.reset_index(drop=True)


def _is_store(path: Path) -> bool:
    """A directory of run directories (not itself a run)."""
    return (path.is_dir() and not (path / "manifest.json").exists()
            and any((d / "manifest.json").is_file() for d in path.iterdir() if d.is_dir()))


def choose_step_run(runs: pd.DataFrame, baseline: str) -> str | None:
    """The measured run of `baseline` at its largest world size (any trainer's if the
    baseline has no measured run); ties go to the last run directory by name."""
    measured = _normalized(runs)
    measured = measured[~measured["simulated"]]
    pool = measured[measured["trainer"] == baseline]
    pool = pool if len(pool) else measured
    if pool.empty:
        return None
    return str(pool.sort_values(["world_size", "run_dir"]).iloc[-1]["run_dir"])


# ---------------------------------------------------------------------------- plots

def median_step_busy_idle(spans: pd.DataFrame) -> tuple[int, float, pd.DataFrame]:
    """The measured step with the median step time (the lower median, so a real step),
    its T in ms, and per rank busy_ms and idle_ms = T - busy (clipped at 0: thread CPU
    time can exceed wall time by clock granularity)."""
    steps = metrics.step_metrics(spans)
    measured = steps[~steps["warmup"]].sort_values(["step_time_ms", "step"])
    if measured.empty:
        raise ConfigError("no measured steps in the run's timelines")
    step = int(measured.iloc[(len(measured) - 1) // 2]["step"])
    per_rank = metrics.rank_step_busy(spans)
    per_rank = per_rank[per_rank["step"] == step].sort_values("rank")
    t_ns = float(per_rank["end_ns"].max() - per_rank["start_ns"].min())
    out = pd.DataFrame({"rank": per_rank["rank"].to_numpy(),
                        "busy_ms": per_rank["busy_ns"].to_numpy() / 1e6,
                        "idle_ms": (t_ns - per_rank["busy_ns"].to_numpy()).clip(min=0) / 1e6})
    return step, t_ns / 1e6, out


def _figure(ncols: int = 1):
    """A matplotlib Figure on the Agg canvas, without pyplot's global state."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install -e '.[report]' (or pass --no-plots)")
    fig = Figure(figsize=(5 * ncols, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def plot_vs_world_size(table: pd.DataFrame, column: str, ylabel: str, scale: float, path: Path) -> None:
    """One panel per workload, a line per trainer (dashed if simulated); hollow markers
    on oversubscribed points, whose wall-clock values measure time-sharing."""
    workloads = list(dict.fromkeys(table["workload"]))
    colors = {t: f"C{i % 10}" for i, t in enumerate(dict.fromkeys(table["trainer"]))}
    fig, axes = _figure(len(workloads))
    for ax, workload in zip(axes, workloads):
        rows = table[table["workload"] == workload]
        legend_over = "oversubscribed (time-sharing)"
        for (trainer, sim), g in rows.groupby(["trainer", "simulated"], sort=False):
            g = g.sort_values("world_size")
            label = trainer + (" (simulated)" if sim else "")
            color = colors[trainer]  # a trainer keeps its colour, measured or simulated
            ax.plot(g["world_size"], g[column] * scale, "--" if sim else "-",
                    marker="s" if sim else "o", color=color, label=label)
            over = g[g["oversubscribed"]]
            ax.plot(over["world_size"], over[column] * scale, "o", mfc="white", mec=color,
                    label=legend_over if len(over) else None)
            legend_over = legend_over if over.empty else None  # one legend entry per panel
        sizes = sorted(rows["world_size"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set(title=workload, xlabel="world size (ranks)", ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def plot_rank_busy_idle(run_dir: str | os.PathLike, path: Path) -> None:
    from fsbench.timeline import read_timelines

    run_dir = Path(run_dir)
    spans = read_timelines(run_dir)
    if spans.empty:
        raise ConfigError(f"{run_dir} has no timelines (rank-*.jsonl) to plot; choose a run "
                          "with --step-run, or pass --no-plots")
    step, t_ms, per_rank = median_step_busy_idle(spans)
    fig, (ax,) = _figure()
    ax.bar(per_rank["rank"], per_rank["busy_ms"], label="busy (compute CPU time)")
    ax.bar(per_rank["rank"], per_rank["idle_ms"], bottom=per_rank["busy_ms"], label="idle (T - busy)",
           color="lightgray", hatch="//", edgecolor="gray")
    ax.axhline(t_ms, color="black", lw=0.8, ls=":", label=f"T = {t_ms:.2f} ms")
    ax.set_xticks(per_rank["rank"], [str(r) for r in per_rank["rank"]])
    manifest = run_dir / "manifest.json"
    over = manifest.exists() and store.read_json(manifest).get("oversubscribed")
    title = f"{run_dir.name}\nstep {step} (median step time)"
    if over:  # the idle bars then include waiting for a core, not only for other ranks
        title += ", oversubscribed: idle includes time-sharing"
    ax.set(xlabel="rank", ylabel="ms", title=title)
    ax.title.set_fontsize("small")
    fig.legend(fontsize="small", loc="outside lower center", ncols=3)  # never over the bars
    fig.savefig(path, dpi=120)


def write_report(runs: pd.DataFrame, baseline: str | None, fmt: str, out_dir: str | os.PathLike,
                 step_run: str | None = None, plots: bool = True) -> tuple[pd.DataFrame, list[Path]]:
    """Write report.<ext> and (unless plots=False) the PNGs into out_dir."""
    ext = check_format(fmt)
    table = report_table(runs, baseline)
    baseline = next(c for c in table.columns if c.startswith("throughput_vs_"))[len("throughput_vs_"):]
    if step_run is not None and not any(Path(step_run).glob("rank-*.jsonl")):
        raise ConfigError(f"--step-run {step_run} is not a run directory (no rank-*.jsonl timelines)")
    out_dir = store.check_writable_dir(out_dir)  # after the input checks: bad input writes nothing
    written = [out_dir / f"report.{ext}"]
    written[0].write_text(render(table, fmt))
    if plots:
        plot_vs_world_size(table, "bubble_ratio", "bubble %", 100, out_dir / PLOTS[0])
        plot_vs_world_size(table, "samples_per_s", "samples/s", 1, out_dir / PLOTS[1])
        written += [out_dir / p for p in PLOTS[:2]]
        step_run = step_run or choose_step_run(runs, baseline)
        if step_run is not None:  # none when every selected run is simulated
            plot_rank_busy_idle(step_run, out_dir / PLOTS[2])
            written.append(out_dir / PLOTS[2])
    return table, written
