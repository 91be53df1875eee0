"""The forward starts on the first chunk (FreeScale 2). Chunks are by whole samples: chunk c
holds the rows sub-batch c is the first to read, and the dense forward runs sub-batch by
sub-batch inside the one call DDP sees (freescale_impl.sub_batches), each waiting only for
its own chunks. On 2 gloo ranks, the owner rank 1 holds back the step's last chunk for
half a second: rank 0's timeline shows its first sub-batches' forwards computed (their
spans ended) before that chunk arrived (its flight ended), and only the last sub-batch
waiting for it."""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch.distributed as dist

from exchange_ranks import join, one_step, rank_shard
from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.measurement.timeline import read_timelines
from fsbench.models import build_model
from fsbench.training.dp import wrap_ddp
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sub_batches import SubBatched
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
    timeline, ctx = join(rank, port, out)
    try:
        layout, shard = rank_shard(WORKLOAD, rank, SEED, "adagrad")
        group = dist.new_group(backend="gloo")
        transport = (HoldsBackTheLastChunk if rank == 1 else CollectiveTransport)(group)
        engine = ShardedEmbeddings(layout, shard, transport, group, rank, chunks=CHUNKS,
                                   overlap=True, priority=False)
        dense = wrap_ddp(SubBatched(build_model(WORKLOAD, seed=SEED).dense), ctx, WORKLOAD.dense_bucket_mb,
                         average=False)
        one_step(timeline, engine, dense, make_batch_source(WORKLOAD, SEED).global_batch(0).select(
            list(range(rank, 12, 2))))
    finally:
        dist.destroy_process_group()


def test_the_first_sub_batch_computes_before_the_last_chunk_has_arrived(tmp_path):
    spawn_ranks(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2)
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
