"""Sharded embedding lookups and gradients by all-to-all, with FreeScale's prioritized,
overlapped communication (technique 2). Built on `torch.distributed` collectives (through
`freescale_impl.transport`) rather than TorchRec's sharded modules: the techniques need
control that TorchRec's `ShardedEmbeddingCollection` does not give, namely issuing the
lookups of step k+1 for some rows *before* step k's optimizer and for the others right
after it, and sending each gradient chunk from an autograd hook as soon as it exists.
(TorchRec's own answer, `TrainPipelineSemiSync`, trains on one-step-stale rows instead.)

Every rank is both a *requester* (its samples need rows) and an *owner* (it holds a shard:
`freescale_impl.sharded_tables`). One step, seen from a requester:

  request   the unique rows its batch needs, in the order the model consumes them
            (users, contexts, input items, targets, negatives), cut into `chunks` equal
            pieces; entries are sent grouped by owner, then chunk. Counts first (an
            all-to-all of an (N, chunks) matrix), then the ids (uneven splits; a rank with
            no samples still asks for the batch's shared negatives).
  fetch     owners look the rows up and send them back, chunk by chunk; the model waits
            for a chunk only when it first reads one of its rows (`LazyLookups`), so the
            targets' and negatives' rows arrive while the encoder runs.
  gradients each chunk's rows form one autograd leaf; when autograd has accumulated its
            gradient (a post-accumulate hook) the chunk's gradients go to the owners,
            while the rest of backward runs. Every collective issued from backward's hooks
            goes in one fixed order on every rank, since collectives must match across
            ranks: with `grads_after_dense`, first DDP's dense all-reduce buckets (in
            DDP's order), then the chunks, last-consumed first, each once it is ready.
            (Issued as each became ready, the chunks' all-to-alls and DDP's all-reduces,
            on two communicators, interleaved by the data: a chunk no sample read counted
            as ready at once, so ranks could issue them in different orders.)
  update    the owner sums the contributions per row and steps only those rows.

With `priority=on`, step k also prepares step k+1 (its input is pulled one step ahead):
after step k's forward every owner splits step k+1's requests into rows that step k
touches (*fresh*: any rank asked for them at step k, so the update may change them) and
the rest (*final*: step k cannot change them). Final rows are looked up and sent during
step k's backward; fresh rows are sent right after step k's update, first in line, chunk
by chunk. Nothing is stale: every row the model reads at step k+1 holds the value after
step k's update, so the losses equal the blocking version's (tested to 1e-6).

Host plans, no host syncs in forward and backward. On a GPU, every read of a device
tensor's values by the host (`.tolist()`, a boolean mask, `torch.unique`, `bincount`)
waits for the device to drain: inside forward or backward it would undo the overlap. So
every decision the host makes (split sizes, which chunks a use reads, which pending
message carries which chunk) is planned from host-side values before the step, in the
input stage when the routing is computed there (`freescale_impl.routing`), and the step
itself only launches gathers with index tensors planned ahead (`Fetch`, `Request.use_index`,
`Request.chunk_entries`). tests/test_sync_free_exchange.py records every such read the
exchange makes inside forward and backward: none.

Switches: `overlap=off` is the blocking version (one fetch, waited before the forward;
one gradient send after backward); `priority` needs `overlap`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fsbench.models.sparse import ITEM, USER, EmbeddingLookups, context_table
from fsbench.measurement.timeline import span
from fsbench.workloads.batch import JaggedBatch
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.transport import CollectiveTransport, Pending

USES = ("users", "contexts", "items", "targets", "negatives")  # the model's reading order


def _counts(index: torch.Tensor, n: int) -> list[int]:
    """Entries per peer, on the host: for planning only, never inside forward or backward."""
    return torch.bincount(index.cpu(), minlength=n).tolist()


@dataclass
class Fetch:
    """One message of rows, planned on the host: the owner looks up its service entries
    `svc_entries` and sends `send_splits[r]` rows to each rank r; the requester receives
    `recv_splits[o]` from each owner o into its entries `req_entries`, which belong to
    `chunks`."""

    name: str
    req_entries: torch.Tensor
    svc_entries: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    chunks: set[int]


@dataclass
class Request:
    """A requester's view of one step: entry e asks owner[e] for global row rows[e]."""

    batch: JaggedBatch
    rows: torch.Tensor       # (E,) by owner, then chunk, then first use
    owner: torch.Tensor      # (E,)
    chunk: torch.Tensor      # (E,)
    counts: torch.Tensor     # (N, chunks) entries per (owner, chunk)
    send_counts: list[int]   # host: entries per owner (the ids' splits)
    grad_splits: list[list[int]]  # host: per chunk, its entries per owner (the gradients' splits)
    chunk_sizes: list[int]   # host: entries per chunk
    chunk_entries: list[torch.Tensor]  # per chunk, its entries in entry order (its leaf's rows)
    use_chunks: dict[str, list[int]]   # host: per use, the chunks it reads (ascending)
    use_index: dict[str, torch.Tensor]  # per use: each id's row in its chunks' concatenated leaves
    # planned once the fresh rows are known (`plan_fetches`)
    fresh: torch.Tensor | None = None  # (E,) rows that must wait for the previous update
    final_fetch: Fetch | None = None   # priority: rows the previous step cannot change
    fresh_fetches: list[Fetch] = field(default_factory=list)  # per chunk, in reading order
    # filled as the protocol runs
    pending: list[tuple[Pending, torch.Tensor, set[int]]] = field(default_factory=list)
    buffer: torch.Tensor | None = None  # (E, D) fetched rows
    leaves: list[torch.Tensor | None] = field(default_factory=list)
    tables: dict = field(default_factory=dict)  # chunks read together -> their leaves concatenated


