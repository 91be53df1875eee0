"""The sm_free transport's slot and split arithmetic, checked on CPU: every sender stages
each receiver's rows in that receiver's slot (freescale_impl.transport.slot_plan), every
receiver pulls its slot out of every peer's buffer (pull_plan), and the result must be
exactly what an all-to-all delivers, empty sends included; rows beyond a slot are a
one-line error on both sides."""
import random

import torch

import pytest

from freescale_impl.transport import check_slots, elements_per_row, pull_plan, slot_elements, slot_plan


def _pull_all_to_all(sends: list[torch.Tensor], splits: list[list[int]], slot: int) -> list[torch.Tensor]:
    """Every rank's output, made the way SmFreeTransport makes it: each sender stages by
    its slot plan into a buffer of a slot per receiver (NaN where nothing was staged, so a
    pull from the wrong place shows); each receiver copies by its pull plan."""
    world = len(sends)
    buffers = []
    for p in range(world):
        buffer = torch.full((world * slot,), float("nan"))
        flat = sends[p].reshape(-1)
        for src_at, dst_at, count in slot_plan(elements_per_row(sends[p]), splits[p], slot):
            buffer[dst_at:dst_at + count] = flat[src_at:src_at + count]
        buffers.append(buffer)
    outputs = []
    for me in range(world):
        recv_splits = [splits[p][me] for p in range(world)]
        out = sends[me].new_empty((sum(recv_splits), *sends[me].shape[1:]))
        for peer, src_at, dst_at, count in pull_plan(elements_per_row(sends[me]), recv_splits, me, slot):
            out.view(-1)[dst_at:dst_at + count] = buffers[peer][src_at:src_at + count]
        outputs.append(out)
    return outputs


def _reference_all_to_all(sends, splits):
    world = len(sends)
    chunks = [list(torch.split(sends[p], splits[p])) for p in range(world)]
    return [torch.cat([chunks[p][me] for p in range(world)]) for me in range(world)]


def test_an_exchange_with_no_rows_to_send_has_a_row_size_and_an_empty_plan():
    """With priority on, the first exchange sends zero final rows: the row size must come
    from the shape (it used to read send[0], an IndexError)."""
    empty = torch.empty((0, 16))
    assert elements_per_row(empty) == 16 and elements_per_row(torch.empty(0)) == 1
    assert pull_plan(16, [0, 0, 0], 1, 64) == [] and slot_plan(16, [0, 0, 0], 64) == []


def test_pulling_by_the_plan_equals_an_all_to_all_for_any_splits():
    rng = random.Random(0)
    for world in (1, 2, 3, 5):
        for trial in range(20):
            splits = [[rng.choice([0, 0, 1, 2, 5]) for _ in range(world)] for _ in range(world)]
            dim = rng.choice([1, 3, 8])
            sends = [torch.randn(sum(s), dim) for s in splits]
            slot = 5 * dim + rng.choice([0, 3])  # room for the most rows a peer gets, or a little more
            got, want = _pull_all_to_all(sends, splits, slot), _reference_all_to_all(sends, splits)
            for g, w in zip(got, want):
                assert g.shape == w.shape and torch.equal(g, w), (world, trial, splits)


def test_a_slot_is_the_buffer_over_the_ranks_and_an_overflow_is_one_line_on_both_sides():
    assert slot_elements(256 << 20, 8, torch.float32) == (32 << 20) // 4
    assert slot_elements(1000, 3, torch.float64) == 41  # whole elements only
    check_slots("emb.fetch_c0", 4, 20, [5, 0], [1, 2], 1 << 20)  # 5 rows of 4 fill 20: fits
    for send, recv in (([6, 0], [1, 1]), ([1, 0], [0, 6])):  # the sender's count, the receiver's
        with pytest.raises(RuntimeError, match=r"^emb.fetch_c0: 6 rows for one peer exceed the sm_free "
                                               r"staging slot of 5 rows .*transport=collective$"):
            check_slots("emb.fetch_c0", 4, 20, send, recv, 1 << 20)


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event.id))


