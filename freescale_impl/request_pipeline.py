"""Exchanged routing's requests, travelling over the steps before the step that reads them
(FreeScale 2, `routing=exchanged`: each rank knows only its own samples' rows).

A step's request reaches its owners in three parts, each of whose sizes the part before
it gives: how many rows a requester asks each owner for, per chunk (the *counts*); the rows
themselves (the *ids*: their splits are the counts); with priority, which of them the
update before that step changes (the owners' *fresh masks*: their splits are the ids').
Sent one after the other inside a step, each would wait for the one before and read its
sizes on the host: a host sync, and on a GPU a drained stream, wherever it falls.

So the parts of different steps travel together, one step apart: at step k one *control*
all-to-all carries step k+4's counts, step k+3's ids and step k+2's fresh masks, and it is
read at step k+1's start, where the step already waits for its host (the previous step's
loss is read there): one host sync a step, at the step boundary, none between the forward
and the backward. Every size in a control message is known a step ahead: the counts
(chunks per peer) from the chunk count, the ids' from the counts that came the step before,
the masks' from the ids' that came two steps before. With priority, step k+1's rows are
planned at step k's start (its fresh masks came in control k-1), its final rows go after
step k's forward, its fresh rows after step k's update.

The first steps' parts go out before step 0, in control messages -4..-2 waited at once;
control k is sent while a step it serves exists (k + 3 < steps, with priority k + 2), so
every rank sends the same messages in the same order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fsbench.measurement.timeline import span
from fsbench.training.trainer import StepInput
from freescale_impl.exchange_plan import Request, Service, build_request, service_of, touched_mask
from freescale_impl.transport import Pending

DEPTH = 4  # control k carries step k+4's counts: the input is pulled four steps ahead


@dataclass
class Ahead:
    """A step whose request is travelling: `counts_in` (what each requester asks this owner,
    per chunk: the service's labels) once its counts came, `svc.local` once its ids came,
    `req.fresh` (priority) once the owners' masks came."""
    prepared: StepInput
    req: Request
    svc: Service | None = None
    counts_in: np.ndarray | None = None  # (N, chunks), host
    rows_sent: bool = False  # priority: its rows went during the step before


def interleave(sizes: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Parts of one all-to-all laid out by peer (peer p's message: part 0's entries for p,
    part 1's, ...), each part's entries grouped by peer with `sizes[i][p]` for peer p.
    Returns the splits per peer and, per part, each entry's position in the message.
    O(entries + N), no loop over peers."""
    per_peer = np.sum(sizes, axis=0)
    before = np.cumsum(per_peer) - per_peer  # where each peer's message starts
    positions = []
    for s in sizes:
        starts = np.cumsum(s) - s  # where each peer's entries start in this part
        positions.append(np.arange(int(s.sum())) + np.repeat(before - starts, s))
        before = before + s
    return per_peer, positions


@dataclass
class _Control:
    """One control message in flight: what it carries, where each part sits in what comes."""
    pending: Pending
    counts_for: Ahead | None
    ids_for: Ahead | None
    mask_for: Ahead | None
    at: list[torch.Tensor]  # positions of the counts, the ids, the masks in the receive buffer


class RequestPipeline:
    """Step k's request and the ones after it, for `freescale_impl.sharded_step`. `start`
    before step 0; per step `current` (the step's request, its ids served) at the step's
    start, then `send_control` once its rows are out, and `done` at its end."""

    def __init__(self, engine, steps: int, build=None) -> None:
        self.engine, self.steps = engine, steps
        self.n, self.chunks = engine.n, engine.chunks
        self._build = build  # StepInput -> Request, when the input stage did not build it
        self.ahead: dict[int, Ahead] = {}  # step -> its request, from k to k + DEPTH
        self._control: _Control | None = None
        self._pulled = 0

    def _pull(self, inputs, upto: int) -> None:
        """Pull the input up to step `upto` (an input span each): its request, built."""
        while self._pulled <= min(upto, self.steps - 1):
            prepared: StepInput = next(inputs)
            req = prepared.aux["request"] if prepared.aux is not None else None
            if req is None:
                with span("emb.route", kind="compute"):
                    req = build_request(prepared.batches[0], self.engine.layout, self.chunks, self.engine.growth)
            req.batch = prepared.batches[0]
            self.ahead[prepared.step] = Ahead(prepared, req)
            self._pulled += 1

    def start(self, inputs) -> None:
        """Before step 0: the first steps' input, and control messages -4..-2 waited at once
        (they carry steps 0..2's counts, 0..1's ids, 1's masks... as in every step); control
        -1 goes out, read at step 0's start."""
        self._pull(inputs, DEPTH - 1)
        for k in range(-DEPTH, -1):
            self.send_control(k)
            self._read_control()
        self.send_control(-1)

    def current(self, k: int, inputs) -> Ahead:
        """Step k's start: the control message of step k-1 read (the step's one host sync),
        step k + DEPTH's input pulled; returns step k, its ids served."""
        self._read_control()
        self._pull(inputs, k + DEPTH)
        return self.ahead[k]

    def done(self, k: int) -> None:
        """Step k's request is no longer needed (its gradients are home)."""
        del self.ahead[k]

    def _get(self, step: int) -> Ahead | None:
        return self.ahead.get(step) if 0 <= step < self.steps else None

    def send_control(self, k: int) -> None:
        """Control message k: step k+4's counts, k+3's ids, k+2's fresh masks (priority)."""
        engine, n, chunks = self.engine, self.n, self.chunks
        if not (k + DEPTH - 1 < self.steps or (engine.priority and k + 2 < self.steps)):
            return  # no step left that it would serve (the same on every rank)
        counts_for, ids_for = self._get(k + DEPTH), self._get(k + DEPTH - 1)
        mask_for = self._get(k + 2) if engine.priority and k + 2 >= 1 else None
        zeros = np.zeros(n, dtype=np.int64)
        with span("emb.route", kind="compute"):
            # What goes, per part and peer, and what comes (all known on the host).
            count_sizes = np.full(n, chunks) if counts_for is not None else zeros
            send = [count_sizes,
                    np.asarray(ids_for.req.send_counts) if ids_for else zeros,
                    mask_for.counts_in.sum(1) if mask_for else zeros]
            recv = [count_sizes,
                    ids_for.counts_in.sum(1) if ids_for else zeros,
                    np.asarray(mask_for.req.send_counts) if mask_for else zeros]
            parts = [counts_for.req.counts.reshape(-1) if counts_for else None,
                     ids_for.req.rows if ids_for else None, None]
            if mask_for is not None:  # the rows step k+1 updates: fresh for step k+2
                touched = self.ahead[k + 1].svc.local
                mask_for.svc.fresh = touched_mask(mask_for.svc.local, touched,
                                                  engine.shard.weight.shape[0])
                parts[2] = mask_for.svc.fresh.to(torch.int64)
            send_splits, send_at = interleave(send)
            recv_splits, recv_at = interleave(recv)
            device = engine.device
            message = torch.empty(int(send_splits.sum()), dtype=torch.int64, device=device)
            for part, at in zip(parts, send_at):
                if part is not None and at.size:
                    message.index_copy_(0, torch.from_numpy(at).to(device, non_blocking=True), part)
        pending = engine.control.all_to_all(message, send_splits.tolist(), recv_splits.tolist(),
                                            "emb.control")
        self._control = _Control(pending, counts_for, ids_for, mask_for,
                                 [torch.from_numpy(a) for a in recv_at])

    def _read_control(self) -> None:
        """Wait for the last control message and take in what it carried: counts become
        services, ids their rows, masks the requests' fresh rows (and their plans)."""
        c, self._control = self._control, None
        if c is None:
            return
        message = c.pending.wait()
        host = message.cpu()  # the step's one host sync: counts and masks, read as sizes
        engine = self.engine
        with span("emb.route", kind="compute"):
            if c.counts_for is not None:
                c.counts_for.counts_in = host[c.at[0]].view(self.n, self.chunks).numpy()
                c.counts_for.svc = service_of(torch.from_numpy(c.counts_for.counts_in), self.n, self.chunks)
            if c.ids_for is not None:
                ids = message.index_select(0, c.at[1].to(message.device, non_blocking=True))
                c.ids_for.svc.local = engine.layout.local_index(ids)
            if c.mask_for is not None:
                c.mask_for.req.fresh = host[c.at[2]].bool()