@dataclass
class Service:
    """An owner's view of one step: entry f of its receive order is row local[f] of its
    shard, asked for by rank src[f] in chunk chunk[f]."""

    local: torch.Tensor
    src: torch.Tensor
    chunk: torch.Tensor
    fresh: torch.Tensor | None = None
    # planned with the fetches: per chunk, its entries and the gradients' splits per rank
    grad_entries: list[torch.Tensor] = field(default_factory=list)
    grad_splits: list[list[int]] = field(default_factory=list)


def rows_by_use(batch: JaggedBatch, layout: RowLayout) -> dict[str, torch.Tensor]:
    """The global rows each use of the model reads, in reading order."""
    ctx_base = torch.tensor([layout.table_base(context_table(i))
                             for i in range(batch.context_ids.shape[1])], dtype=torch.int64)
    item, user = layout.table_base(ITEM), layout.table_base(USER)
    return {"users": user + batch.user_ids,
            "contexts": (ctx_base.to(batch.context_ids.device) + batch.context_ids).reshape(-1),
            "items": item + batch.item_ids, "targets": item + batch.targets,
            "negatives": item + batch.negative_ids}


def all_rows(batch: JaggedBatch, layout: RowLayout) -> torch.Tensor:
    return torch.cat(list(rows_by_use(batch, layout).values()))