class _FakeCuda:
    """The CUDA calls SmFreeTransport and a CUDA timeline's flights make, on CPU: which
    stream each event is recorded on, which waits are queued, and any host synchronize."""

    def __init__(self):
        self.log = []
        self.compute = _Stream("compute", self.log)
        self.now = self.compute
        self.events = []

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda.Event's name
        cuda = self

        class Event:
            def __init__(self):
                self.id, self.stream = len(cuda.events), None
                cuda.events.append(self)

            def record(self, stream=None):
                self.stream = (stream or cuda.now).name
                cuda.log.append(("record", self.id, self.stream))

            def synchronize(self):
                cuda.log.append(("host synchronize", self.id))
        return Event()

    def current_stream(self, device=None):
        return self.now

    def stream(self, s):
        import contextlib

        @contextlib.contextmanager
        def on():
            before, self.now = self.now, s
            try:
                yield
            finally:
                self.now = before
        return on()

    def synchronize(self, device=None):
        self.log.append(("host synchronize", "device"))


class _Handle:
    """Symmetric memory of a world of one: the peer's buffer is this rank's own. A barrier
    is a kernel on the current stream: logged with it."""

    def __init__(self, buffer, cuda):
        self.buffer, self.cuda = buffer, cuda

    def barrier(self):
        self.cuda.log.append(("barrier", self.cuda.now.name))

    def get_buffer(self, peer, shape, dtype):
        return self.buffer.view(dtype)[:shape[0]]


def test_sm_free_flights_end_on_the_copy_stream_and_nothing_blocks_the_host(monkeypatch, tmp_path):
    """The sm_free exchange with torch's CUDA calls faked on CPU, at one rank. Its flight
    must end at an event recorded on the transport's copy stream right after the pulls
    (before: on the caller's stream at wait(), stretching over the compute queued in
    between), and wait() must not block the host (before: done.synchronize() inside
    forward and backward, which torch's sync-debug mode does not count). The rows arrive.
    Everything runs on the copy stream after it waited for the caller's: both barriers
    (before: on the caller's stream, which then waited for every peer twice an exchange),
    and the caller's stream waits for the pulls alone; a second exchange does not make it
    wait for the first (before: wait() of the one before, at issue)."""
    import torch.distributed as dist

    from fsbench.measurement.timeline import Timeline, set_current
    from freescale_impl import transport

    cuda = _FakeCuda()
    for name in ("Event", "current_stream", "stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(dist, "all_to_all_single", lambda out, inp, *a, **k: out.copy_(inp))
    timeline = Timeline(tmp_path / "rank-0.jsonl", device="cuda")
    set_current(timeline)
    try:
        t = transport.SmFreeTransport.__new__(transport.SmFreeTransport)
        t.group, t.device, t.rank, t.world_size = None, torch.device("cpu"), 0, 1
        t.buffer = torch.zeros(1 << 12, dtype=torch.uint8)
        t.handle, t.stream = _Handle(t.buffer, cuda), _Stream("copies", cuda.log)
        send = torch.arange(12, dtype=torch.float32).reshape(6, 2)
        pending = t.all_to_all(send, [6], [6], "emb.fetch_c0")
        issued = len(cuda.log)
        received = pending.wait()
        waited = len(cuda.log)
        t.all_to_all(send, [6], [6], "emb.fetch_c1")  # the next: no wait for the one before
    finally:
        set_current(Timeline(None))
    assert torch.equal(received, send)
    assert not [e for e in cuda.log if e[0] == "host synchronize"], cuda.log
    (flight, start, end), *_ = timeline._flights
    assert flight["name"] == "emb.fetch_c0"
    assert (start.stream, end.stream) == ("compute", "copies")
    issue = cuda.log[:issued]
    barriers = [i for i, e in enumerate(issue) if e[0] == "barrier"]
    assert [issue[i] for i in barriers] == [("barrier", "copies")] * 2
    assert issue.index(("wait_stream", "copies", "compute")) < barriers[0]  # after the rows to send
    # the caller's stream waits for the pulls alone: an event recorded on the copy stream
    # between the two barriers (the rows staged and pulled; the buffer freed after)
    (_, _, awaited), = cuda.log[issued:waited]
    assert cuda.log[issued:waited][0][:2] == ("wait_event", "compute")
    assert barriers[0] < issue.index(("record", awaited, "copies")) < barriers[1]
    assert barriers[0] < issue.index(("record", end.id, "copies")) < barriers[1]
    assert not [e for e in cuda.log[waited:] if e[0] == "wait_event"]
