"""Planned samples move between ranks (`freescale.data=sharded`): each rank ends with
exactly `global.select(assignment[rank])`, given only its own shard."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.sample_exchange import exchange_samples
from ports import free_port

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")

CASES = {
    # shard starts (rank r reads [starts[r], starts[r+1])), then each rank's assignment
    2: ([0, 6, 12], [[11, 0, 7, 3, 5], [1, 2, 4, 6, 8, 9, 10]]),
    4: ([0, 5, 5, 9, 12],  # rank 1 reads nothing
        [[8, 1, 11], [], [0, 2, 3, 4, 5, 6], [10, 9, 7]]),  # rank 1 trains nothing
}


def _rank_main(rank, world_size, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        starts, assignment = CASES[world_size]
        batch = make_batch_source(WORKLOAD, 1).global_batch(0)
        shard = batch.select(list(range(starts[rank], starts[rank + 1])))
        lengths = batch.lengths.clone()  # what the lengths all-gather gives every rank
        del batch  # from here on this rank holds nothing outside its shard
        got = exchange_samples(shard, starts, lengths, assignment, rank)
        torch.save(got, f"{out}/rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_gets_exactly_its_planned_samples(tmp_path, world_size):
    mp.spawn(_rank_main, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size)
    batch = make_batch_source(WORKLOAD, 1).global_batch(0)
    for rank, wanted in enumerate(CASES[world_size][1]):
        got = torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False)
        want = batch.select(wanted)
        for field in ("item_ids", "targets", "lengths", "user_ids", "context_ids", "negative_ids"):
            assert torch.equal(getattr(got, field), getattr(want, field)), (rank, field)
        assert got.global_num_targets == want.global_num_targets
