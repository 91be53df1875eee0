"""What `fsbench compare` and `fsbench gate` print and store: Markdown for a review comment
(one summary line fit for its title, the table, designs, inconclusive reasons, notes), the
JSON of every row, and JUnit XML for CI systems (each key and metric a test case).
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


def _change(row: Row) -> str:
    """The change in a few characters: +12.3% (times, memory), +2.1 pp (ratios)."""
    if math.isnan(row.effect):
        return "n/a"
    if METRICS[row.metric][0] == "ratio":
        return f"{100 * row.effect:+.1f} pp"
    return f"{100 * (row.effect - 1):+.1f}%"


def _key(row: Row) -> str:
    return f"{row.workload} {row.trainer} {row.world_size} ranks"


COUNTED = ("regressed", "inconclusive", "improved", "unchanged")


def summary_line(rows: list[Row]) -> str:
    """One line for a PR comment's title: the outcome and exit code, what regressed (the
    first three), and the count of each verdict."""
    regressed = [f"{_key(r)} {r.metric} {_change(r)}" for r in rows if r.verdict == "regressed"]
    what = ", ".join(regressed[:3]) + (f" and {len(regressed) - 3} more" if len(regressed) > 3 else "")
    counts = ", ".join(f"{sum(r.verdict == v for r in rows)} {v}" for v in COUNTED)
    return (f"fsbench: **{outcome(rows)}** (exit {exit_code(rows)})" + (f": {what}" if what else "")
            + f" | {counts} of {len(rows)} comparisons")


def markdown(rows: list[Row], notes: list[str], only_changed: bool = False) -> str:
    """The summary line, the table (`only_changed`: rows whose verdict is not unchanged),
    each key's design, every inconclusive reason with its remedy, and the notes."""
    mark = {"regressed": "**regressed**", "improved": "improved", "unchanged": "unchanged",
            "inconclusive": "*inconclusive*"}
    shown = [r for r in rows if r.metric != "*" and not (only_changed and r.verdict == "unchanged")]
    cells = [[r.workload, r.trainer, str(r.world_size), r.metric, _fmt(r.base_total),
              _fmt(r.new_total), _fmt_effect(r), _fmt(r.p_adjusted), mark[r.verdict]] for r in shown]
    lines = [summary_line(rows), ""]
    if cells or not only_changed:
        lines.append(grid(["workload", "trainer", "ranks", "metric", "base", "new", "change [95% CI]",
                           "p (Holm)", "verdict"], cells,
                          align=["left", "left", "right", "left", "right", "right", "left", "right", "left"]))
    else:
        lines.append("Every comparison unchanged (--only-changed leaves them out).")
    if only_changed and len(shown) < sum(r.metric != "*" for r in rows):
        lines.append(f"\n{sum(r.verdict == 'unchanged' for r in rows)} unchanged row(s) left out "
                     "(--only-changed).")
    lines.append("")
    for r in rows:
        if r.metric == "step_time_ms":
            lines.append(f"- {_key(r)}: design "
                         f"{'paired' if r.pairing != 'none' and 'unpaired' not in r.pairing else ''} "
                         f"{r.pairing}, {r.units} units (randomization test on totals)".replace("  ", " "))
    for r in rows:
        if r.verdict == "inconclusive":
            lines.append(f"- inconclusive: {_key(r)} "
                         f"{'(every metric)' if r.metric == '*' else r.metric}: {r.reason}. "
                         f"To settle it: {r.remedy}.")
    lines += [f"- note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def junit(rows: list[Row], notes: list[str], name: str = "fsbench compare") -> str:
    """JUnit XML: a test suite per (workload, trainer, world size), a test case per metric
    ("every metric" for a key that could not be compared at all). Regressed is a failure,
    inconclusive a skip whose message gives the reason and the remedy; unchanged and
    improved pass, their change in the case's output. The notes go to each suite's output."""
    import xml.etree.ElementTree as ET

    def counts(of: list[Row]) -> dict[str, str]:
        return {"tests": str(len(of)), "failures": str(sum(r.verdict == "regressed" for r in of)),
                "skipped": str(sum(r.verdict == "inconclusive" for r in of)), "errors": "0"}

    root = ET.Element("testsuites", name=name, **counts(rows))
    keys: dict[str, list[Row]] = {}
    for r in rows:
        keys.setdefault(_key(r), []).append(r)
    for key, of in keys.items():
        suite = ET.SubElement(root, "testsuite", name=key, **counts(of))
        for r in of:
            case = ET.SubElement(suite, "testcase", name="every metric" if r.metric == "*" else r.metric,
                                 classname=f"fsbench.{r.workload}.{r.trainer}.n{r.world_size}")
            detail = (f"{r.metric}: base {_fmt(r.base_total)}, new {_fmt(r.new_total)}, change "
                      f"{_fmt_effect(r) if r.metric != '*' else 'n/a'}, p (Holm) {_fmt(r.p_adjusted)}, "
                      f"design {r.pairing}, {r.units} units")
            if r.verdict == "regressed":
                ET.SubElement(case, "failure", type="regressed",
                              message=f"regressed: {_change(r)}").text = detail
            elif r.verdict == "inconclusive":
                ET.SubElement(case, "skipped",
                              message=f"inconclusive: {r.reason}. To settle it: {r.remedy}.")
            else:
                ET.SubElement(case, "system-out").text = f"{r.verdict}: {detail}"
        ET.SubElement(suite, "system-out").text = "\n".join(notes)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def render(rows: list[Row], notes: list[str], fmt: str, only_changed: bool = False,
           name: str = "fsbench compare") -> str:
    """The output in --format md | json | junit."""
    if fmt == "json":
        return to_json(rows, notes)
    if fmt == "junit":
        return junit(rows, notes, name)
    return markdown(rows, notes, only_changed)


def to_json(rows: list[Row], notes: list[str]) -> str:
    clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v  # noqa: E731
    return json.dumps({"outcome": outcome(rows), "exit_code": exit_code(rows),
                       "rows": [{k: clean(v) for k, v in dataclasses.asdict(r).items()} for r in rows],
                       "notes": notes,
                       "regressions": sum(r.verdict == "regressed" for r in rows),
                       "inconclusive": sum(r.verdict == "inconclusive" for r in rows)}, indent=1)
