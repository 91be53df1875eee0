"""DDP at 2 ranks computes the single-process function on the same global batch."""
import pytest
import torch

from fsbench.config import RunConfig
from fsbench.models import build_model
from fsbench.runner import read_step_stats, run_once
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny

pytestmark = pytest.mark.dist


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def reference_loss_and_grads(workload, seed):
    model = build_model(workload, seed=seed)
    batch = make_batch_source(workload, seed).global_batch(0)
    loss = model(batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("world_size", [2])
def test_ddp_loss_and_gradients_equal_single_process(world_size, tmp_path, monkeypatch, rank_pythonpath):
    workload = tiny()
    monkeypatch.setenv("FSBENCH_TEST_DUMP", str(tmp_path))
    run = RunConfig(workload=workload, trainer="trainers_for_tests:GradDumpDDP",
                    world_size=world_size, seed=7)
    run_dir, summary = run_once(run, tmp_path / "runs", timeout_s=120)

    ref_loss, ref_grads = reference_loss_and_grads(workload, seed=7)
    stats = read_step_stats(run_dir)
    step0 = stats[stats["step"] == 0]
    assert len(step0) == world_size and step0["num_samples"].sum() == workload.global_batch_size
    assert abs(step0["loss"].sum() - ref_loss) <= 1e-5 * abs(ref_loss)

    for rank in range(world_size):
        grads = torch.load(tmp_path / f"grads-rank-{rank}.pt")
        assert set(grads) == set(ref_grads)
        for name, g in ref_grads.items():
            assert rel_err(grads[name], g) <= 1e-5, (rank, name, rel_err(grads[name], g))
