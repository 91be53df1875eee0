"""Sharded embedding lookups and gradients by all-to-all, with FreeScale's prioritized,
overlapped communication (technique 2). Built on `torch.distributed` collectives (through
`freescale_impl.transport`) rather than TorchRec's sharded modules: the techniques need
control that TorchRec's `ShardedEmbeddingCollection` does not give, namely issuing the
lookups of step k+1 for some rows *before* step k's optimizer and for the others right
after it, and sending each gradient chunk from an autograd hook as soon as it exists.
(TorchRec's own answer, `TrainPipelineSemiSync`, trains on one-step-stale rows instead.)

Every rank is both a *requester* (its samples need rows) and an *owner* (it holds a shard:
`freescale_impl.sharded_tables`). One step, seen from a requester:

  request   the unique rows its batch needs, cut into `chunks` by whole samples: its
            samples form `chunks` sub-batches (about equal tokens) and chunk c holds the
            rows sub-batch c is the first to read (the shared negatives in chunk 0);
            entries are sent grouped by owner, then chunk. Counts first (an (N, chunks)
            matrix), then the ids (uneven splits; a rank with no samples still asks for
            the batch's shared negatives): in the trainer, steps ahead, in one control
            message a step (freescale_impl.request_pipeline).
  fetch     owners look the rows up and send them back, chunk by chunk, the first
            sub-batch's first; the forward runs sub-batch by sub-batch
            (`freescale_impl.sub_batches`), and sub-batch c waits only for the chunks it
            reads, all <= c (`LazyLookups.sub_batch`): the first sub-batch's forward runs
            while the later chunks are in flight.
  gradients each chunk's rows form one autograd leaf; when autograd has accumulated its
            gradient (a post-accumulate hook: sub-batch c's backward, the last of those
            that read chunk c, has run) the chunk's gradients go to the owners, while the
            rest of backward runs. Every collective issued from backward's hooks goes
            through one queue (fsbench.training.issue_queue), in one order every rank
            derives from the chunk count alone (`grad_order`): chunks C-1 down to 1, each
            once it is ready (one this rank does not read is ready at the backward's
            first hook); then DDP's buckets in index order, where DDP shares the queue
            (sub-batch 0's backward finishes the dense gradients); then chunk 0 (the
            shared negatives: ready at the backward's end). Issued as each became ready,
            the chunks' all-to-alls and DDP's all-reduces, on two communicators, would
            interleave by the data, in different orders on different ranks: on NCCL, a
            deadlock.
  update    the owner sums the contributions per row and steps only those rows (with
            dense Adam, every row it holds: freescale_impl.sharded_tables).

With `priority=on`, step k also prepares step k+1: every owner splits step k+1's requests
into rows that step k touches (*fresh*: any rank asked for them at step k, so the update
may change them) and the rest (*final*: step k cannot change them); the requesters learn
which at step k's start (freescale_impl.request_pipeline). Final rows are looked up and sent during
step k's backward; fresh rows are sent right after step k's update, first in line, chunk
by chunk. Nothing is stale: every row the model reads at step k+1 holds the value after
step k's update, so the losses equal the blocking version's (tested to 1e-6).

Host plans, no host syncs in forward and backward. On a GPU, every read of a device
tensor's values by the host (`.tolist()`, a boolean mask, `torch.unique`, `bincount`)
waits for the device to drain: inside forward or backward it would undo the overlap. So
every decision the host makes (split sizes, which chunks a use reads, which pending
message carries which chunk) is planned from host-side values before the step, in the
input stage when the routing is computed there (`freescale_impl.routing`), and the step
itself only launches gathers with index tensors planned ahead (`Fetch`, `Request.sub_index`,
`Request.chunk_entries`). tests/test_sync_free_exchange.py records every such read the
exchange makes inside forward and backward: none.

Switches: `overlap=off` is the blocking version (one fetch, waited before the forward;
one gradient send after backward); `priority` needs `overlap`.
"""
from __future__ import annotations

import torch

from fsbench.models.sparse import EmbeddingLookups
from fsbench.measurement.timeline import span
from fsbench.workloads.batch import JaggedBatch
from fsbench.training.issue_queue import IssueQueue
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.transport import CollectiveTransport, Pending

from freescale_impl.exchange_plan import Fetch, Request, Service, build_request, plan_fetches, service_of


