"""The forward starts on the first chunk (FreeScale 2). Chunks are by whole samples: chunk c
holds the rows sub-batch c is the first to read, and the dense forward runs sub-batch by
sub-batch inside the one call DDP sees (freescale_impl.sub_batches), each waiting only for
its own chunks. On 2 gloo ranks, the owner rank 1 holds back the step's last chunk for
half a second: rank 0's timeline shows its first sub-batches' forwards computed (their
spans ended) before that chunk arrived (its flight ended), and only the last sub-batch
waiting for it."""
from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ports import free_port

from fsbench.measurement.timeline import Timeline, read_timelines, set_current, span
from fsbench.models import build_model, table_specs
from fsbench.training.dist import RankContext
from fsbench.training.dp import wrap_ddp
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.sub_batches import SubBatched, sub_batches
from freescale_impl.transport import CollectiveTransport

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
SEED, CHUNKS, HELD_S = 5, 4, 0.5
LAST = f"emb.fetch_c{CHUNKS - 1}"


class HoldsBackTheLastChunk(CollectiveTransport):
    """Rank 1's transport: it issues the last chunk's rows `HELD_S` late (on its own
    thread: the collective cannot complete on rank 0 before)."""

    def all_to_all(self, send, send_splits, recv_splits, name):
        if name == LAST:
            time.sleep(HELD_S)
        return super().all_to_all(send, send_splits, recv_splits, name)


def _rank_main(rank, port, out):
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
        shard = LocalShard(layout, rank, SEED, "adagrad", 0.1, torch.device("cpu"))
        group = dist.new_group(backend="gloo")
        transport = (HoldsBackTheLastChunk if rank == 1 else CollectiveTransport)(group)
        engine = ShardedEmbeddings(layout, shard, transport, group, rank, chunks=CHUNKS,
                                   overlap=True, priority=False)
        dense = wrap_ddp(SubBatched(build_model(WORKLOAD, seed=SEED).dense), ctx, WORKLOAD.dense_bucket_mb,
                         average=False)
        batch = make_batch_source(WORKLOAD, SEED).global_batch(0).select(list(range(rank, 12, 2)))
        timeline.begin_step(0, warmup=False)
        req, svc, ids = engine.request(batch)
        engine.serve(svc, ids)
        engine.fetch_all(req, svc)
        loss = dense(engine.lookups(req), sub_batches(req, batch))  # one forward for DDP
        engine.prepare_gradients(req, svc)
        with span("backward"):
            loss.backward()
        engine.finish_gradients(req, svc)
        timeline.flush()
    finally:
        dist.destroy_process_group()


def test_the_first_sub_batch_computes_before_the_last_chunk_has_arrived(tmp_path):
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2)
    spans = read_timelines(tmp_path)
    mine = spans[spans["rank"] == 0]
    forwards = mine[mine["name"] == "forward"].sort_values("start_ns")
    last = mine[(mine["name"] == LAST) & (mine["kind"] == "flight")].iloc[0]
    arrived = last["start_ns"] + last["dur_ns"]
    assert len(forwards) == CHUNKS  # 6 samples: every sub-batch has some
    ends = (forwards["start_ns"] + forwards["dur_ns"]).tolist()
    # Sub-batches 0..2 computed while the last chunk was held back ...
    assert ends[CHUNKS - 2] < arrived, (ends, arrived)
    assert arrived - forwards["start_ns"].iloc[0] > HELD_S / 2 * 1e9
    # ... and only the last one waited for it, between its forward and the one before.
    wait = mine[mine["name"] == f"{LAST}.wait"].iloc[0]
    assert ends[CHUNKS - 2] <= wait["start_ns"]
    assert wait["start_ns"] + wait["dur_ns"] <= forwards["start_ns"].iloc[CHUNKS - 1]