def build_request(batch: JaggedBatch, layout: RowLayout, chunks: int) -> Request:
    """The step's request and its host plan (ahead of the step: reads values to the host)."""
    ids = rows_by_use(batch, layout)
    flat = torch.cat([ids[u] for u in USES])
    uniq, inverse = torch.unique(flat, return_inverse=True)
    n_uniq = uniq.numel()
    positions = torch.arange(flat.numel(), device=flat.device)
    first_use = torch.full((n_uniq,), flat.numel(), dtype=torch.int64, device=flat.device)
    first_use.scatter_reduce_(0, inverse, positions, reduce="amin")
    order_rank = torch.empty_like(first_use)
    order_rank[torch.argsort(first_use)] = torch.arange(n_uniq, device=flat.device)
    chunk = order_rank * chunks // max(n_uniq, 1)  # equal pieces in reading order
    owner = layout.owner(uniq)
    send_order = torch.argsort((owner * chunks + chunk) * max(n_uniq, 1) + order_rank)
    entry_of_uniq = torch.empty_like(send_order)
    entry_of_uniq[send_order] = torch.arange(n_uniq, device=flat.device)
    entry_of_id = entry_of_uniq[inverse]
    use_entry = dict(zip(USES, entry_of_id.split([ids[u].numel() for u in USES])))
    counts = torch.bincount(owner * chunks + chunk, minlength=layout.world_size * chunks)
    chunk = chunk[send_order]
    # A chunk's leaf holds its entries in entry order (by owner: the gradients' send order).
    by_chunk = torch.argsort(chunk, stable=True)
    sizes = torch.bincount(chunk, minlength=chunks)
    starts = torch.cumsum(sizes, 0) - sizes
    pos_in_chunk = torch.empty_like(chunk)
    pos_in_chunk[by_chunk] = torch.arange(n_uniq, device=flat.device) - starts[chunk[by_chunk]]
    sizes_h, counts_h = sizes.tolist(), counts.view(layout.world_size, chunks).tolist()
    # Each use reads the concatenation of the leaves of the chunks it touches, ascending.
    use_chunks, use_index = {}, {}
    for u in USES:
        needed = torch.unique(chunk[use_entry[u]]).tolist()
        offset = torch.zeros(chunks, dtype=torch.int64, device=flat.device)
        at = 0
        for c in needed:
            offset[c] = at
            at += sizes_h[c]
        use_chunks[u] = needed
        use_index[u] = offset[chunk[use_entry[u]]] + pos_in_chunk[use_entry[u]]
    return Request(batch, uniq[send_order], owner[send_order], chunk,
                   counts.view(layout.world_size, chunks), [sum(row) for row in counts_h],
                   [[row[c] for row in counts_h] for c in range(chunks)], sizes_h,
                   list(by_chunk.split(sizes_h)), use_chunks, use_index)


def _fetch(name: str, sel_req: torch.Tensor, sel_srv: torch.Tensor, req_owner: torch.Tensor,
           req_chunk: torch.Tensor, svc_src: torch.Tensor, n: int) -> Fetch:
    """One message from host masks over the request's and the service's entries."""
    req_entries, svc_entries = sel_req.nonzero().flatten(), sel_srv.nonzero().flatten()
    return Fetch(name, req_entries, svc_entries, _counts(svc_src[svc_entries], n),
                 _counts(req_owner[req_entries], n), set(torch.unique(req_chunk[req_entries]).tolist()))


def plan_fetches(req: Request, svc: Service, n: int, chunks: int, final: bool) -> None:
    """The step's messages from its fresh masks, on the host: with `final` one message of
    the rows the previous step cannot change, then (always) the fresh rows chunk by chunk;
    and the gradients' receive plan per chunk. Index tensors are on the CPU: the input
    stage moves them to the device with the step's input (else `ShardedEmbeddings`)."""
    req_chunk, req_owner, svc_chunk, svc_src = req.chunk.cpu(), req.owner.cpu(), svc.chunk.cpu(), svc.src.cpu()
    req_fresh, svc_fresh = req.fresh.cpu(), svc.fresh.cpu()
    on_host = (req_owner, req_chunk, svc_src, n)
    req.final_fetch = _fetch("emb.fetch_final", ~req_fresh, ~svc_fresh, *on_host) if final else None
    req.fresh_fetches = [_fetch(f"emb.fetch_c{c}", req_fresh & (req_chunk == c),
                                svc_fresh & (svc_chunk == c), *on_host) for c in range(chunks)]
    svc.grad_entries = [(svc_chunk == c).nonzero().flatten() for c in range(chunks)]
    svc.grad_splits = [_counts(svc_src[e], n) for e in svc.grad_entries]


