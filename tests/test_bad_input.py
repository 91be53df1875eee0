"""Bad or odd input, as a new user gives it, across the commands (issue 44): each case
ends with exit 2 and one line naming the field and what is allowed, before any rank
starts, with no run left in the store and no stored file touched. Nothing here starts a
rank: `run` and `sweep` are checked up to the launch, which is stood in for where a case
is valid (the property test)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsbench.cli import main
from written_runs import write_run

RECBOLE_HEADER = "user_id:token\titem_id:token\ttimestamp:float\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Input files a user might hand over, good and bad, and two stores of complete runs."""
    root = tmp_path_factory.mktemp("inputs")
    texts = {
        "empty.inter": "",
        "header.inter": RECBOLE_HEADER,
        "wrong_header.inter": "uid\tiid\tts\n1\t2\t3\n",
        "text_time.inter": RECBOLE_HEADER + "1\t2\tabc\n1\t3\t4\n",
        "short_row.inter": RECBOLE_HEADER + "1\t2\n",
        # 40 distinct items per user, 500 users: 20,000 items, beyond tiny's item_vocab
        "many_items.inter": RECBOLE_HEADER + "".join(
            f"{u}\t{u * 40 + k}\t{k}\n" for u in range(500) for k in range(40)),
        "garbage.inter": "\x00\x01 not a header\n@@@\n",
        "garbage.sasrec": "one two three\n",
        "garbage.otto": "{not json\n",
        "binary.sasrec": None,  # bytes, below
        "huge_count.csv": "length_bin,count\n5,1e400\n",
        "afile": "a file, not a directory\n",
    }
    for name, text in texts.items():
        if text is not None:
            (root / name).write_text(text)
    (root / "binary.sasrec").write_bytes(bytes(range(256)))
    (root / "adir").mkdir()
    for side in ("a", "b"):
        write_run(root / side, f"run-{side}", np.full(10, 100.0))
    return {name: root / name for name in [*texts, "adir", "a", "b"]}


def _run(*more: str) -> list[str]:
    return ["run", "--workload", "tiny", *more]


# (case, argv with {file} placeholders, what the one line must say). Every case: exit 2.
CASES = [
    ("trainer ':'", _run("--trainer", ":"), "give a registered name"),
    ("trainer os:path", _run("--trainer", "os:path"), "os.path is not a trainer class"),
    ("trainer os:nothing", _run("--trainer", "os:nothing"), "module os has no class nothing"),
    ("global batch 1e10", _run("--set", "global_batch_size=10000000000"),
     "global_batch_size=10000000000 must be <= 16,777,216"),
    ("planner samples 1e11", ["micro", "planner", "--samples", "100000000000", "--ranks", "4"],
     "--samples=100000000000 must be <= 16,777,216"),
    ("inter_gbs=0", ["simulate", "--cluster-set", "inter_gbs=0", "--world-sizes", "8"],
     "inter_gbs='0' must be > 0"),
    ("intra_gbs=0", ["simulate", "--cluster-set", "intra_gbs=0", "--world-sizes", "8"],
     "intra_gbs='0' must be > 0"),
    ("mfu=inf", ["simulate", "--cluster-set", "mfu=inf", "--world-sizes", "8"],
     "mfu='inf' must be a finite number"),
    ("gpus_per_node=inf", ["simulate", "--cluster-set", "gpus_per_node=inf", "--world-sizes", "8"],
     "gpus_per_node='inf' must be a finite number"),
    ("trace --out DIR", ["trace", "{a}/run-a", "--out", "{adir}"], "is a directory"),
    ("compare --out DIR", ["compare", "{a}", "{b}", "--out", "{adir}"], "is a directory"),
    ("compare --out runs.parquet", ["compare", "{a}", "{b}", "--out", "{a}/runs.parquet"],
     "runs.parquet is part of the record of"),
    ("compare --out summary.json", ["compare", "{a}", "{b}", "--out", "{a}/run-a/summary.json"],
     "summary.json is part of the record of"),
    ("compare --out rank file", ["compare", "{a}", "{b}", "--out", "{b}/run-b/rank-0.jsonl"],
     "rank-0.jsonl is part of the record of"),
    ("compare the same runs", ["compare", "{a}", "{a}/run-a"], "BASE and NEW share 1 of their runs"),
    ("simulate --sim-store FILE", ["simulate", "--world-sizes", "8", "--sim-store", "{afile}"],
     "--sim-store"),
    ("simulate --store FILE", ["simulate", "--world-sizes", "8", "--store", "{afile}"],
     "cannot write there"),
    ("calibrate --store FILE", ["calibrate", "--workload", "tiny", "--store", "{afile}"],
     "cannot write there"),
    ("calibrate --comm --store FILE", ["calibrate", "--comm", "--store", "{afile}"],
     "cannot write there"),
    ("calibrate into /proc", ["calibrate", "--workload", "tiny", "--store", "/proc/fsbench"],
     "cannot write there"),
    ("run --store FILE", _run("--store", "{afile}/sub"), "cannot write there"),
    ("run --store ''", _run("--store", ""), "--store: an empty path"),
    ("report --store ''", ["report", "--store", ""], "--store: an empty path"),
    ("trace --out ''", ["trace", "{a}/run-a", "--out", ""], "--out: an empty path"),
    ("seed 1e23", _run("--seed", "99999999999999999999999"), "seed=99999999999999999999999 must be in 0..4294967295"),
    ("seed -1", _run("--seed", "-1"), "seed=-1 must be in 0..4294967295"),
    ("us_per_token=inf", _run("--set", "compute=synthetic", "--set", "synthetic.us_per_token=inf"),
     "synthetic.us_per_token='inf': expected a finite number"),
    ("lr=inf", _run("--set", "lr=inf"), "lr='inf': expected a finite number"),
    ("lr=nan", _run("--set", "lr=nan"), "lr='nan': expected a finite number"),
    ("recbole empty", _run("--set", "data=recbole:{empty.inter}"), "lacks the user_id:token"),
    ("recbole header only", _run("--set", "data=recbole:{header.inter}"), "no interactions"),
    ("recbole wrong header", _run("--set", "data=recbole:{wrong_header.inter}"),
     "lacks the user_id:token and item_id:token columns"),
    ("recbole text timestamp", _run("--set", "data=recbole:{text_time.inter}"),
     "line 2: timestamp 'abc' is not a number"),
    ("recbole short row", _run("--set", "data=recbole:{short_row.inter}"),
     "line 2: expected 3 tab-separated fields"),
    ("recbole ids beyond item_vocab", _run("--set", "data=recbole:{many_items.inter}"),
     "has 20000 items but item_vocab=1000"),
    ("recbole garbage", _run("--set", "data=recbole:{garbage.inter}"), "lacks the user_id:token"),
    ("sasrec garbage", _run("--set", "data=sasrec:{garbage.sasrec}"), "expected 'user item'"),
    ("sasrec binary", _run("--set", "data=sasrec:{binary.sasrec}"), "cannot read"),
    ("otto garbage", _run("--set", "data=otto:{garbage.otto}"), "line 1: expected {\"session\""),
    ("sweep of garbage", ["sweep", "--workload", "tiny", "--set", "data=otto:{garbage.otto}"],
     "line 1: expected"),
    ("hist count 1e400", _run("--set", "lengths=hist:{huge_count.csv}"),
     "count='1e400' (finite, >= 0)"),
    ("context_vocabs=abc", _run("--set", "context_vocabs=abc"),
     "expected comma-separated integers, e.g. 100,20,10"),
    ("--set steps vs --steps", _run("--set", "steps=3", "--steps", "6"),
     "--steps 6 and --set steps=3 disagree"),
    ("quality --data synthetic", ["quality", "--data", "synthetic"],
     "allowed here: sasrec:PATH, recbole:PATH, otto:PATH"),
    ("list -q", ["list", "-q"], "-q goes before the command: fsbench -q COMMAND"),
    ("list --debug", ["list", "--debug"], "--debug goes before the command"),
]


