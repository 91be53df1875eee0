"""Collectives that frameworks issue inside their own code leave flight records
(fsbench.measurement.flights), on a gloo group of one in this process."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from fsbench.measurement import timeline
from fsbench.measurement.flights import FrameworkFlights, allreduce_in_python


@pytest.fixture
def world(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    tl = timeline.Timeline(tmp_path / "rank-0.jsonl")
    before = timeline.current()
    timeline.set_current(tl)
    try:
        yield tl
    finally:
        timeline.set_current(before)
        dist.destroy_process_group()


def _flights(tl):
    return [r["name"] for r in tl._buffer if r["kind"] == "flight"]


def test_every_collective_call_is_a_flight_while_open_and_none_after(world):
    flights = FrameworkFlights()
    try:
        dist.all_reduce(torch.ones(4))                       # synchronous
        dist.all_reduce(torch.ones(4), async_op=True).wait()  # completed by gloo's thread
        dist.broadcast(torch.ones(2), src=0)
    finally:
        flights.close()
    dist.all_reduce(torch.ones(4))
    assert _flights(world) == ["all_reduce", "all_reduce", "broadcast"]
    assert all(r["dur_ns"] > 0 for r in world._buffer)


def test_a_framework_built_ddp_all_reduces_through_python_with_ddps_arithmetic(world):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    flights = FrameworkFlights()
    try:
        ddp = DistributedDataParallel(model)
        allreduce_in_python(ddp)
        ddp(x).square().sum().backward()
    finally:
        flights.close()
    assert _flights(world) == ["all_reduce"]  # recorded once, by the hook, before DDP went on
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)  # one rank: the average is the gradient
