"""Self-tests of the copy-engine transport on one GPU: its copies are communication, an
exchange never syncs the host, and what moves the one-rank pull's bytes.

The sm_free transport (freescale_impl.transport.SmFreeTransport) pulls rows with `copy_`
from a symmetric-memory buffer mapped on the local device, on a stream of its own; CUPTI
calls such copies device-to-device, so no kernel or copy name says they are
communication. The profiler's reader (fsbench.measurement.kineto) classes them by their
launch inside a `fsbench.comm.` annotation and by the transport's stream. At one rank the
"peer" is the rank itself, which exercises symmetric memory's rendezvous, the staging
copy, both barriers, the pull and its record; pulls between two GPUs over NVLink need a
second GPU and are not checked here, nor is whether they are SM-free there. Each returns
a `fsbench.measurement.selftests.SelfTest`; each makes its world of one and its transport
and frees both in a `finally` (`one_rank_transport`). NOT YET RUN ON A GPU.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from fsbench.measurement import kineto
from fsbench.measurement.selftests import SelfTest
from fsbench.training.dist import one_rank_group
from freescale_impl.transport import SmFreeTransport, pull_plan, slot_elements, sm_free_unavailable

NAME = "sm_free_copies_are_communication"
WHAT = "one exchange of the copy-engine transport at one rank, under the profiler"


@contextlib.contextmanager
def one_rank_transport(device: torch.device, make=SmFreeTransport):
    """A world of one (NCCL on CUDA: fsbench.training.dist.one_rank_group) and a transport
    on it; on the way out, also on an exception, the transport is closed (its symmetric
    memory freed) and then the group destroyed: a self-test that fails half-way must not
    leave NCCL's communicator or the buffer to the tests after it."""
    with one_rank_group(device) as group:
        transport = make(group, device)
        try:
            yield transport
        finally:
            transport.close()


def sm_free_copies_are_communication(device: torch.device, work_dir: Path) -> SelfTest:
    from torch.profiler import ProfilerActivity, profile, record_function

    why = sm_free_unavailable(device, 1)
    if why:
        return SelfTest(NAME, WHAT, None, None, "copies", "", None, f"not run: {why}")
    send = torch.randn(4096, 64, device=device)  # 1 MiB: one pull
    with one_rank_transport(device) as transport:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function("fsbench.step.0"):
                received = transport.all_to_all(send, [4096], [4096], "selftest").wait()
                torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, the step's end
    path = work_dir / "selftest-sm-free.json"
    prof.export_chrome_trace(str(path))
    activity = kineto.kernel_intervals(kineto.load_trace(path), device=device.index or 0)
    copies = activity[activity["name"].str.contains("Memcpy", case=False)]
    on_transport = copies[copies["kind"] == "comm"]
    # The staging copy (send -> this rank's slot of the symmetric buffer) and the pull both
    # run on the transport's copy stream inside its comm annotation: the exchange's own
    # copies, communication; none is left on the caller's stream as a plain copy.
    plain = copies[copies["kind"] == "memcpy"]
    ok = (bool(torch.equal(received, send)) and len(on_transport) >= 2 and plain.empty
          and on_transport["stream"].nunique() == 1)
    return SelfTest(NAME, WHAT, float(len(on_transport)), 2.0, "copies classed communication",
                    "at least the staging copy and the pull, on one stream, no plain copy", ok,
                    f"copies by kind: {copies.groupby('kind').size().to_dict()}, "
                    f"streams: {copies.groupby('kind')['stream'].agg(lambda s: sorted(set(s))).to_dict()}, "
                    f"rows received intact: {bool(torch.equal(received, send))}")


def sm_free_exchange_never_syncs(device: torch.device) -> SelfTest:
    """One exchange, counted by torch's sync debug mode (fsbench.measurement.host_syncs):
    no host sync. Each receiver pulls its own slot of every peer's buffer
    (freescale_impl.transport.slot_plan); before, the peers' offsets were swapped and read
    back on the host, one sync an exchange."""
    from fsbench.measurement.host_syncs import HostSyncCounter

    name, what = "sm_free_exchange_never_syncs", "one exchange of the copy-engine transport at one rank"
    why = sm_free_unavailable(device, 1)
    if why:
        return SelfTest(name, what, None, None, "syncs", "", None, f"not run: {why}")
    send = torch.randn(4096, 64, device=device)
    with one_rank_transport(device) as transport:
        transport.all_to_all(send, [4096], [4096], "warm").wait()  # first use: allocations
        torch.cuda.synchronize(device)  # note: a sync point outside the counted exchange
        with HostSyncCounter(True, lambda: []).step() as counts:
            transport.all_to_all(send, [4096], [4096], "counted").wait()
        torch.cuda.synchronize(device)  # note: a sync point after the counted exchange
    return SelfTest(name, what, float(counts["host_syncs"]), 0.0, "syncs", "exactly",
                    counts["host_syncs"] == 0, f"counts {counts}")


def sm_free_pull_sm_util(device: torch.device, nbytes: int = 48 << 20) -> SelfTest:
    """What moves the one-rank pull's bytes: GPM SM utilization while the transport's own
    pull (SmFreeTransport.pull) runs alone, back to back (fsbench.measurement.copy_engines).
    A verdict, not a pass mark: passes when a reading was made. "SM" means the transport
    is SM-free only between GPUs, if there (not checked on one GPU); the summary says so."""
    from fsbench.measurement.copy_engines import judged, sm_util_while
    from fsbench.measurement.nvml import environment_limit

    name, what = "sm_free_pull_sm_util", "SM utilization while the one-rank sm_free pull runs alone"
    why = sm_free_unavailable(device, 1)
    if why:
        return SelfTest(name, what, None, None, "fraction", "", None, f"not run: {why}")
    rows = nbytes // (64 * 4)
    send = torch.randn(rows, 64, device=device)
    output = torch.empty_like(send)
    with one_rank_transport(device) as transport:
        transport.all_to_all(send, [rows], [rows], "stage").wait()  # the rows staged once
        plan = pull_plan(64, [rows], 0, slot_elements(transport.buffer.numel(), 1, send.dtype))

        # sm_util_while waits for the whole device between bursts, the pull's stream too
        util, reason = sm_util_while(device, lambda: transport.pull(output, send.dtype, plan, "selftest"))
        intact = bool(torch.equal(output, send))
    found = judged("sm_free_pull", util, reason)
    if util is None:
        env = environment_limit(reason)
        return SelfTest(name, what, None, None, "fraction", "", None if env else False,
                        f"not run: environment: {reason}" if env else reason or "no reading",
                        record={"copies": [found]})
    return SelfTest(name, what, util, None, "SM util fraction",
                    "a verdict: <= 0.05 a copy engine, above it SMs", intact,
                    f"moved by {found['moved_by']}; rows intact: {intact}", record={"copies": [found]})
