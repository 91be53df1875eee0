"""FreeScale's input stage with sharded tables: the rank's planned samples and their
embedding routing, computed in the loader worker. Two ways (`freescale.routing`):

host       (`RoutedShare`) With `data=replicated` every rank can compute every rank's
           planned samples, so it knows what *every* rank will ask each owner for. The
           request phase of `freescale_impl.embedding_exchange` (counts, ids, and with
           priority the fresh/final masks) is computed here instead of exchanged: three
           latency-bound all-to-alls per step fewer, and the final rows of step k+1 can be
           sent as soon as step k starts. But it reads every rank's samples and builds
           every rank's request: O(N x local batch) per rank and step, on every rank.
exchanged  (`OwnRequest`) The rank builds only its own request (O(local batch + N)); the
           owners learn what to serve from the request exchange, which the step pipelines
           over the steps before (freescale_impl.sharded_step). What scales.

`choose_routing` picks one for `routing=auto` by a rule measured with
`fsbench micro input-stage` (docs/freescale.md).
"""
from __future__ import annotations

import time

import torch

from fsbench.errors import ConfigError
from fsbench.training.trainer import StepInput
from fsbench.workloads.batch import JaggedBatch
from freescale_impl.exchange_plan import Request, Service, all_rows, build_request, plan_fetches
from freescale_impl.sharded_tables import RowLayout


def route(batches: list[JaggedBatch], rank: int, layout: RowLayout, chunks: int,
          before: torch.Tensor | None, final: bool, growth: float = 1.0) -> tuple[Request, Service, torch.Tensor]:
    """Rank `rank`'s Request and Service for a step whose per-rank batches are `batches`,
    planned on the host (`plan_fetches`), and the global rows the step reads. `before`:
    the rows the previous step read (they are fresh: its update may change them), or None
    (every row fresh); `final`: send the other rows ahead (priority)."""
    n = len(batches)
    reqs = [build_request(b, layout, chunks, growth) for b in batches]
    req = reqs[rank]
    mine = [q.owner == rank for q in reqs]
    rows_in = torch.cat([q.rows[m] for q, m in zip(reqs, mine)])
    svc = Service(local=layout.local_index(rows_in),
                  src=torch.cat([torch.full((int(m.sum()),), r, dtype=torch.int64)
                                 for r, m in enumerate(mine)]),
                  chunk=torch.cat([q.chunk[m] for q, m in zip(reqs, mine)]))
    req.fresh = (torch.isin(req.rows, before) if before is not None
                 else torch.ones(req.rows.numel(), dtype=torch.bool))
    svc.fresh = (torch.isin(rows_in, before) if before is not None
                 else torch.ones(rows_in.numel(), dtype=torch.bool))
    # The step's messages planned here, on the host: the step launches them with index
    # tensors and host splits alone (no host sync in its forward and backward).
    plan_fetches(req, svc, n, chunks, final=final)
    return req, svc, torch.unique(torch.cat([q.rows for q in reqs]))


# `routing=auto` routes on the host up to this many ranks, and exchanges requests beyond.
# Measured on the 2-core VM (results/input_stage_cpu.md): at 2 ranks the host route
# already costs twice the exchanged stage's CPU (`fsbench micro input-stage --routing
# host,exchanged`: medium 9.7 against 2.5 + 1.9 ms; small 3.3 against 1.0 + 0.9 ms in
# real runs), and real 2-rank runs of `small` were no faster with it (paired, normalized
# step times 252/473/504 ms host against 251/437/446 ms exchanged). Only a single rank,
# which exchanges nothing, keeps it.
HOST_ROUTING_MAX_RANKS = 1


# `routing=host` when asked: refused beyond one node's ranks. It reads every rank's samples
# and builds every rank's request, O(N x local batch) a step on every rank: `fsbench micro
# input-stage --workload medium --ranks 8,256,1024 --routing exchanged,host --set
# batch_per_rank=128` measured its route at 531 ms, 5.0 s and 21.6 s a step, against 5.2,
# 3.0 and 6.8 ms exchanged (results/input_stage_cpu.md). The input stage bypasses this
# check (freescale_impl.routing_cost), so the micro-benchmark still shows that growth.
HOST_ROUTING_LIMIT_RANKS = 8


