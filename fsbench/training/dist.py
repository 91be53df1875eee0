"""One distributed init. The torchrun environment is the contract.

A rank learns who it is from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT,
whether the local launcher (`fsbench.running.launch.local`) or `torchrun` set them, so the same
worker runs unchanged on a laptop and across nodes.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


@dataclass(slots=True)
class RankContext:
    """Who this process is in the world; passed explicitly, never kept as a global."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    group: dist.ProcessGroup | None  # the default (world) group
    barrier_group: dist.ProcessGroup | None = None
    """The harness's start-of-step barrier only. Collectives on one gloo group run in
    order, so a barrier on the trainer's group would wait for communication the trainer
    issued in step k for step k+1 and hide it outside the timed step; its own group
    cannot. (gloo also on CUDA: a CPU barrier, no device stream involved.)"""
    run_dir: Path | None = None
    """Where this run's files go (its parent is the results store)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier(group=self.barrier_group or self.group)


def env_rank() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment; 1 rank if absent."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    if not 0 <= rank < world:
        raise RuntimeError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return rank, world, local


def init_distributed(backend: str, device: str, timeout_s: float = 300.0) -> RankContext:
    """Join the world described by the environment (always, even at world size 1, so the
    code path is the same at every size)."""
    rank, world, local = env_rank()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda was asked for but torch.cuda.is_available() is False")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(
        backend=backend, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    barrier_group = dist.new_group(backend="gloo")  # collective: every rank creates it
    return RankContext(rank=rank, world_size=world, local_rank=local, device=dev,
                       backend=backend, group=dist.group.WORLD, barrier_group=barrier_group)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def one_rank_backend(device: torch.device | str) -> str:
    """The backend a world of one uses on `device`: the runs' own (NCCL on CUDA, so the
    same communicator code runs where it is timed or checked), gloo elsewhere."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@contextlib.contextmanager
def one_rank_group(device: torch.device | str):
    """A world of one in this process, for code that needs a process group outside a run
    (the calibration's DDP, the device check's preflight and self-tests), on an in-memory
    store (nothing to reach). Yields the world group and destroys it on the way out, also
    on an exception: a communicator left behind holds NCCL's buffers and threads, and a
    second init in the same process would fail. Inside a rank (a group exists already)
    it yields that group and leaves it alone. Drop what holds the group (a DDP module)
    inside the block: one that outlives it can deadlock gloo's teardown
    (fsbench.costmodel.timing.measure_replicated_ns_per_element says how)."""
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    device = torch.device(device)
    options = {}
    if device.type == "cuda":
        # device_id binds the communicator to this GPU now (eager init), so a broken NCCL
        # fails here, at the group, and not at the first collective.
        index = torch.cuda.current_device() if device.index is None else device.index
        options["device_id"] = torch.device("cuda", index)
    dist.init_process_group(one_rank_backend(device), store=dist.HashStore(), rank=0,
                            world_size=1, **options)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
