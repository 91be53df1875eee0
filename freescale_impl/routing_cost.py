"""What FreeScale's input stage costs one rank per step, timed on this machine's CPU (one
thread, warm): for `fsbench micro input-stage` and for `fsbench simulate`.

A rank's input stage, by routing (freescale_impl.routing):

  plan   the cost model and the partitioner over the global batch's lengths (every
         routing; `BalancedShare.plan`, timed by the balancer itself);
  read   selecting this rank's planned samples from the global batch by index (what a
         data loader reads; `BalancedShare.read`);
  route  the rest of the loader worker's work: host routing (`RoutedShare`) selects every
         other rank's samples, builds every rank's request and this rank's service (O(N x
         local batch)); exchanged routing (`OwnRequest`) builds its own request (O(local
         batch + N));
  prep   exchanged only: the owner's preparation on the rank's own thread once the
         requests arrive (its service from the counts, the ids' local rows, the fresh
         mask, the messages' plan: O(entries it serves + N)); the real functions the step
         calls (`service_of`, `RowLayout.local_index`, `touched_mask`, `plan_fetches`) on
         what the other ranks' real requests would send it, built untimed.

The global batches are generated before the clock starts (reading data is not the input
stage) and the plan's time is booked apart. Each figure is the median of `repeats` steps
after one untimed step (it warms up and leaves the rows the next step finds fresh).

A global batch of more than `TIMED_TOKENS` tokens is not timed whole (at 1,024 ranks x
512 samples that is ~90 million ids): the stage is timed at two smaller global batches at
the same world size, one eighth and all of `TIMED_TOKENS` (each the median of three
steps), and the line through them in tokens is followed to the simulated batch's
(`extrapolated` says so).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

TIMED_TOKENS = 4_000_000
"""The largest global batch (in tokens) the simulator times whole; beyond, the line."""


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """One rank's input stage per step (CPU ms): the loader worker's routing beyond the
    plan, and the rank thread's exchange preparation."""
    route_ms: float
    prep_ms: float = 0.0
    extrapolated: bool = False


class _Held:
    """Every timed step's global batch, generated before any clock starts (a harness
    stand-in for reading the data). All of them first: making one (350 MB at 1,024 ranks
    of `medium`) right before a timed step left that step on caches and an allocator the
    generator had just churned, which a loader reading only its own samples never sees."""

    def __init__(self, source, steps: range) -> None:
        self.batches = {k: source.global_batch(k) for k in steps}

    def global_batch(self, step: int):
        return self.batches[step]


def time_steps(workload, n: int, seed: int, cost, opts, chunks: int, routing: str,
               repeats: int, rank: int = 0) -> list[dict]:
    """Rank `rank`'s input stage at world size n on `workload`'s global batches, one dict per
    timed step (steps 1..repeats; step 0 runs untimed first): plan_ms, read_ms, route_ms,
    prep_ms (thread CPU ms), and the step's global and local tokens."""
    from fsbench.models.sparse import table_specs
    from fsbench.workloads.generator import SyntheticBatches
    from freescale_impl.balanced_share import BalancedShare
    from freescale_impl.routing import OwnRequest, RoutedShare
    from freescale_impl.sharded_tables import RowLayout

    held = _Held(SyntheticBatches(workload, seed), range(repeats + 1))
    balanced = BalancedShare(held, rank, n, cost, opts, steps=repeats + 1)
    layout = RowLayout(table_specs(workload.model.row_dim, workload.item_vocab, workload.user_vocab,
                                   workload.context_vocabs), n, opts.sharding)
    stage = (RoutedShare(balanced, layout, chunks, opts.priority == "on") if routing == "host"
             else OwnRequest(balanced, layout, chunks))
    # The owner's view plans with a balancer of its own: the timed stage's plan is timed.
    owner = (_Owner(BalancedShare(held, rank, n, cost, opts, steps=repeats + 1), layout, chunks, rank)
             if routing == "exchanged" else None)
    # The loader worker's steps back to back, as a worker runs them; then, per step, the
    # owner's side (building the other ranks' requests, untimed, churns the caches: it must
    # not run between two of the worker's timed steps, where no real worker does it).
    items = [stage(step) for step in range(repeats + 1)]  # each times its own parts (extra)
    prep = [owner.prepare(item.aux["request"], owner.arrivals(step)) if owner is not None else 0.0
            for step, item in enumerate(items)]
    return [{**{k: item.extra[k] for k in ("plan_ms", "read_ms", "route_ms")}, "prep_ms": prep[step],
             "global_tokens": int(held.global_batch(step).lengths.sum()), "local_tokens": item.num_targets,
             "local_samples": item.num_samples}
            for step, item in enumerate(items) if step > 0]


