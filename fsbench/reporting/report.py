"""Result tables (markdown / LaTeX / CSV / an HTML page / JSON) over stored runs, with their plots.

`report_table` is the one way to build a comparison table (`fsbench sweep` and
`fsbench report` both use it): one row per (workload, trainer, world size, simulated),
medians over repeated runs, plus scaling efficiency and the throughput ratio to a
baseline trainer. Simulated rows are a separate group, so a projection is never pooled
with a measurement, and both scaling efficiency and baseline ratios compare measured with
measured and simulated with simulated only.

Wall-clock columns of oversubscribed runs (more busy threads than cores) measure
time-sharing, not training: renderings mark those cells with a dagger and a footnote (a
double dagger for contended runs). LaTeX and the HTML page (fsbench.reporting.report_page) also
mark simulated (§) and emulated (¶) rows; markdown shows those as yes/no columns. The
plots are drawn by fsbench.reporting.plots.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fsbench import columns, stats
from fsbench.measurement import metrics
from fsbench.reporting import report_page
from fsbench.running import store
from fsbench.running.output_paths import check_writable_dir
from fsbench.config import ConfigError
from fsbench.reporting.plot_data import CAUSES, UNRECORDED, simulated_assumptions
from fsbench.reporting.plots import PLOTS, render_plots
from fsbench.table import dumps, formatted, markdown, progress

FORMATS = {"md": "md", "latex": "tex", "csv": "csv", "html": "html", "json": "json"}
KEYS = ["workload", "trainer", "world_size", "simulated"]
# Medians over repeats of every numeric metric; wall-clock columns (T is in every one of
# them, the straggler bubble included, via its denominator) are marked in flagged rows.
MEDIANS = list(columns.MEDIANS)
QUALITY = ("hr_at_10", "ndcg_at_10")
WALL_CLOCK = columns.WALL_CLOCK
PROGRESS_MIN_RUNS = 20  # below this, reading runs is instant and a bar is only noise
# Row marks of LaTeX and the page; † and ‡ also mark wall-clock cells, as in markdown.
ROW_MARKS = {"simulated": "§", "emulated": "¶", "oversubscribed": "†", "contended": "‡"}
# The throughput ratio's interval: numbers in CSV and JSON, "[lo, hi]" beside the ratio
# in the other renderings.
CI_COLUMNS = ("ratio_ci_low", "ratio_ci_high")
# Columns of the table that no rendering shows as a column: the interval is folded into the
# ratio's cell, the assumptions into the notes.
FOLDED = (*CI_COLUMNS, "assumptions")
# The LaTeX table's columns (a paper's width); CSV keeps every column.
PAPER_COLUMNS = ("workload", "trainer", "world_size", "repeats", "step_time_ms_median",
                 "samples_per_s", "bubble_ratio", *CAUSES, "load_imbalance", "sm_occupancy",
                 "scaling_efficiency")


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
    # Contention is unknown (null) for a measured run whose machine has no schedstat: it
    # must not read as "uncontended" once the flags are made boolean below.
    measured = ~runs["simulated"].fillna(False).astype(bool) if "simulated" in runs else True
    runs["contention_unknown"] = (runs["contended"].isna() if "contended" in runs else True) & measured
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


def _ratio_intervals(runs: pd.DataFrame, table: pd.DataFrame, baseline: str) -> tuple[list, list]:
    """Each row's 95% interval of its throughput ratio to the baseline: a bootstrap over
    the repeats (runs) of the row and of the baseline's row at the same workload, world
    size and simulated (fsbench.stats.median_ratio_interval). NaN for the baseline's own
    rows and where either side has fewer than 2 runs."""
    by_key = {key: g["samples_per_s"].to_numpy(dtype=float) for key, g in runs.groupby(KEYS, sort=False)}
    lows, highs = [], []
    for row in table[KEYS].itertuples(index=False):
        key = tuple(row)
        mine = by_key.get(key, [])
        theirs = by_key.get((row.workload, baseline, row.world_size, row.simulated), [])
        lo, hi = ((float("nan"), float("nan")) if row.trainer == baseline
                  else stats.median_ratio_interval(theirs, mine))
        lows.append(lo)
        highs.append(hi)
    return lows, highs


def report_table(runs: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Medians over repeats per (workload, trainer, world size, simulated); one row each.

    scaling_efficiency = samples/s(N) / (N * samples/s(1)), same workload and trainer
    (NaN without a 1-rank row); throughput_vs_<baseline> = samples/s over the baseline's
    at the same workload and world size (NaN where the baseline has no such row), with its
    95% interval over repeats in ratio_ci_low and ratio_ci_high (`_ratio_intervals`).
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
    for flag in [*columns.FLAGS, "contention_unknown"]:  # a row is flagged when any of its repeats is
        table[flag] = g[flag].any()
    # A simulated row carries its cluster's assumptions (fsbench.scaling.sim_inputs), into
    # the notes, the plots and the CSV/JSON; measured rows none.
    table["assumptions"] = g["assumptions"].first() if "assumptions" in runs else None
    table = table.reset_index()
    table["assumptions"] = [(a if isinstance(a, str) else UNRECORDED) if sim else None
                            for a, sim in zip(table["assumptions"], table["simulated"])]
    table["scaling_efficiency"] = table["samples_per_s"] / (
        table["world_size"] * _lookup(table, table["world_size"] == 1, ["workload", "trainer", "simulated"]))
    table[f"throughput_vs_{baseline}"] = table["samples_per_s"] / _lookup(
        table, table["trainer"] == baseline, ["workload", "world_size", "simulated"])
    table["ratio_ci_low"], table["ratio_ci_high"] = _ratio_intervals(runs, table, baseline)
    # Measured before simulated, baseline first, then trainers and workloads as they came.
    order = {t: i for i, t in enumerate(dict.fromkeys([baseline, *trainers]))}
    wl = {w: i for i, w in enumerate(dict.fromkeys(table["workload"]))}
    table = table.assign(_w=table["workload"].map(wl), _t=table["trainer"].map(order))
    table = table.sort_values(["_w", "simulated", "_t", "world_size"], kind="stable")
    cols = KEYS + ["repeats"] + MEDIANS + ["samples_per_s_spread", "scaling_efficiency",
                                           f"throughput_vs_{baseline}", *CI_COLUMNS, *columns.FLAGS,
                                           "contention_unknown", "assumptions"]
    # Quality beside speed, only where runs were evaluated (a speed report stays as it was):
    # medians over repeats of the final evaluation (fsbench quality's own table picks the
    # best-validation epoch: STORE/quality/quality.md).
    if "hr_at_10" in runs and runs["hr_at_10"].notna().any():
        scores = runs.reindex(columns=list(QUALITY)).apply(pd.to_numeric, errors="coerce")
        quality = runs[KEYS].join(scores).groupby(KEYS, sort=False).median()
        table = table.join(quality, on=KEYS)
        cols += list(QUALITY)
        to_quality = _time_to_quality(runs, baseline)
        if to_quality:  # runs that scored validation: fsbench quality's store
            for i, col in enumerate(TO_QUALITY):
                table[col] = [to_quality.get(tuple(k), (None,) * 3)[i]
                              for k in table[KEYS].itertuples(index=False)]
            cols += list(TO_QUALITY)
    return table[cols].reset_index(drop=True)


TO_QUALITY = ("target_valid_ndcg_at_10", "time_to_quality_s", "samples_to_quality")


def _time_to_quality(runs: pd.DataFrame, baseline: str) -> dict[tuple, tuple]:
    """Per report row (KEYS), (target, time, samples) to quality over its runs' learning
    curves (fsbench.quality.time_to_quality.values); empty where no run scored validation."""
    import json

    from fsbench.quality import time_to_quality as ttq

    if "run_dir" not in runs:
        return {}
    curves: dict[tuple, list] = {}
    evaluated = runs[pd.to_numeric(runs["hr_at_10"], errors="coerce").notna()]
    for _, run in evaluated.iterrows():
        try:
            curve = json.loads((Path(run["run_dir"]) / "summary.json").read_text()).get("quality_curve")
        except (OSError, ValueError):
            continue
        if curve and ttq.best(curve) is not None:  # (trainer, world size) last, as rows_by_key reads
            key = (run["workload"], bool(run["simulated"]), run["trainer"], int(run["world_size"]))
            curves.setdefault(key, []).append(curve)
    return {(w, trainer, n, sim): ttq.values(r)
            for (w, sim, trainer, n), r in ttq.rows_by_key(curves, baseline).items()}


# ---------------------------------------------------------------------------- rendering

def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is unknown; choose one of: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def footnotes(table: pd.DataFrame, symbols: bool = False) -> list[str]:
    """The notes under a table: how to read it, then one per mark present. `symbols`: the
    simulated and emulated notes start with their row mark (§, ¶; LaTeX and the page)
    instead of naming their yes/no column (markdown)."""
    ratio = next(c for c in table.columns if c.startswith("throughput_vs_"))
    notes = [f"Medians over measured steps, then over repeats. scaling eff = throughput(N) / "
             f"(N x throughput(1)), same trainer and workload; {ratio.replace('_', ' ')} = "
             f"samples/s ratio at the same world size, [its 95% interval]: a bootstrap over "
             f"both trainers' repeats (none with fewer than 2 repeats a side); n/a = not available."]
    if "time_to_quality_s" in table:
        from fsbench.quality.time_to_quality import report_note

        notes.append(report_note(ratio.removeprefix("throughput_vs_")))
    if table["oversubscribed"].any():
        notes.append("† oversubscribed (ranks x threads > cores): step time, throughput, bubble, "
                     "straggler, exposed comm and the ratios built on them measure time-sharing, "
                     "not training; load imbalance (busy time only) stays valid.")
    if table["contended"].any():
        notes.append(f"‡ contended (ranks waited for a CPU > {metrics.CONTENDED_CPU_WAIT:.0%} of "
                     "their step time: another process took cores): wall-clock cells measure "
                     "that neighbour too; load imbalance stays valid.")
    if "contention_unknown" in table and table["contention_unknown"].any():
        notes.append("contention unknown for some measured rows (their machine has no "
                     "schedstat): a neighbour taking cores would not have been flagged there.")
    if table["simulated"].any():
        clusters = " ".join(f"[{a}]" for a in simulated_assumptions(table))
        notes.append(("§ simulated" if symbols else "simulated = yes") + ": projected by the cost "
                     "model, not measured; kept apart from measured rows. Clusters simulated, "
                     f"with the figures they assume: {clusters}")
    if "emulated" in table and table["emulated"].any():
        notes.append(("¶ emulated" if symbols else "emulated = yes") + ": compute=emulated, each "
                     "rank's encoder compute replaced by waiting the calibrated cost model's time; "
                     "communication, input and optimizer are real, busy time is the model's.")
    return notes


def _cells(table: pd.DataFrame, dagger: str, escape=lambda s: s) -> pd.DataFrame:
    """Display strings, escaped for the target format, with `dagger` on the wall-clock
    cells of oversubscribed rows and a double dagger on those of contended rows."""
    cells = formatted(table).map(escape)
    cells.columns = [escape(c) for c in cells.columns]
    if all(c in table for c in CI_COLUMNS):  # the ratio's interval beside it: "0.98x [0.85, 1.10]"
        at = next(i for i, c in enumerate(table.columns) if c.startswith("throughput_vs_"))
        for row, (lo, hi) in enumerate(zip(table["ratio_ci_low"], table["ratio_ci_high"])):
            if pd.notna(lo) and pd.notna(hi) and cells.iat[row, at] != "n/a":
                cells.iat[row, at] += escape(f" [{lo:.2f}, {hi:.2f}]")
    flagged = [i for i, c in enumerate(table.columns)
               if c in WALL_CLOCK or c.startswith("throughput_vs_")]
    marks = {"oversubscribed": dagger, "contended": dagger.replace("dag", "ddag").replace("†", "‡")}
    for flag, mark in marks.items():
        for row in table.index[table[flag]]:
            for i in flagged:
                if cells.iat[row, i] != "n/a":
                    cells.iat[row, i] += mark
    return cells.iloc[:, [i for i, c in enumerate(table.columns) if c not in FOLDED]]


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The columns the md, LaTeX and HTML renderings show (`_cells`' columns): the
    interval columns are folded into the ratio's cell."""
    return table.drop(columns=[c for c in FOLDED if c in table])



