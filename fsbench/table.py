"""Plain-text tables for the terminal (markdown-compatible), with units in the headers."""
from __future__ import annotations

import math

import pandas as pd

# column -> (header, formatter). Ratios are stored as fractions and shown as percentages.
_pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
COLUMNS: dict[str, tuple[str, object]] = {
    "trainer": ("trainer", str),
    "world_size": ("ranks", str),
    "repeats": ("repeats", str),
    "step_time_ms_median": ("step ms", lambda v: f"{v:.1f}"),
    "samples_per_s": ("samples/s", lambda v: f"{v:.1f}"),
    "tokens_per_s": ("tokens/s", lambda v: f"{v:.0f}"),
    "bubble_ratio": ("bubble %", _pct),
    "straggler_bubble_ratio": ("straggler %", _pct),
    "exposed_comm_ratio": ("exposed comm %", _pct),
    "load_imbalance": ("imbalance %", _pct),
    "sm_occupancy": ("SM occ %", _pct),
    "oversubscribed": ("oversub", lambda v: "yes" if v else "no"),
}


def _cell(col: str, value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if col in COLUMNS:
        return COLUMNS[col][1](value)
    if col.startswith(("throughput_vs_", "ratio_")):
        return f"{value:.2f}x"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    """Markdown pipe table of `columns` (those present in df, in that order)."""
    columns = [c for c in (columns or list(df.columns)) if c in df.columns]
    headers = [COLUMNS[c][0] if c in COLUMNS else c.replace("_", " ") for c in columns]
    cells = [[_cell(c, row[c]) for c in columns] for _, row in df.iterrows()]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in cells])
