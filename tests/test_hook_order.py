"""Collectives issued from autograd hooks go in one order on every rank.

FreeScale's backward issues two kinds from hooks, on two communicators: DDP's dense
all-reduce buckets and the embedding gradient chunks' all-to-alls. Issued as each became
ready, their interleaving followed the data; on NCCL, different orders on different
ranks may deadlock. Here two gloo ranks read their chunks in different ways, so that
their gradients become ready in different orders relative to the dense part's; the
collectives each rank issued (its timeline's flights, in issue order) must still be the
same sequence on both.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch.distributed as dist

from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.measurement.timeline import Timeline, read_timelines, set_current
from fsbench.models import table_specs
from fsbench.training.dist import RankContext
from fsbench.training.dp import wrap_ddp
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.transport import CollectiveTransport

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
SEED = 5


def _loss(rank: int, dense: torch.nn.Module, lk) -> torch.Tensor:
    """Rank 0 reads every use through the dense layer, so its chunks' gradients arrive
    after the dense part's. Rank 1 reads only the users through it and the item rows
    apart from it, later in forward: the chunks that hold item rows alone get their
    gradients first in backward, before any dense gradient."""
    if rank == 0:
        return dense(torch.cat([lk.users, lk.items, lk.targets, lk.negatives])).sum()
    through_dense = dense(lk.users).sum()  # first in forward: last in backward
    return through_dense + sum((getattr(lk, use) ** 2).sum() for use in ("items", "targets", "negatives"))


def _rank_main(rank, port, gated, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        timeline = Timeline(f"{out}/rank-{rank}.jsonl", rank=rank)
        set_current(timeline)
        ctx = RankContext(rank, 2, rank, torch.device("cpu"), "gloo", dist.group.WORLD)
        specs = table_specs(WORKLOAD.model.dim, WORKLOAD.item_vocab, WORKLOAD.user_vocab,
                            WORKLOAD.context_vocabs)
        layout = RowLayout(specs, 2, "row")
        shard = LocalShard(layout, rank, SEED, "sgd", 0.1, torch.device("cpu"))
        group = dist.new_group(backend="gloo")  # the embeddings' own, as the trainer's
        engine = ShardedEmbeddings(layout, shard, CollectiveTransport(group), group, rank,
                                   chunks=3, overlap=True, priority=False)
        ready = []  # the order gradients became ready in, as the hooks saw it
        hooked = engine._grad_ready

        def grad_ready(c):
            ready.append(f"chunk {c}")
            hooked(c)
        engine._grad_ready = grad_ready

        def last_bucket():
            ready.append("dense")
            if gated:
                engine.dense_gradients_issued()
        engine.grads_after_dense = gated
        torch.manual_seed(SEED)
        dense = wrap_ddp(torch.nn.Linear(WORKLOAD.model.dim, 1), ctx, average=False,
                         after_last_bucket=last_bucket)
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
    # The premise: the ranks' gradients became ready in different orders.
    assert ready[0] != ready[1], ready
    assert ready[1].index("chunk 2") < ready[1].index("dense") and ready[0][0] == "dense", ready
    # Every rank issued the same collectives in the same order: DDP's, then the chunks.
    assert issued[0] == issued[1], issued
    assert issued[0] == ["ddp.allreduce", "emb.grad_c2", "emb.grad_c1", "emb.grad_c0"], issued


def test_issued_as_they_became_ready_the_same_ranks_disagree_on_the_order(tmp_path):
    """The same two ranks without the gate (as before): rank 1 sends its negatives' chunk
    before DDP's all-reduce, rank 0 after it. What the gate prevents."""
    _, issued = _run(tmp_path, gated=False)
    assert sorted(issued[0]) == sorted(issued[1]) and issued[0] != issued[1], issued
