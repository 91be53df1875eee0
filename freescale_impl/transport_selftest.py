"""Self-test of the copy-engine transport's record on one GPU: its copies are communication.

The sm_free transport (freescale_impl.transport.SmFreeTransport) pulls rows with `copy_`
from a symmetric-memory buffer mapped on the local device, on a stream of its own; CUPTI
calls such copies device-to-device, so no kernel or copy name says they are
communication. The profiler's reader (fsbench.measurement.kineto) classes them by their
launch inside a `fsbench.comm.` annotation and by the transport's stream. At one rank the
"peer" is the rank itself, which exercises symmetric memory's rendezvous, the staging
copy, both barriers, the pull and its record; pulls between two GPUs over NVLink need a
second GPU and are not checked here. Returns a `fsbench.measurement.selftests.SelfTest`.
NOT YET RUN ON A GPU.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from fsbench.measurement import kineto
from fsbench.measurement.selftests import SelfTest
from freescale_impl.transport import SmFreeTransport, sm_free_unavailable

NAME = "sm_free_copies_are_communication"
WHAT = "one exchange of the copy-engine transport at one rank, under the profiler"


def _one_rank_group(device: torch.device) -> None:
    """A world of one on NCCL, in this process (a store in memory: nothing to reach)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)


def sm_free_copies_are_communication(device: torch.device, work_dir: Path) -> SelfTest:
    from torch.profiler import ProfilerActivity, profile, record_function

    why = sm_free_unavailable(device, 1)
    if why:
        return SelfTest(NAME, WHAT, None, None, "copies", "", None, f"not run: {why}")
    _one_rank_group(device)
    transport = SmFreeTransport(dist.group.WORLD, device)
    send = torch.randn(4096, 64, device=device)  # 1 MiB: one pull
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("fsbench.step.0"):
            received = transport.all_to_all(send, [4096], [4096], "selftest").wait()
            torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, the step's end
    path = work_dir / "selftest-sm-free.json"
    prof.export_chrome_trace(str(path))
    activity = kineto.kernel_intervals(kineto.load_trace(path), device=device.index or 0)
    copies = activity[activity["name"].str.contains("Memcpy", case=False)]
    on_transport = copies[copies["kind"] == "comm"]
    # The staging copy (send -> the symmetric buffer) runs on the compute stream and is a
    # copy, not communication; the pull is on the transport's stream and is communication.
    staged = copies[copies["kind"] == "memcpy"]
    ok = (bool(torch.equal(received, send)) and len(on_transport) >= 1 and len(staged) >= 1
          and on_transport["stream"].nunique() == 1
          and set(on_transport["stream"]).isdisjoint(set(staged["stream"])))
    return SelfTest(NAME, WHAT, float(len(on_transport)), 1.0, "copies classed communication",
                    "at least the one pull, on one stream apart from the staging copy's", ok,
                    f"copies by kind: {copies.groupby('kind').size().to_dict()}, "
                    f"streams: {copies.groupby('kind')['stream'].agg(lambda s: sorted(set(s))).to_dict()}, "
                    f"rows received intact: {bool(torch.equal(received, send))}")
