"""One training step of FreeScale with sharded tables (FreeScale's techniques 2 and 3).

The dense part is replicated under DDP; the tables live in shards
(`freescale_impl.sharded_tables`) reached by the all-to-all protocol of
`freescale_impl.embedding_exchange`. The step, with every switch on:

    pull step k+1's input; send its requests (counts, ids)       comm spans
    forward k, sub-batch by sub-batch: each waits for its chunk  compute (+ blocked waits)
    split k+1's rows into fresh/final; send the final ones      comm: in flight in backward
    backward k, sub-batch by sub-batch, the last first: each
      embedding gradient chunk is sent from its autograd hook
      as the sub-batch makes it, then DDP's buckets, then chunk 0
      (one queue, one order on every rank)                      compute (+ flights)
    receive gradients; update the owned rows                    comm waits, sparse_optimizer
    send k+1's fresh rows, first in line                        comm: in flight in optimizer
    dense optimizer                                             compute
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from fsbench.config import RunConfig
from fsbench.training.dist import RankContext
from fsbench.training.dp import DDP_SLOT, wrap_ddp
from fsbench.training.issue_queue import IssueQueue
from fsbench.models import RecModel, model_from_state, table_specs
from fsbench.models.init import materialize
from fsbench.training.optim import make_dense_optimizer
from fsbench.measurement.timeline import span
from fsbench.training.trainer import StepInput, StepStats
from freescale_impl.embedding_exchange import ShardedEmbeddings
from freescale_impl.sharded_tables import LocalShard, RowLayout, gather_tables
from freescale_impl.node_transport import node_split_transport, ranks_a_node
from freescale_impl.rail_transport import rail_transport
from freescale_impl.sub_batches import SubBatched, sub_batches
from freescale_impl.request_pipeline import RequestPipeline
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
    def __init__(self, ctx: RankContext, run: RunConfig, opts, growth: float = 1.0) -> None:
        self.ctx, self.run, self.opts = ctx, run, opts
        w = run.workload
        # Sums, not averages: each rank's loss is already its share of the global loss.
        # DDP's buckets and the embedding gradients' chunks go through one queue, in one
        # order on every rank (ShardedEmbeddings.grad_order): nothing waits for DDP's last
        # bucket but chunk 0. The dense part runs sub-batch by sub-batch inside the one
        # call DDP sees (freescale_impl.sub_batches): each waits only for its own chunks.
        queue = IssueQueue()
        self.dense = wrap_ddp(SubBatched(build_dense(run, ctx.device)), ctx, w.dense_bucket_mb,
                              average=False, queue=queue)
        self.optimizer = make_dense_optimizer(self.dense.parameters(), w)
        layout = RowLayout(table_specs(w.model.row_dim, w.item_vocab, w.user_vocab, w.context_vocabs),
                           ctx.world_size, opts.sharding)
        shard = LocalShard(layout, ctx.rank, run.seed, w.table_optimizer, w.table_lr, ctx.device)
        # Its own group: embedding exchanges never queue behind DDP's all-reduce (or the
        # reverse), and may stay in flight across the step boundary.
        group = dist.new_group(backend=ctx.backend)
        self.layout = layout
        local = ranks_a_node(opts.node_ranks, ctx.world_size)
        if ctx.world_size > local and opts.a2a == "hierarchical":
            transport = rail_transport(group, ctx.device, local, opts.transport, opts.comm_ctas)
        elif ctx.world_size > local and opts.transport == "sm_free":
            transport = node_split_transport(group, ctx.device, local, opts.comm_ctas)
        else:
            transport = make_transport(opts.transport, group, ctx.device)
        self.engine = ShardedEmbeddings(layout, shard, transport,
                                        group, ctx.rank, opts.chunks, overlap=opts.overlap == "on",
                                        priority=opts.priority == "on", queue=queue, dense_slot=DDP_SLOT,
                                        growth=growth)
        self.ahead = None  # host routing: (StepInput, Request, Service) of the next step
        self.pipeline: RequestPipeline | None = None  # exchanged routing: the requests ahead
        self.host_routed: bool | None = None  # known at the first step

    def step(self, inputs) -> StepStats:
        if self.host_routed is None:
            self.host_routed = self._first_step(inputs)
        return self._step_host_routed(inputs) if self.host_routed else self._step_exchanged(inputs)

    def _first_step(self, inputs) -> bool:
        """Pull the first step: the input stage routed it (host) or left its requests to
        exchange (then the request pipeline starts). Returns whether it was routed."""
        first = next(inputs)
        if first.aux is not None and "service" in first.aux:
            self.ahead = (first, *self.begin(first))
            return True
        self.pipeline = RequestPipeline(self.engine, self.run.workload.steps)
        self.pipeline.start(itertools.chain([first], inputs))
        return False

    # -- host routing: every rank's routing known ahead (freescale_impl.routing.RoutedShare)
    def begin(self, prepared: StepInput):
        """A step nothing was sent for yet (the first, or every step without priority):
        its rows, by the routing the input stage computed."""
        engine, batch = self.engine, prepared.batches[0]
        req, svc = engine.adopt(batch, prepared.aux)
        if engine.priority:
            engine.send_final(req, svc)
        engine.send_fresh(req, svc)
        return req, svc

    def _step_host_routed(self, inputs) -> StepStats:
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
        upcoming = None
        if engine.priority and prepared.step + 1 < self.run.workload.steps:
            nxt: StepInput = next(inputs)  # pulled one step ahead (an input span)
            upcoming = (nxt, *engine.adopt(nxt.batches[0], nxt.aux))
            engine.send_final(*upcoming[1:])  # routing known: final rows for k+1 go now
        loss = self.dense(engine.lookups(req), sub_batches(req, batch))  # forward spans
        self._backward_and_update(loss, req, svc)
        if upcoming is not None:
            engine.send_fresh(*upcoming[1:])  # rows this update changed, first in line
            self.ahead = upcoming
        return self._dense_step(loss, prepared)

    # -- exchanged routing: each rank knows its own requests (OwnRequest, data=sharded) --
    def _step_exchanged(self, inputs) -> StepStats:
        """Step k with its requests exchanged over the steps before it
        (freescale_impl.request_pipeline): at the step's start its rows go (unless sent
        during the step before), then the last control message is read (the step's one
        host sync) and this step's goes out; with priority step k+1's rows are planned
        then, its final rows fly during k's backward and its fresh rows go after k's
        update. Nothing between the forward and the backward reads a value on the host."""
        engine, pipeline = self.engine, self.pipeline
        k = min(pipeline.ahead)  # the steps before it are done
        cur = pipeline.ahead[k]
        if not cur.rows_sent:
            engine.fetch_all(cur.req, cur.svc)
        pipeline.current(k, inputs)  # control k-1 read: k+1's fresh masks, k+2's ids, ...
        nxt = pipeline.ahead.get(k + 1) if engine.priority else None
        if nxt is not None:
            engine.plan(nxt.req, nxt.svc, final=True)
        pipeline.send_control(k)
        if not engine.overlap:
            engine.wait_all(cur.req)  # the blocking version: every row before the forward
        loss = self.dense(engine.lookups(cur.req), sub_batches(cur.req, cur.prepared.batches[0]))
        if nxt is not None:
            engine.send_final(nxt.req, nxt.svc)  # in flight during the backward
        self._backward_and_update(loss, cur.req, cur.svc)
        if nxt is not None:
            engine.send_fresh(nxt.req, nxt.svc)  # rows this update changed, first in line
            nxt.rows_sent = True
        pipeline.done(k)
        return self._dense_step(loss, cur.prepared)

    # -- both -----------------------------------------------------------------------------
    def _backward_and_update(self, loss: torch.Tensor, req, svc) -> None:
        self.engine.prepare_gradients(req, svc)
        with span("backward"):
            loss.backward()
        self.engine.finish_gradients(req, svc)

    def _dense_step(self, loss: torch.Tensor, prepared: StepInput) -> StepStats:
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
        state.update({f"dense.{k}": v for k, v in self.dense.module.dense.state_dict().items()})
        return model_from_state(self.run.workload, state)
