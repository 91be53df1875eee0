"""FreeScale's embedding exchange makes no host sync inside forward and backward, by
construction: the routing and every message's splits are planned on the host in the
input stage (freescale_impl.routing.route), and the step only launches gathers and
all-to-alls with index tensors and host lists. Recorded on 2 gloo ranks, priority on,
3 chunks: the torch calls that would make a GPU's host wait (tests/support/host_syncs.py),
made from the exchange's code during the forward's lookups and the backward's gradient
sends: none. The recorder is live: it sees such a call in a backward hook."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch.distributed as dist

from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.models import table_specs
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.routing import route
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.transport import CollectiveTransport

pytestmark = pytest.mark.dist
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
EXCHANGE_FILES = ("embedding_exchange.py", "exchange_plan.py", "transport.py", "issue_queue.py")


def _shares(step: int, n: int):
    batch = make_batch_source(WORKLOAD, 5).global_batch(step)
    return [batch.select(list(range(r, 12, n))) for r in range(n)]


def _rank(rank, world_size, port, out):
    from host_syncs import HostSyncRecorder

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        specs = table_specs(WORKLOAD.model.dim, WORKLOAD.item_vocab, WORKLOAD.user_vocab,
                            WORKLOAD.context_vocabs)
        layout = RowLayout(specs, world_size, "row")
        shard = LocalShard(layout, rank, 5, "adagrad", 0.3, torch.device("cpu"))
        engine = ShardedEmbeddings(layout, shard, CollectiveTransport(dist.group.WORLD),
                                   dist.group.WORLD, rank, chunks=3, overlap=True, priority=True)
        # Step 1 routed as the input stage routes it: rows step 0 read are fresh.
        _, _, before = route(_shares(0, world_size), rank, layout, 3, None, final=True)
        req, svc, _ = route(_shares(1, world_size), rank, layout, 3, before, final=True)
        req, svc = engine.adopt(_shares(1, world_size)[rank], {"request": req, "service": svc})
        engine.send_final(req, svc)
        engine.send_fresh(req, svc)
        recorder = HostSyncRecorder(*EXCHANGE_FILES)
        live = HostSyncRecorder("test_sync_free_exchange.py")
        probe = torch.ones(2, requires_grad=True)
        def syncing_hook(t):  # a sync in a backward hook: the recorder must see it
            t.grad.tolist()
        probe.register_post_accumulate_grad_hook(syncing_hook)
        with recorder:  # the forward's lookups
            lk = engine.lookups(req)
            loss = ((lk.items * lk.targets).sum() + (lk.negatives ** 2).sum() + lk.users.sum()
                    + lk.contexts.sum() + (probe * 0).sum())
        engine.prepare_gradients(req, svc)
        with recorder, live:  # the backward, chunk gradients sent from their hooks
            loss.backward()
        engine.finish_gradients(req, svc)
        # Chunk gradients sent this step (the exchanges themselves are freed): every one
        # handed to the queue, and the queue issued them all.
        sent = len(engine._put) if engine.queue.issued else -1
        with open(f"{out}/rank-{rank}.json", "w") as f:
            json.dump({"found": recorder.found, "live": live.found, "grad_sends": sent,
                       "fresh": int(req.fresh.sum()), "final": int((~req.fresh).sum())}, f)
    finally:
        dist.destroy_process_group()


def test_no_host_sync_inside_forward_and_backward(tmp_path):
    spawn_ranks(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert got["found"] == [], got["found"]
        assert [call for call, _ in got["live"]] == ["tolist"]  # the recorder sees hooks' calls
        assert got["grad_sends"] == 3  # every chunk's gradients left from backward or after
        assert got["fresh"] > 0 and got["final"] > 0  # both kinds of rows were exercised
