"""A data-parallel trainer skeleton: replicated model, gradients all-reduced by DDP.

Trainers that differ only in *which samples each rank takes* subclass it and override
`make_preparer` (the input stage the harness runs ahead of each step): the naive baseline
takes a contiguous slice, FreeScale a cost-balanced plan. Everything else (model, loss normalization, optimizer, spans) is shared, so such
trainers compute the same function on the same global batch by construction.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from fsbench.config import RunConfig
from fsbench.training.dist import RankContext
from fsbench.models import build_model, model_from_state
from fsbench.training.issue_queue import IssueQueue
from fsbench.training.optim import make_model_optimizer
from fsbench.measurement.timeline import current, span
from fsbench.training.trainer import Preparer, StepInput, StepStats


DDP_SLOT = "ddp.allreduce"
"""The slot DDP's buckets take in a trainer's `IssueQueue` (its flights' name)."""


def wrap_ddp(module: torch.nn.Module, ctx: RankContext, bucket_cap_mb: float, average: bool = True,
             queue: IssueQueue | None = None) -> DistributedDataParallel:
    """DDP over `module`, its gradient all-reduce recorded as flights (fsbench.measurement.timeline:
    issue to completion, for `comm_overlap_ratio`). average=True is DDP's own arithmetic
    (divide by N, then sum); average=False sums, for trainers whose loss is already the
    rank's share of the global loss. bucket_cap_mb: the workload's `dense_bucket_mb`.

    queue: for a trainer that issues collectives of its own from backward's hooks, the
    queue that puts them and DDP's buckets in one order on every rank
    (fsbench.training.issue_queue): the buckets take its slot `DDP_SLOT` (closed by the
    last), in index order, as DDP hands them over; the comm hook returns a future that
    the queue fulfils when it issues the bucket's all-reduce in its turn. Without one,
    each bucket's all-reduce is issued from its hook at once."""
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # DDP broadcasts rank 0's weights at construction; models are built seeded, so the
    # replicas already agree and the broadcast only guards against drift.
    ddp = DistributedDataParallel(module, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
    n = ctx.world_size
    # A bucket's future holds a device tensor: on CUDA it must know the device, so that
    # whoever waits for it waits for the all-reduce's stream.
    devices = [ctx.device] if ctx.device.type == "cuda" else None

    def allreduce(group, tensor: torch.Tensor, result: torch.futures.Future | None):
        flight = current().in_flight(DDP_SLOT)
        if average:
            tensor.div_(n)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            flight.finish()
            if result is None:
                return f.value()[0]
            try:
                result.set_result(f.value()[0])
            except Exception as e:  # noqa: BLE001 (DDP's finalize waits for it: never leave it unset)
                result.set_exception(e)
        return fut.then(done)

    def timed_allreduce(group, bucket):
        tensor = bucket.buffer()
        if queue is None:
            return allreduce(group, tensor, None)
        result = torch.futures.Future(devices=devices)
        queue.put(DDP_SLOT, lambda: allreduce(group, tensor, result), last=bucket.is_last())
        return result

    ddp.register_comm_hook(ctx.group, timed_allreduce)
    return ddp


class DataParallelTrainer:
    options: object = None
    step_alignment = 1  # steps per unit of measurement (fsbench.training.trainer.measured_steps)
    notes = ("DDP's gradient all-reduce runs inside the backward span (bucketed, overlapped "
             "with backward); its wait shows as wall time without thread CPU time.")

    def setup(self, ctx: RankContext, run: RunConfig, source) -> None:
        self.ctx, self.run, self.source = ctx, run, source
        model = build_model(run.workload, seed=run.seed).to(ctx.device)
        # Before DDP wraps it: the tables' optimizer may switch them to sparse gradients.
        self.optimizer = make_model_optimizer(model, run.workload)
        self.model = wrap_ddp(model, ctx, run.workload.dense_bucket_mb)

    def make_preparer(self) -> Preparer:
        """This rank's input stage: step -> its micro-batches (subclasses decide)."""
        raise NotImplementedError

    def step(self, inputs) -> StepStats:
        prepared: StepInput = next(inputs)
        micro = prepared.batches
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
        return StepStats(loss=loss_sum, num_samples=prepared.num_samples,
                         num_targets=prepared.num_targets, extra=prepared.extra or None,
                         step=prepared.step)

    def trained_model(self) -> torch.nn.Module | None:
        """The trained model as a CPU `RecModel` on rank 0 (None elsewhere): the replicas
        agree, so rank 0's copy is the model. Called on every rank, between steps."""
        if not self.ctx.is_main:
            return None
        return model_from_state(self.run.workload, self.model.module.state_dict())

    def close(self) -> None:
        pass