class ShardedEmbeddings:
    """The protocol above for one rank; `freescale_impl.sharded_step` drives it. Per step:
    a request, computed ahead (`adopt`) or exchanged (`request`, `serve`); its rows sent
    (`send_final`, `send_fresh`, or `fetch_all`); `lookups` read by the forward;
    `prepare_gradients`, backward (chunk hooks send gradients), `finish_gradients`."""

    def __init__(self, layout: RowLayout, shard: LocalShard, transport, group, rank: int,
                 chunks: int, overlap: bool, priority: bool) -> None:
        self.layout, self.shard, self.transport = layout, shard, transport
        self.control = CollectiveTransport(group)  # counts, ids, masks: small messages
        self.rank, self.n = rank, layout.world_size
        self.chunks = chunks if overlap else 1
        self.overlap, self.priority = overlap, priority
        self.dim = layout.dim
        self.device = shard.weight.device
        self._grad_sends: list[tuple[Pending, int]] = []  # (exchange, chunk) this step
        self._sent = 0
        self._ready: list[bool] = []
        # Set by a trainer whose dense gradients DDP all-reduces from its own hooks: the
        # chunks' sends then wait for DDP's last bucket (`dense_gradients_issued`).
        self.grads_after_dense = False
        self._dense_issued = True
        self._grad_req: Request | None = None

    # -- requests -----------------------------------------------------------------
    def request(self, batch: JaggedBatch) -> tuple[Request, Service, Pending]:
        """Send a step's requests (before its forward): counts (waited: the ids' splits
        need them), then the ids (returned pending; `serve` waits)."""
        with span("emb.route", kind="compute"):
            req = build_request(batch, self.layout, self.chunks)
        counts_in = self.control.all_to_all(req.counts, [1] * self.n, [1] * self.n,
                                            "emb.counts").wait().tolist()  # (N sources, chunks)
        ids = self.control.all_to_all(req.rows, req.send_counts, [sum(row) for row in counts_in],
                                      "emb.ids")
        src = [r for r in range(self.n) for c in range(self.chunks) for _ in range(counts_in[r][c])]
        chunk = [c for r in range(self.n) for c in range(self.chunks) for _ in range(counts_in[r][c])]
        svc = Service(local=torch.empty(0, dtype=torch.int64), src=torch.tensor(src, dtype=torch.int64),
                      chunk=torch.tensor(chunk, dtype=torch.int64))
        self._new_buffer(req)
        return req, svc, ids

    def serve(self, svc: Service, ids: Pending) -> None:
        ids = ids.wait()
        with span("emb.route", kind="compute"):
            svc.local = self.layout.local_index(ids)

    def _new_buffer(self, req: Request) -> None:
        req.buffer = torch.empty(req.rows.numel(), self.dim, dtype=self.shard.weight.dtype,
                                 device=self.device)

    def _plan(self, req: Request, svc: Service, final: bool) -> None:
        """Requests exchanged inside the step: plan its messages now (before the forward,
        or between forward and backward), and move the plan's indices to the device."""
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
        self._plan(req, svc, final=False)
        self.send_fresh(req, svc)

    def adopt(self, batch: JaggedBatch, routing: dict) -> tuple[Request, Service]:
        """A step whose routing and plan the input stage computed (`freescale_impl.routing`)."""
        req, svc = routing["request"], routing["service"]
        req.batch = batch
        self._new_buffer(req)
        return req, svc

    def split_and_send_final(self, req: Request, svc: Service, touched: torch.Tensor) -> None:
        """Priority, requests exchanged: rows the current step touches (`touched`: this
        owner's local rows asked for at the current step) are fresh; tell the requesters
        which, plan, and send the others now (between the current forward and backward)."""
        with span("emb.route", kind="compute"):
            svc.fresh = torch.isin(svc.local, touched)
        mask = self.control.all_to_all(svc.fresh.to(torch.uint8), _counts(svc.src, self.n),
                                       req.send_counts, "emb.fresh_mask").wait()
        req.fresh = mask.bool()
        self._plan(req, svc, final=True)
        self.send_final(req, svc)

    def send_final(self, req: Request, svc: Service) -> None:
        """Priority: rows the current step cannot change, now (they are final)."""
        self._send(req, svc, req.final_fetch)

    def send_fresh(self, req: Request, svc: Service) -> None:
        """Fresh rows, chunk by chunk in reading order (after the update that made them)."""
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
                leaf.register_post_accumulate_grad_hook(lambda _t, c=c: self._grad_ready(req, c))
            req.leaves[c] = leaf
        return req.leaves[c]

    def rows_for(self, req: Request, use: str) -> torch.Tensor:
        needed = req.use_chunks[use]
        if not needed:
            return req.buffer.new_zeros(0, self.dim)
        # Only the chunks this use reads: a chunk read by the targets alone then gets its
        # gradient (and is sent) as soon as the loss's backward is done. Uses that read
        # the same chunks share one concatenation.
        key = tuple(needed)
        if key not in req.tables:
            leaves = [self._leaf(req, c) for c in needed]
            req.tables[key] = leaves[0] if len(leaves) == 1 else torch.cat(leaves)
        return req.tables[key].index_select(0, req.use_index[use])

    # -- gradients ------------------------------------------------------------------
    def prepare_gradients(self, req: Request, svc: Service) -> None:
        """Before backward: which chunks have no gradient to wait for (none of their rows
        was read, or the chunk is empty)."""
        self._ready = [req.leaves[c] is None for c in range(self.chunks)]
        self._grad_sends, self._sent = [], 0
        self._svc, self._grad_req = svc, req
        self._dense_issued = not self.grads_after_dense

    def _grad_ready(self, req: Request, c: int) -> None:
        self._ready[c] = True
        self._send_grads(req)

    def dense_gradients_issued(self) -> None:
        """DDP issued the step's last dense all-reduce (fsbench.training.dp.wrap_ddp's
        after_last_bucket, on autograd's thread): the chunks may go now."""
        self._dense_issued = True
        if self._grad_req is not None:
            self._send_grads(self._grad_req)

    def _send_grads(self, req: Request, everything: bool = False) -> None:
        """Send chunk gradients in one fixed order, last-consumed first (the order autograd
        produces them), as far as they are ready, and only after DDP's dense all-reduces
        where those come from hooks too: collectives must match across ranks. `everything`
        (after backward, when DDP has issued every bucket): the rest, ready or not."""
        if not (everything or self._dense_issued):
            return
        while self._sent < self.chunks:
            c = self.chunks - 1 - self._sent
            if not (self._ready[c] or everything):
                return
            leaf = req.leaves[c]
            grads = (leaf.grad if leaf is not None and leaf.grad is not None
                     else req.buffer.new_zeros(req.chunk_sizes[c], self.dim))
            p = self.transport.all_to_all(grads, req.grad_splits[c], self._svc.grad_splits[c],
                                          f"emb.grad_c{c}")
            self._grad_sends.append((p, c))
            self._sent += 1

    def finish_gradients(self, req: Request, svc: Service) -> None:
        """After backward: send what is left, receive everything, update the owned rows."""
        self._send_grads(req, everything=True)
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


class LazyLookups:
    """EmbeddingLookups whose fields are fetched when the model first reads them."""

    def __init__(self, engine: ShardedEmbeddings, req: Request) -> None:
        self._engine, self._req, self._cache = engine, req, {}

    def _get(self, use: str) -> torch.Tensor:
        if use not in self._cache:
            self._cache[use] = self._engine.rows_for(self._req, use)
        return self._cache[use]

    users = property(lambda self: self._get("users"))
    items = property(lambda self: self._get("items"))
    targets = property(lambda self: self._get("targets"))
    negatives = property(lambda self: self._get("negatives"))

    @property
    def contexts(self) -> torch.Tensor:
        b = self._req.batch
        return self._get("contexts").view(b.batch_size, b.context_ids.shape[1], self._engine.dim)

    def materialize(self) -> EmbeddingLookups:
        return EmbeddingLookups(items=self.items, targets=self.targets, negatives=self.negatives,
                                users=self.users, contexts=self.contexts)
