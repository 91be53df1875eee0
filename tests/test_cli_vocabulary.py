"""One CLI vocabulary (issue 24): `--store` wherever a store of runs is read or written,
`--format` with json on every command that prints a result, the old flag names as hidden
aliases that warn once, `-q`, results on stdout and notes on stderr, defaults in --help,
and a clean exit when the reader of stdout leaves."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from written_runs import write_run

from fsbench import table
from fsbench.cli.dispatch import build_parser, main

TEXT_JSON = ("text", "json")
# Every leaf command and the formats it prints; a new command must be added here.
FORMATS = {"run": TEXT_JSON, "summarize": TEXT_JSON, "sweep": TEXT_JSON, "list": TEXT_JSON,
           "report": ("md", "latex", "csv", "html", "json"), "compare": ("md", "json", "junit"),
           "gate": ("md", "json", "junit"), "bisect": ("md", "json"), "simulate": TEXT_JSON, "calibrate": TEXT_JSON,
           "validate": TEXT_JSON, "overhead": TEXT_JSON, "history": TEXT_JSON,
           "reference": TEXT_JSON, "micro sm-contention": TEXT_JSON, "micro planner": TEXT_JSON,
           "micro input-stage": TEXT_JSON,
           "quality": TEXT_JSON, "cluster": TEXT_JSON, "trace": None}  # trace writes a file and prints where: no table to format
# Commands that read or write a store of runs (`--store`).
STORES = {"run", "sweep", "calibrate", "validate", "report", "history", "simulate", "gate", "bisect",
          "quality", "cluster"}
# Commands whose `--out` is an artifact (a folder or file that is not a store of runs).
ARTIFACTS = {"report", "history", "trace", "compare", "micro sm-contention", "quality"}
# Positional or required arguments, to parse a command line of each command.
REQUIRED = {"summarize": ["RUN"], "trace": ["RUN"], "compare": ["A", "B"], "gate": ["--base", "HEAD"], "bisect": ["HEAD~1", "HEAD"],
            "reference": ["check"], "quality": ["--data", "recbole:X"]}
# Old name -> (command, new flag's dest) for every flag renamed to the vocabulary.
RENAMED = [("run", "--out", "store"), ("sweep", "--out", "store"), ("calibrate", "--out", "store"),
           ("validate", "--out", "store"), ("gate", "--out", "store"), ("report", "--runs", "store"),
           ("history", "--runs", "store"), ("simulate", "--out", "sim_store")]


def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs, sub-commands included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(words), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*words, name))


def options(parser: argparse.ArgumentParser, hidden: bool = False) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings
            if hidden or a.help != argparse.SUPPRESS}


COMMANDS = dict(leaves(build_parser()))


def test_every_command_is_classified():
    assert set(COMMANDS) == set(FORMATS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_store_and_out_mean_one_thing_each(name):
    shown = options(COMMANDS[name])
    assert ("--store" in shown) == (name in STORES), name
    assert ("--out" in shown) == (name in ARTIFACTS), name
    assert "--runs" not in shown


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f))
def test_every_command_that_prints_a_result_offers_json(name):
    action = options(COMMANDS[name])["--format"]
    assert tuple(action.choices) == FORMATS[name] and action.default == FORMATS[name][0]
    args = build_parser().parse_args([*name.split(), *REQUIRED.get(name, []), "--format", "json"])
    assert args.format == "json"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_default(name):
    parser = COMMANDS[name]
    formatter = parser._get_formatter()
    for action in parser._actions:
        d = action.default
        if (not action.option_strings or action.help == argparse.SUPPRESS or d is None
                or d is False or d == [] or d == argparse.SUPPRESS):
            continue
        assert action.help, f"{name} {action.option_strings}: no help, so --help hides its default"
        assert "default" in formatter._get_help_string(action), (name, action.option_strings)
    parser.format_help()  # every help string formats


def test_trace_help_names_the_tracks_trace_writes(capsys):
    from fsbench.cli.results import TRACKS
    from fsbench.reporting.trace import TRACK_ORDER

    assert TRACKS.split(", ") == list(TRACK_ORDER)
    with pytest.raises(SystemExit):
        main(["trace", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"a track per span kind ({TRACKS})" in text and "data" not in text


@pytest.mark.parametrize("name, old, dest", RENAMED)
def test_old_names_are_hidden_and_warn_once(name, old, dest, capsys):
    parser = build_parser()
    args = parser.parse_args([*name.split(), *REQUIRED.get(name, []), old, "a", old, "b"])
    assert getattr(args, dest) == "b"
    err = capsys.readouterr().err.splitlines()
    new = {"store": "--store", "sim_store": "--sim-store"}[dest]
    assert err == [f"fsbench: warning: {old} is now {new} (the old name still works, for now)"]
    assert old not in options(COMMANDS[name]) and old in options(COMMANDS[name], hidden=True)


def test_the_gate_names_each_sides_store_as_its_version_does(tmp_path):
    """BASE may predate `--store`: its `fsbench run` gets `--out` instead."""
    from fsbench.gates import gate

    (tmp_path / "fsbench").mkdir()
    side = gate.Side("base", tmp_path)
    assert gate.store_flag(side) == "--out"
    (tmp_path / "fsbench" / "cli_args.py").write_text("")  # before fsbench/ had groups
    assert gate.store_flag(side) == "--store"
    (tmp_path / "fsbench" / "cli_args.py").unlink()
    (tmp_path / "fsbench" / "cli").mkdir()
    (tmp_path / "fsbench" / "cli" / "args.py").write_text("")  # since
    assert gate.store_flag(side) == "--store"
    cmd, _ = gate.run_command(side, gate.Sweep(), "ddp", tmp_path, seed=0)
    assert cmd[cmd.index("--store") + 1] == str(tmp_path / "base")


def test_a_usage_error_is_one_line_and_exit_2(capsys):
    assert main(["report", "--format", "pdf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fsbench: error: ") and "invalid choice: 'pdf'" in err[0]


# ---------------------------------------------------------------------------- end to end

@pytest.fixture
def stores(tmp_path):
    """Two stores of written runs (tests/support/written_runs.py), 2 seeds each."""
    rng = np.random.default_rng(0)
    for side in ("a", "b"):
        for seed in (0, 1):
            write_run(tmp_path / side, f"run-{seed}", 100 + rng.normal(0, 1, 24), seed=seed)
    return tmp_path / "a", tmp_path / "b"


def json_of(argv: list[str], capsys, codes=(0,)) -> dict:
    """main(argv)'s stdout, which must be exactly one JSON document."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in codes, err
    return json.loads(out)