def check_routing(routing: str, world_size: int) -> None:
    if routing == "host" and world_size > HOST_ROUTING_LIMIT_RANKS:
        raise ConfigError(f"freescale.routing=host at {world_size} ranks: it routes every rank's "
                          f"samples on every rank (O(N x local batch) a step), allowed up to "
                          f"{HOST_ROUTING_LIMIT_RANKS} ranks; use freescale.routing=exchanged or auto")


def choose_routing(routing: str, world_size: int, data: str) -> tuple[str, str]:
    """(the routing a run uses, why): `data=sharded` must exchange (no rank sees the
    others' samples); `auto` follows the measured rule."""
    if data == "sharded":
        return "exchanged", "data=sharded: a rank sees only its own shard"
    if routing != "auto":
        return routing, f"routing={routing} (asked)"
    chosen = "host" if world_size <= HOST_ROUTING_MAX_RANKS else "exchanged"
    return chosen, f"routing=auto: host at <= {HOST_ROUTING_MAX_RANKS} ranks, else exchanged ({world_size} ranks)"


class OwnRequest:
    """step -> StepInput whose `aux` holds this rank's own Request for the step (no
    Service: the step exchanges the requests). O(local batch + N) per step."""

    def __init__(self, balanced, layout: RowLayout, chunks: int, growth: float = 1.0) -> None:
        self.balanced, self.layout, self.chunks, self.growth = balanced, layout, chunks, growth
        self.rank = balanced.rank

    @property
    def steps_per_item(self) -> int:
        return self.balanced.steps_per_item

    def __call__(self, step: int) -> StepInput:
        local, plan, read_ms = self.balanced.read(step)
        cpu0 = time.thread_time_ns()
        req = build_request(local, self.layout, self.chunks, self.growth)
        route_ms = (time.thread_time_ns() - cpu0) / 1e6
        req.batch = None  # travels as the step's batch; the trainer puts it back
        return StepInput(step, [local], local.batch_size, local.num_targets,
                         {**self.balanced.plan_stats(plan), "read_ms": read_ms, "route_ms": route_ms},
                         aux={"request": req})


class RoutedShare:
    """step -> StepInput whose `aux` holds this rank's Request and Service for the step."""

    def __init__(self, balanced, layout: RowLayout, chunks: int, priority: bool, growth: float = 1.0) -> None:
        self.balanced, self.layout, self.chunks, self.priority = balanced, layout, chunks, priority
        self.growth = growth
        self.rank, self.n = balanced.rank, balanced.world_size
        self._touched: tuple[int, torch.Tensor] | None = None  # (step, rows it reads)

    @property
    def steps_per_item(self) -> int:
        return self.balanced.steps_per_item

    def __call__(self, step: int) -> StepInput:
        _, _, read_ms = self.balanced.read(step)  # this rank's own samples
        cpu0 = time.thread_time_ns()
        shares = [self.balanced.share(step, r) for r in range(self.n)]
        # Fresh: rows the previous step reads, so its update may change them. Without
        # priority every row is fetched after the previous update anyway.
        before = self.touched(step - 1) if self.priority and step > 0 else None
        req, svc, touched = route([b for b, _ in shares], self.rank, self.layout, self.chunks,
                                  before, final=self.priority, growth=self.growth)
        self._touched = (step, touched)
        local, plan = shares[self.rank]
        route_ms = (time.thread_time_ns() - cpu0) / 1e6  # every rank's samples and requests
        req.batch = None  # travels as the step's batch; the trainer puts it back
        return StepInput(step, [local], local.batch_size, local.num_targets,
                         {**self.balanced.plan_stats(plan), "read_ms": read_ms, "route_ms": route_ms},
                         aux={"request": req, "service": svc})

    def touched(self, step: int) -> torch.Tensor:
        """Global rows any rank reads at `step` (cached from the previous call)."""
        if self._touched is not None and self._touched[0] == step:
            return self._touched[1]
        batches: list[JaggedBatch] = [self.balanced.share(step, r)[0] for r in range(self.n)]
        return torch.unique(torch.cat([all_rows(b, self.layout) for b in batches]))
