"""The exchange's host plan (freescale_impl.exchange_plan) against a straightforward
reference: every message's entries, splits and chunks, and the gradients' receive plan,
computed entry by entry and peer by peer with Python loops (what the planner replaces
with a few array calls, so that its cost does not grow with the world size per peer)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fsbench.models import table_specs
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import get_workload, small, tiny
from freescale_impl.exchange_plan import build_request, expected_sub_batches, plan_fetches, service_of
from freescale_impl.sharded_tables import RowLayout

WORKLOAD = dataclasses.replace(tiny(), global_batch_size=24, lengths="yelp")


def _reference_message(req, svc, req_sel, svc_sel, n):
    """(requester's entries, owner's entries, send splits, recv splits, chunks carried)."""
    req_e = [e for e in range(req.owner.numel()) if req_sel(e)]
    svc_e = [f for f in range(svc.src.numel()) if svc_sel(f)]
    send = [sum(1 for f in svc_e if int(svc.src[f]) == p) for p in range(n)]
    recv = [sum(1 for e in req_e if int(req.owner[e]) == p) for p in range(n)]
    return req_e, svc_e, send, recv, {int(req.chunk[e]) for e in req_e}


def _as_tuple(fetch):
    return (fetch.req_entries.tolist(), fetch.svc_entries.tolist(), fetch.send_splits,
            fetch.recv_splits, fetch.chunks)


def _case(n: int, chunks: int, seed: int):
    """Rank 0's real request at world size n, a service from random counts (some
    requesters and chunks send nothing), and random fresh masks on both sides."""
    gen = np.random.default_rng(seed)
    specs = table_specs(WORKLOAD.model.dim, WORKLOAD.item_vocab, WORKLOAD.user_vocab,
                        WORKLOAD.context_vocabs)
    layout = RowLayout(specs, n, "row")
    batch = make_batch_source(WORKLOAD, seed).global_batch(0)
    req = build_request(batch.select(list(range(0, batch.batch_size, 2))), layout, chunks)
    counts = gen.integers(0, 4, size=(n, chunks)) * (gen.random((n, chunks)) < 0.6)
    svc = service_of(torch.from_numpy(counts), n, chunks)
    req.fresh = torch.from_numpy(gen.random(req.owner.numel()) < 0.5)
    svc.fresh = torch.from_numpy(gen.random(svc.src.numel()) < 0.5)
    return req, svc


@pytest.mark.parametrize("n,chunks", [(1, 1), (3, 1), (5, 2), (37, 3), (64, 4)])
@pytest.mark.parametrize("final", [True, False])
def test_planned_messages_equal_the_entry_by_entry_reference(n, chunks, final):
    req, svc = _case(n, chunks, seed=n * 10 + chunks)
    plan_fetches(req, svc, n, chunks, final)
    rf, sf, rc, sc = req.fresh.tolist(), svc.fresh.tolist(), req.chunk.tolist(), svc.chunk.tolist()
    if final:
        assert _as_tuple(req.final_fetch) == _reference_message(
            req, svc, lambda e: not rf[e], lambda f: not sf[f], n)
        assert req.final_fetch.name == "emb.fetch_final"
    else:
        assert req.final_fetch is None
    assert [f.name for f in req.fresh_fetches] == [f"emb.fetch_c{c}" for c in range(chunks)]
    for c, fetch in enumerate(req.fresh_fetches):
        assert _as_tuple(fetch) == _reference_message(
            req, svc, lambda e: rf[e] and rc[e] == c, lambda f: sf[f] and sc[f] == c, n)
    for c in range(chunks):
        entries = [f for f in range(len(sc)) if sc[f] == c]
        assert svc.grad_entries[c].tolist() == entries
        assert svc.grad_splits[c] == [sum(1 for f in entries if int(svc.src[f]) == p) for p in range(n)]
    # Dtypes the engine's index_select and the transports rely on.
    index = [req.final_fetch] * final + req.fresh_fetches
    assert all(f.req_entries.dtype == f.svc_entries.dtype == torch.int64 for f in index)
    assert all(type(s) is int for f in index for s in f.send_splits + f.recv_splits)


def test_the_service_labels_each_entry_by_requester_then_chunk():
    counts = torch.tensor([[2, 0], [0, 1], [1, 3]])
    svc = service_of(counts, 3, 2)
    assert svc.src.tolist() == [0, 0, 1, 2, 2, 2, 2]
    assert svc.chunk.tolist() == [0, 0, 1, 0, 1, 1, 1]


def _rank_request(workload, n: int, chunks: int, step: int = 0):
    """Rank 0's request at world size n: its contiguous share of a global batch."""
    specs = table_specs(workload.model.dim, workload.item_vocab, workload.user_vocab,
                        workload.context_vocabs)
    batch = make_batch_source(workload, 0).global_batch(step)
    local = batch.select(list(range(batch.batch_size // n)))
    return build_request(local, RowLayout(specs, n, "row"), chunks), local


def test_sub_batches_cut_at_equal_tokens_and_chunk_0_is_the_largest():
    """Sub-batches of about equal tokens (within one sample's), whole samples, none empty;
    chunk c holds the rows sub-batch c is the first to read, so chunk 0 (the negatives,
    the popular items) is the largest."""
    w = dataclasses.replace(small(), global_batch_size=256)
    req, batch = _rank_request(w, 2, 4)
    sizes = np.bincount(req.chunk.numpy(), minlength=4)
    bounds = req.sub_samples
    tokens = np.diff(req.sub_tokens)
    assert tokens.max() - tokens.min() <= 2 * int(batch.lengths.max()), tokens
    assert sizes[0] > sizes[1:].max(), (tokens, sizes)
    assert bounds[0] == 0 and all(b1 > b0 for b0, b1 in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("preset,n", [("small", 2), ("medium", 64)])
def test_the_simulators_sub_batch_shares_are_the_trainers_cut(preset, n):
    """One truth: the shares the simulator gives each sub-batch's compute and each chunk's
    rows (expected_sub_batches) are what the trainer's cut gives on the workload's
    real-shaped batches, within 0.04, averaged over 8 steps."""
    w = get_workload(preset)
    chunks = 4
    tokens, rows = (np.array(x) for x in expected_sub_batches(w, n, chunks))
    got_tokens, got_rows = [], []
    for step in range(8):
        req, _ = _rank_request(w, n, chunks, step)
        got_tokens.append(np.diff(req.sub_tokens) / req.sub_tokens[-1])
        got_rows.append(np.bincount(req.chunk.numpy(), minlength=chunks) / req.chunk.numel())
    assert np.abs(np.mean(got_tokens, axis=0) - tokens).max() < 0.04, (np.mean(got_tokens, axis=0), tokens)
    assert np.abs(np.mean(got_rows, axis=0) - rows).max() < 0.04, (np.mean(got_rows, axis=0), rows)
    assert abs(sum(tokens) - 1.0) < 1e-9 and abs(sum(rows) - 1.0) < 1e-9 and rows[0] > 1 / chunks


def test_with_fewer_samples_than_chunks_the_expected_cut_takes_one_sample_each():
    w = dataclasses.replace(get_workload("medium"), global_batch_size=4 * 64)
    tokens, rows = expected_sub_batches(w, 64, 16)
    assert tokens[:4] == (0.25,) * 4 and set(tokens[4:]) == {0.0} and set(rows[4:]) == {0.0}
    assert rows[0] > rows[1] > 0  # the negatives and popular items in chunk 0
