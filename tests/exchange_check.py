"""One exchange of a transport against one flat all-to-all (freescale_impl.transport's
interface), on real gloo groups inside a rank process: the transports that split an
exchange (by node, in two hops) must deliver exactly what it does."""
from __future__ import annotations

import torch
import torch.distributed as dist


def against_one_all_to_all(transport, plain, rank: int, world: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(what `transport` delivers, what `plain` (a CollectiveTransport over every rank)
    does) for uneven random splits, one of them empty, the same on both: every rank's
    recv splits from the others' send splits, all gathered."""
    gen = torch.Generator().manual_seed(seed)
    send_splits = torch.randint(0, 4, (world,), generator=gen)
    send_splits[(rank + 1) % world] = 0
    every = [torch.zeros(world, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(every, send_splits)
    recv = [int(every[src][rank]) for src in range(world)]
    send = torch.randn(int(send_splits.sum()), 3, generator=gen)
    sends = send_splits.tolist()
    got = transport.all_to_all(send, sends, recv, "x").wait()
    want = plain.all_to_all(send, sends, recv, "y").wait()
    return got, want
