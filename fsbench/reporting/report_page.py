"""`fsbench report --format html`: one self-contained page.

The page holds inline CSS, the result table with every simulated, emulated, oversubscribed
or contended row marked (a tinted row and a labelled badge beside the trainer), every plot
as a base64 PNG data URI, and where the numbers came from: each run's machine, git commit,
package versions, configuration and the command that repeats it, read from the runs'
manifest.json. It loads nothing from anywhere (no scripts, stylesheets, fonts or images
elsewhere), so it can be attached to a CI job, mailed, or opened offline.
"""
from __future__ import annotations

import base64
import functools
import json
import shlex
from html import escape
from pathlib import Path

import pandas as pd

from fsbench.running import store
from fsbench.config import ConfigError
from fsbench.training.trainer import option_defaults, resolve_trainer_class

# What a row mark means, in a few words (the notes under the table say it in full).
MARK_LABELS = {"simulated": "projected by the cost model, not measured",
               "emulated": "compute replaced by the cost model's time",
               "oversubscribed": "wall-clock cells measure time-sharing",
               "contended": "another process took CPU time"}
TEXT_COLUMNS = ("workload", "trainer")
# Run-config fields the command line already says (or that do not change the run).
IN_COMMAND = ("trainer", "world_size", "seed", "trainer_options", "workload")

# The page's columns, the answer first: who, at what size, how fast against the baseline,
# then what the step time was made of; every other column after, as the table has them.
FIRST = ("trainer", "world_size", "throughput_vs_", "samples_per_s", "step_time_ms_median",
         "bubble_ratio", "straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio",
         "other_idle_ratio")