def _fill(argv: list[str], files: dict[str, Path]) -> list[str]:
    out = []
    for a in argv:
        for name, path in files.items():
            a = a.replace("{" + name + "}", str(path))
        out.append(a)
    return out


def _record(files: dict[str, Path]) -> dict[str, bytes]:
    """Every stored file of both stores, to prove none was touched."""
    return {str(p): p.read_bytes() for side in ("a", "b") for p in files[side].rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("case, argv, says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_in_one_line_and_writes_nothing(case, argv, says, files, tmp_path,
                                                         capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default store (runs/) would land here
    before = _record(files)
    argv = _fill(argv, files)
    if argv[0] in ("run", "sweep", "simulate") and "--store" not in argv:
        argv += ["--store", str(tmp_path / "store")]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (case, code, err)
    assert len(err) == 1 and says in err[0], (case, err)
    assert "Traceback" not in err[0]
    runs = [p for p in tmp_path.rglob("manifest.json")]
    assert not runs, f"{case}: bad input left runs {runs}"
    assert _record(files) == before, f"{case}: a stored file changed"


def test_gate_in_another_git_repository_is_refused(tmp_path, capsys, monkeypatch):
    """Not fsbench's checkout: the gate would run the installed fsbench on both sides."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    assert main(["gate", "--base", "HEAD"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is another repository" in err[0], err


def test_gate_refuses_a_store_that_holds_an_earlier_gates_runs(tmp_path, capsys):
    """A second gate into the same --store would compare the first one's runs (another
    commit's) with its own: refused before any run, the earlier runs untouched."""
    old = tmp_path / "g" / "new" / "20261206-172339-small-freescale-n2-85f926"
    old.mkdir(parents=True)
    (old / "summary.json").write_text("{}")
    assert main(["gate", "--base", "HEAD", "--store", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a gate's runs (new/)" in err[0], err
    assert sorted(p.name for p in (tmp_path / "g").rglob("*")) == [old.name, "new", "summary.json"]


def test_bisect_outside_git_names_bisect(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["bisect", "HEAD~1", "HEAD"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fsbench: error: fsbench bisect must run"), err


def test_summarize_keeps_an_interrupted_run_interrupted_with_its_real_steps(tmp_path, capsys):
    run = write_run(tmp_path, "r1", np.full(10, 100.0))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"], manifest["config"]["workload"]["steps"] = "interrupted", 200
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["summarize", str(run), "--format", "json"]) == 0
    assert "stays interrupted" in capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["steps_planned"]) == (10, 200)
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def test_summarize_calls_a_run_short_of_its_steps_interrupted(tmp_path):
    """A run whose launcher died (status running) with 10 of 200 steps on disk."""
    run = write_run(tmp_path, "r1", np.full(10, 100.0))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"], manifest["config"]["workload"]["steps"] = "running", 200
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["summarize", str(run)]) == 0
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"


def test_summarize_calls_a_run_that_early_stopping_ended_complete(tmp_path, capsys):
    """10 of 200 steps on disk, and eval.json says early stopping ended it after step 9
    (eval.patience): it ran all it was meant to; one step fewer than that is interrupted."""
    for name, stopped_at, status in (("r1", 9, "complete"), ("r2", 10, "interrupted")):
        run = write_run(tmp_path, name, np.full(10, 100.0))
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["status"], manifest["config"]["workload"]["steps"] = "running", 200
        (run / "manifest.json").write_text(json.dumps(manifest))
        (run / "eval.json").write_text(json.dumps({"stopped_at_step": stopped_at, "evaluations": []}))
        assert main(["summarize", str(run)]) == 0
        assert json.loads((run / "manifest.json").read_text())["status"] == status, name
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 10 and ("steps_planned" in summary) == (status == "interrupted")


def test_a_nan_in_a_summary_is_written_as_null_and_named(tmp_path):
    from fsbench.running.store import write_summary

    written = write_summary(tmp_path, {"loss_last": float("nan"), "losses": [1.0, float("inf")],
                                       "samples_per_s": 3.0, "nested": {"x": float("-inf")}})
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)
    assert back["loss_last"] is None and back["losses"] == [1.0, None] and back["nested"] == {"x": None}
    assert back["non_finite"] == ["loss_last", "losses", "nested"] == written["non_finite"]
    assert back["samples_per_s"] == 3.0


def test_a_diverged_loss_is_nan_in_the_metrics_not_zero():
    """pandas' sum skips NaN: a step whose ranks' losses were NaN read 0.0."""
    import pandas as pd

    from fsbench.measurement import metrics

    stats = pd.DataFrame({"rank": [0, 1, 0, 1], "step": [0, 0, 1, 1],
                          "loss": [1.0, 2.0, float("nan"), 1.0]})
    losses = stats.groupby("step")["loss"].agg(lambda x: x.to_numpy(dtype=float).sum())
    assert losses[0] == 3.0 and np.isnan(losses[1])
    assert "x.to_numpy(dtype=float).sum()" in Path(metrics.__file__).read_text()


def test_a_stored_seed_beyond_int64_does_not_break_the_store(tmp_path, capsys):
    """A run written with a huge seed (before seeds were bounded) is skipped, named, and the
    index of the store still rebuilds."""
    from fsbench.running import store

    write_run(tmp_path, "good", np.full(5, 100.0))
    bad = write_run(tmp_path, "bad", np.full(5, 100.0))
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["seed"] = 99999999999999999999999
    (bad / "manifest.json").write_text(json.dumps(manifest))
    table = store.refresh_table(tmp_path)
    assert list(table["run_id"]) == ["good"]
    assert "seed 99999999999999999999999 is not an integer" in capsys.readouterr().err


# --- any --set value: exit 0 (valid: it would run) or 2 (one line), never a crash -------

def _settable() -> list[str]:
    from fsbench.config_io import _settable_keys
    from fsbench.workloads.presets import tiny

    return [k for k in _settable_keys(tiny()) if k != "data"] + [
        "ddp.bogus", "freescale.window", "freescale.partitioner"]


VALUES = st.one_of(
    st.text(max_size=8),
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1e400", "-0", "0x10", "1_000", "true", "off", " 3 ", "3,4", ",", "nan",
                     "inf", "-inf", "1e-400", "9" * 30, "fixed:0", "hist:", "zipf:-1"]))


@settings(max_examples=150)
@given(key=st.sampled_from(_settable()), value=VALUES)
def test_any_set_value_is_run_or_refused_in_one_line(key, value, tmp_path_factory):
    import contextlib
    import io

    import fsbench.running.runner as runner

    launched = []
    trainer = "freescale" if key.startswith("freescale.") else "ddp"
    argv = ["-q", "run", "--workload", "tiny", "--trainer", trainer, "--set", f"{key}={value}",
            "--store", str(tmp_path_factory.getbasetemp() / "property-store"), "--format", "json"]
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        # The launch is stood in for: what is checked is everything before it.
        mp.setattr(runner, "run_once", lambda run, store, **kw: (
            launched.append(run), (Path(store) / "x", {"trainer": run.trainer}))[1])
        code = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert code in (0, 2), (key, value, code, lines)
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("fsbench: error: "), (key, value, lines)
    else:
        assert len(launched) == 1
