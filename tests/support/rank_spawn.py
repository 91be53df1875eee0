"""Ranks for the tests that start their own gloo groups: torch.multiprocessing.spawn's
contract (fn(rank, *args) in each of nprocs processes, an exception in one raised here),
with the ranks forked from the server that fsbench's launcher forks its ranks from.

A spawned rank is a cold interpreter: it imports torch, fsbench and the test module before
its first collective, a few seconds each on a 2-core machine, which was most of what the
4-rank exchange tests took. The server (fsbench.running.launch.forked) imported torch and
the trainers once and nothing has run in it, so a forked rank starts as a fresh one would,
its first op still ahead of it; each rank sets its own threads and MASTER_ADDR/PORT, as
under spawn. One server serves the whole session, this helper and the launcher alike.
"""
from __future__ import annotations

import torch.multiprocessing as mp

from fsbench.training.warm_start import warm_context


def spawn_ranks(fn, args: tuple, nprocs: int) -> None:
    """fn(rank, *args) for rank in range(nprocs), forked warm; joins them, and raises as
    torch.multiprocessing.spawn does when a rank fails."""
    warm_context()  # the server's preload, whoever in this process starts it first
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
