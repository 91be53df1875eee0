"""Two gloo ranks driving FreeScale's exchange engine by hand, for the timeline tests of
the sharded step (test_forward_overlap, test_gradient_overlap, test_hook_order): what
each rank sets up before its engine, and the one step they run."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from fsbench.measurement.timeline import Timeline, set_current, span
from fsbench.models import table_specs
from fsbench.training.dist import RankContext
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.sub_batches import sub_batches


def join(rank: int, port: int, out: str, world: int = 2) -> tuple[Timeline, RankContext]:
    """This rank in a gloo world on one thread, its timeline current (rank-R.jsonl in out)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    timeline = Timeline(f"{out}/rank-{rank}.jsonl", rank=rank)
    set_current(timeline)
    return timeline, RankContext(rank, world, rank, torch.device("cpu"), "gloo", dist.group.WORLD)


def rank_shard(workload, rank: int, seed: int, optimizer: str, world: int = 2) -> tuple[RowLayout, LocalShard]:
    """The workload's tables laid out by row over the world, and this rank's shard."""
    specs = table_specs(workload.model.dim, workload.item_vocab, workload.user_vocab, workload.context_vocabs)
    layout = RowLayout(specs, world, "row")
    return layout, LocalShard(layout, rank, seed, optimizer, 0.1, torch.device("cpu"))


def one_step(timeline: Timeline, engine, dense, batch) -> None:
    """Step 0 as the trainer runs it: requests, rows, the sub-batched forward (one call for
    DDP), the backward in its span, the gradients home; then the timeline written."""
    timeline.begin_step(0, warmup=False)
    req, svc, ids = engine.request(batch)
    engine.serve(svc, ids)
    engine.fetch_all(req, svc)
    loss = dense(engine.lookups(req), sub_batches(req, batch))
    engine.prepare_gradients(req, svc)
    with span("backward"):
        loss.backward()
    engine.finish_gradients(req, svc)
    timeline.flush()
