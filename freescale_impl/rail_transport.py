"""A row exchange in two hops (`freescale.a2a=hierarchical`): inside the node first, then
across nodes among the ranks of one local index (a "rail": one GPU a node, each with its
own NIC). NOT YET RUN ON A GPU.

Why: a flat all-to-all over N ranks talks to N - 1 peers, and what it pays a peer
(`a2a_peer_s` of fsbench.scaling.collectives, fitted on nccl-tests logs) grows with them:
at 256 ranks it is most of an exchange of a few MiB. In two hops a rank talks to G - 1
node-mates on NVLink and M - 1 = N/G - 1 peers across nodes. The bytes that cross nodes
are the same; each message across them is G times larger.

At rank (n, l) (node n, local index l; G ranks a node, M nodes, rank = n G + l, the
order torchrun places ranks in):
  hop 1, inside the node: to each node-mate j, the rows for (m, j) of every node m, in
         node order (on a GPU, `inside` is the copy-engine transport: no SM);
  hop 2, across nodes, on rail l: to (m, l), the rows that its node-mates and itself have
         for it, in local order (NCCL, its CTAs capped as sm_free's are).
What (m, l) receives from (n, l) is the rows of (n, 0), ..., (n, G-1) for it: every
source in rank order, the output of one flat all-to-all, so callers see no difference.

Hop 2's splits and the reorder between the hops need the node-mates' send splits: they
are all-gathered inside the node on the host (`meta`, a CPU group: no device sync), N
integers a rank. On CUDA the hop-1 wait, the reorder and hop 2 go on a side stream, so
the compute stream never waits for hop 1; on CPU (gloo) the host waits for hop 1 at the
issue, as the step program for CPU says (freescale_impl.step_schedule).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsbench.measurement.timeline import span
from freescale_impl.transport import CollectiveTransport, Pending


def block_rows(sizes: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Row indices of a buffer of consecutive blocks (`sizes[b]` rows each), the blocks
    taken in `order`: one gather, whatever the number of blocks."""
    starts = torch.cumsum(sizes, 0) - sizes
    lengths = sizes[order]
    total = int(lengths.sum())
    shift = starts[order] - (torch.cumsum(lengths, 0) - lengths)
    return torch.repeat_interleave(shift, lengths, output_size=total) + torch.arange(total)


def hop_plan(node_splits: torch.Tensor, local_rank: int, recv_splits: list[int]) -> dict:
    """Everything both hops need at one rank, from its node's send splits (G x N: row l'
    is what node-mate l' sends each rank) and its own recv splits. Host tensors and lists:
      first      this rank's rows reordered for hop 1 (to node-mate j: the rows for
                 (m, j), m in order)
      hop1_send, hop1_recv   hop 1's splits, per node-mate
      second     hop 1's output reordered for hop 2 (to (m, l): from node-mates in order)
      hop2_send, hop2_recv   hop 2's splits, per node"""
    g = node_splits.shape[0]
    m = node_splits.shape[1] // g
    counts = node_splits.view(g, m, g)  # [l', m, j]: rows (n, l') sends to (m, j)
    mine = counts[local_rank]  # (m, j)
    by_mate = torch.arange(m * g).view(m, g).t().reshape(-1)  # (j, m) order of (m, j) blocks
    column = counts[:, :, local_rank]  # (l', m): what hop 1 brings here, in that order
    by_node = torch.arange(g * m).view(g, m).t().reshape(-1)  # (m, l') order of (l', m) blocks
    return {"first": block_rows(mine.reshape(-1), by_mate),
            "hop1_send": mine.sum(0).tolist(), "hop1_recv": column.sum(1).tolist(),
            "second": block_rows(column.reshape(-1), by_node),
            "hop2_send": column.sum(0).tolist(),
            "hop2_recv": torch.tensor(recv_splits, dtype=torch.int64).view(m, g).sum(1).tolist()}


