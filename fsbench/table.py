"""Terminal output: plain-text tables (markdown-compatible, units in the headers) and
progress bars on stderr."""
from __future__ import annotations

import math
import sys

import pandas as pd

from fsbench.columns import BY_KEY

def cell(col: str, value: object) -> str:
    """One value as shown in tables; missing values (None, NaN) read "n/a", or as
    their column says (a contended flag that nobody measured reads "unknown")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return BY_KEY[col].missing if col in BY_KEY else "n/a"
    if col in BY_KEY:
        return BY_KEY[col].fmt(value)
    if col.startswith(("throughput_vs_", "ratio_")):
        return f"{value:.2f}x"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def header(col: str) -> str:
    return BY_KEY[col].header if col in BY_KEY else col.replace("_", " ")


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
