"""Terminal output, in one place: tables (markdown pipe tables by tabulate, units in the
headers), JSON documents, notes and progress bars.

Results go to stdout: a table, or with `--format json` one JSON document. Notes ("stored
in", "resuming") and progress bars go to stderr, and `fsbench -q` silences both;
warnings and errors always print (to stderr)."""
from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING

from tabulate import tabulate

from fsbench.columns import BY_KEY

if TYPE_CHECKING:  # pandas is imported where it is used: `fsbench --help` need not load it
    import pandas as pd

_quiet = False


def set_quiet(on: bool) -> None:
    """`fsbench -q`: no notes, no progress bars (results, warnings and errors still print)."""
    global _quiet
    _quiet = on


def note(text: str) -> None:
    """A line about the work, not its result (where it was stored, what was skipped)."""
    if not _quiet:
        print(text, file=sys.stderr)


def warn(text: str) -> None:
    """A line that qualifies a result or the command line; printed even under -q."""
    print(f"fsbench: warning: {text}", file=sys.stderr)


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
    import pandas as pd

    columns = [c for c in (columns or list(df.columns)) if c in df.columns]
    cells = [[cell(c, row[c]) for c in columns] for _, row in df.iterrows()]
    return pd.DataFrame(cells, columns=[header(c) for c in columns], index=df.index, dtype=object)


def grid(headers: list[str], rows: list[list[str]], align: str | list[str] = "right") -> str:
    """A markdown pipe table of display strings: every table fsbench prints or writes as
    markdown is made here. Right-aligned (numbers line up) unless `align` gives each
    column's alignment ("left", "right", "center")."""
    colalign = [align] * len(headers) if isinstance(align, str) else list(align)
    # disable_numparse: cells are already formatted ("12.0", "n/a"); re-parsing them as
    # numbers would change their digits.
    return tabulate(rows, headers=headers, tablefmt="pipe", colalign=colalign,
                    disable_numparse=True)


def markdown(cells: pd.DataFrame) -> str:
    """Right-aligned markdown pipe table of a DataFrame of strings."""
    return grid([str(c) for c in cells.columns], cells.values.tolist())


def format_table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    """Markdown pipe table of `columns` (those present in df, in that order)."""
    return markdown(formatted(df, columns))


def plain(value: object) -> object:
    """`value` as JSON holds it: NaN and infinities as null, numpy values as Python's, a
    DataFrame as a list of its rows, anything else unknown (paths, times) as a string."""
    import numpy as np
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        return [plain(row) for row in value.to_dict("records")]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if value is pd.NA or value is pd.NaT:
        return None
    return str(value)


def dumps(doc: object) -> str:
    """One JSON document (what `--format json` prints to stdout)."""
    return json.dumps(plain(doc), indent=1, allow_nan=False)


def records(df: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """The rows of `df` (only `columns` that it has, in that order) as JSON-ready dicts."""
    if columns is not None:
        df = df[[c for c in columns if c in df.columns]]
    return plain(df)


def progress_lines_wanted() -> bool:
    """Progress as plain lines (a CI log, a file): stderr is no terminal, and no -q."""
    return not _quiet and not _stderr_is_a_terminal()


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def progress(items, desc: str, unit: str = "it", min_items: int = 1):
    """`items`, wrapped in a tqdm bar on stderr when someone watches it (stderr is a
    terminal, no -q) and there are at least `min_items` of them; a bar's redraws would
    only clutter a log file or a CI transcript."""
    items = list(items)
    if _quiet or len(items) < min_items or not _stderr_is_a_terminal():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, leave=False)
