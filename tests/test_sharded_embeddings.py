"""Sharded embedding tables (FreeScale 2): lookups and gradient updates equal the replicated
reference, at 2 and 4 gloo ranks, row-wise and table-wise, with uneven and empty per-rank
batches; and whole runs equal the blocking version and DDP step by step."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ports import free_port
from rank_spawn import spawn_ranks

from fsbench.config import RunConfig
from fsbench.config_io import run_from_dict
from fsbench.models import SparseArch, table_specs
from fsbench.measurement.timeline import read_step_stats
from fsbench.running.runner import run_once
from fsbench.scaling.chunking import GLOO_DEFAULT
from fsbench.measurement.timeline import read_timelines
from fsbench.workloads import make_batch_source
from fsbench.workloads.presets import tiny
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sharded_tables import LocalShard, RowLayout
from freescale_impl.trainer import FreeScaleOptions, exchange_chunks
from freescale_impl.transport import CollectiveTransport

# Asserts nothing a test running beside it can move: the dist tier runs it two at a time.
pytestmark = [pytest.mark.dist, pytest.mark.parallel_safe]
WORKLOAD = dataclasses.replace(tiny(), global_batch_size=12, lengths="yelp")
SEED, LR = 5, 0.3


def rank_samples(world_size: int) -> list[list[int]]:
    """Uneven shares of the 12 samples, rank 1 empty: 0..6 | none | 7..11 | ..."""
    if world_size == 2:
        return [list(range(12)), []]
    return [list(range(7)), [], [7, 8, 9, 10], [11]]


def toy_loss(lk) -> torch.Tensor:
    """A loss that reads every lookup in the model's order, with distinct gradients."""
    return ((lk.users ** 2).sum() + 0.5 * lk.contexts.sum() + (lk.items * lk.targets).sum()
            + (lk.negatives ** 3).sum() * 0.1)


def reference(world_size: int, optimizer: str):
    specs = table_specs(WORKLOAD.model.dim, WORKLOAD.item_vocab, WORKLOAD.user_vocab,
                        WORKLOAD.context_vocabs)
    sparse = SparseArch(specs)
    sparse.init_weights(SEED)
    batch = make_batch_source(WORKLOAD, SEED).global_batch(0)
    lookups = [sparse.lookup(batch.select(idx)) for idx in rank_samples(world_size)]
    sum(toy_loss(lk) for lk in lookups).backward()
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adagrad)(
        sparse.parameters(), lr=LR, foreach=False)
    opt.step()
    rows = torch.cat([sparse.tables[s.name].weight.detach() for s in specs])
    return [{f: getattr(lk, f).detach() for f in ("users", "contexts", "items", "targets", "negatives")}
            for lk in lookups], rows


