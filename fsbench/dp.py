"""A data-parallel trainer skeleton: replicated model, gradients all-reduced by DDP.

Trainers that differ only in *which samples each rank takes* subclass it and override
`local_samples`: the naive baseline takes a contiguous slice, FreeScale a cost-balanced
plan. Everything else (model, loss normalization, optimizer, spans) is shared, so such
trainers compute the same function on the same global batch by construction.
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from fsbench.config import RunConfig
from fsbench.dist import RankContext
from fsbench.models import build_model
from fsbench.optim import make_optimizer
from fsbench.timeline import span
from fsbench.trainer import StepStats
from fsbench.workloads.batch import JaggedBatch


class DataParallelTrainer:
    options: dict[str, str] = {}
    notes = ("DDP's gradient all-reduce runs inside the backward span (bucketed, overlapped "
             "with backward); its wait shows as wall time without thread CPU time.")

    def setup(self, ctx: RankContext, run: RunConfig) -> None:
        self.ctx, self.run = ctx, run
        model = build_model(run.workload, seed=run.seed).to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # DDP broadcasts rank 0's weights at construction; build_model is seeded, so the
        # replicas already agree and the broadcast only guards against drift.
        self.model = DistributedDataParallel(model, device_ids=device_ids)
        self.optimizer = make_optimizer(self.model.parameters(), run.workload)

    def local_samples(self, batch: JaggedBatch) -> JaggedBatch:
        """This rank's share of the global batch (subclasses decide)."""
        raise NotImplementedError

    def step(self, batch: JaggedBatch) -> StepStats:
        local = self.local_samples(batch).to(self.ctx.device)
        with span("forward"):
            loss = self.model(local)
        with span("backward"):
            # The loss is already normalized by the global target count; DDP *averages*
            # gradients over ranks, so scale by N to make the reduced gradient the sum over
            # ranks, i.e. exactly the single-process gradient of the global batch.
            # DDP's all-reduce runs inside this span (bucketed, overlapped with backward);
            # its wait shows as wall time without thread CPU time.
            (loss * self.ctx.world_size).backward()
        with span("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        # note: on CUDA this is a CPU-GPU sync point, after the step's work is queued
        return StepStats(loss=loss.item(), num_samples=local.batch_size,
                         num_targets=local.num_targets)

    def close(self) -> None:
        pass