class ShardedEmbeddings:
    """The protocol above for one rank; `freescale_impl.sharded_step` drives it. Per step:
    a request, computed ahead (`adopt`) or exchanged (`request`, `serve`); its rows sent
    (`send_final`, `send_fresh`, or `fetch_all`); `lookups` read by the forward;
    `prepare_gradients`, backward (chunk hooks send gradients), `finish_gradients`."""

    def __init__(self, layout: RowLayout, shard: LocalShard, transport, group, rank: int,
                 chunks: int, overlap: bool, priority: bool, queue: IssueQueue | None = None,
                 dense_slot: str | None = None, growth: float = 1.0) -> None:
        self.layout, self.shard, self.transport = layout, shard, transport
        self.control = CollectiveTransport(group)  # counts, ids, masks: small messages
        self.rank, self.n = rank, layout.world_size
        self.chunks = chunks if overlap else 1
        self.growth = growth if overlap else 1.0  # each sub-batch's tokens / the one before's
        # Priority sends rows no update can change before the update: with an optimizer
        # that moves every row at every step (dense Adam) there are none.
        self.overlap, self.priority = overlap, priority and not shard.steps_every_row
        self.dim = layout.dim
        self.device = shard.weight.device
        self._grad_sends: list[tuple[Pending, int]] = []  # (exchange, chunk) this step
        self._put: set[int] = set()  # chunks handed to the queue this step
        # The backward's collectives in one order (`grad_order`): the queue DDP's buckets
        # take too (`dense_slot`, fsbench.training.dp.wrap_ddp(queue=...)), else our own.
        self.queue, self.dense_slot = queue or IssueQueue(), dense_slot if queue else None
        self._svc: Service | None = None
        self._grad_req: Request | None = None

    # -- requests -----------------------------------------------------------------
    # A step's requests at once, counts then ids (a step on its own: the engine's tests).
    # The trainer sends them steps ahead, with the owners' fresh masks, in one control
    # message a step (freescale_impl.request_pipeline).
    def request(self, batch: JaggedBatch, req: Request | None = None
                ) -> tuple[Request, Service, Pending]:
        """Send a step's requests at once: counts (waited: the ids' splits need them),
        then the ids (returned pending; `serve` waits). `req`: built by the input stage
        (`freescale_impl.routing.OwnRequest`), else built here."""
        if req is None:
            with span("emb.route", kind="compute"):
                req = build_request(batch, self.layout, self.chunks, self.growth)
        svc, ids = self.send_ids(req, self.send_counts(req))
        return req, svc, ids

    def send_counts(self, req: Request) -> Pending:
        """Issue the counts: entries this rank asks each owner for, per chunk."""
        return self.control.all_to_all(req.counts, [1] * self.n, [1] * self.n, "emb.counts")

    def send_ids(self, req: Request, counts: Pending) -> tuple[Service, Pending]:
        """Wait for the counts (the ids' splits), then issue the ids. Returns this owner's
        service without its rows (`serve` fills them in) and the ids in flight."""
        counts_in = counts.wait().cpu()  # (N requesters, chunks); host values: the splits
        with span("emb.route", kind="compute"):
            svc = service_of(counts_in, self.n, self.chunks)
            recv = counts_in.sum(1).tolist()
        ids = self.control.all_to_all(req.rows, req.send_counts, recv, "emb.ids")
        self._new_buffer(req)
        return svc, ids

    def serve(self, svc: Service, ids: Pending) -> None:
        """Wait for the ids asked of this owner; its service's rows."""
        ids = ids.wait()
        with span("emb.route", kind="compute"):
            svc.local = self.layout.local_index(ids)

    def _new_buffer(self, req: Request) -> None:
        req.buffer = torch.empty(req.rows.numel(), self.dim, dtype=self.shard.weight.dtype,
                                 device=self.device)

    def plan(self, req: Request, svc: Service, final: bool) -> None:
        """Requests exchanged: plan a step's messages on the host (at a step's start, from
        sizes and masks that came a step ahead: freescale_impl.request_pipeline), and move
        the plan's indices to the device."""
        if req.buffer is None:
            self._new_buffer(req)
        with span("emb.route", kind="compute"):
            plan_fetches(req, svc, self.n, self.chunks, final)
        to = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731
        for f in [req.final_fetch, *req.fresh_fetches]:
            if f is not None:
                f.req_entries, f.svc_entries = to(f.req_entries), to(f.svc_entries)
        svc.grad_entries = [to(e) for e in svc.grad_entries]

    # -- fetch --------------------------------------------------------------------
    def _send(self, req: Request, svc: Service, f: Fetch) -> None:
        with span("emb.lookup", kind="compute"):
            rows = self.shard.lookup(svc.local.index_select(0, f.svc_entries))
        p = self.transport.all_to_all(rows, f.send_splits, f.recv_splits, f.name)
        req.pending.append((p, f.req_entries, f.chunks))

    def fetch_all(self, req: Request, svc: Service) -> None:
        """Every row of this step now (no rows prepared ahead): chunk by chunk."""
        req.fresh = torch.ones(req.rows.numel(), dtype=torch.bool)
        svc.fresh = torch.ones(svc.chunk.numel(), dtype=torch.bool)
        self.plan(req, svc, final=False)
        self.send_fresh(req, svc)

    def adopt(self, batch: JaggedBatch, routing: dict) -> tuple[Request, Service]:
        """A step whose routing and plan the input stage computed (`freescale_impl.routing`)."""
        req, svc = routing["request"], routing["service"]
        req.batch = batch
        self._new_buffer(req)
        return req, svc

    def send_final(self, req: Request, svc: Service) -> None:
        """Priority: rows the current step cannot change, now (they are final)."""
        self._send(req, svc, req.final_fetch)

    def send_fresh(self, req: Request, svc: Service) -> None:
        """Fresh rows, chunk by chunk, the first sub-batch's first (after the update that
        made them)."""
        for f in req.fresh_fetches:
            self._send(req, svc, f)

    def _rows_ready(self, req: Request, chunks: set[int]) -> None:
        """Wait for every pending fetch that carries rows of these chunks."""
        still = []
        for p, entries, carries in req.pending:
            if carries & chunks:
                req.buffer.index_copy_(0, entries, p.wait())
            else:
                still.append((p, entries, carries))
        req.pending = still

    def wait_all(self, req: Request) -> None:
        self._rows_ready(req, set(range(self.chunks)))

    # -- lookups --------------------------------------------------------------------
    def lookups(self, req: Request) -> "LazyLookups":
        req.leaves = [None] * self.chunks
        return LazyLookups(self, req)

    def _leaf(self, req: Request, c: int) -> torch.Tensor:
        if req.leaves[c] is None:
            self._rows_ready(req, {c})
            leaf = req.buffer.index_select(0, req.chunk_entries[c]).detach().requires_grad_(True)
            if self.overlap:
                # The hook lives in C++ on the leaf, out of the garbage collector's sight:
                # a closure over `req` (whose `leaves` hold the leaf) would be a cycle it
                # cannot break, and every step's rows, leaves and gradients would stay.
                leaf.register_post_accumulate_grad_hook(lambda _t, c=c: self._grad_ready(c))
            req.leaves[c] = leaf
        return req.leaves[c]

    def sub_batch_lookups(self, req: Request, c: int) -> EmbeddingLookups:
        """Sub-batch c's rows (`Request.sub_batch`): waits only for the chunks it reads,
        all <= c, so the first sub-batch's forward starts once chunk 0 has arrived."""
        needed = req.sub_chunks[c]
        leaves = [self._leaf(req, k) for k in needed]
        table = (leaves[0] if len(leaves) == 1 else torch.cat(leaves) if leaves
                 else req.buffer.new_zeros(0, self.dim))
        rows = {u: table.index_select(0, i) for u, i in req.sub_index[c].items()}
        samples = req.sub_samples[c + 1] - req.sub_samples[c]
        contexts = rows["contexts"].view(samples, req.batch.context_ids.shape[1], self.dim)
        return EmbeddingLookups(items=rows["items"], targets=rows["targets"],
                                negatives=rows["negatives"], users=rows["users"], contexts=contexts)

    # -- gradients ------------------------------------------------------------------
    def grad_order(self) -> list[str]:
        """The backward's collectives in issue order, from the chunk count alone (the same
        on every rank): chunks C-1 down to 1 (the order sub-batches' backwards make them),
        DDP's buckets, chunk 0 (the shared negatives, made last). The blocking version's
        one chunk goes after the backward, outside the queue."""
        dense = [self.dense_slot] if self.dense_slot else []
        if not self.overlap:
            return dense
        return [_grad_name(c) for c in range(self.chunks - 1, 0, -1)] + dense + [_grad_name(0)]

    def prepare_gradients(self, req: Request, svc: Service) -> None:
        """Before backward: the step's order of collectives begins (`grad_order`)."""
        self._grad_sends, self._put = [], set()
        self._svc, self._grad_req = svc, req
        self.queue.begin(self.grad_order(), at_start=self._put_unread, at_end=self._put_rest)

    def _grad_ready(self, c: int) -> None:
        """Chunk c's gradient is complete (its leaf's post-accumulate hook)."""
        self._put_chunk(c, in_backward=True)

    def _put_chunk(self, c: int, in_backward: bool) -> None:
        if self.overlap and c not in self._put:
            self._put.add(c)
            self.queue.put(_grad_name(c), lambda: self._send_grad(c), in_backward=in_backward)

    def _put_unread(self) -> None:
        """At the backward's first hook: chunks none of whose rows this rank read have no
        gradient to wait for (zeros go)."""
        for c in range(self.chunks - 1, -1, -1):
            if self._grad_req.leaves[c] is None:
                self._put_chunk(c, in_backward=True)

    def _put_rest(self) -> None:
        """After the backward's graph: chunks no gradient reached (zeros go)."""
        for c in range(self.chunks - 1, -1, -1):
            self._put_chunk(c, in_backward=False)

    def _send_grad(self, c: int) -> None:
        """Issue chunk c's gradients to its rows' owners (the queue's turn for it)."""
        req = self._grad_req
        leaf = req.leaves[c]
        grads = (leaf.grad if leaf is not None and leaf.grad is not None
                 else req.buffer.new_zeros(req.chunk_sizes[c], self.dim))
        p = self.transport.all_to_all(grads, req.grad_splits[c], self._svc.grad_splits[c],
                                      _grad_name(c))
        self._grad_sends.append((p, c))

    def finish_gradients(self, req: Request, svc: Service) -> None:
        """After backward: send what is left (the queue's rest, where no hook inside the
        backward ran it; the blocking version's one chunk), receive everything, update the
        owned rows."""
        self.queue.end()
        if not self.overlap:
            self._send_grad(0)
        # Messages that brought this rank no rows (its part of the collective was empty)
        # were never needed by a lookup: complete them, so that no collective is left
        # unwaited when the step's objects go.
        for p, _, _ in req.pending:
            p.wait()
        req.pending = []
        locals_, grads = [], []
        for p, c in self._grad_sends:
            grads.append(p.wait())
            locals_.append(svc.local.index_select(0, svc.grad_entries[c]))
        with span("sparse_optimizer", kind="compute"):
            self.shard.apply_gradients(torch.cat(locals_), torch.cat(grads))
        # The step's autograd leaves and the engine's hold on it go now: nothing reads
        # them after the update, and the look-ahead keeps later steps' requests alive.
        req.leaves = []
        self._grad_sends, self._svc, self._grad_req = [], None, None


