"""Every reader survives every store shape a user can make (issue 21).

`fsbench report` (md, latex, csv, html, plots included), `trace`, `compare`, `history` and
`summarize` either work or refuse in one line (`fsbench: error: ...`, exit 2; compare may
also say inconclusive, exit 3), never with a traceback, on: one run; one world size with no
1-rank run; simulated runs only; runs of an older summary schema beside new ones; a run
with missing, empty or garbage rank files, a garbage clock file, a corrupt or incomplete
manifest, or a garbage summary. Where the rest of the store is usable, the bad run is left
out with a line naming it and the readers go on.

Real runs are made once per module (tiny workload, few steps) and copied, then damaged.
"""
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsbench.cli import main

# Every shape starts from real runs (ranks on gloo): the dist tier.
# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]

FORMATS = ("md", "latex", "csv", "html")
PLOT_FILES = ("bubble_vs_world_size.png", "bubble_causes.png", "throughput_vs_world_size.png",
              "scaling_efficiency_vs_world_size.png")
TINY = ["--workload", "tiny", "--steps", "6", "--warmup", "2"]
# Keys of a summary.json as the first summary schema wrote it (before the bubble's causes,
# flags, memory and quality were recorded), for the mixed-schema stores.
OLD_SUMMARY_KEYS = ("run_id", "trainer", "workload", "world_size", "seed", "steps", "warmup",
                    "oversubscribed", "sm_occupancy", "sm_occupancy_reason", "steps_measured",
                    "step_time_ms_median", "samples_per_s", "tokens_per_s", "bubble_ratio",
                    "straggler_bubble_ratio", "exposed_comm_ratio", "load_imbalance")
OLD_MANIFEST_KEYS = ("schema_version", "run_id", "status", "created", "trainer", "workload",
                     "world_size", "seed", "config", "git_sha", "packages", "host",
                     "oversubscribed")


# ---------------------------------------------------------------------------- real runs

def _only_run(out: Path) -> Path:
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_rank")
    assert main(["run", *TINY, "--store", str(out)]) == 0
    return _only_run(out)


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    """A sweep at --world-sizes 2: a store with no 1-rank run."""
    out = tmp_path_factory.mktemp("two_rank")
    assert main(["sweep", *TINY, "--world-sizes", "2", "--store", str(out)]) == 0
    return _only_run(out)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """`fsbench simulate` runs: manifest and summary flagged simulated, no rank files."""
    out = tmp_path_factory.mktemp("simulated")
    assert main(["simulate", *TINY, "--trainers", "ddp", "--world-sizes", "8,16",
                 "--sim-store", str(out / "runs"), "--store", str(out / "calib")]) == 0
    return sorted(d for d in (out / "runs").iterdir() if d.is_dir())


@pytest.fixture
def sources(request):
    """The real runs a shape needs, by name: only the ones it asks for are made."""
    return lambda name: request.getfixturevalue(name)


# ---------------------------------------------------------------------------- shapes

def copy_run(src: Path, store: Path, run_id: str | None = None) -> Path:
    """A copy of run `src` in `store`, as its own run (`run_id` in its manifest and summary)."""
    run_id = run_id or src.name
    dst = store / run_id
    shutil.copytree(src, dst)
    for name in ("manifest.json", "summary.json"):
        doc = json.loads((dst / name).read_text())
        (dst / name).write_text(json.dumps({**doc, "run_id": run_id}))
    return dst


def _edit_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def old_schema(run: Path) -> None:
    """Rewrite a run as the first summary schema wrote it: fewer summary and manifest keys,
    timeline records without run-queue wait."""
    _edit_json(run / "summary.json", lambda s: {k: s[k] for k in OLD_SUMMARY_KEYS if k in s})
    _edit_json(run / "manifest.json", lambda m: {k: m[k] for k in OLD_MANIFEST_KEYS if k in m})
    for path in run.glob("rank-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "runq_ns"}) + "\n"
                                for r in records))


def _rank_files(run: Path) -> list[Path]:
    return [*run.glob("rank-*.jsonl"), *run.glob("steps-rank-*.jsonl")]


