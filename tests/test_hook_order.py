"""Collectives issued from autograd hooks go in one order on every rank.

FreeScale's backward issues two kinds from hooks, on two communicators: DDP's dense
all-reduce buckets and the embedding gradient chunks' all-to-alls. Issued as each became
ready, their interleaving followed the data; on NCCL, different orders on different
ranks may deadlock. Both go through one queue (fsbench.training.issue_queue) whose order
every rank derives from the chunk count: chunks C-1 down to 1, DDP's buckets, chunk 0.
Here two gloo ranks read their chunks in different ways, so that their gradients become
ready in different orders relative to the dense part's; the collectives each rank issued
(its timeline's flights, in issue order) must still be that sequence on both.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

from exchange_ranks import join, rank_shard
from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.measurement.timeline import read_timelines
from fsbench.training.dp import DDP_SLOT, wrap_ddp
from fsbench.training.issue_queue import IssueQueue
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.transport import CollectiveTransport

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
SEED = 5


def _loss(rank: int, dense: torch.nn.Module, lk) -> torch.Tensor:
    """Rank 0 reads every use through the dense layer, so its chunks' gradients arrive
    after the dense part's. Rank 1 reads only its first sub-batch's rows through it and
    the later sub-batches' apart from it, later in forward: the chunks those read first
    (chunks 1 and 2) get their gradients first in backward, before any dense gradient."""
    if rank == 0:
        return dense(torch.cat([lk.users, lk.items, lk.targets, lk.negatives])).sum()
    first = lk.sub_batch(0)
    through_dense = dense(torch.cat([first.users, first.items, first.negatives])).sum()
    return through_dense + sum((getattr(lk.sub_batch(c), use) ** 2).sum()
                               for c in range(1, lk.sub_batches) for use in ("users", "items", "targets"))


def _rank_main(rank, port, gated, out):
    timeline, ctx = join(rank, port, out)
    try:
        layout, shard = rank_shard(WORKLOAD, rank, SEED, "sgd")
        group = dist.new_group(backend="gloo")  # the embeddings' own, as the trainer's
        queue = IssueQueue() if gated else None  # shared with DDP, else the engine's own
        engine = ShardedEmbeddings(layout, shard, CollectiveTransport(group), group, rank,
                                   chunks=3, overlap=True, priority=False, queue=queue,
                                   dense_slot=DDP_SLOT)
        ready = []  # the order gradients became ready in, as the hooks saw it
        hooked = engine._grad_ready

        def grad_ready(c):
            ready.append(f"chunk {c}")
            hooked(c)
        engine._grad_ready = grad_ready
        torch.manual_seed(SEED)
        dense = wrap_ddp(torch.nn.Linear(WORKLOAD.model.dim, 1), ctx, WORKLOAD.dense_bucket_mb, average=False,
                         queue=queue)
        # The dense part's gradient is ready once its weight's is accumulated: where
        # DDP's own hook sees it too.
        dense.module.weight.register_post_accumulate_grad_hook(lambda _t: ready.append("dense"))
        batch = make_batch_source(WORKLOAD, SEED).global_batch(0)
        half = batch.batch_size // 2
        batch = batch.select(list(range(half)) if rank == 0 else list(range(half, batch.batch_size)))
        timeline.begin_step(0, warmup=False)
        req, svc, ids = engine.request(batch)
        engine.serve(svc, ids)
        engine.fetch_all(req, svc)
        loss = _loss(rank, dense, engine.lookups(req))
        engine.prepare_gradients(req, svc)
        loss.backward()
        engine.finish_gradients(req, svc)
        timeline.flush()
        with open(f"{out}/ready-{rank}.json", "w") as f:
            json.dump(ready, f)
    finally:
        dist.destroy_process_group()


def _issued(out) -> list[list[str]]:
    """Per rank, the backward's collectives in the order they were issued."""
    flights = read_timelines(out)
    flights = flights[(flights["kind"] == "flight")
                      & flights["name"].str.match(r"ddp\.allreduce|emb\.grad_c")]
    return [list(g.sort_values("start_ns")["name"]) for _, g in flights.groupby("rank")]


def _run(tmp_path, gated: bool):
    out = tmp_path / ("gated" if gated else "as_ready")
    out.mkdir()
    spawn_ranks(_rank_main, args=(free_port(), gated, str(out)), nprocs=2)
    ready = [json.loads((out / f"ready-{r}.json").read_text()) for r in range(2)]
    return ready, _issued(out)


def test_backward_collectives_go_in_one_order_on_every_rank_whatever_became_ready_first(tmp_path):
    ready, issued = _run(tmp_path, gated=True)
    # The premise: the ranks' gradients became ready in different orders (rank 0's dense
    # part before any chunk, rank 1's chunks 2 and 1 before its dense part).
    assert ready[0] != ready[1], ready
    assert ready[0][0] == "dense", ready
    assert ready[1].index("chunk 2") < ready[1].index("chunk 1") < ready[1].index("dense"), ready
    # Every rank issued the same collectives in the queue's order: the later chunks as
    # they were made, DDP's bucket (rank 0's held until chunks 2 and 1 had gone), chunk 0.
    assert issued[0] == issued[1], issued
    assert issued[0] == ["emb.grad_c2", "emb.grad_c1", "ddp.allreduce", "emb.grad_c0"], issued


def test_issued_as_they_became_ready_the_same_ranks_disagree_on_the_order(tmp_path):
    """The same two ranks with DDP outside the engine's queue (as before the queue): rank
    0 issues DDP's all-reduce before its chunks, rank 1 after chunks 2 and 1. What the
    shared queue prevents."""
    _, issued = _run(tmp_path, gated=False)
    assert sorted(issued[0]) == sorted(issued[1]) and issued[0] != issued[1], issued
