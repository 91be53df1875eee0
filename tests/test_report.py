"""`fsbench report`: the comparison table, its renderings, the plots, the CLI."""
import io
import math
import sys

import pandas as pd
import pytest

from fsbench.cli import main
from fsbench.config import ConfigError
from fsbench.reporting.plot_data import cause_bars, choose_step_run, median_step_busy_idle, step_timeline
from fsbench.reporting.plots import PLOTS
from fsbench.reporting.report import render, report_table, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(trainer, n, samples, step_ms, *, sim=False, over=False, status="complete",
         bubble=0.1, imbalance=0.02):
    return {"workload": "w", "trainer": trainer, "world_size": n, "samples_per_s": samples,
            "tokens_per_s": 10 * samples, "step_time_ms_median": step_ms,
            "bubble_ratio": bubble, "straggler_bubble_ratio": bubble / 2,
            "exposed_comm_ratio": bubble / 2, "load_imbalance": imbalance,
            "sm_occupancy": None, "oversubscribed": over, "simulated": sim, "status": status,
            "run_dir": f"/runs/{trainer}-n{n}-{samples}"}


@pytest.fixture
def runs() -> pd.DataFrame:
    return pd.DataFrame([
        _run("fs", 1, 100.0, 10.0),  # fs first: the default baseline is still ddp
        _run("ddp", 1, 100.0, 10.0, bubble=0.1),
        _run("ddp", 1, 120.0, 12.0, bubble=0.3),
        _run("ddp", 1, 110.0, 11.0, bubble=0.2),
        _run("ddp", 1, 999.0, 1.0, status="failed"),  # never counted
        _run("ddp", 2, 180.0, 20.0),
        _run("ddp", 2, 200.0, 22.0),
        _run("fs", 2, 210.0, 19.0),
        _run("fs", 4, 300.0, 25.0, over=True, imbalance=0.05),
        _run("ddp", 8, 640.0, 30.0),
        _run("ddp", 8, 700.0, 28.0, sim=True),  # a projection: its own row, never pooled
        _run("fs", 8, 560.0, 32.0, sim=True),
    ])


