"""Every table optimizer, beside each dense optimizer, trains the single-process function at
2 gloo ranks, on replicated tables (ddp: DDP's all-reduce, sparse gradients for SparseAdam;
deepspeed: ZeRO 2, one optimizer, a param group per part) and on sharded ones (freescale:
each owner steps its rows; torchrec: fbgemm's fused CPU kernels), wherever the trainer runs
the pair on CPU: every step's loss and, after
the last step, every weight equal those of one process training the global batches with
torch's optimizers (relative error <= 1e-5). Equal weights after several steps is the
gradient's equality at every step (the step-0 gradient alone: test_gradient_equivalence),
carried through the update. The two Adams are told apart: each run is checked to be far
from the other Adam's weights, so a dense Adam that left untouched rows alone (or a
sparse one that moved them) fails."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from reference_optimizers import torch_optimizer

from fsbench.config import RunConfig
from fsbench.config_io import override_all
from fsbench.measurement.timeline import read_step_stats
from fsbench.models import build_model
from fsbench.running.runner import run_once
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]
SEED, STEPS = 11, 6
# Rates large enough that a step visibly moves the rows it reads (and Adam's the others).
# The dense part's SGD takes less: at 0.5 six steps amplify the all-reduce's rounding
# (a different summation order) to 1.5e-5 in the dense weights whatever the tables do.
LR = {"adam": 0.02, "sparse_adam": 0.02, "adagrad": 0.05, "rowwise_adagrad": 0.05, "sgd": 0.5}
DENSE_LR = {**LR, "sgd": 0.1}
# (tables, dense): every table optimizer once, every dense optimizer at least once; the
# pairs recsys stacks train with first (Adam on the dense part beside each Adam or
# row-wise Adagrad on the tables).
COMBINATIONS = [("adam", "adam"), ("sparse_adam", "adam"), ("rowwise_adagrad", "adam"),
                ("adagrad", "adagrad"), ("sgd", "sgd")]
# freescale: sharded tables, requests exchanged (the default at 2 ranks); freescale_host:
# routed by the input stage, rows in 3 chunks (gradients sent from inside backward).
TRAINERS = {"ddp": ("trainers_for_tests:FinalModelDumpDDP", {}),
            "freescale": ("trainers_for_tests:FinalModelDumpFreeScale", {}),
            "freescale_host": ("trainers_for_tests:FinalModelDumpFreeScale",
                               {"routing": "host", "chunks": "3"}),
            "torchrec": ("trainers_for_tests:FinalModelDumpTorchRec", {}),
            "deepspeed": ("trainers_for_tests:FinalModelDumpDeepSpeed", {}),  # ZeRO 2
            "deepspeed_zero3": ("trainers_for_tests:FinalModelDumpDeepSpeed", {"zero_stage": "3"})}
# What each trainer runs on CPU (the others it refuses: tests/test_optimizers.py):
# fbgemm's CPU kernels have no Adam; DeepSpeed steps both parts with one optimizer (a
# param group per part where their lrs differ: sgd's do).
RUNS = [(t, tables, dense) for t in TRAINERS for tables, dense in COMBINATIONS
        if not (t == "torchrec" and "adam" in tables) and not (t.startswith("deepspeed") and tables != dense)]
FRAMEWORK = {"torchrec": "torchrec", "deepspeed": "deepspeed", "deepspeed_zero3": "deepspeed"}


def workload(tables: str, dense: str):
    # yelp lengths: uneven shares; 6 steps of 8 samples over 1,000 items leave most item
    # rows unread at any one step, where the dense and the row-sparse Adam part.
    return override_all(dataclasses.replace(tiny(), steps=STEPS, warmup=1, lengths="yelp"), [
        ("optimizer.tables", tables), ("optimizer.tables_lr", str(LR[tables])),
        ("optimizer.dense", dense), ("optimizer.dense_lr", str(DENSE_LR[dense]))])


def reference(w) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the global batches: each step's loss, and the weights at the end."""
    model = build_model(w, SEED)
    model.sparse.sparse_gradients(w.table_optimizer == "sparse_adam")
    opts = [torch_optimizer(w.table_optimizer, model.sparse.parameters(), w.table_lr),
            torch_optimizer(w.dense_optimizer, model.dense.parameters(), w.dense_lr)]
    source, losses = make_batch_source(w, SEED), []
    for step in range(w.steps):
        loss = model(source.global_batch(step))
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("trainer,tables,dense", RUNS)
def test_losses_and_weights_equal_single_process(trainer, tables, dense, tmp_path, monkeypatch,
                                                 rank_pythonpath):
    if trainer in FRAMEWORK:
        pytest.importorskip(FRAMEWORK[trainer])
    w = workload(tables, dense)
    monkeypatch.setenv("FSBENCH_TEST_DUMP", str(tmp_path))
    name, options = TRAINERS[trainer]
    run = RunConfig(workload=w, trainer=name, world_size=2, seed=SEED, trainer_options=options)
    run_dir, _ = run_once(run, tmp_path / "runs", timeout_s=300)
    losses = read_step_stats(run_dir).groupby("step")["loss"].sum().sort_index().tolist()
    got = torch.load(tmp_path / "trained-model.pt")

    ref_losses, ref_weights = reference(w)
    assert len(losses) == STEPS
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)
    assert set(got) == set(ref_weights)
    for name, ref in ref_weights.items():
        assert rel_err(got[name], ref) <= 1e-5, (name, rel_err(got[name], ref))

    if trainer.startswith("freescale"):  # sharded; priority has nothing to send early under dense Adam
        ran = json.loads((run_dir / "manifest.json").read_text())["trainer_ran"]
        assert ran["tables"] == "sharded"
        assert ran.get("priority", "on").startswith("off" if tables == "adam" else "on")
    if tables in ("adam", "sparse_adam"):  # and the other Adam would have been caught
        other = workload("sparse_adam" if tables == "adam" else "adam", dense)
        _, other_weights = reference(other)
        item = "sparse.tables.item.weight"
        assert rel_err(got[item], other_weights[item]) > 1e-3
