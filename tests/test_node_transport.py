"""SM-free past one node (freescale_impl.node_transport): each exchange split into the
node's rows (copy engines on a GPU) and the other nodes' rows (NCCL, its CTAs capped). On
CPU the split and the reassembly are checked on real gloo groups, a collective standing in
for the copy engines inside the node; the copy engines and the CTA cap need GPUs (NOT YET
RUN ON A GPU: docs/gpu.md)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from exchange_check import against_one_all_to_all
from ports import free_port
from rank_spawn import spawn_ranks

from freescale_impl.node_transport import NodeSplitTransport, node_block, split_by_node
from freescale_impl.transport import CollectiveTransport


def test_a_nodes_rows_are_one_slice_and_the_rest_keep_their_rank_order():
    splits = [3, 0, 2, 5, 1, 4]
    block = node_block(3, 2)  # ranks 2 and 3
    assert block == range(2, 4)
    rows, node, far = split_by_node(splits, block)
    assert (rows.start, rows.stop) == (3, 10) and node == [2, 5]
    assert far == [3, 0, 0, 0, 1, 4] and sum(far) + sum(node) == sum(splits)


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        local = 2
        node_groups = [dist.new_group([first, first + 1]) for first in range(0, world, local)]
        node = node_groups[rank // local]
        split = NodeSplitTransport(CollectiveTransport(node), dist.new_group(), rank, local)
        plain = CollectiveTransport(dist.new_group())
        got, want = against_one_all_to_all(split, plain, rank, world, seed=rank)
        torch.save({"got": got, "want": want}, f"{out}/rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_the_node_split_exchange_delivers_what_one_all_to_all_does(tmp_path):
    world = 4
    spawn_ranks(_rank_main, args=(world, free_port(), str(tmp_path)), nprocs=world)
    for rank in range(world):
        result = torch.load(tmp_path / f"rank-{rank}.pt")
        assert torch.equal(result["got"], result["want"]), rank
