"""Gradients leave as they are made (FreeScale 2). The backward runs sub-batch by sub-batch,
the last first, and gradient chunk c is complete once sub-batch c's backward has run: it
goes to its owners then, through the queue it shares with DDP's buckets
(fsbench.training.issue_queue), while the earlier sub-batches' backward still runs. On 2
gloo ranks, each sub-batch's backward takes `SLOW_S` longer: each rank's timeline shows
the last chunk's gradients issued, and arrived, while at least two more sub-batches'
backward had yet to run, ahead of DDP's all-reduce and of chunk 0."""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import torch.distributed as dist

from exchange_ranks import join, one_step, rank_shard
from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.measurement.timeline import read_timelines
from fsbench.models import build_model
from fsbench.training.dp import DDP_SLOT, wrap_ddp
from fsbench.training.issue_queue import IssueQueue
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sub_batches import SubBatched
from freescale_impl.transport import CollectiveTransport

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
SEED, CHUNKS, SLOW_S = 5, 4, 0.25
LAST = f"emb.grad_c{CHUNKS - 1}"


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward first sleeps `SLOW_S`: a sub-batch's backward made long."""

    @staticmethod
    def forward(ctx, loss):
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLOW_S)
        return grad


class SlowBackward(torch.nn.Module):
    def __init__(self, dense: torch.nn.Module) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, rows, batch):
        return _SlowBackward.apply(self.dense(rows, batch))


def _rank_main(rank, port, out):
    timeline, ctx = join(rank, port, out)
    try:
        layout, shard = rank_shard(WORKLOAD, rank, SEED, "adagrad")
        group = dist.new_group(backend="gloo")
        queue = IssueQueue()  # the trainer's: DDP's buckets and the chunks in one order
        engine = ShardedEmbeddings(layout, shard, CollectiveTransport(group), group, rank,
                                   chunks=CHUNKS, overlap=True, priority=False, queue=queue,
                                   dense_slot=DDP_SLOT)
        dense = wrap_ddp(SubBatched(SlowBackward(build_model(WORKLOAD, seed=SEED).dense)), ctx,
                         WORKLOAD.dense_bucket_mb, average=False, queue=queue)
        one_step(timeline, engine, dense, make_batch_source(WORKLOAD, SEED).global_batch(0).select(
            list(range(rank, 12, 2))))
    finally:
        dist.destroy_process_group()


def test_a_gradient_chunk_is_issued_before_the_backward_ends(tmp_path):
    spawn_ranks(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2)
    spans = read_timelines(tmp_path)
    for rank in range(2):
        mine = spans[spans["rank"] == rank]
        assert (mine["name"] == "forward").sum() == CHUNKS  # 6 samples: every sub-batch has some
        backward = mine[mine["name"] == "backward"].iloc[0]
        ends = backward["start_ns"] + backward["dur_ns"]
        flights = mine[mine["kind"] == "flight"].sort_values("start_ns")
        last = flights[flights["name"] == LAST].iloc[0]
        # Issued inside the backward, with sub-batches 2..0's backward (3 x SLOW_S) to run:
        # at least two of them after it ...
        assert backward["start_ns"] < last["start_ns"], rank
        assert ends - last["start_ns"] > 2 * SLOW_S * 1e9, (rank, (ends - last["start_ns"]) / 1e9)
        # ... and arrived at its owners before the backward ended: hidden under it.
        assert last["start_ns"] + last["dur_ns"] < ends, rank
        # In the queue's order: chunks C-1 down to 1, DDP's bucket, chunk 0.
        order = [n for n in flights["name"] if n.startswith(("emb.grad", DDP_SLOT))]
        order = [n for i, n in enumerate(order) if i == 0 or n != order[i - 1]]  # DDP's buckets as one
        assert order == [f"emb.grad_c{c}" for c in range(CHUNKS - 1, 0, -1)] + [DDP_SLOT, "emb.grad_c0"], order
