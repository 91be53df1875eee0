"""The paper table's 'what limits FreeScale' (scripts/paper_limits.py) and the simulator's
exposure by kind of collective it rests on (Replay.exposed_by_kind)."""
import importlib.util
from pathlib import Path

import pandas as pd

from fsbench.scaling.step_engine import Carry, Replay

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("paper_limits", ROOT / "scripts" / "paper_limits.py")
pl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pl)


def test_exposure_is_summed_by_kind_of_collective():
    r = Replay(3.0, 0.9, 0.0, {}, {"ddp.allreduce:0": 0.1, "ddp.allreduce:3": 0.2, "emb.fetch_c0": 0.3,
                                    "emb.fetch_c1": 0.05, "emb.grad_c0.node": 0.01, "emb.grad_c2.node": 0.02,
                                    "emb.grad_c1.nodes": 0.04, "emb.control": 0.0}, [], Carry())
    got = r.exposed_by_kind()
    assert got.keys() == {"ddp.allreduce", "emb.fetch", "emb.grad.node", "emb.grad.nodes", "emb.control"}
    assert abs(got["ddp.allreduce"] - 0.3) < 1e-12 and abs(got["emb.fetch"] - 0.35) < 1e-12
    assert abs(got["emb.grad.node"] - 0.03) < 1e-12 and got["emb.grad.nodes"] == 0.04


def test_limits_name_each_part_and_judge_the_targets():
    steps = pd.DataFrame({"exposed_ms:ddp.allreduce": [0.4, 0.6], "exposed_ms:emb.fetch": [0.1, None],
                          "exposed_ms:emb.control": [0.0, 0.0], "host_sync_ms": [0.03, 0.03]})
    parts = pl.exposed_parts(steps)
    assert parts == "ddp.allreduce=0.500;emb.fetch=0.050;host_sync=0.030"  # largest first, zeros left out
    df = pd.DataFrame([
        {"config": "freescale", "gpus": 256, "preset": "medium", "batch_per_rank": 128, "step_alone_ms": 3.2,
         "exposed_comm": 0.19, "reduction_vs_sharded_alone": 0.58, "exposed_parts": parts},
        {"config": "freescale", "gpus": 256, "preset": "large", "batch_per_rank": 128, "step_alone_ms": 400.0,
         "exposed_comm": 0.018, "reduction_vs_sharded_alone": 0.95, "exposed_parts": ""},
        {"config": "ddp", "gpus": 256, "preset": "medium", "batch_per_rank": 128, "step_alone_ms": 20.0,
         "exposed_comm": 0.6, "reduction_vs_sharded_alone": -0.3, "exposed_parts": "x=1"}])
    text = "\n".join(pl.limits_section(df))
    medium = next(line for line in text.splitlines() if line.startswith("| medium"))
    assert "19.0% (missed)" in medium and "58.0% (70.0%: missed)" in medium
    assert "dense all-reduce" in medium and "0.500" in medium and "host syncs" in medium
    large = next(line for line in text.splitlines() if line.startswith("| large"))
    assert "95.0% (90.3%: met)" in large and large.endswith("| none |")
    assert text.count("\n| ") == 3  # the header and the two FreeScale rows: ddp's left out
    assert "regenerate" in "\n".join(pl.limits_section(df.drop(columns="exposed_parts")))


def test_a_part_between_nodes_is_named_as_such():
    assert pl.what("emb.fetch.nodes") == ("rows (the next step's fresh rows, sent after the update, "
                                           "before its forward, its part across nodes, over NCCL)")
    assert pl.what("emb.grad.node").endswith("its part inside the node, on copy engines)")
    assert pl.what("samples.tokens") == "samples.tokens"


def test_the_dense_window_sweep_simulates_each_chunk_count(tmp_path, monkeypatch):
    """scripts/dense_window.py on a small point: one row per chunk count, each from its own
    simulation (the chunk count it asked for reaches the run), the baseline's kinds named."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # it imports paper_table beside it
    spec = importlib.util.spec_from_file_location("dense_window", ROOT / "scripts" / "dense_window.py")
    dw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dw)
    out = tmp_path / "dw.md"
    monkeypatch.setattr("sys.argv", ["dense_window.py", "--preset", "small", "--gpus", "16", "--batch", "16",
                                     "--chunks", "1,2", "--out", str(out)])
    dw.main()
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "2"]
    assert rows[0].split("|")[2:] != rows[1].split("|")[2:]  # two counts, two different steps
    assert "tr.dense" in out.read_text()
    assert dw.by_kind({"a": 0.1, "b": 0.3, "c": 0.0}) == "b 0.300, a 0.100"