class _ReadElsewhere(Pending):
    """Hop 2's exchange, issued on the side stream and read on the stream that waits for
    it: that stream holds its output too, for the caching allocator."""

    def wait(self) -> torch.Tensor:
        out = super().wait()
        out.record_stream(torch.cuda.current_stream(out.device))
        return out


class RailTransport:
    """The two-hop exchange of the module docstring, with the transport interface
    (freescale_impl.transport): `inside` moves hop 1 on the node's group, `rail` hop 2."""

    def __init__(self, inside, rail_group, meta_group, local_rank: int, local_size: int) -> None:
        self.inside, self.rail = inside, CollectiveTransport(rail_group)
        self.name = f"hierarchical/{inside.name}"  # what the manifest says ran
        self.meta, self.local_rank, self.local_size = meta_group, local_rank, local_size
        self._side = None  # CUDA: the stream hop 1's wait, the reorder and hop 2 go on

    def node_splits(self, send_splits: list[int], name: str) -> torch.Tensor:
        """Every node-mate's send splits (G x N), gathered on the host."""
        mine = torch.tensor(send_splits, dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.local_size)]
        with span(f"{name}.splits", kind="comm"):
            dist.all_gather(every, mine, group=self.meta)
        return torch.stack(every)

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   name: str) -> Pending:
        plan = hop_plan(self.node_splits(send_splits, name), self.local_rank, recv_splits)
        if not send.is_cuda:
            return self._hops(send, plan, name)
        if self._side is None:
            self._side = torch.cuda.Stream(device=send.device)
        self._side.wait_stream(torch.cuda.current_stream(send.device))
        send.record_stream(self._side)  # read there: the allocator must not reuse it before
        with torch.cuda.stream(self._side):
            second = self._hops(send, plan, name)
        return _ReadElsewhere(second.name, second.output, second._work)

    def _hops(self, send: torch.Tensor, plan: dict, name: str) -> Pending:
        def to(t: torch.Tensor) -> torch.Tensor:
            # pinned: a copy from pageable memory would sync the stream first (a host sync)
            return t.pin_memory().to(send.device, non_blocking=True) if send.is_cuda else t
        first = self.inside.all_to_all(send.index_select(0, to(plan["first"])), plan["hop1_send"],
                                       plan["hop1_recv"], f"{name}.node")
        gathered = first.wait()
        return self.rail.all_to_all(gathered.index_select(0, to(plan["second"])), plan["hop2_send"],
                                    plan["hop2_recv"], f"{name}.nodes")

    def close(self) -> None:
        self.inside.close()


def rail_transport(group, device: torch.device, local_size: int, inside_kind: str, comm_ctas: int):
    """Every rank builds every node's and every rail's groups (collectives over all ranks,
    in one order), then keeps its own: hop 1 on its node's group (copy engines where
    `inside_kind` is sm_free), hop 2 on its rail (NCCL's CTAs capped on CUDA), the splits
    on a gloo group of its node."""
    from freescale_impl.node_transport import capped_nccl_options
    from freescale_impl.transport import make_transport

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world % local_size:
        raise RuntimeError(f"freescale.a2a=hierarchical: {world} ranks are not whole nodes of {local_size}")
    nodes, cuda = world // local_size, getattr(device, "type", device) == "cuda"
    node = meta = rail = None
    for first in range(0, world, local_size):
        members = list(range(first, first + local_size))
        g = dist.new_group(members)
        m = dist.new_group(members, backend="gloo") if cuda else g
        if rank in members:
            node, meta = g, m
    for j in range(local_size):
        r = dist.new_group([k * local_size + j for k in range(nodes)],
                           pg_options=capped_nccl_options(comm_ctas) if cuda else None)
        if rank % local_size == j:
            rail = r
    inside = make_transport(inside_kind, node, device)
    return RailTransport(inside, rail, meta, rank % local_size, local_size)