def _row(table, trainer, n, sim=False):
    sel = table[(table["trainer"] == trainer) & (table["world_size"] == n) & (table["simulated"] == sim)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_report_table_medians_scaling_and_baseline_ratios(runs):
    table = report_table(runs, None)
    assert "throughput_vs_ddp" in table.columns  # ddp is the default baseline when present
    assert list(zip(table["trainer"], table["world_size"], table["simulated"])) == [
        ("ddp", 1, False), ("ddp", 2, False), ("ddp", 8, False), ("fs", 1, False),
        ("fs", 2, False), ("fs", 4, False), ("ddp", 8, True), ("fs", 8, True)]
    d1 = _row(table, "ddp", 1)
    assert (d1["repeats"], d1["samples_per_s"], d1["step_time_ms_median"]) == (3, 110.0, 11.0)
    assert d1["bubble_ratio"] == pytest.approx(0.2) and d1["tokens_per_s"] == 1100.0
    assert d1["scaling_efficiency"] == 1.0 and d1["throughput_vs_ddp"] == 1.0
    assert d1["samples_per_s_spread"] == pytest.approx((120 - 100) / 110)  # over repeats
    d2 = _row(table, "ddp", 2)
    assert d2["samples_per_s"] == 190.0 and d2["step_time_ms_median"] == 21.0
    assert d2["scaling_efficiency"] == pytest.approx(190 / (2 * 110))
    f2 = _row(table, "fs", 2)
    assert f2["scaling_efficiency"] == pytest.approx(210 / (2 * 100))
    assert f2["throughput_vs_ddp"] == pytest.approx(210 / 190)
    f4 = _row(table, "fs", 4)
    assert bool(f4["oversubscribed"]) and not bool(f2["oversubscribed"])
    assert math.isnan(f4["throughput_vs_ddp"])  # no ddp run at 4 ranks
    assert f4["scaling_efficiency"] == pytest.approx(300 / 400)
    # Simulated rows compare with simulated rows only: no simulated 1-rank run, so no
    # scaling efficiency (pooling with the measured 1-rank run would give 700/880).
    s8 = _row(table, "ddp", 8, sim=True)
    assert s8["samples_per_s"] == 700.0 and math.isnan(s8["scaling_efficiency"])
    assert _row(table, "fs", 8, sim=True)["throughput_vs_ddp"] == pytest.approx(560 / 700)
    assert _row(table, "ddp", 8)["samples_per_s"] == 640.0
    assert table["sm_occupancy"].isna().all()


def test_baseline_default_and_explicit(runs):
    no_ddp = runs[runs["trainer"] != "ddp"]
    assert "throughput_vs_fs" in report_table(no_ddp, None).columns  # first trainer present
    table = report_table(runs, "fs")
    assert _row(table, "ddp", 2)["throughput_vs_fs"] == pytest.approx(190 / 210)
    assert list(table["trainer"][:3]) == ["fs"] * 3  # the baseline's rows first
    with pytest.raises(ConfigError, match="baseline 'nope' has no runs"):
        report_table(runs, "nope")


def _md_rows(text: str) -> list[dict]:
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    return [dict(zip(lines[0], r)) for r in lines[2:]]


def test_markdown_marks_oversubscribed_wall_clock_cells_and_na(runs):
    text = render(report_table(runs, None), "md")
    rows = _md_rows(text)
    (f4,) = [r for r in rows if (r["trainer"], r["ranks"]) == ("fs", "4")]
    flagged = ("step ms", "samples/s", "tokens/s", "bubble %", "straggler %", "exposed comm %",
               "scaling eff %")
    assert all(f4[col].endswith("†") for col in flagged), f4
    assert f4["imbalance %"] == "5.0" and f4["SM occ %"] == "n/a"
    assert f4["throughput vs ddp"] == "n/a" and f4["oversub"] == "yes" and f4["simulated"] == "no"
    assert [r["simulated"] for r in rows].count("yes") == 2
    assert text.count("†") == len(flagged) + 1, "only that row's cells, plus the footnote"
    assert any(line.startswith("† oversubscribed") for line in text.splitlines())
    assert "simulated = yes" in text


def test_every_format_renders_and_parses_back(runs):
    table = report_table(runs, None)
    back = pd.read_csv(io.StringIO(render(table, "csv")))
    assert list(back.columns) == list(table.columns)
    pd.testing.assert_series_equal(back["samples_per_s"], table["samples_per_s"])
    assert back["oversubscribed"].tolist() == table["oversubscribed"].tolist()
    assert back["simulated"].tolist() == table["simulated"].tolist()
    html = render(table, "html")
    results = html[html.index('<table class="results">'):]
    results = results[:results.index("</table>")]
    assert results.count("<tr") == len(table) + 1, "a header and a row per table row"
    assert "† oversubscribed" in html
    latex = render(table, "latex")
    assert r"\begin{tabular}" in latex and r"\end{tabular}" in latex
    assert r"bubble \%" in latex and r"\textsuperscript{\dag}" in latex and "†" not in latex
    with pytest.raises(ConfigError, match="--format 'pdf' is unknown; choose one of: md, latex, csv, html"):
        render(table, "pdf")


def test_median_step_busy_idle_picks_the_median_measured_step():
    rows = []
    for step, t_ms in ((0, 50), (1, 10), (2, 30), (3, 20)):  # step 0 is a slow warm-up
        for rank, busy_ms in ((0, 8), (1, 4)):
            start = step * 100_000_000
            rows += [(rank, step, step == 0, "step", "step", start, t_ms * 1_000_000, 0),
                     (rank, step, step == 0, "forward", "compute", start, busy_ms * 1_000_000,
                      busy_ms * 1_000_000)]
    spans = pd.DataFrame(rows, columns=["rank", "step", "warmup", "name", "kind", "start_ns",
                                        "dur_ns", "cpu_ns"])
    step, t_ms, per_rank = median_step_busy_idle(spans)
    assert (step, t_ms) == (3, 20.0)  # measured 10, 20, 30 ms: the median is step 3
    assert per_rank.to_dict("list") == {"rank": [0, 1], "busy_ms": [8.0, 4.0], "idle_ms": [12.0, 16.0]}


def test_cause_bars_stack_to_the_bubble_ratio_of_every_row():
    def run(trainer, n, causes, sim=False):
        r = _run(trainer, n, 100.0 * n, 10.0, sim=sim, bubble=sum(causes))
        r.update(zip(("straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio",
                      "other_idle_ratio"), causes))
        return r

    older = _run("fs", 4, 300.0, 20.0, bubble=0.3)  # a run from before the bubble was split
    older["straggler_bubble_ratio"] = older["exposed_comm_ratio"] = None
    runs = pd.DataFrame([
        older,
        run("ddp", 1, (0.0, 0.0, 0.05, 0.05)),
        # Three repeats whose causes' medians (0.2, 0.2, 0, 0.1) sum to 0.5, while the
        # median bubble is 0.4: the bar must keep the bubble's height.
        run("ddp", 2, (0.1, 0.2, 0.0, 0.1)), run("ddp", 2, (0.3, 0.0, 0.0, 0.1)),
        run("ddp", 2, (0.2, 0.2, 0.0, 0.1)),
        run("fs", 2, (0.02, 0.03, 0.01, 0.04)),
        run("fs", 8, (0.1, 0.1, 0.0, 0.0), sim=True),
    ])
    table = report_table(runs, None)
    bars = cause_bars(table)
    causes = ["straggler_bubble_ratio", "exposed_comm_ratio", "input_stall_ratio", "other_idle_ratio"]
    stacked = bars[causes + ["unsplit"]].sum(axis=1)
    assert stacked.to_numpy() == pytest.approx(table["bubble_ratio"].to_numpy())
    assert list(bars["trainer"]) == list(table["trainer"]) and list(bars["simulated"]) == list(table["simulated"])
    d2 = bars[(bars["trainer"] == "ddp") & (bars["world_size"] == 2)].iloc[0]
    assert d2["bubble_ratio"] == pytest.approx(0.4)
    assert d2[causes].tolist() == pytest.approx([0.16, 0.16, 0.0, 0.08])  # 0.2:0.2:0:0.1 of 0.4
    f2 = bars[(bars["trainer"] == "fs") & (bars["world_size"] == 2)].iloc[0]
    assert f2[causes].tolist() == pytest.approx([0.02, 0.03, 0.01, 0.04])  # one repeat: as measured
    f4 = bars[bars["world_size"] == 4].iloc[0]
    assert f4["unsplit"] == pytest.approx(0.3) and f4[causes].sum() == 0
    assert (bars.loc[bars["world_size"] != 4, "unsplit"] == 0).all()


def _span(rank, step, kind, name, start_ms, dur_ms, cpu_ms=None, nested=False, warmup=False):
    return {"rank": rank, "step": step, "warmup": warmup, "name": name, "kind": kind,
            "start_ns": int(start_ms * 1e6), "dur_ns": int(dur_ms * 1e6),
            "cpu_ns": int((dur_ms if cpu_ms is None else cpu_ms) * 1e6), "runq_ns": 0,
            "gpu_ns": None, "nested": nested, "overhead_ns": 0}


def test_step_timeline_keeps_each_ranks_partition_inside_its_step_window():
    rows = []
    for step, t in ((0, 90), (1, 30), (2, 50), (3, 40)):  # measured 30, 50, 40: median step 3
        base = step * 1000
        for rank in (0, 1):
            s = base + 10 + rank  # rank 1's step starts 1 ms later
            rows += [_span(rank, step, "probe", "probe", base, 3, warmup=step == 0),
                     _span(rank, step, "wait", "barrier", base + 4, s - base - 4, warmup=step == 0),
                     _span(rank, step, "step", "step", s, t - rank, warmup=step == 0),
                     _span(rank, step, "input", "input", s, 2, warmup=step == 0),
                     _span(rank, step, "compute", "forward", s + 2, 10 + 5 * rank, warmup=step == 0),
                     _span(rank, step, "compute", "backward", s + 12 + 5 * rank, 10, cpu_ms=6,
                           warmup=step == 0),
                     _span(rank, step, "compute", "hook", s + 13 + 5 * rank, 1, nested=True,
                           warmup=step == 0),
                     _span(rank, step, "flight", "allreduce", s + 20, 200, warmup=step == 0),
                     _span(rank, step, "comm", "allreduce", s + 22 + 5 * rank, 3, warmup=step == 0),
                     _span(rank, step, "wait", "sync", s + 25 + 5 * rank, 2, warmup=step == 0)]
    step, windows, segments = step_timeline(pd.DataFrame(rows))
    assert step == 3
    assert windows.to_dict("list") == {"rank": [0, 1], "start_ms": [0.0, 1.0], "end_ms": [40.0, 40.0]}
    assert set(segments["kind"]) == {"compute", "comm", "input"}
    assert set(segments["name"]) == {"input", "forward", "backward", "allreduce", "sync"}, \
        "no nested, flight, probe, barrier or step spans"
    w = windows.set_index("rank")
    assert (segments["start_ms"] >= segments["rank"].map(w["start_ms"])).all()
    assert (segments["end_ms"] <= segments["rank"].map(w["end_ms"])).all()
    r1 = segments[segments["rank"] == 1].set_index("name")
    assert (r1.loc["forward", "start_ms"], r1.loc["forward", "end_ms"]) == (3.0, 18.0)
    assert r1.loc["backward", "busy_ms"] == 6.0 and r1.loc["sync", "kind"] == "comm"
    assert segments.groupby("rank").size().tolist() == [5, 5]
    assert step_timeline(pd.DataFrame(rows), step=1)[0] == 1


def _flagged_runs() -> pd.DataFrame:
    runs = [_run("ddp", 1, 100.0, 10.0), _run("ddp", 2, 180.0, 11.0),
            _run("fs", 2, 190.0, 10.5), _run("fs", 4, 300.0, 14.0, over=True),
            _run("ddp", 8, 700.0, 12.0, sim=True), _run("fs", 8, 760.0, 11.0, sim=True)]
    runs[2]["contended"] = True
    runs[1]["emulated"] = True
    return pd.DataFrame(runs)


def test_latex_is_a_booktabs_table_with_every_mark():
    table = report_table(_flagged_runs(), None)
    tex = render(table, "latex")
    body = tex[tex.index(r"\begin{tabular}"):tex.index(r"\end{tabular}")]
    lines = body.splitlines()
    assert (lines[1], lines[3], lines[-1]) == (r"\toprule", r"\midrule", r"\bottomrule")
    assert r"\hline" not in tex
    rows = [ln for ln in lines[4:] if ln.endswith(r"\\")]
    assert len(rows) == len(table)
    assert lines.count(r"\midrule") == 2, "under the header, and between measured and simulated"
    header = lines[2]
    assert r"bubble \%" in header and r"straggler \%" in header and "oversub" not in header
    assert "SM occ" not in header, "a column with no value in any row is left out"
    cells = {(r.split(" & ")[1].split(r"\textsuperscript")[0], r.split(" & ")[2]): r for r in rows}
    assert cells[("ddp", "8")].split(" & ")[1] == r"ddp\textsuperscript{\S{}}"
    assert cells[("ddp", "2")].split(" & ")[1] == r"ddp\textsuperscript{\P{}}"
    assert cells[("fs", "4")].count(r"\textsuperscript{\dag}") >= 5  # its wall-clock cells
    assert cells[("fs", "2")].count(r"\textsuperscript{\ddag}") >= 5
    assert cells[("fs", "2")].split(" & ")[1] == "fs", "† and ‡ mark cells, not the trainer"
    assert r"\textsuperscript{" not in cells[("ddp", "1")]
    for note in (r"\dag{} oversubscribed", r"\ddag{} contended", r"\S{} simulated", r"\P{} emulated"):
        assert note in tex
    assert not any(ch in tex for ch in "†‡§¶")


def test_step_run_is_the_baselines_largest_measured_world_size(runs):
    assert choose_step_run(runs, "ddp") == "/runs/ddp-n8-640.0"
    assert choose_step_run(runs, "fs") == "/runs/fs-n4-300.0"


def test_missing_matplotlib_is_one_clear_line(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"plots need matplotlib: pip install -e '\.\[report\]'"):
        write_report(runs, None, "md", tmp_path)
    assert (tmp_path / "report.md").exists()  # the table does not need matplotlib
    write_report(runs, None, "md", tmp_path / "t", plots=False)


# ---------------------------------------------------------------------------- end to end

def _valid_png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 5_000


@pytest.mark.dist
def test_report_cli_writes_table_and_plots(tiny_sweep, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "rep"
    assert main(["report", "--store", str(tiny_sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in printed.splitlines()
            if line.startswith("|")]
    assert rows[0][:4] == ["workload", "trainer", "ranks", "simulated"]
    assert [r[:4] for r in rows[2:]] == [["tiny", t, n, "no"] for t in ("ddp", "freescale")
                                         for n in ("1", "2")]
    assert (out / "report.md").read_text().split("|")[1].strip() == "workload"
    speed = {k: p for k, p in PLOTS.items() if k != "learning"}  # no run here was evaluated
    assert not (out / PLOTS["learning"].file).exists() and "HR@10" not in printed
    for plot in speed.values():  # md: every plot as a PNG beside the table
        assert _valid_png(out / plot.file), plot.file
    html = tmp_path / "html"  # one page, the plots inside it, nothing beside it
    assert main(["report", "--store", str(tiny_sweep), "--format", "html", "--out", str(html)]) == 0
    assert [p.name for p in html.iterdir()] == ["report.html"]
    assert (html / "report.html").read_text().count('src="data:image/png;base64,') == len(speed)
    run_dirs = sorted(str(d) for d in tiny_sweep.iterdir() if d.is_dir())
    assert main(["report", *run_dirs, "--format", "csv", "--out", str(tmp_path / "csv"),
                 "--no-plots", "--step-run", run_dirs[0]]) == 0
    back = pd.read_csv(tmp_path / "csv" / "report.csv")
    assert back["world_size"].tolist() == [1, 2, 1, 2] and back["repeats"].tolist() == [1] * 4
    assert back["scaling_efficiency"].iloc[0] == 1.0


@pytest.mark.dist
@pytest.mark.parametrize("args, expected", [
    (["--workload", "nope"], "no complete runs matched in"),
    (["--trainers", "magic"], "(trainers=magic)"),
    (["--format", "pdf"], "argument --format: invalid choice: 'pdf'"),
    (["--baseline", "magic"], "baseline 'magic' has no runs here; trainers present: "),
    (["--step-run", "{tmp}"], "is not a run directory"),
    (["{tmp}"], "is not a run directory (no manifest.json)"),
])
def test_report_bad_input_is_one_line_and_exit_2(tiny_sweep, tmp_path, capsys, args, expected):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code = main(["report", "--store", str(tiny_sweep), "--out", str(tmp_path / "rep"), *args])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists(), "bad input writes nothing"


def test_report_of_a_missing_runs_dir_is_exit_2(tmp_path, capsys):
    assert main(["report", "--store", str(tmp_path / "none"), "--out", str(tmp_path / "r")]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.dist
def test_many_runs_show_a_progress_bar_on_a_terminal(tiny_sweep, tmp_path, capsys, monkeypatch):
    import shutil
    import sys

    from fsbench.reporting.report import PROGRESS_MIN_RUNS

    (one,) = [d for d in tiny_sweep.iterdir() if d.is_dir() and "-ddp-n2-" in d.name]
    for i in range(PROGRESS_MIN_RUNS):
        shutil.copytree(one, tmp_path / "runs" / f"copy-{i:02d}")
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)  # someone watches
    assert main(["report", "--store", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                 "--format", "csv", "--no-plots"]) == 0
    assert "reading runs" in capsys.readouterr().err
    assert pd.read_csv(tmp_path / "r" / "report.csv")["repeats"].tolist() == [PROGRESS_MIN_RUNS]


def test_unknown_contention_is_said_not_read_as_uncontended():
    """A run from a machine without schedstat has `contended: null`: the report's notes
    say contention is unknown there instead of counting the row as quiet."""
    from fsbench.reporting.report import footnotes

    known = pd.DataFrame([{**_run("ddp", 1, 100.0, 10.0), "contended": False},
                          {**_run("ddp", 2, 180.0, 11.0), "contended": False}])
    unknown = known.assign(contended=[False, None])
    assert not any("contention unknown" in n for n in footnotes(report_table(known, "ddp")))
    table = report_table(unknown, "ddp")
    assert table["contention_unknown"].tolist() == [False, True]
    assert not table["contended"].any()
    assert any("contention unknown" in n for n in footnotes(table))


LONG_WORKLOAD = ("small+data=recbole:/home/someone/datasets/recbole/ml-100k/ml-100k.inter,"
                 "model.dim=128,lengths=hist:/home/someone/lengths/kuairand-1k-histogram.csv")


def test_plot_titles_of_a_long_workload_stay_inside_their_figure(runs):
    """A `data=recbole:PATH` workload's name is long: each panel's title is wrapped to fit,
    not drawn past the figure's edge (where the PNG cuts it)."""
    from fsbench.reporting.plots import plot_bubble_causes, plot_vs_world_size

    table = report_table(runs.assign(workload=LONG_WORKLOAD), "ddp")
    for fig in (plot_vs_world_size(table, "samples_per_s", "samples/s", 1.0),
                plot_bubble_causes(table)):
        fig.canvas.draw()
        renderer, edge = fig.canvas.get_renderer(), fig.bbox
        for ax in fig.axes:
            box = ax.title.get_window_extent(renderer)
            assert edge.x0 <= box.x0 and box.x1 <= edge.x1, (ax.title.get_text(), box, edge)
            assert "ml-100k.inter" in ax.title.get_text().replace("\n", "")  # wrapped, not cut