def test_list_json(capsys):
    doc = json_of(["list", "--format", "json"], capsys)
    assert {"workloads", "length_presets", "trainers"} <= set(doc)


def test_compare_json(stores, capsys):
    doc = json_of(["compare", *map(str, stores), "--format", "json"], capsys, codes=(0, 1, 3))
    assert doc["outcome"] in {"unchanged", "regressed", "inconclusive"} and doc["rows"]


def test_report_json_with_the_old_name_of_store(stores, tmp_path, capsys):
    code = main(["report", "--runs", str(stores[0]), "--format", "json", "--no-plots",
                 "--out", str(tmp_path / "rep")])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert [r["trainer"] for r in doc["table"]] == ["ddp"] and doc["table"][0]["repeats"] == 2
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["table"] == doc["table"]
    assert err.count("--runs is now --store") == 1 and "written: " in err


def test_history_json(stores, tmp_path, capsys):
    doc = json_of(["history", "--store", str(stores[0]), "--out", str(tmp_path / "h"),
                   "--format", "json"], capsys)
    assert isinstance(doc["items"], list) and len(doc["written"]) == 2


def test_summarize_json(stores, capsys):
    run = stores[0] / "run-0"
    doc = json_of(["summarize", str(run), "--format", "json"], capsys)
    assert doc["run_dir"] == str(run) and doc["summary"]["world_size"] == 2


def test_reference_check_json(capsys):
    doc = json_of(["reference", "check", "--only", "planner_loads", "--format", "json"], capsys)
    assert doc == {"action": "check", "quantities": ["planner_loads"], "moved": [], "notes": [],
                   "ok": True}


SIMULATE = ["simulate", "--workload", "tiny", "--trainers", "ddp", "--world-sizes", "8",
            "--steps", "3", "--warmup", "1"]


