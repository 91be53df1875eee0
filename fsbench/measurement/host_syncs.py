"""Device-to-host synchronizations per step on CUDA: a measured quantity.

torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`) makes every CUDA call
that makes the host wait for the device warn ("called a synchronizing CUDA operation"):
`.item()`, `.tolist()`, a boolean mask, `nonzero`, a copy to pageable host memory.
`HostSyncCounter` turns it on for the trainer's part of each step and counts those
warnings, and how many fell while a `forward` or `backward` span was open (the timeline's
open spans), where a sync drains the device and undoes overlap: FreeScale's exchange
targets zero there (freescale_impl.embedding_exchange). Warnings raised on autograd's
device threads are replayed on the calling thread when `backward()` returns, still inside
its span. The worker's own end-of-step synchronize falls outside the count. CPU runs have
nothing to count: None. NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterator

SYNC_WARNING = "called a synchronizing CUDA operation"
INSIDE = ("forward", "backward")


class HostSyncCounter:
    """`with counter.step() as counts:` around a step's training: on CUDA `counts` holds
    `host_syncs` and `host_syncs_fwd_bwd` when the block ends; elsewhere it is None.
    `open_spans()` names the spans open at a moment (Timeline.open_spans)."""

    def __init__(self, on: bool, open_spans: Callable[[], list[str]]) -> None:
        self.on, self.open_spans = on, open_spans

    @contextlib.contextmanager
    def step(self) -> Iterator[dict | None]:
        if not self.on:
            yield None
            return
        import torch

        counts = {"host_syncs": 0, "host_syncs_fwd_bwd": 0}
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # every sync, not only a call site's first
            shown = warnings.showwarning

            def count(message, category, filename, lineno, file=None, line=None):
                if SYNC_WARNING not in str(message):
                    return shown(message, category, filename, lineno, file, line)
                counts["host_syncs"] += 1
                counts["host_syncs_fwd_bwd"] += any(s in INSIDE for s in self.open_spans())
            warnings.showwarning = count
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield counts
            finally:
                torch.cuda.set_sync_debug_mode(previous)


def per_step(stats) -> dict:
    """The summary's keys from the step records (`host_syncs`, `host_syncs_fwd_bwd` per rank
    and step, measured steps only): the busiest rank's mean per step; None where no rank
    counted (CPU runs, runs recorded before the count existed)."""
    out = {"host_syncs_per_step": None, "host_syncs_fwd_bwd_per_step": None}
    for key, name in (("host_syncs", "host_syncs_per_step"), ("host_syncs_fwd_bwd", "host_syncs_fwd_bwd_per_step")):
        if key in stats and stats[key].notna().any():
            out[name] = float(stats.groupby("rank")[key].mean().max())
    return out
