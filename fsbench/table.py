"""Terminal output: plain-text tables (markdown-compatible, units in the headers) and
progress bars on stderr."""
from __future__ import annotations

import math
import sys

import pandas as pd

# column -> (header, formatter). Ratios are stored as fractions and shown as percentages.
_pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
COLUMNS: dict[str, tuple[str, object]] = {
    "workload": ("workload", str),
    "trainer": ("trainer", str),
    "world_size": ("ranks", str),
    "repeats": ("repeats", str),
    "step_time_ms_median": ("step ms", lambda v: f"{v:.1f}"),
    "samples_per_s": ("samples/s", lambda v: f"{v:.1f}"),
    "samples_per_s_spread": ("samples/s spread %", _pct),
    "tokens_per_s": ("tokens/s", lambda v: f"{v:.0f}"),
    "bubble_ratio": ("bubble %", _pct),
    "straggler_bubble_ratio": ("straggler %", _pct),
    "exposed_comm_ratio": ("exposed comm %", _pct),
    "load_imbalance": ("imbalance %", _pct),
    "sm_occupancy": ("SM occ %", _pct),
    "scaling_efficiency": ("scaling eff %", _pct),
    "simulated": ("simulated", lambda v: "yes" if v else "no"),
    "oversubscribed": ("oversub", lambda v: "yes" if v else "no"),
}


def cell(col: str, value: object) -> str:
    """One value as shown in tables; missing values (None, NaN) read "n/a"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if col in COLUMNS:
        return COLUMNS[col][1](value)
    if col.startswith(("throughput_vs_", "ratio_")):
        return f"{value:.2f}x"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def header(col: str) -> str:
    return COLUMNS[col][0] if col in COLUMNS else col.replace("_", " ")


def formatted(df: pd.DataFrame, columns: list[str] | None = None) -> pd.DataFrame:
    """`columns` (those present in df, in that order) as display strings, with display
    headers: what every rendering (markdown, HTML, LaTeX) starts from."""
    columns = [c for c in (columns or list(df.columns)) if c in df.columns]
    cells = [[cell(c, row[c]) for c in columns] for _, row in df.iterrows()]
    return pd.DataFrame(cells, columns=[header(c) for c in columns], index=df.index, dtype=object)


def markdown(cells: pd.DataFrame) -> str:
    """Right-aligned markdown pipe table of a DataFrame of strings."""
    headers = list(cells.columns)
    rows = cells.values.tolist()
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def format_table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    """Markdown pipe table of `columns` (those present in df, in that order)."""
    return markdown(formatted(df, columns))


def progress(items, desc: str, unit: str = "it", min_items: int = 1):
    """`items`, wrapped in a tqdm bar on stderr when there are at least `min_items` of
    them (and tqdm is installed); stdout stays clean for tables."""
    items = list(items)
    if len(items) < min_items:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False)
