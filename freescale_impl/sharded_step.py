"""One training step of FreeScale with sharded tables (FreeScale's techniques 2 and 3).

The dense part is replicated under DDP; the tables live in shards
(`freescale_impl.sharded_tables`) reached by the all-to-all protocol of
`freescale_impl.embedding_exchange`. The step, with every switch on:

    pull step k+1's input; send its requests (counts, ids)       comm spans
    forward k: reads rows as it needs them, chunk by chunk      compute (+ blocked waits)
    split k+1's rows into fresh/final; send the final ones      comm: in flight in backward
    backward k: DDP all-reduces dense gradients; each embedding
      gradient chunk is sent from its autograd hook             compute (+ flights)
    receive gradients; update the owned rows                    comm waits, sparse_optimizer
    send k+1's fresh rows, first in line                        comm: in flight in optimizer
    dense optimizer                                             compute
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsbench.config import RunConfig
from fsbench.training.dist import RankContext
from fsbench.training.dp import wrap_ddp
from fsbench.models import RecModel, model_from_state, table_specs
from fsbench.models.init import materialize
from fsbench.training.optim import make_optimizer
from fsbench.measurement.timeline import span
from fsbench.training.trainer import StepInput, StepStats
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sharded_tables import LocalShard, RowLayout, gather_tables
from freescale_impl.transport import make_transport


def build_dense(run: RunConfig, device: torch.device) -> torch.nn.Module:
    """The reference model's dense part alone, with the weights `build_model` gives it
    (initialized by name), never materializing the tables."""
    w = run.workload
    with torch.device("meta"):
        model = RecModel(w)
    dense = materialize(model.dense)
    dense.init_weights(run.seed)
    return dense.to(device)


class ShardedTableTrainer:
    def __init__(self, ctx: RankContext, run: RunConfig, opts) -> None:
        self.ctx, self.run, self.opts = ctx, run, opts
        w = run.workload
        # Sums, not averages: each rank's loss is already its share of the global loss.
        # The embedding gradients' all-to-alls wait for DDP's last bucket: one order of
        # the collectives issued from backward's hooks on every rank (embedding_exchange).
        self.dense = wrap_ddp(build_dense(run, ctx.device), ctx, average=False,
                              after_last_bucket=lambda: self.engine.dense_gradients_issued())
        self.optimizer = make_optimizer(self.dense.parameters(), w)
        layout = RowLayout(table_specs(w.model.dim, w.item_vocab, w.user_vocab, w.context_vocabs),
                           ctx.world_size, opts.sharding)
        shard = LocalShard(layout, ctx.rank, run.seed, w.optimizer, w.lr, ctx.device)
        # Its own group: embedding exchanges never queue behind DDP's all-reduce (or the
        # reverse), and may stay in flight across the step boundary.
        group = dist.new_group(backend=ctx.backend)
        self.layout = layout
        self.engine = ShardedEmbeddings(layout, shard, make_transport(opts.transport, group, ctx.device),
                                        group, ctx.rank, opts.chunks or (4 if ctx.device.type == "cuda" else 1), overlap=opts.overlap == "on",
                                        priority=opts.priority == "on")
        self.engine.grads_after_dense = True
        self.ahead = None  # (StepInput, Request, Service) of the next step, when prepared

    def begin(self, prepared: StepInput):
        """A step nothing was sent for yet (the first, or every step without priority):
        its requests (computed by the input stage, else exchanged), then its rows."""
        engine, batch = self.engine, prepared.batches[0]
        if prepared.aux is not None:
            req, svc = engine.adopt(batch, prepared.aux)
            if engine.priority:
                engine.send_final(req, svc)
            engine.send_fresh(req, svc)
            return req, svc
        req, svc, ids = engine.request(batch)
        engine.serve(svc, ids)
        engine.fetch_all(req, svc)
        return req, svc

    def step(self, inputs) -> StepStats:
        engine = self.engine
        if self.ahead is not None:
            prepared, req, svc = self.ahead
            self.ahead = None
        else:
            prepared = next(inputs)
            req, svc = self.begin(prepared)
        batch = prepared.batches[0]
        if not engine.overlap:
            engine.wait_all(req)  # the blocking version: every row before the forward
        upcoming = exchanged = None
        if engine.priority and prepared.step + 1 < self.run.workload.steps:
            nxt: StepInput = next(inputs)  # pulled one step ahead (an input span)
            if nxt.aux is not None:  # routing known: final rows for k+1 go now
                upcoming = (nxt, *engine.adopt(nxt.batches[0], nxt.aux))
                engine.send_final(*upcoming[1:])
            else:  # requests must be exchanged; final rows go after the forward
                nreq, nsvc, exchanged = engine.request(nxt.batches[0])
                upcoming = (nxt, nreq, nsvc)
        with span("forward"):
            loss = self.dense(engine.lookups(req), batch)
        if exchanged is not None:
            _, nreq, nsvc = upcoming
            engine.serve(nsvc, exchanged)
            engine.split_and_send_final(nreq, nsvc, touched=torch.unique(svc.local))
        engine.prepare_gradients(req, svc)
        with span("backward"):
            loss.backward()
        engine.finish_gradients(req, svc)
        if upcoming is not None:
            engine.send_fresh(*upcoming[1:])  # rows this update changed, first in line
            self.ahead = upcoming
        with span("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss=float(loss.detach()), num_samples=prepared.num_samples,
                         num_targets=prepared.num_targets, extra=prepared.extra or None,
                         step=prepared.step)

    def trained_model(self) -> torch.nn.Module | None:
        """The trained model as a CPU `RecModel` on rank 0 (None elsewhere): the dense
        replica, and every table gathered from its shards. A collective, between steps:
        the shards then hold step k's updated rows (rows already sent ahead for step k+1
        are read, never changed)."""
        tables = gather_tables(self.layout, self.engine.shard.weight, self.ctx.rank,
                               self.ctx.group)
        if tables is None:
            return None
        state = {f"sparse.tables.{name}.weight": w for name, w in tables.items()}
        state.update({f"dense.{k}": v for k, v in self.dense.module.state_dict().items()})
        return model_from_state(self.run.workload, state)
