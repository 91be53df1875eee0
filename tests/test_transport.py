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
