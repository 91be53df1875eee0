"""The host side of the sharded-embedding exchange: who asks which owner for which rows,
in which chunk, and which of them must wait for the previous update. Pure planning on
tensors and numpy, no collective: the loader's input stage builds a step's `Request`
(freescale_impl.routing), the step fills in the `Service` from the exchanged counts, and
freescale_impl.embedding_exchange's `ShardedEmbeddings` carries both out."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fsbench.models.sparse import ITEM, USER, context_table
from fsbench.training.sub_batch_cut import sub_batch_bounds
from fsbench.workloads.batch import JaggedBatch
from freescale_impl.sharded_tables import RowLayout
from freescale_impl.transport import Pending

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
    """A requester's view of one step: entry e asks owner[e] for global row rows[e].

    Chunks are by whole samples: the rank's samples are cut into `chunks` sub-batches
    (contiguous, about equal tokens), and chunk c holds the rows sub-batch c is the first
    to read (the shared negatives, read by every sub-batch, in chunk 0). Sub-batch c then
    reads only chunks <= c, and the forward runs sub-batch by sub-batch."""

    batch: JaggedBatch
    rows: torch.Tensor       # (E,) by owner, then chunk, then first use
    owner: torch.Tensor      # (E,)
    chunk: torch.Tensor      # (E,)
    counts: torch.Tensor     # (N, chunks) entries per (owner, chunk)
    send_counts: list[int]   # host: entries per owner (the ids' splits)
    grad_splits: list[list[int]]  # host: per chunk, its entries per owner (the gradients' splits)
    chunk_sizes: list[int]   # host: entries per chunk
    chunk_entries: list[torch.Tensor]  # per chunk, its entries in entry order (its leaf's rows)
    sub_samples: list[int]   # host: (chunks + 1) sample bounds of the sub-batches
    sub_tokens: list[int]    # host: (chunks + 1) token bounds of the sub-batches
    sub_chunks: list[list[int]]  # host: per sub-batch, the chunks it reads (ascending)
    sub_index: list[dict[str, torch.Tensor]]  # per sub-batch and use: each id's row in
    #                                           its chunks' concatenated leaves
    # planned once the fresh rows are known (`plan_fetches`)
    fresh: torch.Tensor | None = None  # (E,) rows that must wait for the previous update
    final_fetch: Fetch | None = None   # priority: rows the previous step cannot change
    fresh_fetches: list[Fetch] = field(default_factory=list)  # per chunk, first sub-batch first
    # filled as the protocol runs
    pending: list[tuple[Pending, torch.Tensor, set[int]]] = field(default_factory=list)
    buffer: torch.Tensor | None = None  # (E, D) fetched rows
    leaves: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def sub_batches(self) -> int:
        return len(self.sub_samples) - 1

    def sub_batch(self, batch: JaggedBatch, c: int) -> JaggedBatch:
        """Sub-batch c of `batch` (the step's batch, on any device): host bounds only."""
        return batch.between(self.sub_samples[c], self.sub_samples[c + 1],
                             self.sub_tokens[c], self.sub_tokens[c + 1])


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


def expected_sub_batches(workload, n: int, chunks: int, growth: float = 1.0
                         ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(each sub-batch's share of a rank's tokens, each chunk's share of its rows), in
    expectation: `sub_batch_bounds`' cut (equal tokens, or each sub-batch `growth` times
    the one before), in whole samples, on the
    workload's expected lengths and popularity at its share of the global batch
    (deterministic: the simulator's compute and exchange shares, fsbench.scaling.simulate).
    A chunk's rows: those its sub-batch is the first to read, counted as the simulator
    counts rows (sim_costs.unique_rows): the shared negatives first (chunk 0's), then each
    token's and sample's draws, one user and context row a sample."""
    from fsbench.scaling.sim_costs import expected_distinct, expected_tokens
    from fsbench.specs import parse_popularity

    if chunks <= 1:
        return (1.0,), (1.0,)
    w = workload
    s, samples = float(parse_popularity(w.popularity).s), w.global_batch_size / n
    per_sample = expected_tokens(w) / n + samples  # item draws past the negatives
    # In whole samples, at least one each (the empty ones last), as the trainer cuts.
    b = max(int(round(samples)), 1)
    bounds = sub_batch_bounds(np.ones(b), chunks, growth)
    at = bounds / b  # the share of the samples (and, in expectation, tokens) read so far
    read = (expected_distinct(w.negatives_per_step + at * per_sample, w.item_vocab, s)
            + at * samples * (1 + len(w.context_vocabs)))
    read[0] = 0.0  # the negatives are read, by sub-batch 0
    return (tuple(float(x) for x in np.diff(at)),
            tuple(float(x) for x in np.diff(read) / read[-1]))


def build_request(batch: JaggedBatch, layout: RowLayout, chunks: int, growth: float = 1.0) -> Request:
    """The step's request and its host plan (ahead of the step: reads values to the host).

    O(local ids + N + chunks x negatives). In numpy on the host: its sorts are several
    times faster than torch's at these sizes (a rank's ~20k ids: `fsbench micro
    input-stage`); the tensors are zero-copy views, moved to the batch's device at the end."""
    ids = rows_by_use(batch, layout)
    use_sizes = [ids[u].numel() for u in USES]
    # A host copy of the ids: on a GPU a sync, outside any forward or backward.
    flat = torch.cat([ids[u] for u in USES]).cpu().numpy()
    lengths = batch.lengths.cpu().numpy()
    n_ctx, b = batch.context_ids.shape[1], lengths.size
    sample_of_token = np.repeat(np.arange(b), lengths)
    # The sample each id is read by (the negatives: by every one, first by sample 0).
    sample_of_id = np.concatenate([np.arange(b), np.repeat(np.arange(b), n_ctx), sample_of_token,
                                   sample_of_token, np.zeros(use_sizes[-1], dtype=np.int64)])
    uniq, inverse = np.unique(flat, return_inverse=True)
    n_uniq = uniq.size
    inv = torch.from_numpy(inverse)
    # Each unique row's first reader; the sub-batches cut at equal tokens.
    first_sample = torch.full((n_uniq,), max(b - 1, 0), dtype=torch.int64).scatter_reduce_(
        0, inv, torch.from_numpy(sample_of_id), reduce="amin").numpy()
    bounds = sub_batch_bounds(lengths, chunks, growth)
    token_bounds = np.concatenate([[0], np.cumsum(lengths)])[bounds]
    sub_of_sample = np.repeat(np.arange(chunks), np.diff(bounds))
    # Each unique row's chunk: the sub-batch of its first reader (sub-batch 0 for the
    # negatives, also without samples); its first use (the smallest position of its
    # ids), then its rank in reading order.
    chunk = sub_of_sample[first_sample] if b else np.zeros(n_uniq, dtype=np.int64)
    first_use = torch.full((n_uniq,), flat.size, dtype=torch.int64).scatter_reduce_(
        0, inv, torch.arange(flat.size), reduce="amin").numpy()
    order_rank = np.empty(n_uniq, dtype=np.int64)
    order_rank[np.argsort(first_use)] = np.arange(n_uniq)  # first uses are distinct
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
    # Sub-batch c reads the concatenation of the leaves of the chunks it touches,
    # ascending (all <= c). (Host lists of N entries come from one array call each:
    # Python loops over the ranks would make the request O(N) in interpreter time.)
    sub_chunks, sub_index = [], []
    for c in range(chunks):
        s0, s1, t0, t1 = bounds[c], bounds[c + 1], token_bounds[c], token_bounds[c + 1]
        entries = {"users": use_entry["users"][s0:s1],
                   "contexts": use_entry["contexts"][s0 * n_ctx:s1 * n_ctx],
                   "items": use_entry["items"][t0:t1], "targets": use_entry["targets"][t0:t1],
                   "negatives": use_entry["negatives"]}
        read = np.bincount(np.concatenate([chunk[e] for e in entries.values()]), minlength=chunks)
        needed = np.flatnonzero(read).tolist()
        offset = np.zeros(chunks, dtype=np.int64)
        offset[needed] = np.cumsum([0] + [sizes_h[k] for k in needed[:-1]])
        sub_chunks.append(needed)
        sub_index.append({u: offset[chunk[e]] + pos_in_chunk[e] for u, e in entries.items()})
    device = batch.item_ids.device
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    return Request(batch, t(uniq[send_order]), t(owner[send_order]), t(chunk), t(counts),
                   counts.sum(1).tolist(), counts.T.tolist(), sizes_h,
                   [t(e) for e in np.split(by_chunk, np.cumsum(sizes)[:-1])],
                   bounds.tolist(), token_bounds.tolist(), sub_chunks,
                   [{u: t(i) for u, i in index.items()} for index in sub_index])


def service_of(counts_in: torch.Tensor, n: int, chunks: int) -> Service:
    """An owner's service, its rows still unknown, from the counts each of the n requesters
    sends it per chunk ((n, chunks), on the host): entries arrive by requester, then chunk,
    so each entry's (src, chunk) label follows from the counts alone. O(entries + n)."""
    per = counts_in.reshape(-1).cpu().numpy()
    return Service(local=torch.empty(0, dtype=torch.int64),
                   src=torch.from_numpy(np.repeat(np.repeat(np.arange(n), chunks), per)),
                   chunk=torch.from_numpy(np.repeat(np.tile(np.arange(chunks), n), per)))


def _peer_counts(fresh: np.ndarray, chunk: np.ndarray, peer: np.ndarray, n: int,
                 chunks: int) -> np.ndarray:
    """(2, chunks, n): one side's entries per (stale or fresh, chunk, peer), from one
    bincount over every entry (a bincount a message paid an n-long pass each)."""
    key = (fresh.astype(np.int64) * chunks + chunk) * n + peer
    return np.bincount(key, minlength=2 * chunks * n).reshape(2, chunks, n)


def plan_fetches(req: Request, svc: Service, n: int, chunks: int, final: bool) -> None:
    """The step's messages from its fresh masks, on the host: with `final` one message of
    the rows the previous step cannot change, then (always) the fresh rows chunk by chunk;
    and the gradients' receive plan per chunk. Index tensors are on the CPU: the input
    stage moves them to the device with the step's input (else `ShardedEmbeddings`).
    In numpy (as `build_request`): O(entries x chunks + chunks x n). The n-long terms are
    a few array calls and one conversion to the lists torch.distributed takes, (2 + 3 x
    chunks) x n ints at about 5 ns each: 25 ns a peer at one chunk, 1,024 to 8,192 ranks
    (a Python step per peer would cost tens of times that)."""
    host = lambda t: t.cpu().numpy()  # noqa: E731
    req_chunk, req_owner = host(req.chunk), host(req.owner)
    svc_chunk, svc_src = host(svc.chunk), host(svc.src)
    req_fresh, svc_fresh = host(req.fresh), host(svc.fresh)
    send = _peer_counts(svc_fresh, svc_chunk, svc_src, n, chunks)  # rows this owner sends
    recv = _peer_counts(req_fresh, req_chunk, req_owner, n, chunks)  # rows this requester gets
    # Every message's splits in one host conversion (torch.distributed takes lists): the
    # final message's, the fresh chunks', the gradients' (a chunk's gradients go back
    # along all of its entries, stale or fresh).
    splits = np.concatenate([send[0].sum(0, keepdims=True), recv[0].sum(0, keepdims=True),
                             send[1], recv[1], send.sum(0)]).tolist()
    fresh_send, fresh_recv = splits[2:2 + chunks], splits[2 + chunks:2 + 2 * chunks]
    carried = recv.sum(2) > 0  # (stale or fresh, chunk): does that message carry the chunk

    def fetch(name: str, sel_req: np.ndarray, sel_svc: np.ndarray, send_splits: list[int],
              recv_splits: list[int], carries: set[int]) -> Fetch:
        return Fetch(name, torch.from_numpy(np.flatnonzero(sel_req)),
                     torch.from_numpy(np.flatnonzero(sel_svc)), send_splits, recv_splits, carries)

    req.final_fetch = (fetch("emb.fetch_final", ~req_fresh, ~svc_fresh, splits[0], splits[1],
                             set(np.flatnonzero(carried[0]).tolist())) if final else None)
    # Entries by message: a mask and a scan a chunk (O(chunks x entries)), at a few chunks
    # faster than one stable sort of the entries by message (36 against 90 us at 4 chunks
    # and 11k entries, numpy 2.4).
    if chunks == 1:  # every entry is in chunk 0
        req_in, svc_in, entries = [req_fresh], [svc_fresh], [np.arange(svc_chunk.size)]
    else:
        req_in = [req_fresh & (req_chunk == c) for c in range(chunks)]
        svc_in = [svc_fresh & (svc_chunk == c) for c in range(chunks)]
        entries = [np.flatnonzero(svc_chunk == c) for c in range(chunks)]
    req.fresh_fetches = [fetch(f"emb.fetch_c{c}", req_in[c], svc_in[c], fresh_send[c], fresh_recv[c],
                               {c} if carried[1, c] else set()) for c in range(chunks)]
    svc.grad_entries = [torch.from_numpy(e) for e in entries]
    svc.grad_splits = splits[2 + 2 * chunks:]
