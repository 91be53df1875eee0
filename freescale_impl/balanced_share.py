"""FreeScale's balanced input stage for one rank (technique 1): step -> this rank's planned
samples, from the global batch's lengths, the same plan on every rank. Runs in the
harness's loader worker, ahead of the step; a look-ahead window's plan is made once per
window (cached). Kept apart from the trainer so that the input stage's timings
(freescale_impl.routing_cost) and the routing (freescale_impl.routing) read it without
the trainer.
"""
from __future__ import annotations

import time

import numpy as np

from fsbench.training.trainer import StepInput
from fsbench.workloads.batch import JaggedBatch, concat_batches
from freescale_impl import partition
from freescale_impl.balance import CostModel
from freescale_impl.window import WindowStep, lookahead_window

PARTITIONERS = {"kk": partition.karmarkar_karp, "lpt": partition.lpt, "best": partition.best_of}


class BalancedShare:
    """FreeScale's input stage for one rank: step -> this rank's planned micro-batches.
    Pure in the step (a window's plan is cached, and recomputed on a miss), picklable."""

    def __init__(self, source, rank: int, world_size: int, cost: CostModel,
                 opts, steps: int) -> None:  # opts: FreeScaleOptions
        self.source, self.rank, self.world_size = source, rank, world_size
        self.cost, self.opts, self.steps = cost, opts, steps
        self.partitioner = PARTITIONERS[opts.partitioner]
        self._window: tuple[int, list[JaggedBatch], list[list[int]], dict[int, WindowStep]] | None = None
        self._planned: tuple[int, JaggedBatch, partition.Plan] | None = None  # last step's
        self._planning_ns = 0  # planning since the last plan_stats: a window's, at its first step

    def __call__(self, step: int) -> StepInput:
        local, plan = self.share(step, self.rank)
        micro = self.micro(local)
        return StepInput(step, micro, local.batch_size, local.num_targets, self.plan_stats(plan))

    def _timed(self, plan_fn, *args, **kwargs):
        """Run a planner, adding its thread CPU time to what the next step reports: the
        planner is pure CPU work, and CPU time does not count a busy neighbour's turns."""
        t0 = time.thread_time_ns()
        try:
            return plan_fn(*args, **kwargs)
        finally:
            self._planning_ns += time.thread_time_ns() - t0

    def share(self, step: int, rank: int) -> tuple[JaggedBatch, partition.Plan]:
        """Rank `rank`'s planned samples at `step` (every rank can compute every rank's:
        the plan is a function of the global batch alone)."""
        if self.opts.window > 1 and self.opts.balance == "on":
            return self._windowed(step, rank)
        if self._planned is None or self._planned[0] != step:
            batch = self.source.global_batch(step)
            self._planned = (step, batch, self.plan(batch.lengths.numpy()))
        _, batch, plan = self._planned
        return batch.select(plan.assignment[rank]), plan

    @property
    def steps_per_item(self) -> int:
        """A look-ahead window's steps are prepared together, by one loader worker, which
        plans the window once (fsbench.training.inputs.steps_per_item)."""
        return self.opts.window if self.opts.window > 1 and self.opts.balance == "on" else 1

    def read(self, step: int) -> tuple[JaggedBatch, partition.Plan, float]:
        """This rank's `share` and the CPU ms spent reading its samples (selecting them
        from the global batch by index: the data loader's part), planning and the source's
        making of the global batch (`read_ns` of a fsbench MeteredSource) left out."""
        made0 = getattr(self.source, "read_ns", 0)
        cpu0, planned0 = time.thread_time_ns(), self._planning_ns
        local, plan = self.share(step, self.rank)
        spent = (time.thread_time_ns() - cpu0 - (self._planning_ns - planned0)
                 - (getattr(self.source, "read_ns", 0) - made0))
        return local, plan, spent / 1e6

    def plan(self, lengths: np.ndarray) -> partition.Plan:
        return self._timed(self._plan, lengths)

    def _plan(self, lengths: np.ndarray) -> partition.Plan:
        costs, n = self.cost(lengths), self.world_size
        if self.opts.balance == "off":
            return partition.contiguous(costs, n)
        if self.opts.max_tokens:
            return partition.lpt(costs, n, tokens=lengths, max_tokens_per_rank=self.opts.max_tokens)
        return self.partitioner(costs, n)

    def plan_stats(self, plan: partition.Plan) -> dict:
        """The step's plan, and the CPU time spent planning since the last step's stats
        (`plan_ms`: the cost model, the partitioner, a window's re-packing at its first
        step, the micro-batches): it shows when the planner, not the step, is slow."""
        planning_ms, self._planning_ns = self._planning_ns / 1e6, 0
        return {"predicted_cost": float(plan.loads[self.rank]), "plan_max": plan.max_load,
                "plan_mean": plan.mean_load, "plan_lower_bound": plan.lower_bound,
                "cost_unit": self.cost.unit, "plan_ms": planning_ms}

    def micro(self, local: JaggedBatch) -> list[JaggedBatch]:
        """The rank's samples as `micro_batches` of balanced cost for gradient
        accumulation (memory: a micro-batch holds ~1/M of the rank's work)."""
        if self.opts.micro_batches == 1:
            return [local]
        plan = self._timed(partition.balance_microbatches, self.cost(local.lengths.numpy()),
                           np.arange(local.batch_size), self.opts.micro_batches, self.partitioner)
        return [local.select(idx) for idx in plan.assignment if len(idx)] or [local]

    def _windowed(self, step: int, rank: int) -> tuple[JaggedBatch, partition.Plan]:
        k = self.opts.window
        start = step - step % k
        if self._window is None or self._window[0] != start:
            batches = [self.source.global_batch(s) for s in range(start, min(start + k, self.steps))]
            plans = self._timed(lambda: lookahead_window(
                [self.cost(b.lengths.numpy()) for b in batches], self.world_size, k,
                partitioner=self.partitioner))
            trained = [b.trained_per_sample().tolist() for b in batches]  # the loss's count
            self._window = (start, batches, trained, {start + i: p for i, p in enumerate(plans)})
        _, batches, trained, steps = self._window
        ws = steps[step]
        by_batch: dict[int, list[int]] = {}
        for off, idx in (ws.samples[i] for i in ws.plan.assignment[rank]):
            by_batch.setdefault(off, []).append(idx)  # one select per source batch
        # A rank may get no sample of a step (whales packed apart, about a sample a rank).
        parts = ([batches[off].select(idx) for off, idx in sorted(by_batch.items())]
                 or [batches[step - start].select([])])
        step_targets = sum(int(trained[off][idx]) for off, idx in ws.samples)
        return concat_batches(parts, batches[step - start].negative_ids, step_targets, step), ws.plan
