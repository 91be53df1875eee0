"""compute=emulated: real ranks and collectives, the encoder's compute replaced by waiting
for its calibrated cost; busy time is exactly that cost."""
import json

import numpy as np
import pytest

from fsbench.costmodel.fit import load_fit
from fsbench.cli import main
from fsbench.config_io import run_from_dict
from fsbench.measurement.metrics import rank_step_table
from fsbench.measurement.timeline import read_timelines
from fsbench.workloads.batch import contiguous_split
from fsbench.workloads.generator import SyntheticBatches

pytestmark = pytest.mark.dist


def test_four_emulated_ranks_are_busy_exactly_their_modelled_cost(tmp_path, capsys, no_corun_measurement):
    args = ["run", "--workload", "tiny", "--set", "compute=emulated", "--trainer", "ddp",
            "--world-size", "4", "--steps", "4", "--warmup", "1", "--store", str(tmp_path)]
    assert main(args) == 0
    assert "calibrating it first" in capsys.readouterr().err  # the store had no fit yet
    (run_dir,) = [d for d in tmp_path.iterdir() if (d / "summary.json").exists()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["emulated"] is True and summary["oversubscribed"] is False
    run = run_from_dict(json.loads((run_dir / "run_spec.json").read_text()))
    fit = load_fit(tmp_path, run.workload, "cpu")
    per_rank = rank_step_table(read_timelines(run_dir))
    source = SyntheticBatches(run.workload, run.seed)
    for step in range(run.workload.steps):
        lengths = source.global_batch(step).lengths.numpy()
        for rank, idx in enumerate(contiguous_split(len(lengths), 4)):
            # its samples' cost(L), and the batch's fixed and per-bucket terms
            expected_ns = (float(np.sum(fit.cost_ms(lengths[idx]))) + fit.batch_extra_ms(lengths[idx])) * 1e6
            busy = per_rank[(per_rank["step"] == step) & (per_rank["rank"] == rank)]["busy_ns"].item()
            # forward and backward each truncate to whole nanoseconds
            assert abs(busy - expected_ns) <= 2, (step, rank, busy, expected_ns)
    # The gradient all-reduce really ran (DDP's comm hook records its flights).
    spans = read_timelines(run_dir)
    assert (spans["kind"] == "flight").sum() >= run.workload.steps * 4
    # A second run finds the stored fit: no calibration. (The fit is looked up before any
    # rank starts, and not per world size: one rank shows it as well as four.)
    one_rank = args.copy()
    one_rank[one_rank.index("--world-size") + 1] = "1"
    assert main(one_rank) == 0
    assert "calibrating" not in capsys.readouterr().err
