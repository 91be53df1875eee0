"""A world of one made outside a run (fsbench.training.dist.one_rank_group): the backend the
runs use on the device, a group torn down on every way out, and the code that needs it
(the replicated tables' calibration under DDP, the transport self-tests' cleanup) on CPU
with gloo. The CUDA side (NCCL) is in tests/test_gpu_selftests.py."""
import dataclasses

import pytest
import torch
import torch.distributed as dist

from fsbench.training.dist import one_rank_backend, one_rank_group
from fsbench.workloads.presets import tiny


def test_a_world_of_one_uses_the_runs_backend_and_is_gone_after_an_exception():
    assert (one_rank_backend("cuda:0"), one_rank_backend(torch.device("cuda")), one_rank_backend("cpu")) == (
        "nccl", "nccl", "gloo")
    with pytest.raises(RuntimeError, match="half-way"):
        with one_rank_group("cpu") as group:
            x = torch.ones(4)
            dist.all_reduce(x, group=group)
            assert dist.get_world_size(group) == 1 and x.tolist() == [1.0] * 4
            raise RuntimeError("a self-test failed half-way")
    assert not dist.is_initialized()


def test_a_world_that_exists_is_used_and_left_alone():
    with one_rank_group("cpu") as outer:
        with one_rank_group("cpu") as inner:
            assert inner is outer
        assert dist.is_initialized()  # the inner block did not destroy its caller's group
    assert not dist.is_initialized()


def _ops_during(fn) -> set[str]:
    """The CPU-side ops the profiler saw while `fn` ran."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_the_replicated_calibration_times_ddps_all_reduce_whoever_made_the_group():
    """The replicated tables' calibration runs under DDP on a world of one, so its bucket
    copies and all-reduce are timed. Before, it did so only on CPU when it made the group
    itself: on CUDA (and wherever a group existed) it timed the tables without DDP and
    `simulate --cluster-fit` under-booked DDP-style trainers. Here a one-rank gloo world
    exists already, as a CUDA calibration's NCCL one does: DDP's all-reduce must still run."""
    from fsbench.costmodel.timing import measure_replicated_ns_per_element

    w = dataclasses.replace(tiny(), item_vocab=2_000, user_vocab=500)
    with one_rank_group("cpu"):
        ops = _ops_during(lambda: measure_replicated_ns_per_element(w, repeats=1, samples=4))
    assert "gloo:all_reduce" in ops, "no all-reduce ran: DDP was not around the replicated tables"
    assert "torch.distributed.ddp.reducer::copy_bucket_to_grad" in ops, "DDP's bucket copies were not timed"
    assert not dist.is_initialized()


class _Closing:
    """Stands in for the transport only to see that it is closed (nothing is measured)."""

    closed = 0

    def __init__(self, group, device) -> None:
        self.group = group

    def close(self) -> None:
        _Closing.closed += 1


def test_the_transport_self_tests_free_their_transport_and_group_when_one_fails():
    from freescale_impl.transport_selftest import one_rank_transport

    _Closing.closed = 0
    with pytest.raises(ValueError):
        with one_rank_transport(torch.device("cpu"), make=_Closing) as transport:
            assert dist.get_world_size(transport.group) == 1
            raise ValueError("an assertion inside the self-test")
    assert _Closing.closed == 1 and not dist.is_initialized()


def test_both_transports_can_be_closed():
    from freescale_impl.transport import CollectiveTransport, SmFreeTransport

    assert callable(CollectiveTransport.close) and callable(SmFreeTransport.close)
    with one_rank_group("cpu") as group:
        CollectiveTransport(group).close()


TEARDOWNS = """
import dataclasses, torch
from fsbench.costmodel.timing import measure_replicated_ns_per_element
from fsbench.workloads.presets import tiny
torch.set_num_threads(1)
w = dataclasses.replace(tiny(), item_vocab=2_000, user_vocab=500)
for i in range(500):
    measure_replicated_ns_per_element(w, repeats=1, samples=2)
    print(i, flush=True)
print("done", flush=True)
"""
STALL_S = 60.0
"""A freeze is no calibration done in this long (one takes ~30 ms on the 2-core VM): a slow
or busy machine only makes progress slower, so no total time is bounded."""


def test_the_replicated_calibration_never_deadlocks_tearing_its_world_down():
    """DDP dropped after its gloo group was destroyed froze a CI run's calibration: the
    group's destructor, holding the GIL, waited for a gloo thread that waited for the GIL
    to free the last all-reduce. Before the fix, 6 of 6 loops like this one froze, after
    9 to 249 calibrations (and 13 of 14 loops of three-step ones, after 33 to 444), on
    the 2-core VM on 2026-12-07; after it, none of 9 loops of 250 to 1000. In a child
    process, so that a freeze fails this test instead of freezing the suite."""
    import os
    import selectors
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", TEARDOWNS], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    watch = selectors.DefaultSelector()
    watch.register(child.stdout, selectors.EVENT_READ)
    last = "none"
    try:
        while True:
            if not watch.select(STALL_S):
                pytest.fail(f"no replicated calibration finished in {STALL_S:.0f} s after "
                            f"calibration {last}: a world's teardown froze")
            line = child.stdout.readline()
            if not line:
                break
            last = line.strip()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == 0 and last == "done", child.stderr.read()[-2000:]