def _grad_name(c: int) -> str:
    return f"emb.grad_c{c}"


class LazyLookups:
    """The step's lookups, fetched when the model first reads them: sub-batch by sub-batch
    (`sub_batch(c)`, what `freescale_impl.sub_batches.SubBatched` reads), or whole (the
    fields, for a reader that takes the batch at once: the sub-batches' concatenated)."""

    def __init__(self, engine: ShardedEmbeddings, req: Request) -> None:
        self._engine, self._req, self._subs = engine, req, {}

    @property
    def sub_batches(self) -> int:
        return self._req.sub_batches

    def sub_batch(self, c: int) -> EmbeddingLookups:
        if c not in self._subs:
            self._subs[c] = self._engine.sub_batch_lookups(self._req, c)
        return self._subs[c]

    def _whole(self, use: str) -> torch.Tensor:
        bounds = self._req.sub_samples
        parts = [getattr(self.sub_batch(c), use) for c in range(self.sub_batches)
                 if c == 0 or bounds[c + 1] > bounds[c]]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    users = property(lambda self: self._whole("users"))
    contexts = property(lambda self: self._whole("contexts"))
    items = property(lambda self: self._whole("items"))
    targets = property(lambda self: self._whole("targets"))
    negatives = property(lambda self: self.sub_batch(0).negatives)  # shared: chunk 0