class _Owner:
    """What rank `rank` receives as an owner under exchanged routing, built from the other
    ranks' real requests (untimed), and its preparation of them on its thread (timed)."""

    def __init__(self, balanced, layout, chunks: int, rank: int) -> None:
        self.balanced, self.layout, self.chunks, self.rank = balanced, layout, chunks, rank
        self.touched_global = None  # global rows any rank read at the previous step
        self.touched_local = None   # this owner's local rows asked for at the previous step
        self.rows_held = int(layout.owned_rows(rank).numel())

    def arrivals(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(counts each requester sends me per chunk, the ids in arrival order, every global
        row read at this step)."""
        from freescale_impl.exchange_plan import all_rows, build_request

        counts, ids = [], []
        for r in range(self.balanced.world_size):
            req = build_request(self.balanced.share(step, r)[0], self.layout, self.chunks)
            counts.append(req.counts[self.rank])
            ids.append(req.rows[req.owner == self.rank])  # by owner, then chunk: mine in order
        batch = self.balanced.source.global_batch(step)
        return torch.stack(counts), torch.cat(ids), torch.unique(all_rows(batch, self.layout))

    def prepare(self, req, served) -> float:
        """CPU ms of the owner's preparation of one step, as the step does it."""
        from freescale_impl.exchange_plan import plan_fetches, service_of, touched_mask

        counts_in, ids, read_now = served
        n = self.layout.world_size
        cpu0 = time.thread_time_ns()
        svc = service_of(counts_in, n, self.chunks)
        svc.local = self.layout.local_index(ids)
        first = self.touched_local is None  # the first step: every row is fresh
        svc.fresh = (torch.ones(ids.numel(), dtype=torch.bool) if first
                     else touched_mask(svc.local, self.touched_local, self.rows_held))
        cpu_owner = time.thread_time_ns() - cpu0
        # The mask the owners send back (what every owner computed for this rank's entries).
        req.fresh = (torch.ones(req.rows.numel(), dtype=torch.bool) if first
                     else torch.isin(req.rows, self.touched_global))
        cpu0 = time.thread_time_ns()
        plan_fetches(req, svc, n, self.chunks, final=not first)
        cpu_plan = time.thread_time_ns() - cpu0
        self.touched_global = read_now
        self.touched_local = svc.local
        return (cpu_owner + cpu_plan) / 1e6


def _stage_ms(workload, n: int, seed: int, cost, opts, chunks: int, routing: str,
              repeats: int = 3) -> tuple[float, float, float]:
    """(median route ms, median prep ms, mean global tokens) over `repeats` timed steps."""
    rows = time_steps(workload, n, seed, cost, opts, chunks, routing, repeats)
    return (statistics.median(r["route_ms"] for r in rows), statistics.median(r["prep_ms"] for r in rows),
            statistics.mean(r["global_tokens"] for r in rows))


def stage_times(workload, n: int, seed: int, cost, opts, chunks: int, routing: str,
                expected_tokens: float) -> StageTimes:
    """One rank's routing and exchange preparation per step at world size n on `workload`'s
    global batch (`expected_tokens` of it), by `routing` (see the module's docstring)."""
    batch = workload.global_batch_size
    if expected_tokens <= TIMED_TOKENS or batch < 16 * n:  # three steps: one is noisy here
        route, prep, _ = _stage_ms(workload, n, seed, cost, opts, chunks, routing)
        return StageTimes(route, prep)
    per_sample = expected_tokens / batch
    big = max(8 * n, int(TIMED_TOKENS / per_sample))
    (r_lo, p_lo, tok_lo), (r_hi, p_hi, tok_hi) = [
        _stage_ms(dataclasses.replace(workload, global_batch_size=b), n, seed, cost, opts, chunks, routing)
        for b in (max(n, big // 8), big)]

    def follow(lo: float, hi: float) -> float:
        slope = max(0.0, (hi - lo) / (tok_hi - tok_lo)) if tok_hi > tok_lo else 0.0
        return hi + slope * (expected_tokens - tok_hi)
    return StageTimes(follow(r_lo, r_hi), follow(p_lo, p_hi), extrapolated=True)