def _join(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _engine(rank, world_size, layout_kind, optimizer, overlap, chunks=3):
    """This rank's (layout, shard, engine): `chunks` chunks, no priority, on the world group."""
    specs = table_specs(WORKLOAD.model.dim, WORKLOAD.item_vocab, WORKLOAD.user_vocab,
                        WORKLOAD.context_vocabs)
    layout = RowLayout(specs, world_size, layout_kind)
    shard = LocalShard(layout, rank, SEED, optimizer, LR, torch.device("cpu"))
    group = dist.group.WORLD
    return layout, shard, ShardedEmbeddings(layout, shard, CollectiveTransport(group), group,
                                            rank, chunks=chunks, overlap=overlap, priority=False)


def _rank_main(rank, world_size, port, layout_kind, optimizer, overlap, chunks, out):
    _join(rank, world_size, port)
    try:
        layout, shard, engine = _engine(rank, world_size, layout_kind, optimizer, overlap, chunks)
        batch = make_batch_source(WORKLOAD, SEED).global_batch(0).select(rank_samples(world_size)[rank])
        req, svc, ids = engine.request(batch)
        engine.serve(svc, ids)
        engine.fetch_all(req, svc)
        lk = engine.lookups(req)
        loss = toy_loss(lk)
        got = {f: getattr(lk, f).detach().clone() for f in ("users", "contexts", "items", "targets", "negatives")}
        engine.prepare_gradients(req, svc)
        loss.backward()
        engine.finish_gradients(req, svc)
        torch.save({"lookups": got, "rows": layout.owned_rows(rank), "weight": shard.weight},
                   f"{out}/rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size,layout_kind,optimizer,overlap,chunks", [
    (2, "row", "adagrad", True, 3), (2, "table", "sgd", False, 3), (2, "row", "sgd", True, 4),
    (4, "row", "sgd", True, 2), (4, "table", "adagrad", True, 4), (4, "row", "adagrad", True, 1)])
def test_sharded_lookups_and_updates_equal_replicated(tmp_path, world_size, layout_kind,
                                                      optimizer, overlap, chunks):
    """Chunks by sub-batch (4 chunks: rank 3 of 4 has one sample, so three sub-batches
    are empty; rank 1 has none)."""
    spawn_ranks(_rank_main, args=(world_size, free_port(), layout_kind, optimizer, overlap, chunks,
                               str(tmp_path)), nprocs=world_size)
    ref_lookups, ref_rows = reference(world_size, optimizer)
    covered = 0
    for rank in range(world_size):
        got = torch.load(tmp_path / f"rank-{rank}.pt")
        for field, value in ref_lookups[rank].items():
            assert torch.equal(got["lookups"][field], value), (rank, field)
        want = ref_rows[got["rows"]]
        err = float((got["weight"] - want).norm() / want.norm())
        assert err <= 1e-6, (rank, err)
        covered += len(got["rows"])
    assert covered == ref_rows.shape[0]  # every row lives on exactly one rank


def _rank_released(rank, world_size, port, out):
    """Five steps of the overlapped engine; then whether any step's request is still alive."""
    import gc
    import weakref
    _join(rank, world_size, port)
    try:
        _, _, engine = _engine(rank, world_size, "row", "adagrad", overlap=True)
        source = make_batch_source(WORKLOAD, SEED)
        requests = []
        for step in range(5):
            batch = source.global_batch(step).select(rank_samples(world_size)[rank])
            req, svc, ids = engine.request(batch)
            engine.serve(svc, ids)
            engine.fetch_all(req, svc)
            loss = toy_loss(engine.lookups(req))
            engine.prepare_gradients(req, svc)
            loss.backward()
            engine.finish_gradients(req, svc)
            requests.append(weakref.ref(req))
            del req, svc, ids, loss
        gc.collect()
        with open(f"{out}/alive-{rank}.json", "w") as f:
            json.dump([r() is not None for r in requests], f)
    finally:
        dist.destroy_process_group()


def test_a_finished_step_leaves_nothing_behind(tmp_path):
    """Each step's request (its rows, leaves and gradients) is freed once the step is
    done. Gradient hooks live on the leaves in C++, where the garbage collector cannot
    see: a hook that held its request kept every step's tensors (about 2 MB a step on
    `small`, the peak memory `fsbench gate` saw grow)."""
    spawn_ranks(_rank_released, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        assert json.loads((tmp_path / f"alive-{rank}.json").read_text()) == [False] * 5


def test_table_layout_places_whole_tables():
    specs = table_specs(8, 1000, 100, (10, 5))
    layout = RowLayout(specs, 2, "table")
    owners = layout.owner(torch.arange(layout.num_rows))
    for t in range(len(specs)):
        lo, hi = int(layout.base[t]), int(layout.base[t + 1])
        assert owners[lo:hi].unique().numel() == 1
    assert {int(o) for o in owners.unique()} == {0, 1}


# --- whole runs --------------------------------------------------------------------

def _losses(tmp_path, trainer: str, world_size: int, steps: int = 20, batch: int | None = None,
            **opts) -> tuple[np.ndarray, object]:
    workload = dataclasses.replace(tiny(), steps=steps, warmup=1, lengths="yelp")
    if batch is not None:
        workload = dataclasses.replace(workload, global_batch_size=batch)
    run = RunConfig(workload=workload, trainer=trainer, world_size=world_size, seed=3,
                    trainer_options={k: str(v) for k, v in opts.items()})
    run_dir, _ = run_once(run, tmp_path / "runs", timeout_s=300)
    return read_step_stats(run_dir).groupby("step")["loss"].sum().to_numpy(), run_dir


def test_overlapped_prioritized_equals_blocking_and_ddp(tmp_path, rank_pythonpath):
    blocking, _ = _losses(tmp_path, "freescale", 2, overlap="off", priority="off")
    # chunks=3: several chunks, so that gradient chunks leave from inside backward
    full, run_dir = _losses(tmp_path, "freescale", 2, chunks=3, routing="host")
    ddp, _ = _losses(tmp_path, "ddp", 2)
    # data=sharded: no rank knows the others' requests, so they are exchanged (counts,
    # ids, fresh masks) instead of computed by the input stage; same function.
    exchanged, _ = _losses(tmp_path, "freescale", 2, data="sharded")
    # routing=exchanged: replicated input, but each rank's input stage builds only its own
    # request and the step exchanges them, pipelined over the steps before (the path at
    # scale); with chunks, so that gradient chunks still leave from inside backward.
    own, own_dir = _losses(tmp_path, "freescale", 2, chunks=3, routing="exchanged")
    assert len(full) == 20
    assert np.max(np.abs(full - blocking) / np.abs(blocking)) <= 1e-6
    assert np.max(np.abs(exchanged - blocking) / np.abs(blocking)) <= 1e-6
    assert np.max(np.abs(own - blocking) / np.abs(blocking)) <= 1e-6
    assert np.max(np.abs(full - ddp) / np.abs(ddp)) <= 1e-5  # all-reduce vs a2a sum order

    # What really ran is in the manifest.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["trainer_ran"] == {
        "tables": "sharded", "sharding": "row", "chunks": 3, "transport": "collective",
        "chunk_rule": {"chunks": 3, "why": "asked", "world_size": 2, "model": None, "chunk_bytes": None,
                       "latency_us": None, "transfer_us": None, "predicted_ms": None, "growth": 1.0,
                       "route": ""},
        "routing": "host", "routing_rule": "routing=host (asked)"}
    own_ran = json.loads((own_dir / "manifest.json").read_text())["trainer_ran"]
    assert (own_ran["routing"], own_ran["routing_rule"]) == ("exchanged", "routing=exchanged (asked)")
    auto_dir = _losses(tmp_path, "freescale", 2)[1]
    auto_ran = json.loads((auto_dir / "manifest.json").read_text())["trainer_ran"]
    assert auto_ran["routing"] == "exchanged"  # the measured rule at 2 ranks
    # chunks=0: the chunking rule chose, on gloo's default (this store holds no comm fit),
    # as the simulator would on it; the manifest says what and why
    workload = run_from_dict(json.loads((auto_dir / "run_spec.json").read_text())).workload
    rule = exchange_chunks(FreeScaleOptions.parse({}), workload, 2, "cpu", auto_dir.parent)
    assert auto_ran["chunk_rule"] == json.loads(json.dumps(rule.record()))
    assert auto_ran["chunks"] == rule.chunks == 1 and rule.why == "rule" and rule.model == GLOO_DEFAULT
    assert rule.chunk_bytes > 0 and rule.latency_us > rule.transfer_us  # tiny's rows: latency-bound
    assert auto_ran["routing_rule"].startswith("routing=auto: host at <= 1 ranks, else exchanged")

    # The order the technique promises, read from the timeline of the full run:
    spans = read_timelines(run_dir)
    for rank in (0, 1):
        s = spans[spans["rank"] == rank]
        for k in range(1, 18):
            step, nxt = s[s["step"] == k], s[s["step"] == k + 1]
            update_end = step[step["name"] == "sparse_optimizer"].eval("start_ns + dur_ns").max()
            fresh = step[step["name"].str.match(r"emb\.fetch_c\d+\.issue")]
            final_next = nxt[nxt["name"] == "emb.fetch_final.issue"]["start_ns"].min()
            # rows updated by step k go after its update, before step k+1's other sends
            assert len(fresh) and fresh["start_ns"].min() >= update_end
            assert fresh["start_ns"].max() < final_next
            # the others (final rows for k+1) were in flight during step k's backward
            final = step[(step["name"] == "emb.fetch_final") & (step["kind"] == "flight")]
            backward = step[step["name"] == "backward"].iloc[0]
            assert len(final) == 1
            assert final["start_ns"].iloc[0] <= backward["start_ns"] + backward["dur_ns"]
            assert final["start_ns"].iloc[0] < update_end
        # gradient chunks are sent from inside backward (nested issue spans)
        grads = s[s["name"].str.match(r"emb\.grad_c\d+\.issue") & s["nested"]]
        assert len(grads) > 0


# Every switch set of the overlapped exchange (the requests routed on the host with 2
# chunks, else exchanged), sub-batches that grow (each 1.5 or 2 times the one before), and
# the exchange in two hops.
SWITCH_SETS = [dict(priority=p, chunks=c, routing="host" if c == 2 else "exchanged")
               for p in ("off", "on") for c in (1, 2, 4)] + [
    dict(priority="on", chunks=4, chunk_growth="2", routing="exchanged"),
    dict(priority="off", chunks=2, chunk_growth="1.5", routing="host"),
    # two hops (inside "nodes" of 2 ranks, then along the rails) at 4 ranks; one node at 2
    dict(priority="on", chunks=2, a2a="hierarchical", node_ranks=2, routing="exchanged")]


@pytest.mark.parametrize("world_size,batch", [(2, 8), (4, 4), (4, 10)],
                         ids=["2-uneven", "4-one-each", "4-uneven"])
def test_every_switch_set_equals_the_blocking_version(tmp_path, rank_pythonpath, world_size, batch):
    """The forward sub-batch by sub-batch (chunk c: the rows sub-batch c reads first) is
    exact: every switch set's losses equal the blocking version's within 1e-6, with uneven
    shares, and at 4 ranks of 4 samples (one a rank: every sub-batch beyond the first
    empty). A run gives every rank a sample; a rank with none is the engine's test above."""
    blocking, _ = _losses(tmp_path, "freescale", world_size, 8, batch, overlap="off", priority="off")
    for opts in SWITCH_SETS:
        got, _ = _losses(tmp_path, "freescale", world_size, 8, batch, **opts)
        err = np.max(np.abs(got - blocking) / np.abs(blocking))
        assert err <= 1e-6, (opts, err)


def test_exchanged_routing_keeps_every_wait_off_the_critical_path(tmp_path, rank_pythonpath):
    """routing=exchanged at 4 ranks (uneven and empty shares: yelp lengths, 12 samples):
    the losses equal the blocking version's, and the timeline shows the pipeline: step k's
    control message (later steps' counts, ids and fresh masks) goes out before k's forward,
    k+1's final rows between k's forward and backward and nothing else there, and k+1's
    fresh rows after k's update."""
    blocking, _ = _losses(tmp_path, "freescale", 4, overlap="off", priority="off")
    own, run_dir = _losses(tmp_path, "freescale", 4, chunks=2, routing="exchanged")
    assert np.max(np.abs(own - blocking) / np.abs(blocking)) <= 1e-6
    spans = read_timelines(run_dir)
    for rank in range(4):
        s = spans[spans["rank"] == rank]
        for k in range(1, 17):
            step = s[s["step"] == k]
            first = lambda name: step[step["name"] == name]["start_ns"].min()  # noqa: E731
            forward = step[step["name"] == "forward"]  # a span a sub-batch
            fwd_end = (forward["start_ns"] + forward["dur_ns"]).max()
            bwd_start = first("backward")
            update_end = step[step["name"] == "sparse_optimizer"].eval("start_ns + dur_ns").max()
            assert first("emb.control.issue") < forward["start_ns"].min()
            assert fwd_end <= first("emb.fetch_final.issue") < bwd_start
            between = step[(step["start_ns"] >= fwd_end) & (step["start_ns"] < bwd_start)
                           & step["name"].str.endswith(".issue")]
            assert set(between["name"]) == {"emb.fetch_final.issue"}, set(between["name"])
            fresh = step[step["name"].str.match(r"emb\.fetch_c\d+\.issue")]
            assert len(fresh) and fresh["start_ns"].min() >= update_end
