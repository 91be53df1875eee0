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
  update    the owner sums the contributions per row and steps only those rows (with
            dense Adam, every row it holds: freescale_impl.sharded_tables).

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

import numpy as np
import torch

from fsbench.models.sparse import ITEM, USER, EmbeddingLookups, context_table
from fsbench.measurement.timeline import span
from fsbench.workloads.batch import JaggedBatch
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.transport import CollectiveTransport, Pending

USES = ("users", "contexts", "items", "targets", "negatives")  # the model's reading order


def _counts(index, n: int) -> list[int]:
    """Entries per peer, on the host: for planning only, never inside forward or backward."""
    if isinstance(index, torch.Tensor):
        index = index.cpu().numpy()
    return np.bincount(index, minlength=n).tolist()


def touched_mask(local: torch.Tensor, touched: torch.Tensor, rows_held: int) -> torch.Tensor:
    """Which of an owner's entries (`local`: local rows) are among `touched` (local rows, any
    order, repeats allowed): a table of the rows it holds, O(entries + rows held), where a
    sorted `isin` took ~1 ms a step at 11k entries."""
    table = torch.zeros(rows_held, dtype=torch.bool, device=local.device)
    table[touched] = True
    return table[local]


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
    """The step's request and its host plan (ahead of the step: reads values to the host).

    O(local ids + N). In numpy on the host: its sorts are several times faster than
    torch's at these sizes (a rank's ~20k ids: `fsbench micro input-stage`); the tensors
    are zero-copy views, moved to the batch's device at the end."""
    ids = rows_by_use(batch, layout)
    use_sizes = [ids[u].numel() for u in USES]
    # A host copy of the ids: on a GPU a sync, outside any forward or backward.
    flat = torch.cat([ids[u] for u in USES]).cpu().numpy()
    uniq, inverse = np.unique(flat, return_inverse=True)
    n_uniq = uniq.size
    # Each unique row's first use (the smallest position of its ids), then its rank in
    # reading order.
    first_use = torch.full((n_uniq,), flat.size, dtype=torch.int64).scatter_reduce_(
        0, torch.from_numpy(inverse), torch.arange(flat.size), reduce="amin").numpy()
    order_rank = np.empty(n_uniq, dtype=np.int64)
    order_rank[np.argsort(first_use)] = np.arange(n_uniq)  # first uses are distinct
    chunk = order_rank * chunks // max(n_uniq, 1)  # equal pieces in reading order
    owner = layout.owner(torch.from_numpy(uniq)).numpy()
    # Entries by owner, then chunk, then first use (keys distinct: any sort will do).
    send_order = np.argsort((owner * chunks + chunk) * max(n_uniq, 1) + order_rank)
    entry_of_uniq = np.empty(n_uniq, dtype=np.int64)
    entry_of_uniq[send_order] = np.arange(n_uniq)
    entry_of_id = entry_of_uniq[inverse]
    use_entry = dict(zip(USES, np.split(entry_of_id, np.cumsum(use_sizes)[:-1])))
    counts = np.bincount(owner * chunks + chunk, minlength=layout.world_size * chunks)
    counts = counts.reshape(layout.world_size, chunks)
    chunk = chunk[send_order]
    # A chunk's leaf holds its entries in entry order (by owner: the gradients' send order).
    arange = np.arange(n_uniq)
    by_chunk = np.argsort(chunk, kind="stable") if chunks > 1 else arange
    sizes = np.bincount(chunk, minlength=chunks)
    starts = np.cumsum(sizes) - sizes
    pos_in_chunk = np.empty(n_uniq, dtype=np.int64)
    pos_in_chunk[by_chunk] = arange - starts[chunk[by_chunk]]
    sizes_h = sizes.tolist()
    # Each use reads the concatenation of the leaves of the chunks it touches, ascending.
    # (Host lists of N entries come from one array call each: Python loops over the
    # ranks would make the request O(N) in interpreter time at 1,024 ranks.)
    use_chunks, use_index = {}, {}
    for u in USES:
        used = chunk[use_entry[u]]
        needed = np.flatnonzero(np.bincount(used, minlength=chunks)).tolist()
        offset = np.zeros(chunks, dtype=np.int64)
        offset[needed] = np.cumsum([0] + [sizes_h[c] for c in needed[:-1]])
        use_chunks[u] = needed
        use_index[u] = offset[used] + pos_in_chunk[use_entry[u]]
    device = batch.item_ids.device
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return Request(batch, t(uniq[send_order]), t(owner[send_order]), t(chunk), t(counts),
                   counts.sum(1).tolist(), counts.T.tolist(), sizes_h,
                   [t(e) for e in np.split(by_chunk, np.cumsum(sizes)[:-1])],
                   use_chunks, {u: t(i) for u, i in use_index.items()})


def service_of(counts_in: torch.Tensor, n: int, chunks: int) -> Service:
    """An owner's service, its rows still unknown, from the counts each of the n requesters
    sends it per chunk ((n, chunks), on the host): entries arrive by requester, then chunk,
    so each entry's (src, chunk) label follows from the counts alone. O(entries + n)."""
    per = counts_in.reshape(-1).cpu().numpy()
    return Service(local=torch.empty(0, dtype=torch.int64),
                   src=torch.from_numpy(np.repeat(np.repeat(np.arange(n), chunks), per)),
                   chunk=torch.from_numpy(np.repeat(np.tile(np.arange(chunks), n), per)))


