"""The collectives a backward issues from its hooks, in one order on every rank.

A trainer's backward may issue collectives from autograd hooks on more than one
communicator: DDP's bucket all-reduces (`fsbench.training.dp.wrap_ddp`'s comm hook) and
its own (FreeScale's embedding gradient chunks). When each becomes ready follows the data
and the rank's graph, so issued as they become ready they go in different orders on
different ranks, and on NCCL collectives on two communicators issued in different orders
on different ranks may deadlock. An `IssueQueue` issues them in an order of *slots*
declared before the backward (`begin`) from data every rank shares: a slot's collectives
go once it is closed (it has them all) and every slot before it has gone; a slot that is
ready early waits for the ones before it, a later one never holds an earlier one back.

It cannot deadlock:
  within a rank  nothing waits for the queue while the graph runs: a slot fills from the
                 backward's own hooks, never from a collective's completion. The first put
                 from inside the backward queues an autograd final callback (`end`): it
                 runs after every hook of the graph, and before DDP's finalize (DDP queues
                 that after its last bucket's hook, whose put came first), which is the
                 only thing that waits for a queued collective inside the backward. `end`
                 closes whatever no hook closed (`at_end`: a chunk no gradient reached) and
                 issues every slot, or raises naming the one left open.
  across ranks   every rank issues the same collectives in the same order, so the first
                 one not yet complete has been issued everywhere and can complete, and so
                 on down the order.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from torch.autograd import Variable


class IssueQueue:
    """One step's backward collectives at a time: `begin` before the backward, `put` from
    its hooks (or before it), `end` after the graph (queued by the first put inside it)."""

    def __init__(self) -> None:
        # Hooks run on autograd's threads; `at_start`/`at_end` put from inside a put.
        self._lock = threading.RLock()
        self._order: list[str] = []
        self._at = 0
        self._ended = True

    def begin(self, order: Sequence[str], at_start: Callable[[], None] | None = None,
              at_end: Callable[[], None] | None = None) -> None:
        """A step's backward: its slots in issue order (the same on every rank).
        `at_start`: called at the first put from inside the backward (put what is ready
        at once there, so that it is issued inside the backward whatever the data);
        `at_end`: called by `end` (put what no hook put)."""
        with self._lock:
            assert len(set(order)) == len(order), order
            self._order, self._at = list(order), 0
            self._pending: dict[str, list[Callable[[], None]]] = {s: [] for s in order}
            self._closed: set[str] = set()
            self._at_start, self._at_end = at_start, at_end
            self._started, self._ended = False, False

    def put(self, slot: str, issue: Callable[[], None], last: bool = True,
            in_backward: bool = True) -> None:
        """Hand over one collective of `slot` (`issue` issues it; a slot's go in the order
        handed over); `last`: the slot is closed. `in_backward`: called from an autograd
        hook (the first such put queues `end` as the backward's final callback)."""
        with self._lock:
            if self._ended:
                raise RuntimeError(f"IssueQueue: {slot} put outside a step's backward (begin first)")
            if slot not in self._pending:
                raise RuntimeError(f"IssueQueue: {slot} is not a slot of this step ({self._order})")
            if slot in self._closed:
                raise RuntimeError(f"IssueQueue: {slot} put after its last collective")
            if in_backward and not self._started:
                self._started = True
                Variable._execution_engine.queue_callback(self.end)
                if self._at_start is not None:
                    self._at_start()
            self._pending[slot].append(issue)
            if last:
                self._closed.add(slot)
            self._pump()

    def _pump(self) -> None:
        while self._at < len(self._order):
            slot = self._order[self._at]
            issues, self._pending[slot] = self._pending[slot], []
            for issue in issues:
                issue()
            if slot not in self._closed:
                return
            self._at += 1

    def end(self) -> None:
        """After the backward's graph: close what no hook closed (`at_end`), issue every
        slot. Idempotent (a trainer calls it after the backward too, in case no hook put
        anything inside it)."""
        with self._lock:
            if self._ended:
                return
            if self._at_end is not None:
                self._at_end()
            self._pump()
            if self._at < len(self._order):
                raise RuntimeError(f"IssueQueue: slot {self._order[self._at]} still open after "
                                   "the backward: its collectives were never all handed over")
            self._ended = True
            self._pending, self._at_start, self._at_end = {}, None, None

    @property
    def issued(self) -> bool:
        """Every slot of the step has gone (`end` ran)."""
        return self._ended