def test_simulate_json_goes_to_store_simulated(tmp_path, capsys):
    doc = json_of([*SIMULATE, "--store", str(tmp_path), "--format", "json"], capsys)
    assert doc["simulated"] is True and doc["store"] == f"{tmp_path}/simulated"
    (row,) = doc["table"]
    assert row["world_size"] == 8 and row["run_dir"].startswith(f"{tmp_path}/simulated/")


def test_results_to_stdout_notes_to_stderr_and_quiet_silences_notes(tmp_path, capsys):
    assert main([*SIMULATE, "--store", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("SIMULATED") and "stored in" not in out
    assert "trainer" in [line for line in out.splitlines() if line.startswith("|")][0]
    assert f"simulated runs stored in {tmp_path}/simulated/" in err
    assert main(["-q", *SIMULATE, "--sim-store", str(tmp_path / "sim")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("SIMULATED") and err == ""


def test_micro_planner_json(capsys):
    doc = json_of(["micro", "planner", "--samples", "64", "--ranks", "4", "--window", "1",
                   "--repeats", "1", "--format", "json"], capsys)
    assert doc["samples"] == 64 and len(doc["rows"]) == 3


def test_micro_json_holds_the_record(tmp_path, monkeypatch, capsys):
    import torch

    from fsbench.scaling import micro

    alone = ([1.0, 1.0], [1.0, 1.0])
    beside = {"sm_copy": {"gemm": [(0.0, 1.5), (1.5, 3.0)], "copies": [(0.0, 3.0)],
                          "copy_alone_ms": [1.0]}}
    record = micro.build_record({"device": "stand-in", "torch": "0"}, 1000, 4096, 2, alone, beside)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(micro, "sm_contention", lambda *args: record)
    doc = json_of(["micro", "sm-contention", "--out", str(tmp_path), "--format", "json"], capsys)
    assert doc["record"] == json.loads(json.dumps(record))
    assert json.loads(open(doc["path"]).read()) == doc["record"]


def test_progress_bars_only_on_a_terminal_and_never_quiet(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert table.progress([1, 2], "x") == [1, 2]  # a log file gets no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert type(table.progress([1, 2], "x")).__name__ == "tqdm"
    table.set_quiet(True)
    try:
        assert table.progress([1, 2], "x") == [1, 2]
    finally:
        table.set_quiet(False)


def test_json_of_missing_values_is_null():
    import pandas as pd

    text = table.dumps({"t": pd.DataFrame({"a": [1.0, float("nan")], "b": [np.int64(2), None]}),
                        "inf": float("inf"), "arr": np.array([1, 2])})
    assert json.loads(text) == {"t": [{"a": 1.0, "b": 2}, {"a": None, "b": None}], "inf": None,
                                "arr": [1, 2]}


# ---------------------------------------------------------------------------- closed pipe

def test_a_reader_that_leaves_early_gets_no_traceback():
    """`fsbench list | head -1`: head exits after one line; fsbench's next write (or its
    last flush) meets a closed pipe and must end quietly, exit 0."""
    cli = f"{sys.executable} -m fsbench.cli"
    proc = subprocess.run(["bash", "-c", f"{cli} list | head -1; exit ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("workloads"), proc.stderr
    assert proc.stderr == ""
    # The same with the pipe already closed when fsbench writes (head gone first: what
    # the line above races with): deterministic.
    read, write = os.pipe()
    os.close(read)
    try:
        for argv in (["list"], ["report", "--help"], []):
            done = subprocess.run([sys.executable, "-m", "fsbench.cli", *argv], stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
            assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)
    finally:
        os.close(write)


def test_main_flushes_inside_its_error_handling(monkeypatch, capsys):
    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["list"]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------- dist tier

@pytest.mark.dist
def test_run_and_sweep_json(tmp_path, capsys):
    tiny = ["--workload", "tiny", "--steps", "6", "--warmup", "2", "--store", str(tmp_path)]
    doc = json_of(["run", *tiny, "--world-size", "1", "--format", "json"], capsys)
    assert doc["summary"]["world_size"] == 1 and doc["summary"]["steps"] == 6
    assert os.path.isdir(doc["run_dir"])
    doc = json_of(["sweep", *tiny, "--world-sizes", "1", "--trainers", "ddp", "--format", "json"],
                  capsys)
    assert [(r["trainer"], r["world_size"]) for r in doc["table"]] == [("ddp", 1)]
    assert doc["store"] == str(tmp_path) and doc["steps"] == {"tiny": 6}
