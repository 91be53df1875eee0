"""The sm_free transport's offset and split arithmetic, checked on CPU: every receiver pulls
its rows out of every peer's staging buffer (freescale_impl.transport.pull_plan), and the
result must be exactly what an all-to-all delivers, empty sends included."""
import random

import torch

from freescale_impl.transport import elements_per_row, pull_plan, send_starts


def _pull_all_to_all(sends: list[torch.Tensor], splits: list[list[int]]) -> list[torch.Tensor]:
    """Every rank's output, made the way SmFreeTransport makes it: staging buffers are the
    senders' rows flattened; each receiver copies by the plan."""
    world = len(sends)
    buffers = [s.reshape(-1) for s in sends]
    outputs = []
    for me in range(world):
        recv_splits = [splits[p][me] for p in range(world)]
        peer_starts = [send_starts(splits[p])[me] for p in range(world)]
        out = sends[me].new_empty((sum(recv_splits), *sends[me].shape[1:]))
        for peer, src_at, dst_at, count in pull_plan(elements_per_row(sends[me]), recv_splits, peer_starts):
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
    assert pull_plan(16, [0, 0, 0], [0, 0, 0]) == []


def test_pulling_by_the_plan_equals_an_all_to_all_for_any_splits():
    rng = random.Random(0)
    for world in (1, 2, 3, 5):
        for trial in range(20):
            splits = [[rng.choice([0, 0, 1, 2, 5]) for _ in range(world)] for _ in range(world)]
            dim = rng.choice([1, 3, 8])
            sends = [torch.randn(sum(s), dim) for s in splits]
            got, want = _pull_all_to_all(sends, splits), _reference_all_to_all(sends, splits)
            for g, w in zip(got, want):
                assert g.shape == w.shape and torch.equal(g, w), (world, trial, splits)


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
    """Symmetric memory of a world of one: the peer's buffer is this rank's own."""

    def __init__(self, buffer, log):
        self.buffer, self.log = buffer, log

    def barrier(self):
        self.log.append(("barrier",))

    def get_buffer(self, peer, shape, dtype):
        return self.buffer.view(dtype)[:shape[0]]


def test_sm_free_flights_end_on_the_copy_stream_and_nothing_blocks_the_host(monkeypatch, tmp_path):
    """The sm_free exchange with torch's CUDA calls faked on CPU, at one rank. Its flight
    must end at an event recorded on the transport's copy stream right after the pulls
    (before: on the caller's stream at wait(), stretching over the compute queued in
    between), and wait() must not block the host (before: done.synchronize() inside
    forward and backward, which torch's sync-debug mode does not count). The rows arrive,
    and the second barrier is queued after the caller's stream waits for the pulls."""
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
        t.handle, t.stream, t._unfinished = _Handle(t.buffer, cuda.log), _Stream("copies", cuda.log), None
        send = torch.arange(12, dtype=torch.float32).reshape(6, 2)
        pending = t.all_to_all(send, [6], [6], "emb.fetch_c0")
        issued = len(cuda.log)
        received = pending.wait()
    finally:
        set_current(Timeline(None))
    assert torch.equal(received, send)
    assert not [e for e in cuda.log if e[0] == "host synchronize"], cuda.log
    (flight, start, end), = timeline._flights
    assert flight["name"] == "emb.fetch_c0"
    assert (start.stream, end.stream) == ("compute", "copies")
    assert cuda.log.index(("record", end.id, "copies")) < issued, "the end is recorded at issue"
    after_wait = cuda.log[issued:]
    assert after_wait[0][:2] == ("wait_event", "compute") and after_wait[1] == ("barrier",)
