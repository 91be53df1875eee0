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
            are SM-free needs two GPUs and is not checked. No host sync: the buffer holds
            a slot for each receiver at a place every rank knows (`slot_plan`), so a
            receiver pulls with its own recv splits alone and no offsets are swapped.
            Feature-detected (`sm_free_unavailable`): asking for it where it cannot run is
            a one-line error before any rank starts. NOT YET RUN ON A GPU.
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
            flight.watch(work)  # and the rank's own spans see it done (Flight.watch)
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
    """Where the rows for each destination rank start in the sender's `send`."""
    return [sum(send_splits[:r]) for r in range(len(send_splits))]


def slot_plan(row: int, send_splits: list[int], slot: int) -> list[tuple[int, int, int]]:
    """The staging copies a sender makes, in elements: (from where in `send`, to where in
    its buffer, how many). The rows for rank d go to slot d, `slot` elements from d * slot:
    a place the receiver knows without asking (unlike a packed buffer, whose offsets
    depend on every other receiver's count and had to be swapped, and read back on the
    host, at each exchange)."""
    return [(start * row, dest * slot, n * row)
            for dest, (start, n) in enumerate(zip(send_starts(send_splits), send_splits)) if n]


def pull_plan(row: int, recv_splits: list[int], rank: int, slot: int) -> list[tuple[int, int, int, int]]:
    """The copies a receiver makes, in elements: (peer, where in the peer's staging buffer,
    where in the output, how many), skipping peers that send nothing: this rank's slot of
    each peer's buffer (`slot_plan`)."""
    plan, at = [], 0
    for peer, n in enumerate(recv_splits):
        if n:
            plan.append((peer, rank * slot, at * row, n * row))
        at += n
    return plan


def slot_elements(buffer_bytes: int, world_size: int, dtype: torch.dtype) -> int:
    """Elements of `dtype` in one receiver's slot of a staging buffer of `buffer_bytes`."""
    return buffer_bytes // world_size // torch.empty((), dtype=dtype).element_size()


def check_slots(name: str, row: int, slot: int, send_splits: list[int], recv_splits: list[int],
                buffer_bytes: int) -> None:
    """One line naming the exchange when a peer's rows overflow its slot, on the sender and
    on the receiver alike (both know the count), before anything is staged."""
    most = max([0, *send_splits, *recv_splits])
    if most * row > slot:
        raise RuntimeError(f"{name}: {most} rows for one peer exceed the sm_free staging slot of "
                           f"{slot // max(row, 1)} rows (a {buffer_bytes >> 20} MiB buffer over "
                           f"{len(send_splits)} ranks); use freescale.transport=collective")


class SmFreeTransport:
    """Pull-based all-to-all over symmetric memory: rank r copies its slot out of every
    peer's staging buffer with `Tensor.copy_` (cudaMemcpyAsync: a peer DMA between GPUs;
    see the module docstring for one GPU). Each receiver has a slot of `capacity_bytes /
    world` in every buffer (`slot_plan`).

    The whole exchange runs on the transport's copy stream, after what the caller's stream
    queued before it (the rows to send): the staging copies, a barrier (every rank has
    staged), the pulls, a barrier (every peer has pulled). The caller's stream waits only
    for the pulls, in `wait()`: never for a barrier, nor for an earlier exchange, whose last
    barrier the next staging queues behind on the same stream (so the buffer is never
    overwritten while a peer pulls). A barrier is a one-block kernel (symmetric memory's),
    microseconds on an SM; the copies use none between GPUs. Nothing here blocks the host.

    The flight ends at an event recorded on the copy stream right after the pulls (not
    when the caller waits: compute queued in between is no part of it). The staging copies
    and the pulls are launched inside a `fsbench.comm.` annotation on the copy stream, so
    that the profiler's record classes them as communication (CUPTI calls them
    device-to-device copies). NOT YET RUN ON A GPU."""

    name = "sm_free"

    def __init__(self, group, device: torch.device, capacity_bytes: int = 256 << 20) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group, self.device = group, device
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.symm_mem = symm_mem
        self.buffer = symm_mem.empty(capacity_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buffer, group)
        # The exchange's own stream, so that compute on the caller's stream overlaps it.
        self.stream = torch.cuda.Stream(device)

    def all_to_all(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int],
                   name: str) -> Pending:
        row = elements_per_row(send)
        slot = slot_elements(self.buffer.numel(), self.world_size, send.dtype)
        check_slots(name, row, slot, send_splits, recv_splits, self.buffer.numel())
        output = send.new_empty((sum(recv_splits), *send.shape[1:]))
        with span(f"{name}.issue", kind="comm"):
            flight = current().in_flight(name)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            if send.is_cuda:  # used on the copy stream: not reused before it is done with them
                send.record_stream(self.stream)
                output.record_stream(self.stream)
            self.stage(send, slot_plan(row, send_splits, slot), name)
            with torch.cuda.stream(self.stream):
                self.handle.barrier()  # every rank has staged its rows
            self.pull(output, send.dtype, pull_plan(row, recv_splits, self.rank, slot), name)
            done = torch.cuda.Event()
            done.record(self.stream)
            flight.finish_on(self.stream)  # the pulls' end, on their stream
            with torch.cuda.stream(self.stream):
                self.handle.barrier()  # every peer has pulled: the buffer may be staged again

        def finish() -> None:
            # No host synchronize: inside forward and backward it would drain the device
            # (and torch's sync-debug mode would not count it). The caller's stream waits
            # for the pulls alone.
            torch.cuda.current_stream(self.device).wait_event(done)

        return Pending(name, output, finish=finish)

    def stage(self, send: torch.Tensor, plan: list[tuple[int, int, int]], name: str) -> None:
        """Each receiver's rows into its slot of this rank's buffer (`slot_plan`), on the
        copy stream inside a comm annotation: the exchange's own copies."""
        staging, flat = self.buffer.view(send.dtype), send.reshape(-1)
        with torch.cuda.stream(self.stream), comm_launch(f"sm_free.{name}.stage"):
            for src_at, dst_at, count in plan:
                staging[dst_at:dst_at + count].copy_(flat[src_at:src_at + count], non_blocking=True)

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
        """Let go of the symmetric memory: the device idle (no copy or barrier of an
        exchange still uses the buffer), then the buffer and its handle dropped, which
        frees the allocation; the group stays its owner's to destroy."""
        torch.cuda.synchronize(self.device)  # note: a CPU-GPU sync point, at teardown only
        self.handle = self.buffer = None


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