def _fetch(name: str, sel_req: np.ndarray, sel_srv: np.ndarray, req_owner: np.ndarray,
           req_chunk: np.ndarray, svc_src: np.ndarray, n: int, chunks: int) -> Fetch:
    """One message from host masks over the request's and the service's entries."""
    req_entries, svc_entries = np.flatnonzero(sel_req), np.flatnonzero(sel_srv)
    carried = np.flatnonzero(np.bincount(req_chunk[req_entries], minlength=chunks))
    return Fetch(name, torch.from_numpy(req_entries), torch.from_numpy(svc_entries),
                 _counts(svc_src[svc_entries], n), _counts(req_owner[req_entries], n),
                 set(carried.tolist()))


def plan_fetches(req: Request, svc: Service, n: int, chunks: int, final: bool) -> None:
    """The step's messages from its fresh masks, on the host: with `final` one message of
    the rows the previous step cannot change, then (always) the fresh rows chunk by chunk;
    and the gradients' receive plan per chunk. Index tensors are on the CPU: the input
    stage moves them to the device with the step's input (else `ShardedEmbeddings`).
    In numpy (as `build_request`): O(entries + n)."""
    host = lambda t: t.cpu().numpy()  # noqa: E731
    req_chunk, req_owner, svc_chunk, svc_src = host(req.chunk), host(req.owner), host(svc.chunk), host(svc.src)
    req_fresh, svc_fresh = host(req.fresh), host(svc.fresh)
    on_host = (req_owner, req_chunk, svc_src, n, chunks)
    req.final_fetch = _fetch("emb.fetch_final", ~req_fresh, ~svc_fresh, *on_host) if final else None
    if chunks == 1:  # every entry is in chunk 0
        req.fresh_fetches = [_fetch("emb.fetch_c0", req_fresh, svc_fresh, *on_host)]
        entries = [np.arange(svc_chunk.size)]
    else:
        req.fresh_fetches = [_fetch(f"emb.fetch_c{c}", req_fresh & (req_chunk == c),
                                    svc_fresh & (svc_chunk == c), *on_host) for c in range(chunks)]
        entries = [np.flatnonzero(svc_chunk == c) for c in range(chunks)]
    svc.grad_entries = [torch.from_numpy(e) for e in entries]
    svc.grad_splits = [_counts(svc_src[e], n) for e in entries]


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
        # Priority sends rows no update can change before the update: with an optimizer
        # that moves every row at every step (dense Adam) there are none.
        self.overlap, self.priority = overlap, priority and not shard.steps_every_row
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
    # A step's requests are exchanged in three messages, each issued early and waited
    # late (freescale_impl.sharded_step pipelines them over the steps before): counts
    # (the ids' splits), the ids, and with priority the owners' fresh masks.
    def request(self, batch: JaggedBatch, req: Request | None = None
                ) -> tuple[Request, Service, Pending]:
        """Send a step's requests at once: counts (waited: the ids' splits need them),
        then the ids (returned pending; `serve` waits). `req`: built by the input stage
        (`freescale_impl.routing.OwnRequest`), else built here."""
        if req is None:
            with span("emb.route", kind="compute"):
                req = build_request(batch, self.layout, self.chunks)
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

    def _plan(self, req: Request, svc: Service, final: bool) -> None:
        """Requests exchanged inside the step: plan its messages now (before the forward,
        or between forward and backward), and move the plan's indices to the device."""
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
        self.adopt_fresh_mask(req, svc, self.send_fresh_mask(req, svc, touched))
        self.send_final(req, svc)

    def send_fresh_mask(self, req: Request, svc: Service, touched: torch.Tensor) -> Pending:
        """Priority, requests exchanged: mark this owner's entries whose rows the current
        step touches (`touched`: its local rows asked for at the current step, repeats
        allowed) fresh, and issue the mask to the requesters."""
        with span("emb.route", kind="compute"):
            svc.fresh = touched_mask(svc.local, touched, self.shard.weight.shape[0])
        return self.control.all_to_all(svc.fresh.to(torch.uint8), _counts(svc.src, self.n),
                                       req.send_counts, "emb.fresh_mask")

    def adopt_fresh_mask(self, req: Request, svc: Service, mask: Pending) -> None:
        """The owners' fresh masks arrived: plan the step's messages from them."""
        req.fresh = mask.wait().bool()
        self._plan(req, svc, final=True)

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
                # The hook lives in C++ on the leaf, out of the garbage collector's sight:
                # a closure over `req` (whose `leaves` hold the leaf) would be a cycle it
                # cannot break, and every step's rows, leaves and gradients would stay.
                leaf.register_post_accumulate_grad_hook(lambda _t, c=c: self._grad_ready(c))
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

    def _grad_ready(self, c: int) -> None:
        self._ready[c] = True
        self._send_grads(self._grad_req)

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
        # The step's autograd leaves and the engine's hold on it go now: nothing reads
        # them after the update, and the look-ahead keeps later steps' requests alive.
        req.leaves, req.tables = [], {}
        self._grad_sends, self._svc, self._grad_req = [], None, None


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
