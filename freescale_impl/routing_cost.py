"""What FreeScale's routed input stage costs beyond its plan, timed for `fsbench simulate`.

With sharded tables and replicated input, every rank's loader worker computes the whole
step's all-to-all routing (`freescale_impl.routing.RoutedShare`): each rank's planned
samples, every rank's request, this rank's service. That work grows with the ranks (a
request per rank) and with the global batch's tokens (every rank's rows are read), and it
is input-stage work: the simulator books it where the plan's time goes (input stall once
it outlasts the step; on `local`, the loader worker's CPU). So it is timed, here, on this
machine's CPU (one thread, warm), with the real `RoutedShare` at the simulated world size:
the median of three steps (one step's timing moved by half between repeats on the 2-core
VM).

A global batch of more than `TIMED_TOKENS` tokens is not routed whole (at 1,024 ranks x
512 samples that is ~90 million ids): the routing is timed at two smaller global batches
at the same world size, one eighth and all of `TIMED_TOKENS` (each the median of three
steps: with the two at a half and the whole, one step each, the line's slope moved so
much that 512 ranks came out at a fifth of 256's), and the line through them in tokens
is followed to the simulated batch's (`extrapolated` says so).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

TIMED_TOKENS = 1_000_000
"""The largest global batch (in tokens) the simulator routes whole; beyond, the line."""


class _Held:
    """Global batches generated before the clock starts: the routing is timed, not the
    generator (a harness stand-in for reading the data)."""

    def __init__(self, source, steps: range) -> None:
        self.batches = {k: source.global_batch(k) for k in steps}

    def global_batch(self, step: int):
        return self.batches[step]


def _routing_ms(workload, n: int, seed: int, cost, opts, chunks: int,
                repeats: int = 1) -> tuple[float, float]:
    """(CPU ms one rank's input stage spends on a step beyond planning it, the median over
    steps 1..repeats; their global batches' mean tokens). Step 0 runs first, untimed: it
    warms up and leaves the rows step 1 finds fresh."""
    from fsbench.models.sparse import table_specs
    from fsbench.workloads.generator import SyntheticBatches
    from freescale_impl.routing import RoutedShare
    from freescale_impl.sharded_tables import RowLayout
    from freescale_impl.trainer import BalancedShare

    source = _Held(SyntheticBatches(workload, seed), range(repeats + 1))
    balanced = BalancedShare(source, 0, n, cost, opts, steps=repeats + 1)
    layout = RowLayout(table_specs(workload.model.dim, workload.item_vocab, workload.user_vocab,
                                   workload.context_vocabs), n, opts.sharding)
    routed = RoutedShare(balanced, layout, chunks, opts.priority == "on")
    routed(0)  # its plan_stats reset the planning clock
    times = []
    for step in range(1, repeats + 1):
        cpu0 = time.thread_time_ns()
        item = routed(step)
        # The plan is timed and booked apart (the simulator's planner); the rest is routing.
        times.append(max(0.0, (time.thread_time_ns() - cpu0) / 1e6 - item.extra["plan_ms"]))
    tokens = [float(source.batches[k].lengths.sum()) for k in range(1, repeats + 1)]
    return statistics.median(times), statistics.mean(tokens)


def routing_ms(workload, n: int, seed: int, cost, opts, chunks: int,
               expected_tokens: float) -> tuple[float, bool]:
    """CPU ms per step that one rank's routed input stage spends beyond its plan at world
    size n on `workload`'s global batch (`expected_tokens` of it), and whether it was
    extrapolated (see the module's docstring)."""
    batch = workload.global_batch_size
    if expected_tokens <= TIMED_TOKENS or batch < 16 * n:  # three steps: one is noisy here
        return _routing_ms(workload, n, seed, cost, opts, chunks, repeats=3)[0], False
    per_sample = expected_tokens / batch
    big = max(8 * n, int(TIMED_TOKENS / per_sample))
    points = [_routing_ms(dataclasses.replace(workload, global_batch_size=b), n, seed, cost, opts, chunks,
                          repeats=3) for b in (max(n, big // 8), big)]
    (ms_lo, tok_lo), (ms_hi, tok_hi) = points
    slope = max(0.0, (ms_hi - ms_lo) / (tok_hi - tok_lo)) if tok_hi > tok_lo else 0.0
    return ms_hi + slope * (expected_tokens - tok_hi), True