# How a run can be damaged; each takes the run directory.
DAMAGES = {
    "missing_rank_files": lambda run: [p.unlink() for p in _rank_files(run)],
    "empty_rank_files": lambda run: [p.write_text("") for p in _rank_files(run)],
    "binary_rank_files": lambda run: [p.write_bytes(b"\x00\xff\xfe garbage \x80\n\x81\x82")
                                      for p in _rank_files(run)],
    # Valid JSON, but not records: a list, a number, a record missing its fields, mid-file.
    "garbage_rank_lines": lambda run: [p.write_text('[1, 2]\n42\n{"rank": "x"}\n' + p.read_text())
                                       for p in _rank_files(run)],
    "garbage_clock_file": lambda run: [p.write_text("not json") for p in run.glob("clock-rank-*.json")],
    "manifest_not_json": lambda run: (run / "manifest.json").write_bytes(b"\x00{not json"),
    "manifest_without_world_size": lambda run: _edit_json(
        run / "manifest.json", lambda m: {k: v for k, v in m.items() if k != "world_size"}),
    "summary_not_json": lambda run: (run / "summary.json").write_text("garbage"),
    "summary_wrong_types": lambda run: _edit_json(
        run / "summary.json", lambda s: {**s, "samples_per_s": "fast", "bubble_ratio": [1],
                                         "step_time_ms_median": None}),
    "old_schema": old_schema,
}


def build(shape: str, store: Path, sources) -> Path:
    """Make store `shape` in `store`; return the run the one-run readers (trace,
    summarize) read: the damaged run where there is one."""
    store.mkdir(parents=True, exist_ok=True)
    if shape == "one_run":
        return copy_run(sources("one_rank"), store)
    if shape == "only_2_ranks":  # two repeats at 2 ranks: no 1-rank run
        copy_run(sources("two_rank"), store, "two-a")
        return copy_run(sources("two_rank"), store, "two-b")
    if shape in ("simulated_only", "measured_and_simulated"):
        sims = [copy_run(s, store) for s in sources("simulated")]
        return sims[0] if shape == "simulated_only" else copy_run(sources("one_rank"), store)
    if shape in ("simulate_store", "measured_and_simulate_store"):
        # where `fsbench simulate --store STORE` puts its runs: STORE/simulated/
        sims = [copy_run(s, store / "simulated") for s in sources("simulated")]
        return sims[0] if shape == "simulate_store" else copy_run(sources("one_rank"), store)
    shape, _, alone = shape.partition(":")
    if alone != "alone":  # the damaged run beside a good one: the store stays usable
        copy_run(sources("one_rank"), store, "good")
    run = copy_run(sources("one_rank"), store, "damaged")
    DAMAGES[shape](run)
    return run


SHAPES = ["one_run", pytest.param("only_2_ranks", marks=pytest.mark.dist), "simulated_only",
          "measured_and_simulated", *DAMAGES, "old_schema:alone", "missing_rank_files:alone",
          "manifest_not_json:alone"]
# The one shape without a complete run that has a readable manifest: report and history
# refuse it; every other store holds one, and they must work on it.
UNUSABLE = {"manifest_not_json:alone"}
# Shapes whose one-run readers see intact rank files: trace must work on them (a garbage
# clock file is refused: the spans' placement would be wrong).
TRACEABLE = {"one_run", "only_2_ranks", "measured_and_simulated", "manifest_not_json",
             "manifest_without_world_size", "summary_not_json", "summary_wrong_types",
             "old_schema", "old_schema:alone", "manifest_not_json:alone"}
# ... and summarize, which needs a readable manifest too.
SUMMARIZABLE = TRACEABLE - {"manifest_not_json", "manifest_without_world_size",
                            "manifest_not_json:alone"}


# ---------------------------------------------------------------------------- readers

