"""The chunk count by replaying the step: the rule FreeScale's trainer and the simulator
apply wherever they can price a step (a cluster's collectives and the encoder's cost), so
that it weighs everything a chunk changes, not the links alone
(fsbench.scaling.chunking's rule, which stays where no encoder cost is known).

For each candidate count the step program the trainer runs at that count (its
sub-batches and chunks as it cuts them) is replayed by the simulator's engine
(fsbench.scaling.step_engine) on expected costs:
- the encoder of a rank with its share of the global batch (DRAWS fixed draws of the
  workload's lengths, averaged), pass by pass: each sub-batch is a pass of its own and
  launches every layer again (Costs.encoder_passes), a third in forward;
- each collective on the cluster's model at the bytes the workload's expected rows make
  (sim_costs.expected_payloads, comm_bytes), two steps, the second with what the first
  left in flight (the steady state).
Beyond one chunk each count is tried at each cut of GROWTHS asked for (sub-batches of
equal tokens, or each 1.5 or 2 times the one before). The candidate with the shortest
step wins; within TIE of it, the fewest chunks, then the evener cut. So the first
chunk's wait before the forward, the latency each chunk adds, the window the dense
all-reduce hides under (sub-batch 0's backward) and the launches each pass repeats are
all in the choice. The estimate is not the simulator's booking: the co-run and overhead
terms of `local`, and the plan's imbalance, are left out (the same for every count).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)
"""The counts tried (up to a rank's samples: a sub-batch holds whole samples)."""
GROWTHS = (1.0, 1.5, 2.0)
"""The cuts tried (`freescale.chunk_growth=auto`): each sub-batch's tokens 1, 1.5 or 2
times the one before's (fsbench.training.sub_batch_cut)."""
TIE = 0.002
"""Candidates within 0.2% of the shortest step count as tied: the fewest chunks wins."""
DRAWS = 8
"""Rank batches drawn (fixed generator) for a rank's expected encoder."""


@dataclasses.dataclass(frozen=True)
class StepEstimate:
    """What the rule prices a step with. `program_of(chunks)`: the step program the
    trainer runs at that count; `costs`: the cluster's (fsbench.scaling.sim_costs.Costs:
    collectives, the encoder per sample and per pass); `buckets`: DDP's bucket bytes."""
    program_of: Callable[[int, float, str], object]
    costs: object
    gpus_per_node: int
    buckets: tuple[float, ...]
    host_sync_ms: float = 0.0
    name: str = ""
    routes: tuple[str, ...] = ("",)
    """The ways the step may route its exchanges, tried with every count (a trainer's own
    labels, passed back to `program_of`; FreeScale's: flat, hierarchical); the first wins
    a tie."""


def hosts(cluster, n: int) -> tuple[int, float]:
    """(ranks a node, a host sync's device ms) of n ranks on `cluster`: a GPU preset's
    nodes; `local` is one host, whose syncs cost no device time."""
    if cluster.compute == "fit":
        return n, 0.0
    return cluster.gpus_per_node, cluster.host_sync_s * 1e3


def rank_encoder_ms(workload, n: int, costs, passes: int, growth: float = 1.0) -> float:
    """A rank's encoder on the device in `passes` sub-batches (launch gaps included), mean
    over DRAWS batches of its share of the global batch."""
    from fsbench.workloads.distributions import parse_length_spec

    b = max(int(round(workload.global_batch_size / n)), 1)
    spec, rng = parse_length_spec(workload.lengths), np.random.default_rng(0)
    device = []
    for _ in range(DRAWS):
        lengths = spec.sample(rng, b, workload.max_seq_len)
        device.append(costs.encoder_passes(costs.sample_ms(lengths), lengths, passes, growth)[1])
    return float(np.mean(device))


def predicted_step_ms(workload, n: int, chunks: int, est: StepEstimate, growth: float = 1.0,
                      route: str = "") -> float:
    """The step at `chunks` chunks cut with `growth`, its exchanges routed by `route`: the
    encoder's device time and what the replayed program exposes beyond it (host syncs
    included)."""
    from fsbench.scaling.sim_costs import comm_bytes, expected_payloads
    from fsbench.scaling.step_engine import replay

    program = est.program_of(chunks, growth, route)
    payloads = expected_payloads(workload, n, chunks)
    dense, per_node = float(sum(est.buckets)), est.gpus_per_node

    def cost(comm) -> float:
        return est.costs.comm_ms(comm, n, per_node, comm_bytes(comm, payloads, dense, per_node, n))

    device = rank_encoder_ms(workload, n, est.costs, chunks, growth)
    phases = {"forward": device / 3, "backward": 2 * device / 3, "table_update": 0.0, "optimizer": 0.0}
    first = replay(program, cost, phases, est.host_sync_ms)
    steady = replay(program, cost, phases, est.host_sync_ms, first.carry)
    return device + steady.exposed_ms


def candidate_name(chunks: int, growth: float, route: str = "") -> str:
    """'4' (equal tokens), '8x1.5' (each sub-batch 1.5 times the one before), '4
    hierarchical' (routed so)."""
    name = str(chunks) if chunks == 1 or growth == 1.0 else f"{chunks}x{growth:g}"
    return f"{name} {route}" if route else name


def choose_by_replay(workload, n: int, est: StepEstimate, growths: tuple[float, ...] = (1.0,)
                     ) -> tuple[int, float, str, dict[str, float]]:
    """(the chosen count, its growth, its route, each tried candidate's predicted step in
    ms, by `candidate_name`). Ties: the fewest chunks, then the evener cut, then the first
    route."""
    most = max(1, workload.global_batch_size // n)
    tried = [(c, g, r) for c in COUNTS if c <= most for g in (sorted(growths) if c > 1 else (1.0,))
             for r in est.routes]
    steps = {k: predicted_step_ms(workload, n, k[0], est, k[1], k[2]) for k in tried}
    best = min(steps.values())
    chunks, growth, route = next(k for k in tried if steps[k] <= best * (1 + TIE))
    return chunks, growth, route, {candidate_name(*k): ms for k, ms in steps.items()}
