"""`fsbench trace`: rank timelines merged into a Chrome Trace Event Format file."""
import json
from collections import Counter, defaultdict

import pandas as pd
import pytest

from fsbench.cli import main
from fsbench.reporting.trace import chrome_trace

COLS = ["rank", "step", "warmup", "name", "kind", "start_ns", "dur_ns", "cpu_ns"]


def _spans() -> pd.DataFrame:
    """Two ranks, two steps; rank 1 has two comm chunks in flight together (partial
    overlap) and an embedding lookup nested in its forward."""
    t = 5_000_000_000  # an arbitrary CLOCK_MONOTONIC origin
    rows = []
    for step, base in ((0, t), (1, t + 20_000_000)):
        warm = step == 0
        for rank in (0, 1):
            o = base + rank * 1_000  # ranks start a microsecond apart
            rows += [
                (rank, step, warm, "data", "data", o, 1_000_000, 900_000),
                (rank, step, warm, "barrier", "wait", o + 1_000_000, 500_000, 10_000),
                (rank, step, warm, "step", "step", o + 1_600_000, 10_000_000, 8_000_000),
                (rank, step, warm, "forward", "compute", o + 1_700_000, 4_000_000, 3_900_000),
                (rank, step, warm, "backward", "compute", o + 5_800_000, 4_000_000, 3_000_000),
            ]
            if rank == 1:
                rows += [
                    (1, step, warm, "embedding", "compute", o + 1_800_000, 1_000_000, 990_000),
                    (1, step, warm, "all_to_all", "comm", o + 5_900_000, 2_000_000, 50_000),
                    (1, step, warm, "all_to_all", "comm", o + 6_900_000, 2_000_000, 50_000),
                ]
    return pd.DataFrame(rows, columns=COLS)


def check_trace(trace: dict, spans: pd.DataFrame) -> None:
    """Every property a viewer relies on, checked against the source spans."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    meta = [e for e in events if e["ph"] == "M"]
    spans_ev = [e for e in events if e["ph"] == "X"]
    assert len(meta) + len(spans_ev) == len(events)
    for e in spans_ev:
        assert isinstance(e["name"], str) and isinstance(e["cat"], str)
        assert type(e["pid"]) is int and type(e["tid"]) is int
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert type(e["args"]["step"]) is int and type(e["args"]["warmup"]) is bool
        assert isinstance(e["args"]["cpu_ms"], float)
    # One process per rank, named; every track used is named.
    assert {e["pid"] for e in spans_ev} == set(spans["rank"])
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in set(spans["rank"])}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in spans_ev} == threads
    # A track holds one kind; compute and comm never share one.
    kinds_by_tid = defaultdict(set)
    for e in spans_ev:
        kinds_by_tid[(e["pid"], e["tid"])].add(e["cat"])
    assert all(len(k) == 1 for k in kinds_by_tid.values())
    tids = lambda kind: {e["tid"] for e in spans_ev if e["cat"] == kind}  # noqa: E731
    assert not tids("compute") & tids("comm")
    # Events of one track are disjoint or nested, never partially overlapping (in ns,
    # converted back from the microsecond floats).
    by_track = defaultdict(list)
    for e in spans_ev:
        start = round(e["ts"] * 1000)
        by_track[(e["pid"], e["tid"])].append((start, start + round(e["dur"] * 1000)))
    for intervals in by_track.values():
        open_ends = []
        for start, end in sorted(intervals, key=lambda iv: (iv[0], -iv[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"partial overlap at {start}"
            open_ends.append(end)
    # Same spans, same times: ts relative to the earliest span, durations unchanged.
    t0 = int(spans["start_ns"].min())
    assert min(e["ts"] for e in spans_ev) == 0
    got = Counter((e["pid"], e["args"]["step"], e["name"], round(e["ts"] * 1000) + t0,
                   round(e["dur"] * 1000)) for e in spans_ev)
    want = Counter(zip(spans["rank"], spans["step"], spans["name"], spans["start_ns"], spans["dur_ns"]))
    assert got == want
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN a viewer would reject


def test_chrome_trace_of_hand_made_spans():
    spans = _spans()
    trace = chrome_trace(spans)
    check_trace(trace, spans)
    comm = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"]
    assert len({e["tid"] for e in comm}) == 2, "overlapping chunks go to two comm lanes"
    thread_names = {e["args"]["name"] for e in trace["traceEvents"]
                    if e["name"] == "thread_name" and e["pid"] == 1}
    assert thread_names == {"step", "compute", "comm", "comm #2", "wait", "data"}
    emb = next(e for e in trace["traceEvents"] if e["name"] == "embedding")
    fwd = next(e for e in trace["traceEvents"] if e["name"] == "forward" and e["pid"] == 1)
    assert emb["tid"] == fwd["tid"], "a nested span stays on its parent's track"
    assert emb["args"] == {"step": 0, "warmup": True, "cpu_ms": 0.99}


@pytest.mark.dist
def test_trace_of_a_real_two_rank_run(tiny_sweep, tmp_path, capsys):
    import shutil

    from fsbench.measurement.timeline import read_timelines

    # The session's 2-rank ddp run, copied: the trace is written beside its timelines.
    (shared,) = [d for d in tiny_sweep.iterdir() if "-ddp-n2-" in d.name]
    run_dir = shutil.copytree(shared, tmp_path / shared.name)
    assert main(["trace", str(run_dir)]) == 0
    assert "trace.json" in capsys.readouterr().out
    trace = json.loads((run_dir / "trace.json").read_text())
    check_trace(trace, read_timelines(run_dir))
    assert trace["otherData"]["world_size"] == 2
    assert main(["trace", str(run_dir), "--out", str(tmp_path / "t" / "x.json")]) == 0
    assert json.loads((tmp_path / "t" / "x.json").read_text()) == trace


def test_trace_of_a_non_run_dir_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a run directory" in err and len(err.strip().splitlines()) == 1