def run_cli(argv: list[str], capsys, allowed: set[int]) -> tuple[int, str]:
    """main(argv): its exit code must be allowed, and it must fail (if at all) in one line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert rc in allowed, (argv, rc, err)
    errors = [line for line in err.splitlines() if line.startswith("fsbench: error:")]
    assert len(errors) == (1 if rc == 2 else 0), err
    return rc, err


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_report(shape, fmt, tmp_path, sources, capsys):
    build(shape, tmp_path / "store", sources)
    out = tmp_path / "report"
    # The plots are drawn once per shape, embedded in html: md, latex and csv write the
    # same render_plots bytes as files beside the table, which the specific cases below
    # (and test_report.py) check on real runs.
    plots = fmt == "html"
    rc, _ = run_cli(["report", "--store", str(tmp_path / "store"), "--format", fmt, "--out", str(out),
                     *([] if plots else ["--no-plots"])], capsys, {2} if shape in UNUSABLE else {0})
    if rc == 0:
        assert (out / f"report.{ {'latex': 'tex'}.get(fmt, fmt)}").stat().st_size > 0
        if plots:
            page = (out / "report.html").read_text()
            assert page.count("data:image/png;base64,") >= len(PLOT_FILES)


@pytest.mark.parametrize("shape", SHAPES)
def test_history(shape, tmp_path, sources, capsys):
    build(shape, tmp_path / "store", sources)
    out = tmp_path / "history"
    rc, _ = run_cli(["history", "--store", str(tmp_path / "store"), "--out", str(out)],
                    capsys, {2} if shape in UNUSABLE else {0})
    if rc == 0:
        assert (out / "history.html").exists() and (out / "history.md").exists()


@pytest.mark.parametrize("shape", SHAPES)
def test_compare(shape, tmp_path, sources, capsys):
    build(shape, tmp_path / "store", sources)
    store = str(tmp_path / "store")
    run_cli(["compare", store, store], capsys, {0, 2, 3})


@pytest.mark.parametrize("shape", SHAPES)
def test_trace(shape, tmp_path, sources, capsys):
    run = build(shape, tmp_path / "store", sources)
    rc, _ = run_cli(["trace", str(run), "--out", str(tmp_path / "trace.json")], capsys,
                    {0} if shape in TRACEABLE else {2})
    if rc == 0:
        assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


@pytest.mark.parametrize("shape", SHAPES)
def test_summarize(shape, tmp_path, sources, capsys):
    run = build(shape, tmp_path / "store", sources)
    rc, _ = run_cli(["summarize", str(run)], capsys, {0} if shape in SUMMARIZABLE else {2})
    if rc == 0:
        assert json.loads((run / "summary.json").read_text())["samples_per_s"] > 0


# ---------------------------------------------------------------------------- specific cases

def test_trace_says_which_rank_it_could_not_show(two_rank, tmp_path, capsys):
    """A 2-rank run whose rank 1 timeline is one unreadable line: the trace of rank 0 is
    written (exit 0) and a warning names rank 1, so its missing lane is not read as idle."""
    run = copy_run(two_rank, tmp_path / "store")
    (run / "rank-1.jsonl").write_bytes(b"\x00\xff garbage\n")
    _, err = run_cli(["trace", str(run), "--out", str(tmp_path / "t.json")], capsys, {0})
    assert "no timeline spans of rank(s) 1" in err


@pytest.mark.parametrize("shape", ["simulate_store", "measured_and_simulate_store"])
def test_readers_of_a_store_include_what_fsbench_simulate_put_in_it(shape, tmp_path, sources, capsys):
    """`fsbench simulate --store S` writes S/simulated/ (the store shapes above copy
    simulated runs into S itself); `report --store S` shows those rows marked simulated,
    apart from the measured one, with its plots; history keeps them a series of their own;
    compare names them as no measurement."""
    store = tmp_path / "store"
    build(shape, store, sources)
    for fmt in ("csv", "md"):
        run_cli(["report", "--store", str(store), "--format", fmt, "--out", str(tmp_path / fmt),
                 *(["--no-plots"] if fmt == "csv" else [])], capsys, {0})
    for name in PLOT_FILES:
        assert (tmp_path / "md" / name).stat().st_size > 0, name
    table = (tmp_path / "csv" / "report.csv").read_text().splitlines()
    header = table[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in table[1:]]
    measured = [("1", "False")] if shape.startswith("measured") else []
    assert sorted((r["world_size"], r["simulated"]) for r in rows) == \
        measured + [("16", "True"), ("8", "True")]
    run_cli(["history", "--store", str(store), "--out", str(tmp_path / "h")], capsys, {0})
    md = (tmp_path / "h" / "history.md").read_text()
    assert "8 (simulated)" in md and "16 (simulated)" in md
    other = tmp_path / "other"
    for sim in sources("simulated"):
        copy_run(sim, other / "simulated", f"{sim.name}-other")
    assert main(["compare", str(store), str(other)]) == 3  # nothing measured on both sides
    assert "simulated, not a measurement, left out" in capsys.readouterr().out


@pytest.mark.dist
def test_html_report_of_2_rank_runs_plots_scaling_against_2_ranks(two_rank, tmp_path, capsys):
    """No 1-rank run: scaling efficiency is n/a in the table, and its plot is drawn
    relative to the smallest world size present, labelled so."""
    from fsbench.reporting import plot_data, plots
    from fsbench.reporting import report

    store = tmp_path / "store"
    store.mkdir()
    copy_run(two_rank, store)
    out = tmp_path / "report"
    assert main(["report", "--store", str(store), "--format", "html", "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(plots.PLOTS) - 1  # no learning curves: no run was evaluated
    assert plots.PLOTS["scaling"].caption in page
    table = report.report_table(report.select_runs([], store), None)
    assert table["scaling_efficiency"].isna().all()  # n/a: no 1-rank run
    relative = plot_data.relative_scaling(table)
    assert list(relative["base_world_size"]) == [2] and list(relative["relative_efficiency"]) == [1.0]
    (legend,) = plots.plot_scaling(table).legends  # one, below the panels
    assert [t.get_text() for t in legend.get_texts()][0] == "ddp, relative to 2 ranks"


def test_a_damaged_rank_file_is_refused_naming_its_line_but_a_torn_last_line_is_not(tmp_path):
    from fsbench.config import ConfigError
    from fsbench.measurement.timeline import SPAN_FIELDS, read_records

    good = '{"rank": 0, "step": 0, "name": "step", "kind": "step", "start_ns": 1, "dur_ns": 2}\n'
    path = tmp_path / "rank-0.jsonl"
    path.write_text(good + '{"rank": 0, "st')  # a rank killed mid-write
    assert len(read_records(path, SPAN_FIELDS)) == 1
    for bad in ('{"rank": 0, "st\n', '[1, 2]\n', '{"rank": "0"}\n'):
        path.write_text(good + bad + good)
        with pytest.raises(ConfigError, match="rank-0.jsonl: line 2 "):
            read_records(path, SPAN_FIELDS)


def test_summarize_refuses_a_corrupt_manifest_in_one_line(one_rank, tmp_path, capsys):
    for damage in ("manifest_not_json", "manifest_without_world_size"):
        run = copy_run(one_rank, tmp_path, damage)
        DAMAGES[damage](run)
        assert main(["summarize", str(run)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fsbench: error:") and str(run) in err[0], err


def test_report_names_the_run_it_leaves_out_of_the_step_plots(one_rank, tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    copy_run(one_rank, store, "a-good")
    DAMAGES["missing_rank_files"](copy_run(one_rank, store, "z-damaged"))  # chosen first: last by name
    assert main(["report", "--store", str(store), "--format", "md", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "left out" in err and "z-damaged" in err, err
    assert (tmp_path / "r" / "rank_busy_idle.png").exists()


# Damages that leave a run without a row in the runs table (report and history skip it).
NO_ROW = {"manifest_not_json", "manifest_without_world_size", "summary_not_json"}


# A store mixing shapes: any subset of damaged copies beside simulated runs and, or not, an
# intact run. Report (html, every plot) and history must work whenever one complete run
# with a readable summary remains, and refuse in one line otherwise.
@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damages=st.lists(st.sampled_from(sorted(DAMAGES)), max_size=4),
       with_good=st.booleans(), with_simulated=st.booleans())
def test_mixed_store(one_rank, simulated, capsys, damages, with_good, with_simulated):
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        store.mkdir()
        if with_good:
            copy_run(one_rank, store, "good")
        for i, damage in enumerate(damages):
            DAMAGES[damage](copy_run(one_rank, store, f"d{i}-{damage}"))
        for s in simulated if with_simulated else []:
            copy_run(s, store)
        usable = with_good or with_simulated or not set(damages) <= NO_ROW
        for argv in (["report", "--store", str(store), "--format", "html", "--out", f"{tmp}/r"],
                     ["history", "--store", str(store), "--out", f"{tmp}/h"]):
            run_cli(argv, capsys, {0} if usable else {0, 2})
