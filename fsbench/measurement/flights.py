"""Flights of the collectives a framework issues inside its own code (TorchRec, DeepSpeed).

The metrics book a compute span's blocked time as communication only while a collective
of its rank is in flight (fsbench.measurement.metrics), so every collective a trainer runs must leave
a `flight` record (fsbench.measurement.timeline). Our own code records them where it issues them
(fsbench.training.dp's DDP comm hook, freescale_impl.transport); a framework issues its own deep
inside forward, backward and its optimizer step. `FrameworkFlights` wraps
torch.distributed's collective functions in the rank process, so that every call is
recorded from issue to completion: a synchronous call completes when it returns, an
asynchronous one when its Work's future does (stamped by the communication library's
thread, whenever the caller waits).

Hazards: install it before the framework initializes (DeepSpeed keeps references to some
of these functions). DDP's reducer calls its process group from C++, past any Python
wrapper: `allreduce_in_python` gives a framework-built DDP a comm hook that does what
DDP's default does and records its flight. Collectives issued from C++ by other
paths (functional collectives under torch.compile) stay unseen; the harness's own start
barrier is not a collective of the step and is not wrapped.
"""
from __future__ import annotations

import functools

import torch.distributed as dist

from fsbench.measurement.timeline import current

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather",
               "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "all_to_all", "all_to_all_single", "gather", "scatter")


def _recorded(name: str, collective):
    @functools.wraps(collective)
    def call(*args, **kwargs):
        flight = current().in_flight(name)
        work = collective(*args, **kwargs)
        if work is None:  # synchronous (or this rank is not in the group): done
            flight.finish()
        else:
            try:
                work.get_future().then(lambda _: flight.finish())
            except RuntimeError:  # a Work without a future (inside a coalescing block)
                pass  # its end is unknown: better no record than a wrong one
        return work
    call.fsbench_original = collective
    return call


class FrameworkFlights:
    """While open, every torch.distributed collective of this process is recorded as a
    flight on the current timeline; `close()` restores the original functions."""

    def __init__(self) -> None:
        self._originals = {}
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None and not hasattr(fn, "fsbench_original"):
                self._originals[name] = fn
                setattr(dist, name, _recorded(name, fn))

    def close(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)
        self._originals = {}


def allreduce_in_python(ddp) -> None:
    """Gives a framework-built DDP a comm hook that does DDP's default arithmetic (divide
    by the group's size, then sum) through Python, recording its flight itself: DDP waits
    for the hook's future, which completes only once the flight is recorded. (Through
    `FrameworkFlights`' wrapper the record came from a second callback on gloo's thread,
    which could wait for the GIL past DDP's wait: a fast-tier test read no flight, once,
    on 2026-12-07.)"""
    group = ddp.process_group

    def hook(state, bucket):
        tensor = bucket.buffer().div_(group.size())
        all_reduce = getattr(dist.all_reduce, "fsbench_original", dist.all_reduce)
        flight = current().in_flight("all_reduce")

        def done(fut):
            flight.finish()
            return fut.value()[0]

        return all_reduce(tensor, group=group, async_op=True).get_future().then(done)

    ddp.register_comm_hook(None, hook)
