"""The run-time half of classing GPU work as communication: an annotation around its
launch. Kept apart from fsbench.measurement.kineto (the analysis, on pandas) so that a
rank that imports it (FreeScale's transport, the synthetic model) does not load pandas:
some 60 MB of every rank's memory."""
from __future__ import annotations

COMM_ANNOTATION = "fsbench.comm."


def comm_launch(name: str):
    """`with comm_launch("sm_free.pull"):` around the launch of communication on its own
    stream: the profiler's record classes what is launched inside as communication, and
    everything on a stream that carries nothing else (fsbench.measurement.kineto
    `comm_activity`). Hazard: wrap only launches on that stream; a launch on the compute
    stream inside it would be booked as communication. Costs a record_function
    (microseconds) when no profiler runs."""
    import torch

    return torch.profiler.record_function(COMM_ANNOTATION + name)
