"""FreeScaleTrainer: FreeScale's techniques as switches (`--set freescale.<key>=value`).

Implemented here: (1) load-balanced input samples (`balance`), optionally also across
`micro_batches` of gradient accumulation inside each rank. Every rank computes the
same plan from the global batch's lengths (with `data=replicated` every rank holds them,
so no communication is needed; with `data=sharded` each rank holds its shard and one
all-gather of lengths precedes the plan), trains its planned subset, and normalizes its loss by the global target
count, so the summed gradient equals the unbalanced run's on the same global batch.

With `window=K > 1` the samples of K consecutive global batches are re-packed so that
each step is balanced even when single samples ("whales") exceed a rank's fair share:
every sample is still trained exactly once per window, but a step's samples then come
from any batch of its window (the documented deviation from the original batches).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fsbench.config import ConfigError, RunConfig
from fsbench.dist import RankContext
from fsbench.dp import DataParallelTrainer
from fsbench.timeline import span
from fsbench.trainer import StepStats
from fsbench.workloads import make_batch_source
from fsbench.workloads.batch import JaggedBatch, concat_batches, contiguous_split
from freescale_impl import partition
from freescale_impl.balance import cost_model

PARTITIONERS = {"kk": partition.karmarkar_karp, "lpt": partition.lpt, "best": partition.best_of}
CHOICES = {
    "balance": ("on", "off"),
    "partitioner": tuple(PARTITIONERS),
    "cost": ("auto", "calibrated", "analytical"),
    "data": ("replicated", "sharded"),
}


class FreeScaleTrainer(DataParallelTrainer):
    # kk by default: it beats LPT on most real-shaped batches and plans 8k samples onto
    # 256 ranks in ~3-6 ms, about the 5 ms target (best_of runs both, ~6-9 ms; lpt is the
    # fastest, ~3.5 ms): see benchmarks/bench_partition.py.
    options = {"balance": "on", "partitioner": "kk", "cost": "auto", "window": "1",
               "max_tokens": "0", "micro_batches": "1", "data": "replicated"}

    @staticmethod
    def validate_options(opts: dict[str, str]) -> None:
        for key, allowed in CHOICES.items():
            if opts[key] not in allowed:
                raise ConfigError(f"freescale.{key}={opts[key]!r} is not allowed; choose one "
                                  f"of: {', '.join(allowed)}")
        for key, minimum in (("window", 1), ("max_tokens", 0), ("micro_batches", 1)):
            if not opts[key].isdigit() or int(opts[key]) < minimum:
                raise ConfigError(f"freescale.{key}={opts[key]!r} must be an integer >= {minimum}")
        if opts["data"] == "sharded" and opts["window"] != "1":
            raise ConfigError("freescale.window > 1 needs freescale.data=replicated (a window "
                              "reads future batches, which a rank's shard does not hold)")

    def setup(self, ctx: RankContext, run: RunConfig) -> None:
        super().setup(ctx, run)
        opts = self.options
        self.balance = opts["balance"] == "on"
        self.partitioner = PARTITIONERS[opts["partitioner"]]
        self.window = int(opts["window"])
        self.max_tokens = int(opts["max_tokens"]) or None
        self.micro_batches = int(opts["micro_batches"])
        self.sharded = opts["data"] == "sharded"
        # Calibrations live in the results store that holds this run.
        store_dir = Path(ctx.run_dir).parent if ctx.run_dir else None
        self.cost = cost_model(run.workload, store_dir, run.device, opts["cost"])
        if ctx.is_main:
            print(f"freescale: balance={opts['balance']} partitioner={opts['partitioner']} "
                  f"window={self.window} cost model: {self.cost.source}", flush=True)
        self._source = make_batch_source(run.workload, run.seed) if self.window > 1 else None
        self._window_steps: dict[int, partition.WindowStep] = {}
        self._plan_stats: dict = {}

    # -- planning ----------------------------------------------------------------

    def _plan(self, lengths: np.ndarray) -> partition.Plan:
        costs = self.cost(lengths)
        if not self.balance:
            return partition.contiguous(costs, self.ctx.world_size)
        if self.max_tokens:
            return partition.lpt(costs, self.ctx.world_size, tokens=lengths,
                                 max_tokens_per_rank=self.max_tokens)
        return self.partitioner(costs, self.ctx.world_size)

    def _record(self, plan: partition.Plan) -> None:
        self._plan_stats = {
            "predicted_cost": float(plan.loads[self.ctx.rank]),
            "plan_max": plan.max_load, "plan_mean": plan.mean_load,
            "plan_lower_bound": plan.lower_bound, "cost_unit": self.cost.unit,
        }

    def _windowed_samples(self, batch: JaggedBatch) -> JaggedBatch:
        step, k = batch.step, self.window
        if step not in self._window_steps:
            start = step - step % k
            end = min(start + k, self.run.workload.steps)
            batches = [self._source.global_batch(s) for s in range(start, end)]
            self._window_batches = batches
            plans = partition.lookahead_window(
                [self.cost(b.lengths.numpy()) for b in batches], self.ctx.world_size, k,
                partitioner=self.partitioner)
            self._window_steps = {start + i: p for i, p in enumerate(plans)}
        ws = self._window_steps[step]
        self._record(ws.plan)
        mine = [ws.samples[i] for i in ws.plan.assignment[self.ctx.rank]]
        by_batch: dict[int, list[int]] = {}
        for off, idx in mine:  # one select per source batch, not per sample
            by_batch.setdefault(off, []).append(idx)
        parts = [self._window_batches[off].select(idx) for off, idx in sorted(by_batch.items())]
        step_targets = sum(int(self._window_batches[off].lengths[idx]) for off, idx in ws.samples)
        return concat_batches(parts, batch.negative_ids, step_targets, step)

    def _gather_lengths(self, batch: JaggedBatch) -> np.ndarray:
        """Sharded data: this rank's loader holds only its contiguous shard, so the plan
        needs one all-gather of every shard's lengths (the only communication balancing
        costs). The planned samples are then read by index from the (random-access)
        source: here the generator, a pure function of (seed, step)."""
        n, rank = self.ctx.world_size, self.ctx.rank
        shards = contiguous_split(batch.batch_size, n)
        width = max(len(s) for s in shards)
        mine = torch.zeros(width, dtype=torch.int64)
        mine[:len(shards[rank])] = batch.lengths[shards[rank]]
        parts = [torch.empty_like(mine) for _ in range(n)]
        with span("all_gather", kind="comm"):
            dist.all_gather(parts, mine.to(self.ctx.device), group=self.ctx.group)
        return torch.cat([p[:len(s)].cpu() for p, s in zip(parts, shards)]).numpy()

    def local_samples(self, batch: JaggedBatch) -> JaggedBatch:
        lengths = self._gather_lengths(batch) if self.sharded else batch.lengths.numpy()
        # Planning is input preparation on every rank (no communication): a `data` span.
        with span("plan", kind="data"):
            if self.window > 1 and self.balance:
                return self._windowed_samples(batch)
            plan = self._plan(lengths)
            self._record(plan)
            return batch.select(plan.assignment[self.ctx.rank])

    def local_microbatches(self, batch: JaggedBatch) -> list[JaggedBatch]:
        """This rank's planned samples, split into `micro_batches` of balanced cost for
        gradient accumulation (memory: a micro-batch holds ~1/M of the rank's work)."""
        local = self.local_samples(batch)
        if self.micro_batches == 1:
            return [local]
        with span("plan", kind="data"):
            costs = self.cost(local.lengths.numpy())
            plan = partition.balance_microbatches(costs, np.arange(local.batch_size),
                                                  self.micro_batches, self.partitioner)
            micro = [local.select(idx) for idx in plan.assignment if len(idx)]
        return micro or [local]

    def step(self, batch: JaggedBatch) -> StepStats:
        stats = super().step(batch)
        stats.extra = dict(self._plan_stats)
        return stats
