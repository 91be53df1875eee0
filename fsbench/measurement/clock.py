"""The ranks' one clock, and each rank's offset to rank 0's.

Spans are stamped with CLOCK_MONOTONIC. On one host every process shares it; across hosts
each has its own zero, so a step time taken as "last rank's end - first rank's start" from
raw stamps of two hosts would be garbage. After joining the world every rank measures its
offset to rank 0 (`measure_offset`: a ping-pong over gloo, NTP's rule, keeping the round
trip with the least delay) and writes it to clock-rank-<r>.json; `read_timelines` moves
every rank's stamps onto rank 0's clock before any metric sees them.

FSBENCH_CLOCK_SKEW_NS (tests only) adds a constant to this process's clock: two torchrun
node agents on one machine then behave like two hosts whose clocks disagree.
"""
from __future__ import annotations

import os
import time

SKEW_NS = int(float(os.environ.get("FSBENCH_CLOCK_SKEW_NS", "0")))
ROUNDS = 16


def now_ns() -> int:
    return time.monotonic_ns() + SKEW_NS


def measure_offset(rank: int, world_size: int, group=None) -> dict:
    """Offset (ns) to add to this rank's stamps to express them on rank 0's clock, and the
    round trip it was measured over (its error is at most half of it). Collective: every
    rank calls it; rank 0 answers each other rank in turn."""
    import torch
    import torch.distributed as dist

    if world_size == 1:
        return {"offset_ns": 0, "rtt_ns": 0}
    buf = torch.zeros(1, dtype=torch.int64)
    best = {"offset_ns": 0, "rtt_ns": None}
    for peer in range(1, world_size):
        for _ in range(ROUNDS):
            if rank == 0 and peer != 0:
                dist.recv(buf, src=peer, group=group)        # the peer's "now": a ping
                buf.fill_(now_ns())
                dist.send(buf, dst=peer, group=group)        # rank 0's clock, as soon as possible
            elif rank == peer:
                t1 = now_ns()
                buf.fill_(t1)
                dist.send(buf, dst=0, group=group)
                dist.recv(buf, src=0, group=group)
                t3 = now_ns()
                rtt = t3 - t1
                if best["rtt_ns"] is None or rtt < best["rtt_ns"]:
                    # rank 0 read its clock half-way through the round trip (symmetric delays)
                    best = {"offset_ns": int(buf.item()) - (t1 + t3) // 2, "rtt_ns": rtt}
    if rank == 0:
        best["rtt_ns"] = 0
    return best


# compute=emulated (fsbench.models.emulation): this process's (rank's) emulated compute so far,
# the busy clock of its timeline's spans.
_emulated_ns = 0


def emulated_ns() -> int:
    return _emulated_ns


def emulate(ns: float) -> None:
    """Wait `ns` without using the CPU, and count it as compute."""
    global _emulated_ns
    if ns > 0:
        time.sleep(ns / 1e9)
        _emulated_ns += int(ns)
