"""A data-parallel trainer skeleton: replicated model, gradients all-reduced by DDP.

Trainers that differ only in *which samples each rank takes* subclass it and override
`local_samples`: the naive baseline takes a contiguous slice, FreeScale a cost-balanced
plan. Everything else (model, loss normalization, optimizer, spans) is shared, so such
trainers compute the same function on the same global batch by construction.
"""
from __future__ import annotations

import contextlib

import torch
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

    def local_microbatches(self, batch: JaggedBatch) -> list[JaggedBatch]:
        """This rank's share as gradient-accumulation micro-batches (default: one)."""
        return [self.local_samples(batch)]

    def step(self, batch: JaggedBatch) -> StepStats:
        micro = [m.to(self.ctx.device) for m in self.local_microbatches(batch)]
        losses = []
        for i, local in enumerate(micro):
            # Gradients accumulate locally; DDP all-reduces only with the last micro-batch.
            sync = contextlib.nullcontext() if i == len(micro) - 1 else self.model.no_sync()
            with sync:
                with span("forward"):
                    loss = self.model(local)
                with span("backward"):
                    # The loss is already normalized by the global target count; DDP
                    # *averages* gradients over ranks, so scale by N to make the reduced
                    # gradient the sum over ranks, i.e. exactly the single-process gradient
                    # of the global batch. DDP's all-reduce runs inside this span (bucketed,
                    # overlapped with backward); its wait shows as wall time without CPU time.
                    (loss * self.ctx.world_size).backward()
            losses.append(loss.detach())
        with span("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        # note: on CUDA this is the step's one CPU-GPU sync point, after all work is queued
        loss_sum = float(torch.stack(losses).sum())
        return StepStats(loss=loss_sum, num_samples=sum(m.batch_size for m in micro),
                         num_targets=sum(m.num_targets for m in micro))

    def close(self) -> None:
        pass