def _latex_escape(text: str) -> str:
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
               "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
               "^": r"\textasciicircum{}", "†": r"\dag{}", "‡": r"\ddag{}", "§": r"\S{}",
               "¶": r"\P{}"}
    return "".join(special.get(ch, ch) for ch in text)


def latex(table: pd.DataFrame) -> str:
    """A booktabs tabular for papers (needs \\usepackage{booktabs}): the paper's columns
    (PAPER_COLUMNS and the baseline ratio; a column with no value in any row left out),
    a rule between workloads and between measured and simulated rows, and the marks as
    footnote symbols: † oversubscribed and ‡ contended on wall-clock cells, § simulated
    and ¶ emulated on the trainer cell; the notes below say what each means."""
    table = table.reset_index(drop=True)
    ratio = next(c for c in table.columns if c.startswith("throughput_vs_"))
    cols = [c for c in (*PAPER_COLUMNS, ratio) if c in table and not table[c].isna().all()]
    cells = _cells(table, r"\textsuperscript{\dag}", _latex_escape)
    cells = cells.iloc[:, [list(shown(table).columns).index(c) for c in cols]]
    trainer = cols.index("trainer")
    for flag in ("simulated", "emulated"):  # whole rows; † and ‡ mark the cells they affect
        mark = ROW_MARKS[flag]
        for row in table.index[table[flag]] if flag in table else []:
            cells.iat[row, trainer] += rf"\textsuperscript{{{_latex_escape(mark)}}}"
    spec = "".join("l" if c in ("workload", "trainer") else "r" for c in cols)
    lines = ["% fsbench report: needs \\usepackage{booktabs}", rf"\begin{{tabular}}{{{spec}}}",
             r"\toprule", " & ".join(cells.columns) + r" \\", r"\midrule"]
    group = list(zip(table["workload"], table["simulated"]))
    for i in range(len(cells)):
        if i and group[i] != group[i - 1]:
            lines.append(r"\midrule")
        lines.append(" & ".join(cells.iloc[i]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    notes = "".join(f"\\par\\noindent{{\\footnotesize {_latex_escape(n)}}}\n"
                    for n in footnotes(table, symbols=True))
    return "\n".join(lines) + "\n" + notes


def render(table: pd.DataFrame, fmt: str, images: dict[str, bytes] | None = None,
           sources: list[dict] | None = None, title: str = "fsbench report",
           command: str | None = None) -> str:
    """The report table as md | latex | csv | html | json. CSV and JSON keep raw numbers
    (fractions, not percentages) and the flags as booleans, for machines. html is a whole page
    (fsbench.reporting.report_page), with `images` (PNG bytes by fsbench.reporting.plots.PLOTS key) and
    `sources` (report_page.run_sources) embedded when given, and `title` and `command` (the
    command line that made it) in its header."""
    check_format(fmt)
    table = table.reset_index(drop=True)
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "json":
        return dumps({"table": table, "notes": footnotes(table)}) + "\n"
    if fmt == "md":
        return markdown(_cells(table, "†")) + "".join(f"\n\n{n}" for n in footnotes(table)) + "\n"
    if fmt == "html":
        figures = [(PLOTS[k].caption, data) for k, data in (images or {}).items()]
        return report_page.page(shown(table), _cells(table, "†"), footnotes(table, symbols=True),
                                ROW_MARKS, figures, sources or [], title=title, command=command)
    return latex(table)


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
                                  "a store use --store DIR")
    else:
        root = Path(runs_root)
        if not root.is_dir():
            raise ConfigError(f"--store {root}: no such directory")
        dirs = store.store_run_dirs(root)  # fsbench simulate's too: rows marked simulated
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
            and any((d / "manifest.json").is_file() for d in store.store_run_dirs(path)))


