"""Transports: one interface for "move these rows to these ranks", chosen by
`--set freescale.transport=collective|sm_free`.

    pending = transport.all_to_all(send, send_splits, recv_splits, name)   # issue, async
    received = pending.wait()                                              # where needed

`send` holds the rows for rank 0, then rank 1, ... (`send_splits[r]` rows each); the
result holds what each rank sent here, in rank order (`recv_splits`). Issue and wait are
separate so that the trainer can put compute between them; each is a `comm` span, and
each collective's flight from issue to completion is recorded (`Timeline.in_flight`), so
exposed and hidden communication are both measured.

collective  `torch.distributed.all_to_all_single` on the trainer's own group: gloo on CPU,
            NCCL on GPU (whose kernels run on SMs, competing with overlapped compute).
sm_free     CUDA ranks with peer access: each rank stages its rows in a PyTorch
            symmetric-memory buffer and every peer *pulls* its slices with plain device
            copies (cudaMemcpyAsync, no kernel of ours). Between GPUs such a copy is a
            peer DMA, which copy engines carry; within one GPU (one rank pulling from
            itself) the driver may run it on SMs, as fast same-GPU copies suggest. The
            device check samples SM utilization while the one-rank pull runs alone
            (freescale_impl.transport_selftest) and says which; whether pulls between GPUs
            are SM-free needs two GPUs and is not checked. One host sync per exchange:
            the peers' offsets read back. Feature-detected (`sm_free_unavailable`): asking
            for it where it cannot run is a one-line error before any rank starts. NOT
            YET RUN ON A GPU.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from fsbench.measurement.comm_annotation import comm_launch
from fsbench.measurement.timeline import current, span

TRANSPORTS = ("collective", "sm_free")


class Pending:
    """An issued exchange; `wait()` returns the received tensor (once)."""

    def __init__(self, name: str, output: torch.Tensor, work=None, finish=None) -> None:
        self.name, self.output, self._work, self._finish = name, output, work, finish
        self._done = work is None and finish is None

    def wait(self) -> torch.Tensor:
        if not self._done:
            with span(f"{self.name}.wait", kind="comm"):
                if self._work is not None:
                    self._work.wait()
                if self._finish is not None:
                    self._finish()
            self._done = True
        return self.output


class CollectiveTransport:
    name = "collective"

    def __init__(self, group) -> None:
        self.group = group

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   name: str) -> Pending:
        output = send.new_empty((sum(recv_splits), *send.shape[1:]))
        with span(f"{name}.issue", kind="comm"):
            flight = current().in_flight(name)
            work = dist.all_to_all_single(output, send.contiguous(), recv_splits, send_splits,
                                          group=self.group, async_op=True)
            # Completion is stamped by gloo's/NCCL's own thread, not when we wait: a
            # message that landed during compute was hidden even if we wait later.
            work.get_future().then(lambda _: flight.finish())
        return Pending(name, output, work)

    def close(self) -> None:
        """Nothing of its own to free: the group is its owner's."""


def sm_free_unavailable(device: torch.device | str, world_size: int, local_size: int | None = None) -> str | None:
    """Why `sm_free` cannot run here (one line), or None where it can. Beyond one node
    (`local_size` ranks a node, by default this host's GPUs) every node holds as many ranks
    and the exchange splits by node (freescale_impl.node_transport)."""
    if getattr(device, "type", device) != "cuda" or not torch.cuda.is_available():
        return "it needs CUDA ranks (this run's device is cpu)"
    try:
        from torch.distributed import _symmetric_memory  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed._symmetric_memory"
    count = torch.cuda.device_count()
    local = min(world_size, local_size or count)
    if local > count:
        return f"it needs one local GPU per rank ({local} ranks a node, {count} GPUs)"
    if world_size % local:
        return f"every node needs as many ranks ({world_size} ranks, {local} a node)"
    for a in range(local):
        for b in range(local):
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return f"GPUs {a} and {b} have no peer access"
    return None


def elements_per_row(send: torch.Tensor) -> int:
    """Elements in one row of `send` (rows along dim 0), known from the shape alone: an
    exchange may send no rows at all (with priority on, the first step's final rows)."""
    return math.prod(send.shape[1:])


def send_starts(send_splits: list[int]) -> list[int]:
    """Where the rows for each destination rank start in the sender's staging buffer."""
    return [sum(send_splits[:r]) for r in range(len(send_splits))]


def pull_plan(row: int, recv_splits: list[int], peer_starts: list[int]) -> list[tuple[int, int, int, int]]:
    """The copies a receiver makes, in elements: (peer, where in the peer's staging buffer,
    where in the output, how many), skipping peers that send nothing. `peer_starts[p]`:
    where this rank's rows start in peer p's buffer, in rows (p's `send_starts`)."""
    plan, at = [], 0
    for peer, n in enumerate(recv_splits):
        if n:
            plan.append((peer, peer_starts[peer] * row, at * row, n * row))
        at += n
    return plan


