"""How many chunks FreeScale's exchange runs with, and the step it runs: the trainer's
choice (`exchange_chunks`, fsbench.scaling.chunking and chunk_replay) on the costs of
`freescale.chunk_cluster`, and its step as ops (`step_program`), which the chunk rule
replays and the simulator costs (FreeScaleTrainer.sim_profile)."""
from __future__ import annotations

from fsbench.config import ConfigError
from fsbench.scaling.chunk_replay import GROWTHS, StepEstimate, hosts
from fsbench.scaling.chunking import ChunkChoice, a2a_model, choose_chunks
from fsbench.scaling.ddp_buckets import step_buckets
from fsbench.scaling.sim_costs import Costs
from fsbench.scaling.sim_inputs import load_cluster
from fsbench.training.step_program import StepProgram, ddp_program
from freescale_impl.exchange_plan import expected_sub_batches
from freescale_impl.node_transport import ranks_a_node
from freescale_impl.routing import choose_routing
from freescale_impl.step_schedule import sharded_step_program


def exchange_chunks(opts, workload, n: int, device: str, store) -> ChunkChoice:
    """The row exchange's chunk count on n ranks (fsbench.scaling.chunking): asked, one
    for the blocking exchange, else its step replayed at each count on
    `opts.chunk_cluster`'s costs (chunk_replay) where they price the encoder, else the
    links' rule on its all-to-all."""
    blocking = opts.overlap == "off"
    reads_costs = not (opts.chunks or blocking or n <= 1)
    a2a, model = a2a_model(opts.chunk_cluster, device, store) if reads_costs else (None, None)
    estimate = step_estimate(opts, workload, n, device, store) if reads_costs else None
    return choose_chunks(workload, n, a2a, model, asked=opts.chunks, blocking=blocking, estimate=estimate,
                         growths=growth_choices(opts))


def growth_choices(opts) -> tuple[float, ...]:
    """The cuts the chunk rule chooses among: `chunk_growth` as asked, else with an asked
    count equal tokens, else every cut the replay tries (chunk_replay.GROWTHS)."""
    if opts.chunk_growth != "auto":
        return (float(opts.chunk_growth),)
    return (1.0,) if opts.chunks else GROWTHS


def step_estimate(opts, workload, n: int, device: str, store) -> StepEstimate | None:
    """What the chunk rule replays this run's step on: `opts.chunk_cluster`'s costs (auto:
    the h100 preset on CUDA, this machine's fits on CPU), or None where they do not price
    the encoder and every collective the step runs (on CPU without `fsbench calibrate`)."""
    spec = opts.chunk_cluster
    name = ("h100" if device == "cuda" else "local") if spec == "auto" else spec
    try:
        cluster = load_cluster(name)
        costs = Costs(cluster, workload, store or ".")
        if cluster.compute == "fit" and not {"all_to_all", "all_reduce"} <= set(costs.comm or {}):
            return None
    except ConfigError:
        return None
    per_node, sync_ms = hosts(cluster, n)
    buckets = step_buckets(workload)
    return StepEstimate(lambda c, g, r="": step_program(opts, n, buckets, per_node, c, workload, g,
                                                        device == "cuda", r),
                        costs, per_node,
                        tuple(b.nbytes for b in buckets), sync_ms, cluster.name, a2a_routes(opts))


def a2a_routes(opts) -> tuple[str, ...]:
    """The routes the chunk rule tries: both under a2a=auto (flat wins a tie), else none
    to choose (the program follows `a2a`)."""
    return ("flat", "hierarchical") if opts.a2a == "auto" else ("",)


def step_program(opts, world_size: int, buckets, gpus_per_node: int, chunks: int,
                 workload=None, growth: float = 1.0, gpu: bool = False, route: str = "") -> StepProgram:
    """The step the trainer runs with these switches (freescale_impl.step_schedule), with
    `chunks` chunks, on GPUs or CPU ranks, its exchanges routed by `route` (flat |
    hierarchical, the chunk rule's choice under a2a=auto; else `a2a`, auto meaning flat):
    what the simulator costs and the chunk rule replays."""
    a2a = route or ("flat" if opts.a2a == "auto" else opts.a2a)
    if opts.tables != "sharded":
        return ddp_program(buckets)
    exchange = ("blocking" if opts.overlap == "off" else
                "prioritized" if opts.priority == "on" else "overlapped")
    transport = opts.transport
    if world_size > ranks_a_node(opts.node_ranks, world_size, gpus_per_node):
        # beyond a node: two hops (inside the node on the transport, then the rails), or
        # sm_free's split of each exchange by node
        if a2a == "hierarchical":
            transport = "rail_sm_free" if transport == "sm_free" else "rail" if gpu else "rail_host"
        elif transport == "sm_free":
            transport = "sm_free_nodes"
    routing, _ = choose_routing(opts.routing, world_size, opts.data)
    # The sub-batches and chunks as the trainer cuts them (by tokens, each `growth` times
    # the one before, in whole samples), in expectation on the workload; without one, equal.
    cut = (expected_sub_batches(workload, world_size, chunks, growth)
           if workload is not None and exchange != "blocking" else None)
    return sharded_step_program(exchange, chunks, routing, transport, buckets,
                                sample_exchange=opts.data == "sharded", cut=cut)