# ---------------------------------------------------------------------------- writing

def write_report(runs: pd.DataFrame, baseline: str | None, fmt: str, out_dir: str | os.PathLike,
                 step_run: str | None = None, plots: bool = True, title: str = "fsbench report",
                 command: str | None = None) -> tuple[pd.DataFrame, list[Path]]:
    """Write report.<ext> into out_dir and (unless plots=False) the plots: for html,
    embedded in the one page; for the other formats, as PNGs beside the table."""
    ext = check_format(fmt)
    table = report_table(runs, baseline)
    baseline = next(c for c in table.columns if c.startswith("throughput_vs_"))[len("throughput_vs_"):]
    if step_run is not None and not any(Path(step_run).glob("rank-*.jsonl")):
        raise ConfigError(f"--step-run {step_run} is not a run directory (no rank-*.jsonl timelines)")
    out_dir = check_writable_dir(out_dir)  # after the input checks: bad input writes nothing
    report = out_dir / f"report.{ext}"
    sources = report_page.run_sources(runs) if fmt == "html" else None
    page = {"title": title, "command": command}
    report.write_text(render(table, fmt, sources=sources, **page))  # first: the table needs no matplotlib
    if not plots:
        return table, [report]
    images = render_plots(table, runs, baseline, step_run)
    if fmt == "html":
        report.write_text(render(table, fmt, images=images, sources=sources, **page))
        return table, [report]
    written = [report]
    for key, data in images.items():
        written.append(out_dir / PLOTS[key].file)
        written[-1].write_bytes(data)
    return table, written
