"""SM-free past one node (`freescale.transport=sm_free` at more ranks than one node's GPUs):
each row exchange split by where the peer is. NOT YET RUN ON A GPU.

  inside the node  the node's peers' rows by copy-engine pulls (`SmFreeTransport` on the
                   node's group): no SM.
  across nodes     the other nodes' rows by NCCL's `all_to_all_single` on a group whose
                   communicator may use at most `freescale.comm_ctas` CTAs
                   (ProcessGroupNCCL.Options().config.max_ctas; 0: NCCL's own limit, 32
                   channels on H100): at most that many of the GPU's 132 SMs while in
                   flight, instead of as many as NCCL takes.

Both parts are in flight at once, on disjoint slices of the same rows. A node's ranks are
a block of consecutive ranks (torchrun places them so), so the rows for the node's peers
are one contiguous slice of the send buffer, and their rows one slice of the output; the
other nodes' rows travel in one all-to-all whose splits are zero for the node's peers.
tests/test_node_transport.py checks the split and the reassembly on gloo at 4 ranks (2 a
"node"), with a collective standing in for the copy engines inside the node."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from freescale_impl.transport import CollectiveTransport, Pending

NCCL_DEFAULT_CTAS = 32  # NCCL_MAX_CTAS's default (MAXCHANNELS) on Hopper: ASSUMED for the simulator


def ranks_a_node(asked: int, world: int, launched: int | None = None) -> int:
    """Ranks a node: `freescale.node_ranks` where asked, else the launcher's
    (LOCAL_WORLD_SIZE; a simulated cluster's GPUs a node), at most every rank."""
    default = launched if launched is not None else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return min(world, asked or default)


def node_block(rank: int, local_size: int) -> range:
    """The ranks of `rank`'s node."""
    first = rank // local_size * local_size
    return range(first, first + local_size)


def split_by_node(splits: list[int], block: range) -> tuple[slice, list[int], list[int]]:
    """(the node's rows as a slice of the buffer, the node's splits in node order, the
    other nodes' splits over every rank, zero for the node's)."""
    start = sum(splits[:block.start])
    stop = start + sum(splits[block.start:block.stop])
    remote = [0 if r in block else c for r, c in enumerate(splits)]
    return slice(start, stop), list(splits[block.start:block.stop]), remote


class NodeSplitTransport:
    """A row exchange in two parts (see the module docstring): `inside` moves the node's
    rows (copy engines on a GPU), `across` the rest (NCCL, its SMs capped)."""

    name = "sm_free"

    def __init__(self, inside, across_group, rank: int, local_size: int) -> None:
        self.inside, self.across = inside, CollectiveTransport(across_group)
        self.block = node_block(rank, local_size)

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   name: str) -> Pending:
        sent, node_send, far_send = split_by_node(send_splits, self.block)
        got, node_recv, far_recv = split_by_node(recv_splits, self.block)
        near = self.inside.all_to_all(send[sent], node_send, node_recv, f"{name}.node")
        far = self.across.all_to_all(torch.cat([send[:sent.start], send[sent.stop:]]), far_send, far_recv,
                                     f"{name}.nodes")
        output = send.new_empty((sum(recv_splits), *send.shape[1:]))

        def finish() -> None:
            # The other nodes' rows come in rank order around the node's block.
            rest = far.wait()
            output[:got.start] = rest[:got.start]
            output[got] = near.wait()
            output[got.stop:] = rest[got.start:]

        return Pending(name, output, finish=finish)

    def close(self) -> None:
        self.inside.close()


def capped_nccl_options(max_ctas: int):
    """A process group option that caps NCCL's CTAs (None: NCCL's own limit)."""
    if not max_ctas:
        return None
    options = dist.ProcessGroupNCCL.Options()
    options.config.max_ctas = max_ctas
    return options


def node_split_transport(group, device: torch.device, local_size: int, comm_ctas: int):
    """Every rank builds every node's group (collectives over all ranks, in one order),
    then its node's copy-engine transport and the capped NCCL group across nodes."""
    from freescale_impl.transport import SmFreeTransport, sm_free_unavailable

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    why = sm_free_unavailable(device, world, local_size)
    if why:
        raise RuntimeError(f"freescale.transport=sm_free cannot run: {why}")
    mine = None
    for first in range(0, world, local_size):
        g = dist.new_group(list(range(first, first + local_size)))
        if rank in range(first, first + local_size):
            mine = g
    across = dist.new_group(backend="nccl", pg_options=capped_nccl_options(comm_ctas))
    return NodeSplitTransport(SmFreeTransport(mine, device), across, rank, local_size)
