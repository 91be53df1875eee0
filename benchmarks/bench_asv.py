"""asv suites: `asv run --python=same --quick` (dry run) or, to record a commit,
`asv machine --yes && asv run --python=same --set-commit-hash $(git rev-parse HEAD)`.

Each suite measures the real code path: the planner on real-shaped costs, the batch
generator, one training step of the reference model, and the instrumentation overhead
of the harness itself (a `track_` ratio, lower is better).
"""
from __future__ import annotations

import numpy as np

from fsbench.workloads.distributions import LENGTH_PRESETS


def _costs(preset: str, n: int, seed: int = 0, max_len: int = 200) -> np.ndarray:
    lengths = LENGTH_PRESETS[preset].distribution.sample(np.random.default_rng(seed), n, max_len)
    return lengths.astype(np.float64) ** 2 + 64 * lengths


class Planner:
    """FreeScale's partitioners: 8,192 samples onto 256 ranks (target <= 5 ms)."""
    params = (["lpt", "karmarkar_karp", "best_of"], ["yelp", "movielens-100k", "otto-sessions"])
    param_names = ["partitioner", "lengths"]

    def setup(self, partitioner, lengths):
        from freescale_impl import partition

        self.fn = getattr(partition, partitioner)
        self.costs = _costs(lengths, 8192)
        self.fn(self.costs, 256)  # warm caches

    def time_plan_8192_onto_256(self, partitioner, lengths):
        self.fn(self.costs, 256)

    def track_ratio_to_lower_bound(self, partitioner, lengths):
        return self.fn(self.costs, 256).ratio_to_bound


class PlannerAtScale:
    """A 256-GPU batch at 128 samples per GPU (32,768 samples), alone and with the
    look-ahead window of 4 batches: `fsbench micro planner --samples 32768 --ranks 256`."""
    params = (["lpt", "karmarkar_karp"],)
    param_names = ["partitioner"]

    def setup(self, partitioner):
        from freescale_impl import partition

        try:
            from freescale_impl.window import lookahead_window
        except ImportError:  # asv runs this suite on commits before the window had its module
            lookahead_window = partition.lookahead_window
        self.lookahead_window = lookahead_window
        self.fn = getattr(partition, partitioner)
        self.batches = [_costs("movielens-100k", 32768, seed=k) for k in range(4)]
        self.fn(self.batches[0], 256)  # warm caches

    def time_plan_32768_onto_256(self, partitioner):
        self.fn(self.batches[0], 256)

    def time_window_4x32768_onto_256(self, partitioner):
        self.lookahead_window(self.batches, 256, 4, partitioner=self.fn)


class InputStage:
    """One rank's exchanged-routing input stage per step on `medium` at 128 samples a rank
    (`fsbench micro input-stage`): its own request (the loader worker's routing) and the
    owner's preparation (the rank thread's), at 8 and 256 ranks. Flat in the ranks by
    construction (O(local batch + N))."""
    params = ([8, 256],)
    param_names = ["ranks"]
    timeout = 300

    def setup(self, ranks):
        import dataclasses

        import torch

        from fsbench.models.sparse import table_specs
        from fsbench.workloads.generator import SyntheticBatches
        from fsbench.workloads.presets import medium
        from freescale_impl.exchange_plan import build_request, plan_fetches, service_of, touched_mask
        from freescale_impl.sharded_tables import RowLayout

        w = dataclasses.replace(medium(), global_batch_size=ranks * 128)
        batch = SyntheticBatches(w, 0).global_batch(0)
        self.layout = RowLayout(table_specs(w.model.dim, w.item_vocab, w.user_vocab, w.context_vocabs),
                                ranks, "row")
        self.local = batch.select(list(range(0, batch.batch_size, ranks)))  # ~128 samples
        self.build_request, self.plan_fetches = build_request, plan_fetches
        self.service_of, self.touched_mask, self.torch = service_of, touched_mask, torch
        req = build_request(self.local, self.layout, 1)
        # As if every requester asked this owner for what this rank asks all owners for
        # (the same count of entries an owner serves on average), relabelled onto rank 0.
        self.counts = req.counts.clone()
        self.ids = req.rows - self.layout.owner(req.rows)
        self.held = int(self.layout.owned_rows(0).numel())
        self.req = req

    def time_own_request(self, ranks):
        self.build_request(self.local, self.layout, 1)

    def time_owner_preparation(self, ranks):
        torch = self.torch
        svc = self.service_of(self.counts, ranks, 1)
        svc.local = self.layout.local_index(self.ids)
        svc.fresh = self.touched_mask(svc.local, svc.local[::2], self.held)
        self.req.fresh = torch.zeros(self.req.rows.numel(), dtype=torch.bool)
        self.plan_fetches(self.req, svc, ranks, 1, final=True)


class BatchGenerator:
    params = (["tiny", "small"],)
    param_names = ["workload"]

    def setup(self, workload):
        from fsbench.workloads import make_batch_source
        from fsbench.workloads.presets import get_workload

        self.source = make_batch_source(get_workload(workload), seed=0)
        self.source.global_batch(0)

    def time_global_batch(self, workload):
        self.source.global_batch(1)


class ModelStep:
    """Forward + backward of the reference model on one `small` global batch, 1 thread."""
    params = (["hstu", "sasrec"],)
    param_names = ["family"]
    timeout = 120

    def setup(self, family):
        import torch

        from fsbench.config import override
        from fsbench.models import build_model
        from fsbench.workloads import make_batch_source
        from fsbench.workloads.presets import small

        torch.set_num_threads(1)
        workload = override(small(), "model.family", family)
        self.model = build_model(workload, seed=0)
        self.batch = make_batch_source(workload, seed=0).global_batch(0)
        self.time_forward_backward(family)

    def time_forward_backward(self, family):
        self.model(self.batch).backward()
        self.model.zero_grad(set_to_none=True)


class InstrumentationOverhead:
    """Spans + monitor vs a bare loop on `small`, one rank (target <= 1%)."""
    timeout = 600
    number = 1
    repeat = 1

    def track_overhead_ratio_small(self):
        from fsbench.running.overhead import measure_overhead
        from fsbench.workloads.presets import small

        return measure_overhead(small(), blocks=6, steps_per_block=5)["overhead_ratio"]
    track_overhead_ratio_small.unit = "ratio"