ALWAYS_SHOWN = ("trainer", "world_size")  # never folded into the header, even when constant
SILENT_WHEN_FALSE = ("contention_unknown",)

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; max-width: 1400px;
       overflow-wrap: break-word; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.lead { color: #555; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: .3em .35em; border-bottom: 1px solid #e3e3e3; text-align: right; white-space: nowrap; }
/* The page fits 1,400 px (tests/test_report_page.py): headers wrap between words, a long
   text cell (a data=recbole:PATH workload) anywhere; a number never breaks. */
th { background: #f2f2f2; font-weight: 600; white-space: normal; vertical-align: bottom;
     font-size: .85em; }
td.text, th.text { text-align: left; }
table.results td.text { white-space: normal; overflow-wrap: anywhere; min-width: 7em; }
tr.simulated td { background: #eaf1ff; font-style: italic; }
tr.emulated td { background: #f2ecff; }
tr.oversubscribed td, tr.contended td { background: #fff2dc; }
.mark { display: inline-block; font-size: .75em; font-style: normal; color: #fff; padding: 0 .45em;
        border-radius: .7em; margin-left: .4em; }
.mark.simulated { background: #2b5fb4; } .mark.emulated { background: #6f42b0; }
.mark.oversubscribed { background: #b36b00; } .mark.contended { background: #b3261e; }
.notes p { margin: .3em 0; color: #444; font-size: .92em; }
figure { margin: 1.2em 0 2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .92em; }
code, pre { font: .9em ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: #f6f6f6; padding: .7em; overflow-x: auto; }
td code { white-space: nowrap; }
table.meta td { border: none; padding: .15em .8em .15em 0; text-align: left; white-space: normal; }
table.meta td:first-child { color: #666; white-space: nowrap; }
.dirty { color: #fff; background: #b3261e; padding: 0 .45em; border-radius: .7em; font-size: .85em; }
"""


# ---------------------------------------------------------------------------- sources

@functools.lru_cache(maxsize=None)
def _option_defaults(trainer: str) -> dict[str, str]:
    """The trainer's switches at their defaults; {} when it does not import here."""
    try:
        return option_defaults(resolve_trainer_class(trainer))
    except (ConfigError, ImportError):
        return {}


def run_command(manifest: dict) -> str:
    """The `fsbench run` command line that repeats a run, from its manifest: the preset,
    the workload overrides its name records (`small+lengths=yelp`), step counts that differ
    from the preset's, the trainer's switches that differ from its defaults (all of them
    when the trainer cannot be imported here), and non-default run settings."""
    from fsbench.workloads.presets import get_workload

    config = manifest.get("config") or {}
    name = str(manifest.get("workload", ""))
    preset, _, overrides = name.partition("+")
    args = ["fsbench", "run", "--workload", preset, "--trainer", str(manifest.get("trainer")),
            "--world-size", str(manifest.get("world_size")), "--seed", str(manifest.get("seed"))]
    sets: list[str] = []
    for piece in overrides.split(",") if overrides else []:
        if "=" in piece or not sets:  # a value may hold commas (tuple fields)
            sets.append(piece)
        else:
            sets[-1] += "," + piece
    workload = config.get("workload") or {}
    try:
        defaults = get_workload(preset)
    except ConfigError:
        defaults = None  # a preset this checkout does not have: its step counts are unknown
    for key in ("steps", "warmup"):
        if defaults is not None and key in workload and workload[key] != getattr(defaults, key):
            args += [f"--{key}", str(workload[key])]
    for flag, key, default in (("--device", "device", "cpu"), ("--threads", "threads_per_rank", 1),
                               ("--input-workers", "input_workers", 1)):
        if key in config and config[key] != default:
            args += [flag, str(config[key])]
    trainer = str(manifest.get("trainer"))
    defaults = _option_defaults(trainer)  # a switch at its default is left out of the command
    sets += [f"{trainer}.{k}={v}" for k, v in (config.get("trainer_options") or {}).items()
             if k not in defaults or str(v) != str(defaults[k])]
    for pair in sets:
        args += ["--set", pair]
    return " ".join(shlex.quote(a) for a in args)


def run_sources(runs: pd.DataFrame) -> list[dict]:
    """For every run of `runs` with a readable manifest.json: run_id, trainer, workload,
    world_size, seed, git_sha, created, host, packages, config and command. Rows without
    one (simulated rows) are left out."""
    out = []
    for run_dir in runs.get("run_dir", pd.Series(dtype=object)).dropna():
        path = Path(str(run_dir)) / "manifest.json"
        if not path.is_file():
            continue
        try:
            m = store.read_json(path)
        except (OSError, ValueError):
            continue  # select_runs warned about it already
        out.append({"run_id": m.get("run_id", Path(str(run_dir)).name), "trainer": m.get("trainer"),
                    "workload": m.get("workload"), "world_size": m.get("world_size"),
                    "seed": m.get("seed"), "git_sha": m.get("git_sha"), "created": m.get("created"),
                    "host": m.get("host") or {}, "packages": m.get("packages") or {},
                    "config": m.get("config") or {}, "command": run_command(m),
                    "simulated": bool(m.get("simulated", False))})
    return out


# ---------------------------------------------------------------------------- page

def _table(cells: pd.DataFrame, table: pd.DataFrame, marks: dict[str, str],
           flags_from: pd.DataFrame) -> str:
    """The result table (`table`'s columns, `cells` their text): a row's flags (read from
    `flags_from`, which still has the folded columns) as its CSS classes and as badges
    beside its trainer, each badge with its footnote symbol."""
    keys = list(table.columns)
    head = "".join(f'<th class="{"text" if k in TEXT_COLUMNS else "num"}">{escape(h)}</th>'
                   for k, h in zip(keys, cells.columns))
    rows = []
    for i in range(len(cells)):
        flags = [f for f in marks if f in flags_from and bool(flags_from[f].iloc[i])]
        tds = []
        for j, key in enumerate(keys):
            text = escape(str(cells.iat[i, j]))
            if key == "trainer":
                text += "".join(f'<span class="mark {f}" title="{escape(f + ": " + MARK_LABELS[f])}">'
                                f"{escape(marks[f])} {f}</span>" for f in flags)
            tds.append(f'<td class="{"text" if key in TEXT_COLUMNS else "num"}">{text}</td>')
        cls = f' class="{" ".join(flags)}"' if flags else ""
        rows.append(f"<tr{cls}>{''.join(tds)}</tr>")
    return (f'<table class="results"><thead><tr>{head}</tr></thead>\n<tbody>\n'
            + "\n".join(rows) + "\n</tbody></table>")


def _kv_table(rows: list[tuple[str, str]], header: tuple[str, str]) -> str:
    body = "".join(f'<tr><td class="text">{escape(k)}</td><td class="text">{escape(v)}</td></tr>'
                   for k, v in rows)
    return (f'<table><thead><tr><th class="text">{escape(header[0])}</th>'
            f'<th class="text">{escape(header[1])}</th></tr></thead><tbody>{body}</tbody></table>')


def _grouped(sources: list[dict], key: str) -> list[tuple[dict, list[str]]]:
    """Distinct values of sources' `key` (dicts), each with the run ids that have it."""
    groups: dict[str, tuple[dict, list[str]]] = {}
    for s in sources:
        value = s[key]
        if key == "config":  # what the command line does not say, the workload's fields first
            value = {"workload": value.get("workload"),
                     **{k: v for k, v in value.items() if k not in IN_COMMAND}}
        groups.setdefault(json.dumps(value, sort_keys=True, default=str), (value, []))[1].append(s["run_id"])
    return list(groups.values())


def _sources(sources: list[dict], simulated: bool) -> str:
    if not sources:
        return "<p>No run directory with a manifest.json among the reported rows.</p>"
    parts = ["<h3>Machines</h3>"]
    for host, ids in _grouped(sources, "host"):
        parts.append(_kv_table([(k, str(v)) for k, v in host.items()] + [("runs", str(len(ids)))],
                               ("host", "value")))
    shas = list(dict.fromkeys(str(s["git_sha"] or "unknown (not a git checkout)") for s in sources))
    parts.append("<h3>Code</h3><p>git commit" + ("s" if len(shas) > 1 else "") + ": "
                 + ", ".join(f"<code>{escape(x)}</code>" for x in shas) + "</p>")
    for packages, ids in _grouped(sources, "packages"):
        parts.append(_kv_table(sorted((k, str(v)) for k, v in packages.items()),
                               ("package", f"version ({len(ids)} runs)")))
    parts.append("<h3>Runs and the commands that repeat them</h3>")
    body = "".join(
        f'<tr><td class="text">{escape(str(s["run_id"]))}</td>'
        f'<td class="text">{escape(str(s["git_sha"] or "")[:10])}</td>'
        f'<td class="text">{escape(str((s["host"] or {}).get("hostname", "")))}</td>'
        f'<td class="text"><code>{escape(s["command"])}</code></td></tr>' for s in sources)
    parts.append('<div class="scroll"><table><thead><tr><th class="text">run</th>'
                 '<th class="text">git</th><th class="text">host</th><th class="text">command</th>'
                 f"</tr></thead><tbody>{body}</tbody></table></div>")
    parts.append("<h3>Configurations</h3>")
    for config, ids in _grouped(sources, "config"):
        name = (config.get("workload") or {}).get("name", "?")
        parts.append(f"<details><summary>workload <code>{escape(str(name))}</code>, {len(ids)} "
                     f"run{'s' if len(ids) > 1 else ''}</summary><pre>"
                     f"{escape(json.dumps(config, indent=1, sort_keys=True, default=str))}</pre></details>")
    if simulated:
        parts.append("<p>Simulated rows come from the cost model, not from run directories.</p>")
    return "\n".join(parts)


def arranged(table: pd.DataFrame, cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[str, str]]]:
    """The page's table: FIRST columns first, and every column whose cells read the same
    in every row (of two or more) taken out and returned as (header, value) for the
    header, so that the table shows what differs."""
    keys = list(table.columns)

    def rank(key: str) -> int:
        return next((i for i, k in enumerate(FIRST) if key == k or (k.endswith("_") and key.startswith(k))),
                    len(FIRST))
    order = sorted(range(len(keys)), key=lambda i: (rank(keys[i]), i))
    folded = [] if len(table) < 2 else [
        i for i in order if keys[i] not in ALWAYS_SHOWN and cells.iloc[:, i].nunique() == 1]
    kept = [i for i in order if i not in folded]
    # A bookkeeping flag false in every row says nothing (the legend covers the true case).
    # The header lists the rest in the table's own order (workload first), not the page's.
    said = sorted(i for i in folded if not (keys[i] in SILENT_WHEN_FALSE and not table.iloc[0, i]))
    return (table.iloc[:, kept], cells.iloc[:, kept],
            [(str(cells.columns[i]), str(cells.iat[0, i])) for i in said])


def _png_width(data: bytes) -> int:
    """A PNG's width in pixels (its IHDR chunk). The plots are drawn at twice the density
    they are shown at (fsbench.reporting.plots.PNG_DPI), so the page shows them at half."""
    return int.from_bytes(data[16:20], "big")


def _machine_line(host: dict) -> str:
    parts = [str(host.get("cpu_model") or "CPU unknown"), f"{host.get('cpus', '?')} cores",
             ", ".join(host.get("gpus") or []) or "no GPU", f"Python {host.get('python', '?')}"]
    return f"{host.get('hostname', '?')}: " + ", ".join(parts)


def _header(sources: list[dict], generated: str, command: str | None,
            folded: list[tuple[str, str]]) -> str:
    """Date, machine(s), commit(s) with uncommitted changes flagged, the command that made
    the page, and the columns that are the same in every row."""
    rows = [("made", escape(generated))]
    # Simulated rows were computed on a machine, not measured on it: only measured runs
    # name the machine the numbers are of.
    measured = [s for s in sources if not s.get("simulated")]
    hosts = _grouped(measured, "host") if measured else []
    if sources and not measured:
        rows.append(("machine", "none: every row is projected by the cost model (fsbench "
                                "simulate), not measured"))
    if hosts:
        lines = [escape(_machine_line(h)) + (f" ({len(ids)} runs)" if len(hosts) > 1 else "")
                 for h, ids in hosts]
        warn = ' <span class="dirty">runs from different machines</span>' if len(hosts) > 1 else ""
        rows.append(("machine", "<br>".join(lines) + warn))
        torches = list(dict.fromkeys(str((s.get("packages") or {}).get("torch") or "unknown")
                                     for s in measured))
        rows.append(("torch", escape(", ".join(torches)) + (
            ' <span class="dirty">runs from different torch versions</span>' if len(torches) > 1 else "")))
    shas = list(dict.fromkeys(str(s.get("git_sha") or "unknown") for s in sources))
    if shas:
        rows.append(("commit", ", ".join(
            f"<code>{escape(x.removesuffix('-dirty')[:12])}</code>"
            + (' <span class="dirty">dirty: uncommitted changes, not reproducible from the '
               'commit alone</span>' if x.endswith("-dirty") else "") for x in shas)))
    if command:
        rows.append(("command", f"<code>{escape(command)}</code>"))
    if folded:
        rows.append(("every row", "; ".join(f"{escape(h)}: {escape(v)}" for h, v in folded)))
    return '<table class="meta">' + "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def page(table: pd.DataFrame, cells: pd.DataFrame, notes: list[str], marks: dict[str, str],
         figures: list[tuple[str, bytes]], sources: list[dict], title: str = "fsbench report",
         command: str | None = None, generated: str | None = None) -> str:
    """The whole report as one HTML page.

    Args:
        table: the report table (fsbench.reporting.report.report_table), for the rows' flags.
        cells: its display strings (wall-clock cells already marked), same rows and columns.
        notes: the notes under the table.
        marks: flag column -> its symbol (fsbench.reporting.report.ROW_MARKS).
        figures: (caption, PNG bytes) per plot, embedded as data URIs.
        sources: run_sources(runs).
        command: the command line that made the page, shown in its header.
        generated: when, as text (default: now, UTC).
    """
    import datetime

    generated = generated or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    present = [f for f in marks if f in table and table[f].any()]
    legend = ("Marked rows: " + "; ".join(f'<span class="mark {f}">{escape(marks[f])} {f}</span> '
                                          f"{escape(MARK_LABELS[f])}" for f in present) + "."
              if present else "Every row is measured on real compute, not oversubscribed, and "
              + ("uncontended." if not table.get("contention_unknown", pd.Series(False)).any()
                 else "with contention unknown on some rows (no schedstat on their machine)."))
    summary = (f"{len(table)} rows; workloads: {', '.join(dict.fromkeys(map(str, table['workload'])))}; "
               f"trainers: {', '.join(dict.fromkeys(map(str, table['trainer'])))}; world sizes: "
               f"{', '.join(map(str, sorted(set(table['world_size']))))}.")
    shown_table, shown_cells, folded = arranged(table, cells)
    figs = "\n".join(
        f'<figure><img alt="{escape(caption)}" width="{_png_width(data) // 2}" src="data:image/png;base64,'
        f'{base64.b64encode(data).decode("ascii")}"><figcaption>{escape(caption)}</figcaption></figure>'
        for caption, data in figures) or "<p>No plots in this report.</p>"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="lead">{escape(summary)}</p>
{_header(sources, generated, command, folded)}
<h2>Results</h2>
<p class="legend">{legend}</p>
<div class="scroll">{_table(shown_cells, shown_table, marks, table)}</div>
<div class="notes">{"".join(f"<p>{escape(n)}</p>" for n in notes)}</div>
<h2>Plots</h2>
{figs}
<h2>Where these numbers come from</h2>
{_sources(sources, bool(table["simulated"].any()))}
</body>
</html>
"""
