"""The backward's queue of collectives (fsbench.training.issue_queue), one process: slots go
in their declared order whatever order they are put in, a slot of several goes when its
last is put, what no hook put is put at the backward's end, and a slot left open fails
loudly instead of leaving DDP's finalize waiting."""
import pytest
import torch

from fsbench.training.issue_queue import IssueQueue


def _backward_with_hooks(hooks):
    """One backward in which leaf i's post-accumulate hook runs hooks[i], in order 0, 1, ..."""
    leaves = [torch.ones(1, requires_grad=True) for _ in hooks]
    for leaf, hook in zip(leaves, hooks):
        leaf.register_post_accumulate_grad_hook(lambda _t, hook=hook: hook())
    out = leaves[0]
    for leaf in leaves[1:]:
        out = out * 1 + leaf  # the later leaves nearer the loss: their hooks run first
    (out * 1).sum().backward()


def test_slots_go_in_the_declared_order_whatever_order_they_become_ready_in():
    ready, issued, queue = [], [], IssueQueue()
    order = ["c2", "c1", "dense", "c0"]
    queue.begin(order, at_end=lambda: queue.put("c0", lambda: issued.append("c0"), in_backward=False))

    def put(slot, last=True):
        def hook():
            ready.append(slot)
            queue.put(slot, lambda: issued.append(slot), last=last)
        return hook
    # Ready (hooks run from the last leaf): the dense buckets first (two of them), then c1,
    # then c2; c0 never (put at the end).
    _backward_with_hooks([put("c2"), put("c1"), put("dense"), put("dense", last=False)])
    assert ready == ["dense", "dense", "c1", "c2"]
    assert issued == ["c2", "c1", "dense", "dense", "c0"]
    assert queue.issued


def test_what_is_ready_at_once_goes_at_the_backwards_first_hook():
    issued, queue = [], IssueQueue()
    at_start = lambda: queue.put("c1", lambda: issued.append("c1"))  # noqa: E731
    queue.begin(["c1", "c0"], at_start=at_start)
    _backward_with_hooks([lambda: queue.put("c0", lambda: issued.append("c0"))])
    assert issued == ["c1", "c0"]


def test_a_slot_left_open_fails_at_the_backwards_end():
    queue = IssueQueue()
    queue.begin(["dense", "c0"])
    with pytest.raises(RuntimeError, match="slot dense still open"):
        _backward_with_hooks([lambda: queue.put("dense", lambda: None, last=False)])
