"""What `fsbench compare` and `fsbench gate` print and store: the Markdown table with its
outcome line, designs, inconclusive reasons and notes, and the JSON of every row.
"""
from __future__ import annotations

import dataclasses
import json
import math

from fsbench.gates.compare import METRICS, Row, exit_code, outcome
from fsbench.table import grid


def _fmt_effect(row: Row) -> str:
    if math.isnan(row.effect):
        return "n/a"
    kind = METRICS[row.metric][0]
    if kind == "ratio":
        return f"{100 * row.effect:+.1f} pp [{100 * row.ci_low:+.1f}, {100 * row.ci_high:+.1f}]"
    return f"{row.effect:.3f}x [{row.ci_low:.3f}, {row.ci_high:.3f}]"


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def markdown(rows: list[Row], notes: list[str]) -> str:
    mark = {"regressed": "**regressed**", "improved": "improved", "unchanged": "unchanged",
            "inconclusive": "*inconclusive*"}
    cells = [[r.workload, r.trainer, str(r.world_size), r.metric, _fmt(r.base_total),
              _fmt(r.new_total), _fmt_effect(r), _fmt(r.p_adjusted), mark[r.verdict]]
             for r in rows if r.metric != "*"]
    lines = [grid(["workload", "trainer", "ranks", "metric", "base", "new", "change [95% CI]",
                   "p (Holm)", "verdict"], cells,
                  align=["left", "left", "right", "left", "right", "right", "left", "right", "left"])]
    counts = {v: sum(r.verdict == v for r in rows) for v in mark}
    lines += ["", f"outcome: **{outcome(rows)}** (exit {exit_code(rows)}): {counts['regressed']} "
              f"regressed, {counts['inconclusive']} inconclusive, {counts['improved']} improved, "
              f"{counts['unchanged']} unchanged, of {len(rows)}."]
    for r in rows:
        if r.metric == "step_time_ms":
            lines.append(f"- {r.workload} {r.trainer} {r.world_size} ranks: design "
                         f"{'paired' if r.pairing != 'none' and 'unpaired' not in r.pairing else ''} "
                         f"{r.pairing}, {r.units} units (randomization test on totals)".replace("  ", " "))
    for r in rows:
        if r.verdict == "inconclusive":
            lines.append(f"- inconclusive: {r.workload} {r.trainer} {r.world_size} ranks "
                         f"{'(every metric)' if r.metric == '*' else r.metric}: {r.reason}. "
                         f"To settle it: {r.remedy}.")
    lines += [f"- note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def to_json(rows: list[Row], notes: list[str]) -> str:
    clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
    return json.dumps({"outcome": outcome(rows), "exit_code": exit_code(rows),
                       "rows": [{k: clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
                       "notes": notes,
                       "regressions": sum(r.verdict == "regressed" for r in rows),
                       "inconclusive": sum(r.verdict == "inconclusive" for r in rows)}, indent=1)
