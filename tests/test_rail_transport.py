"""The two-hop row exchange (freescale_impl.rail_transport): inside the node, then across
nodes on each local index's rail. Its plan is checked in one process by carrying every
rank's rows through both hops by hand, and the transport on real gloo groups at 6 ranks
(nodes of 2 and of 3) against one flat all-to-all; the copy engines and NCCL's rails
need GPUs (NOT YET RUN ON A GPU: docs/gpu.md)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from exchange_check import against_one_all_to_all
from ports import free_port
from rank_spawn import spawn_ranks

from freescale_impl.rail_transport import RailTransport, block_rows, hop_plan
from freescale_impl.transport import CollectiveTransport


def test_blocks_are_taken_in_the_order_asked_and_empty_ones_take_nothing():
    sizes = torch.tensor([2, 0, 3, 1])  # rows 0-1 | - | 2-4 | 5
    assert block_rows(sizes, torch.tensor([2, 0, 3, 1])).tolist() == [2, 3, 4, 0, 1, 5]
    assert block_rows(torch.tensor([0, 0]), torch.tensor([1, 0])).tolist() == []


def _exchange_by_hand(splits: torch.Tensor, sends: list[torch.Tensor], local: int) -> list[torch.Tensor]:
    """Both hops carried out with plain tensor slicing, from each rank's `hop_plan`."""
    world = len(sends)
    nodes = world // local
    plans = []
    for rank in range(world):
        first = rank // local * local
        recv = splits[:, rank].tolist()
        plans.append(hop_plan(splits[first:first + local], rank % local, recv))
    def hop(buffers, send_key, recv_key, peers_of):
        pieces = [list(torch.split(b, p[send_key])) for b, p in zip(buffers, plans)]
        out = []
        for rank in range(world):
            got = [pieces[src][idx] for src, idx in peers_of(rank)]
            assert [len(g) for g in got] == plans[rank][recv_key]
            out.append(torch.cat(got))
        return out
    first_in = [s[p["first"]] for s, p in zip(sends, plans)]
    # hop 1: node-mate l' of rank (n, l) sends it its piece l
    after1 = hop(first_in, "hop1_send", "hop1_recv",
                 lambda r: [(r // local * local + mate, r % local) for mate in range(local)])
    second_in = [a[p["second"]] for a, p in zip(after1, plans)]
    # hop 2: rail peer (m, l) of rank (n, l) sends it its piece n
    return hop(second_in, "hop2_send", "hop2_recv",
               lambda r: [(m * local + r % local, r // local) for m in range(nodes)])


@pytest.mark.parametrize("world,local", [(4, 2), (6, 2), (6, 3), (8, 4), (8, 1), (4, 4)])
def test_two_hops_deliver_every_row_where_one_flat_all_to_all_does(world, local):
    gen = torch.Generator().manual_seed(world * 10 + local)
    splits = torch.randint(0, 4, (world, world), generator=gen)
    splits[0] = 0  # a rank that sends nothing
    splits[:, 1] = 0  # and one that receives nothing
    sends = [torch.arange(int(splits[r].sum())) + 1000 * r for r in range(world)]
    flat = [torch.cat([torch.split(sends[src], splits[src].tolist())[dst] for src in range(world)])
            for dst in range(world)]
    got = _exchange_by_hand(splits, sends, local)
    for dst in range(world):
        assert torch.equal(got[dst], flat[dst]), dst


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        plain = CollectiveTransport(dist.new_group())
        results = {}
        for local in (2, 3):
            nodes = [dist.new_group(list(range(f, f + local))) for f in range(0, world, local)]
            rails = [dist.new_group([m * local + j for m in range(world // local)]) for j in range(local)]
            node = nodes[rank // local]
            two_hops = RailTransport(CollectiveTransport(node), rails[rank % local], node, rank % local, local)
            results[local] = against_one_all_to_all(two_hops, plain, rank, world, seed=rank + 100 * local)
        torch.save(results, f"{out}/rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_the_two_hop_exchange_on_gloo_delivers_what_one_all_to_all_does(tmp_path):
    world = 6
    spawn_ranks(_rank_main, args=(world, free_port(), str(tmp_path)), nprocs=world)
    for rank in range(world):
        for local, (got, want) in torch.load(tmp_path / f"rank-{rank}.pt").items():
            assert torch.equal(got, want), (rank, local)