class SmFreeTransport:
    """Pull-based all-to-all over symmetric memory: rank r copies its slice out of every
    peer's staging buffer with `Tensor.copy_` (cudaMemcpyAsync: a peer DMA between GPUs;
    see the module docstring for one GPU). Two barriers per exchange: the senders' rows are staged before anyone pulls,
    and everyone has pulled before a buffer is reused.

    The flight ends at an event recorded on the copy stream right after the pulls (not
    when the caller waits: compute queued in between is no part of it), and nothing here
    blocks the host on the device: `wait()` makes the caller's stream wait for the pulls
    and queues the second barrier behind them. The pulls are launched inside a
    `fsbench.comm.` annotation on their own stream, so that the profiler's record classes
    them as communication (CUPTI calls them device-to-device copies). NOT YET RUN ON A GPU."""

    name = "sm_free"

    def __init__(self, group, device: torch.device, capacity_bytes: int = 64 << 20) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group, self.device = group, device
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.symm_mem = symm_mem
        self.buffer = symm_mem.empty(capacity_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group)
        # Copies run on their own stream so that compute on the default stream overlaps.
        self.stream = torch.cuda.Stream(device)
        self._unfinished: Pending | None = None

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   name: str) -> Pending:
        # One staging buffer: the previous exchange's pulls must end before it is reused.
        if self._unfinished is not None:
            self._unfinished.wait()
        nbytes = send.numel() * send.element_size()
        if nbytes > self.buffer.numel():
            raise RuntimeError(f"{name}: {nbytes} bytes exceed the sm_free staging buffer "
                               f"({self.buffer.numel()} bytes)")
        row = elements_per_row(send)
        output = send.new_empty((sum(recv_splits), *send.shape[1:]))
        # Where my rows start in each peer's buffer (the peer's send splits to the ranks
        # before me): receivers know only their own recv splits, so exchange them.
        starts = offsets_to_device(send_starts(send_splits), self.device)
        peer_starts = torch.empty_like(starts)
        with span(f"{name}.issue", kind="comm"):
            flight = current().in_flight(name)
            dist.all_to_all_single(peer_starts, starts, group=self.group)
            # note: a CPU-GPU sync point, the exchange's one (the offsets are needed on the
            # host to slice); torch's sync-debug mode sees it, so host_syncs_fwd_bwd_per_step
            # counts it.
            peer_starts = peer_starts.tolist()
            self.buffer[:nbytes].view(send.dtype)[:send.numel()].copy_(send.reshape(-1))
            self.handle.barrier()  # every rank has staged its rows
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            self.pull(output, send.dtype, pull_plan(row, recv_splits, peer_starts), name)
            done = torch.cuda.Event()
            done.record(self.stream)
            flight.finish_on(self.stream)  # the pulls' end, on their stream

        def finish() -> None:
            # No host synchronize: inside forward and backward it would drain the device
            # (and torch's sync-debug mode would not count it). The caller's stream waits
            # for the pulls; the barrier, queued behind them on that stream, completes when
            # every peer has pulled, and only then can a later staging copy (queued after
            # it on the same stream) overwrite the buffer.
            torch.cuda.current_stream(self.device).wait_event(done)
            self.handle.barrier()  # every peer has pulled: the staging buffer is free
            self._unfinished = None

        self._unfinished = Pending(name, output, finish=finish)
        return self._unfinished

    def pull(self, output: torch.Tensor, dtype: torch.dtype, plan: list[tuple[int, int, int, int]],
             name: str) -> None:
        """The pulls of `plan` (pull_plan) into `output`, queued on the transport's stream
        inside a comm annotation: the copies the device check samples SM utilization
        under (freescale_impl.transport_selftest), so it judges the code that runs here."""
        src_elements = self.buffer.numel() // torch.empty((), dtype=dtype).element_size()
        with torch.cuda.stream(self.stream), comm_launch(f"sm_free.{name}"):
            for peer, src_at, dst_at, count in plan:
                src = self.handle.get_buffer(peer, (src_elements,), dtype)
                output.view(-1)[dst_at:dst_at + count].copy_(src[src_at:src_at + count],
                                                             non_blocking=True)

    def close(self) -> None:
        """Let go of the symmetric memory: the pending exchange finished, the device idle
        (no pull still reads the buffer), then the buffer and its handle dropped, which
        frees the allocation; the group stays its owner's to destroy."""
        if self._unfinished is not None:
            self._unfinished.wait()
        torch.cuda.synchronize(self.device)  # note: a CPU-GPU sync point, at teardown only
        self.handle = self.buffer = None


def offsets_to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A few int64 offsets on `device` without a host wait: on CUDA staged in pinned host
    memory and copied `non_blocking` (a DMA queued on the current stream; torch's caching
    host allocator keeps the pinned block until the copy ends). From pageable memory,
    `torch.tensor(..., device=cuda)` makes the host wait for the stream: a second host
    sync in every exchange, beside the offsets' read back."""
    host = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def make_transport(name: str, group, device: torch.device):
    """Within one node (sm_free beyond one: freescale_impl.node_transport)."""
    if name == "collective":
        return CollectiveTransport(group)
    if name == "sm_free":
        why = sm_free_unavailable(device, dist.get_world_size(group))
        if why:
            raise RuntimeError(f"freescale.transport=sm_free cannot run: {why}")
        return SmFreeTransport(group, device)
    raise ValueError(f"transport={name!r}; choose one of: {', '.join(TRANSPORTS)}")
