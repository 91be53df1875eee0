"""Every data-parallel trainer at 2 ranks computes the single-process function on the same
global batch: the loss and every gradient after the first step (relative error <= 1e-5)."""
import dataclasses

import pytest
import torch

from fsbench.config import RunConfig
from fsbench.models import build_model
from fsbench.measurement.timeline import read_step_stats
from fsbench.running.runner import run_once
from fsbench.measurement.timeline import read_timelines
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def reference_loss_and_grads(workload, seed):
    model = build_model(workload, seed=seed)
    batch = make_batch_source(workload, seed).global_batch(0)
    loss = model(batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# FreeScale with replicated tables here: every gradient is on every rank to compare.
# Sharded tables are proven equal in tests/test_sharded_embeddings.py.
REPLICATED = {"tables": "replicated"}
TRAINERS = {
    "ddp": ("trainers_for_tests:GradDumpDDP", {}),
    "freescale_balanced": ("trainers_for_tests:GradDumpFreeScale", {"balance": "on", **REPLICATED}),
    "freescale_balanced_lpt": ("trainers_for_tests:GradDumpFreeScale",
                               {"balance": "on", "partitioner": "lpt", **REPLICATED}),
    "freescale_balanced_3_microbatches": ("trainers_for_tests:GradDumpFreeScale",
                                          {"balance": "on", "micro_batches": "3", **REPLICATED}),
    "freescale_balanced_sharded_data": ("trainers_for_tests:GradDumpFreeScale",
                                        {"balance": "on", "data": "sharded", **REPLICATED}),
    # rows narrower than the model (model.table_dim): the projections in and out
    "ddp_narrow_rows": ("trainers_for_tests:GradDumpDDP", {}),
}
MODEL_CHANGES = {"ddp_narrow_rows": {"table_dim": 8}}


@pytest.mark.parametrize("name", list(TRAINERS))
def test_loss_and_gradients_equal_single_process(name, tmp_path, monkeypatch, rank_pythonpath):
    world_size = 2
    trainer, options = TRAINERS[name]
    # Heavy-tailed lengths, so that a balanced plan really differs from the contiguous one.
    workload = dataclasses.replace(tiny(), lengths="yelp")
    workload = dataclasses.replace(workload, model=dataclasses.replace(workload.model,
                                                                       **MODEL_CHANGES.get(name, {})))
    monkeypatch.setenv("FSBENCH_TEST_DUMP", str(tmp_path))
    run = RunConfig(workload=workload, trainer=trainer, world_size=world_size, seed=7,
                    trainer_options=options)
    run_dir, summary = run_once(run, tmp_path / "runs", timeout_s=120)

    ref_loss, ref_grads = reference_loss_and_grads(workload, seed=7)
    stats = read_step_stats(run_dir)
    step0 = stats[stats["step"] == 0]
    assert len(step0) == world_size and step0["num_samples"].sum() == workload.global_batch_size
    assert abs(step0["loss"].sum() - ref_loss) <= 1e-5 * abs(ref_loss)
    if "micro_batches" in options:  # every rank really accumulated over that many passes
        spans = read_timelines(run_dir)
        forwards = spans[(spans["step"] == 0) & (spans["name"] == "forward")]
        assert (forwards.groupby("rank").size() == int(options["micro_batches"])).all()
    if options.get("data") == "sharded":  # the plan's lengths came through an all-gather
        spans = read_timelines(run_dir)
        assert (spans[spans["name"] == "all_gather"]["kind"] == "comm").all()
        assert set(spans[spans["name"] == "all_gather"]["rank"]) == set(range(world_size))
        # and the planned samples moved between ranks by all-to-all
        moves = spans[spans["name"] == "sample_all_to_all"]
        assert set(moves["rank"]) == set(range(world_size)) and (moves["kind"] == "comm").all()
    if "freescale" in name:  # the balanced plan must really differ from the contiguous split
        batch = make_batch_source(workload, 7).global_batch(0)
        contiguous = [batch.contiguous_slice(r, world_size).num_targets for r in range(world_size)]
        assert sorted(step0["num_targets"]) != sorted(contiguous)

    for rank in range(world_size):
        grads = torch.load(tmp_path / f"grads-rank-{rank}.pt")
        assert set(grads) == set(ref_grads)
        for name, g in ref_grads.items():
            assert rel_err(grads[name], g) <= 1e-5, (rank, name, rel_err(grads[name], g))
