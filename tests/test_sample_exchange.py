"""Planned samples move between ranks (`freescale.data=sharded`): each rank ends with
exactly `global.select(assignment[rank])`, given only its own shard.

The test process builds the global batches and writes each rank one file holding only
what `data=sharded` gives it: its shard (fresh tensors, no view into the global batch),
the lengths all-gather's result, the shard starts and the plan. The ranks (forked from a
server that never held one either: tests/support/rank_spawn.py) never see a global batch,
so a correct result proves nothing outside the shard was read.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from fsbench.workloads import make_batch_source
from fsbench.workloads.batch import JaggedBatch
from fsbench.workloads.presets import tiny
from freescale_impl.sample_exchange import exchange_samples
from ports import free_port
from rank_spawn import spawn_ranks

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
FIELDS = ("item_ids", "targets", "lengths", "user_ids", "context_ids", "negative_ids")

FIXED = {
    # shard starts (rank r reads [starts[r], starts[r+1])), then each rank's assignment
    2: ([0, 6, 12], [[11, 0, 7, 3, 5], [1, 2, 4, 6, 8, 9, 10]]),
    4: ([0, 5, 5, 9, 12],  # rank 1 reads nothing
        [[8, 1, 11], [], [0, 2, 3, 4, 5, 6], [10, 9, 7]]),  # rank 1 trains nothing
}


def random_batch(gen: torch.Generator, batch_size: int, contexts: int = 3) -> JaggedBatch:
    lengths = torch.randint(1, 20, (batch_size,), generator=gen)
    tokens = int(lengths.sum())
    ids = lambda *shape: torch.randint(1, 10_000, shape, generator=gen)  # noqa: E731 (0 = padding)
    return JaggedBatch(item_ids=ids(tokens), targets=ids(tokens), lengths=lengths,
                       user_ids=ids(batch_size), context_ids=ids(batch_size, contexts),
                       negative_ids=ids(7), global_num_targets=tokens, step=3)


def random_case(seed: int, world_size: int):
    """A random batch, random uneven shard bounds and a random plan. Even seeds force a
    rank that reads nothing and a different rank that trains nothing."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    batch = random_batch(gen, int(rng.integers(world_size, 40)))
    b = batch.batch_size
    edge = seed % 2 == 0
    empty_shard, idle = rng.choice(world_size, size=2, replace=False)

    def split(n_parts: int) -> np.ndarray:  # n_parts random bounds over [0, b]
        return np.concatenate([[0], np.sort(rng.integers(0, b + 1, n_parts - 1)), [b]])

    bounds = split(world_size - 1 if edge else world_size)
    if edge:
        bounds = np.insert(bounds, empty_shard + 1, bounds[empty_shard])
    order = rng.permutation(b)
    cut = split(world_size - 1 if edge else world_size)
    parts = [order[a:e] for a, e in zip(cut, cut[1:])]
    if edge:
        parts.insert(idle, order[:0])
    # Plans hold numpy arrays (`Plan.assignment`); the trainer passes lists; take both.
    assignment = parts if seed % 4 == 1 or seed % 4 == 2 else [p.tolist() for p in parts]
    return batch, bounds.tolist(), assignment


def cases(world_size: int):
    fixed = make_batch_source(WORKLOAD, 1).global_batch(0)
    return [(fixed, *FIXED[world_size])] + [random_case(s, world_size) for s in range(6)]


def _rank_main(rank, world_size, port, out, n_cases):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        for c in range(n_cases):
            given = torch.load(f"{out}/in-{c}-{rank}.pt", weights_only=False)
            got = exchange_samples(given["shard"], given["starts"], given["lengths"],
                                   given["assignment"], rank)
            torch.save(got, f"{out}/out-{c}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_gets_exactly_its_planned_samples(tmp_path, world_size, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    todo = cases(world_size)
    for c, (batch, starts, assignment) in enumerate(todo):
        for rank in range(world_size):
            shard = batch.select(list(range(starts[rank], starts[rank + 1])))
            assert shard.item_ids.untyped_storage().data_ptr() != \
                batch.item_ids.untyped_storage().data_ptr()  # a copy, not a view
            torch.save({"shard": shard, "starts": starts, "lengths": batch.lengths.clone(),
                        "assignment": assignment}, tmp_path / f"in-{c}-{rank}.pt")
    if world_size == 4:  # the cases cover a rank with an empty shard and an idle rank
        assert any(s == e for _, st, _ in todo for s, e in zip(st, st[1:]))
        assert any(len(a) == 0 for _, _, asg in todo for a in asg)

    spawn_ranks(_rank_main, args=(world_size, free_port(), str(tmp_path), len(todo)),
                nprocs=world_size)

    for c, (batch, _, assignment) in enumerate(todo):
        for rank in range(world_size):
            got = torch.load(tmp_path / f"out-{c}-{rank}.pt", weights_only=False)
            want = batch.select(assignment[rank])
            for field in FIELDS:
                assert torch.equal(getattr(got, field), getattr(want, field)), (c, rank, field)
            assert (got.global_num_targets, got.step) == (want.global_num_targets, want.step)
            assert got.context_ids.shape[1] == batch.context_ids.shape[1], (c, rank)


def test_a_shard_that_does_not_match_the_lengths_is_refused():
    batch = random_batch(torch.Generator().manual_seed(0), 6)
    with pytest.raises(ValueError, match="shard does not match"):
        exchange_samples(batch.select([0, 1]), [0, 3, 6], batch.lengths, [[0], [1]], 0)
