"""FreeScaleTrainer: FreeScale's techniques as switches (`--set freescale.<key>=value`).

(2, 3) Sharded tables (`tables=sharded`, the default; `sharding=row|table`) with
prioritized, chunked all-to-all overlapped with compute (`overlap`, `priority`,
`chunks`) over a chosen transport (`transport=collective|sm_free`): see
`freescale_impl.embedding_exchange`. Only the dense part is replicated under DDP (its
gradients summed, since each rank's loss is its share of the global loss).

(1) Load-balanced input samples (`balance`), optionally also across
`micro_batches` of gradient accumulation inside each rank. The plan is input preparation:
`BalancedShare` computes it from the global batch's lengths inside the harness's input
pipeline (a loader worker, ahead of the step), the same on every rank, so with
`data=replicated` no communication is needed and no planning sits on the step's critical
path. Each rank trains its planned subset and normalizes its loss by the global target
count, so the summed gradient equals the unbalanced run's on the same global batch.

With `window=K > 1` the samples of K consecutive global batches are re-packed so that
each step is balanced even when single samples ("whales") exceed a rank's fair share:
every sample is still trained exactly once per window, but a step's samples then come
from any batch of its window (the documented deviation from the original batches). Only
whole windows are measured (`step_alignment`).

With `data=sharded` each rank's loader holds only its contiguous shard: the lengths of
all shards are all-gathered when the step pulls its input (a `comm` span), the plan
follows (an `input` span), and the planned samples move between ranks in two
all-to-alls of their jagged contents (`freescale_impl.sample_exchange`, a `comm` span).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from fsbench.config import ConfigError, RunConfig
from fsbench.training.dist import RankContext
from fsbench.training.dp import DataParallelTrainer
from fsbench.training.table_memory import REPLICATED, TableMemory, sharded
from fsbench.scaling.chunking import ChunkChoice, check_chunk_cluster
from fsbench.scaling.sim_inputs import PlanInputs, SimProfile, contiguous_plan
from fsbench.options import TrainerOptions
from fsbench.measurement.timeline import span
from fsbench.training.trainer import Preparer, StepInput, StepStats, measured_steps
from fsbench.workloads.batch import contiguous_split
from freescale_impl import partition
from freescale_impl.window import lookahead_window
from freescale_impl.balance import analytical_cost, cost_model
from freescale_impl.balanced_share import PARTITIONERS, BalancedShare
from freescale_impl.routing import OwnRequest, RoutedShare, check_routing, choose_routing
from freescale_impl.sample_exchange import exchange_samples
from freescale_impl.sharded_step import ShardedTableTrainer
from freescale_impl.node_transport import NCCL_DEFAULT_CTAS
from freescale_impl.chunk_choice import a2a_routes, exchange_chunks, growth_choices, step_program  # noqa: F401  (exchange_chunks: the trainer's API)
from freescale_impl.transport import sm_free_unavailable



@dataclass(frozen=True, kw_only=True)
class FreeScaleOptions(TrainerOptions):
    balance: Literal["on", "off"] = "on"
    """Cost-balanced samples per rank, or the baselines' contiguous split."""
    # kk by default: it beats LPT on most real-shaped batches and, compiled, plans 32k
    # samples onto 256 ranks in ~0.8-1.7 ms (best runs both, ~0.8-2.0 ms; lpt ~0.6-0.8 ms):
    # results/planner_scale_cpu.md.
    partitioner: Literal["kk", "lpt", "best"] = "kk"
    cost: Literal["auto", "calibrated", "analytical"] = "auto"
    window: int = field(default=1, metadata={"min": 1})
    """Re-pack K consecutive batches so whales share a step."""
    max_tokens: int = field(default=0, metadata={"min": 0})
    """Per-rank token cap (0: none)."""
    micro_batches: int = field(default=1, metadata={"min": 1})
    data: Literal["replicated", "sharded"] = "replicated"
    tables: Literal["sharded", "replicated"] = "sharded"
    """Embedding tables sharded over the ranks (all-to-all), or replicated under DDP."""
    sharding: Literal["row", "table"] = "row"
    overlap: Literal["on", "off"] = "on"
    """Embedding communication overlapped with compute (off: the blocking version)."""
    priority: Literal["on", "off"] = "on"
    """Rows the next step needs that this step cannot change are sent during this step."""
    # 0 = auto: each chunk is an all-to-all of its own and pays the collective's fixed
    # cost, so the count follows a chunk's bytes against that cost at this world size
    # (fsbench.scaling.chunking: up to 4, fewer at many ranks). On gloo it gives 1 for this
    # repository's CPU workloads, as measured: at 2 ranks on comm-heavy, small and
    # small+amazon-beauty, chunks=1 beat chunks=4 (results/freescale_comm_cpu.md).
    chunks: int = field(default=0, metadata={"min": 0})
    """Pieces each step's embedding exchange is cut into, one a sub-batch of whole samples
    that the forward runs in turn (0: auto, by the chunking rule on chunk_cluster)."""
    chunk_growth: Literal["auto", "1", "1.5", "2"] = "auto"
    """How the samples are cut into sub-batches: each sub-batch's tokens 1 (equal), 1.5 or
    2 times the one before's; auto: the chunk rule's choice among them with chunks=0,
    equal with an asked count (fsbench.training.sub_batch_cut)."""
    chunk_cluster: str = "auto"
    """Whose all-to-all costs the chunking rule reads (chunks=0): auto (h100 on CUDA; on
    CPU the store's `fsbench calibrate --comm` fit, else gloo's default), local (the
    store's comm fit, nccl-tests logs' included), a cluster preset or a cluster file."""
    transport: Literal["collective", "sm_free"] = "collective"
    comm_ctas: int = field(default=0, metadata={"min": 0})
    """sm_free beyond one node: the CTAs (SMs) NCCL may use for the rows between nodes
    (0: NCCL's own limit; freescale_impl.node_transport). NOT YET RUN ON A GPU."""
    a2a: Literal["flat", "hierarchical", "auto"] = "flat"
    """Beyond one node, each row exchange as one all-to-all over every rank (flat: N - 1
    peers a rank), or in two hops, inside the node, then across nodes among the ranks of
    one local index (hierarchical: G - 1 + N/G - 1 peers; freescale_impl.rail_transport);
    auto: the chunk rule's replay chooses with the count (flat where it does not replay).
    NOT YET RUN ON A GPU."""
    node_ranks: int = field(default=0, metadata={"min": 0})
    """Ranks a node, where sm_free and a2a=hierarchical split an exchange (0: the
    launcher's LOCAL_WORLD_SIZE); set on one host, it emulates nodes (the CPU tests)."""
    routing: Literal["auto", "host", "exchanged"] = "auto"
    """Sharded tables, replicated input: who learns what each owner serves. host: every
    rank's input stage computes every rank's requests (O(N x local batch)); exchanged:
    its own only, the owners told by a request exchange pipelined over earlier steps;
    auto: host at few ranks, else exchanged (the measured rule in docs/freescale.md)."""

    def check(self, prefix: str) -> None:
        check_chunk_cluster(self.chunk_cluster, f"{prefix}.chunk_cluster")
        if self.priority == "on" and self.overlap == "off":
            raise ConfigError(f"{prefix}.priority=on needs {prefix}.overlap=on (set "
                              f"{prefix}.priority=off for the blocking version)")
        if self.tables == "sharded" and self.micro_batches != 1:
            raise ConfigError(f"{prefix}.micro_batches > 1 needs {prefix}.tables=replicated")
        if self.data == "sharded" and self.routing == "host":
            raise ConfigError(f"{prefix}.routing=host needs {prefix}.data=replicated (a rank "
                              "that reads only its shard cannot route the others' samples)")
        if self.a2a != "flat" and self.tables != "sharded":
            raise ConfigError(f"{prefix}.a2a={self.a2a} needs {prefix}.tables=sharded (replicated "
                              "tables exchange no rows)")
        if self.data == "sharded" and self.window != 1:
            raise ConfigError(f"{prefix}.window > 1 needs {prefix}.data=replicated (a window "
                              "reads future batches, which a rank's shard does not hold)")


class ShardLengths:
    """The input stage of `data=sharded`: this rank's shard of step k, all this rank's
    loader reads (the rest arrives by `exchange_samples` once the plan is known)."""

    def __init__(self, source, rank: int, world_size: int) -> None:
        self.source, self.rank, self.world_size = source, rank, world_size

    def __call__(self, step: int) -> StepInput:
        batch = self.source.global_batch(step)  # the generator's unit; only the shard leaves
        shard = batch.select(contiguous_split(batch.batch_size, self.world_size)[self.rank])
        return StepInput(step, [shard], 0, 0)


class FreeScaleTrainer(DataParallelTrainer):
    Options = FreeScaleOptions
    options: FreeScaleOptions

    @staticmethod
    def sim_profile(options: dict[str, str], world_size: int) -> SimProfile:
        """What `fsbench simulate` models of FreeScale: its balanced (windowed) plan, its
        sharded tables and the exchange's overlap, each switch as it is set."""
        opts = FreeScaleOptions.parse(options, prefix="freescale")
        planner = PARTITIONERS[opts.partitioner]

        def plan(lengths: list[np.ndarray], n: int, inputs: PlanInputs
                 ) -> tuple[list[list[np.ndarray]], float]:
            if opts.balance == "off":
                return contiguous_plan(lengths, n)
            # The costs the trainer would predict on that device (its calibrated fit
            # there when the store holds one, else FLOPs), not the simulator's own.
            cost = cost_model(inputs.workload, inputs.store, inputs.device, opts.cost, fit=inputs.fit)
            # What the input stage computes (BalancedShare), timed as it times it.
            cpu0 = time.thread_time_ns()
            steps = lookahead_window([cost(L) for L in lengths], n, opts.window,
                                               partitioner=planner)
            planning_ms = (time.thread_time_ns() - cpu0) / 1e6
            # Indices into the window's concatenated samples, per step and rank.
            return [[ws.positions()[idx] for idx in ws.plan.assignment] for ws in steps], planning_ms

        # Routed as the trainer routes at that size (choose_routing: host or exchanged), and
        # refused where the trainer refuses it (host routing beyond a node: O(N) a rank).
        check_routing(opts.routing, world_size)
        routing, _ = choose_routing(opts.routing, world_size, opts.data)

        def route(workload, n: int, seed: int, inputs: PlanInputs, tokens: float, chunks: int):
            # The input stage's work beyond the plan, as the trainer's loader worker and
            # rank thread do it (freescale_impl.routing_cost).
            from freescale_impl.routing_cost import stage_times

            cost = cost_model(inputs.workload, inputs.store, inputs.device, opts.cost, fit=inputs.fit)
            return stage_times(workload, n, seed, cost, opts, chunks, routing, tokens)

        exchange = "none"
        if opts.tables == "sharded":
            exchange = ("blocking" if opts.overlap == "off" else
                        "prioritized" if opts.priority == "on" else "overlapped")
        sharded_tables = opts.tables == "sharded"
        # Its step as ops, each switch as set (freescale_impl.step_schedule), with the
        # chunks the simulator chose as the trainer would (chunks=0: the chunking rule on
        # the simulated cluster): the simulator costs what the trainer runs.
        def program(buckets, gpus_per_node: int, chunks: int, workload=None, growth: float = 1.0,
                    gpu: bool = False, route: str = ""):
            return step_program(opts, world_size, buckets, gpus_per_node, chunks, workload, growth, gpu, route)

        return SimProfile(tables=FreeScaleTrainer.table_memory(options, world_size),
                          exchange=exchange, sm_free=opts.transport == "sm_free", plan=plan,
                          # routed wherever the trainer routes (make_preparer)
                          route=route if sharded_tables else None,
                          sample_exchange=opts.data == "sharded",
                          window=opts.window if opts.balance == "on" else 1,
                          chunks=opts.chunks, growths=growth_choices(opts), program=program,
                          nodes_sm_share=min(1.0, opts.comm_ctas / NCCL_DEFAULT_CTAS) if opts.comm_ctas else 1.0,
                          ranks_a_node=opts.node_ranks, routes=a2a_routes(opts))

    @staticmethod
    def input_stage(workload, options: dict[str, str], n: int, routing: str, repeats: int,
                    seed: int) -> tuple[str, list[dict]]:
        """What `fsbench micro input-stage` times: one rank's input stage at world size n
        on `workload`'s global batches with these switches (costs from the analytical
        model, as on a GPU without a fit), by `routing` (auto: the trainer's rule).
        Returns (the routing used, one dict per timed step: freescale_impl.routing_cost)."""
        from freescale_impl.routing_cost import time_steps

        opts = FreeScaleOptions.parse(options, prefix="freescale")
        used, _ = choose_routing(routing, n, opts.data)
        chunks = exchange_chunks(opts, workload, n, "cuda", None).chunks  # as on that GPU
        return used, time_steps(workload, n, seed, analytical_cost(workload), opts,
                                chunks, used, repeats)

    @staticmethod
    def planners(workload, window: int) -> dict:
        """What `fsbench micro planner` times: the input stage's planning of one global
        batch (costs from the analytical cost model, then a partitioner), and with the
        look-ahead window over `window` batches. Name -> (batches it plans, fn(lengths of
        each of those batches, ranks) -> the plans it made, one per batch)."""
        cost = analytical_cost(workload)

        def one(fn):  # as the input stage plans without a window (BalancedShare.plan)
            return lambda batches, n: [fn(cost(batches[0]), n)]

        def windowed(fn):
            return lambda batches, n: [s.plan for s in lookahead_window(
                [cost(b) for b in batches], n, len(batches), partitioner=fn)]

        out = {}
        for name in ("lpt", "kk", "best_of"):
            fn = partition.PARTITIONERS[name]
            out[name] = (1, one(fn))
            if window > 1:
                out[f"{name} window={window}"] = (window, windowed(fn))
        return out

    @staticmethod
    def table_memory(options: dict[str, str], world_size: int) -> TableMemory:
        """How a rank holds the tables (fsbench.running.memory): sharded rows or whole tables, or
        replicated under DDP."""
        if options["tables"] == "replicated":
            return REPLICATED
        return sharded(options["sharding"])

    @classmethod
    def check_run(cls, run: RunConfig) -> None:
        """Before any rank starts: a window needs whole windows to measure. (Sharded tables
        step every table optimizer exactly: freescale_impl.sharded_tables.)"""
        opts = cls.Options.parse(run.trainer_options, prefix="freescale")
        measured_steps(run.workload.warmup, run.workload.steps, opts.window)
        check_routing(opts.routing, run.world_size)
        if opts.node_ranks and run.world_size > opts.node_ranks and run.world_size % opts.node_ranks:
            raise ConfigError(f"freescale.node_ranks={opts.node_ranks}: {run.world_size} ranks are not "
                              f"whole nodes of {opts.node_ranks}; choose a divisor of {run.world_size}")
        if opts.tables == "sharded" and run.workload.compute != "synthetic":
            if opts.transport == "sm_free":
                why = sm_free_unavailable(run.device, run.world_size)
                if why:
                    raise ConfigError(f"freescale.transport=sm_free cannot run here: {why}; "
                                      "use freescale.transport=collective")

    def setup(self, ctx: RankContext, run: RunConfig, source) -> None:
        opts = self.options
        # The synthetic ground-truth model has no tables to shard.
        self.sharded = opts.tables == "sharded" and run.workload.compute != "synthetic"
        # Calibrations live in the results store that holds this run.
        store_dir = Path(ctx.run_dir).parent if ctx.run_dir else None
        if self.sharded:
            self.ctx, self.run, self.source = ctx, run, source
            self.chunking = self._chunking(ctx, run, store_dir)
            a2a = (self.chunking.route or "flat") if opts.a2a == "auto" else opts.a2a
            self.tables = ShardedTableTrainer(ctx, run, dataclasses.replace(opts, chunks=self.chunking.chunks, a2a=a2a),
                                              growth=self.chunking.growth)
            self.routing, self.routing_rule = choose_routing(opts.routing, ctx.world_size, opts.data)
        else:
            super().setup(ctx, run, source)
        self.step_alignment = opts.window
        self.cost = cost_model(run.workload, store_dir, run.device, opts.cost)
        if ctx.is_main:
            tables = (f"tables=sharded/{opts.sharding} overlap={opts.overlap} "
                      f"priority={self._priority()} {self.chunking.line()} "
                      f"transport={opts.transport} routing={self.routing}"
                      if self.sharded else "tables=replicated")
            print(f"freescale: balance={opts.balance} partitioner={opts.partitioner} "
                  f"window={opts.window} data={opts.data} {tables} cost model: "
                  f"{self.cost.source}", file=sys.stderr, flush=True)  # a note: stdout is for results
        self.balanced = BalancedShare(source, ctx.rank, ctx.world_size, self.cost, opts,
                                      run.workload.steps)

    def _chunking(self, ctx: RankContext, run: RunConfig, store_dir: Path | None) -> ChunkChoice:
        """The row exchange's chunks, chosen as the simulator chooses them, then rank 0's on
        every rank: a count is a number of collectives, and a host without rank 0's comm
        fit would choose another (a deadlock)."""
        chosen = exchange_chunks(self.options, run.workload, ctx.world_size, ctx.device.type, store_dir)
        routes = ("", "flat", "hierarchical")
        held = torch.tensor([chosen.chunks, chosen.growth, routes.index(chosen.route)], dtype=torch.float64,
                            device=ctx.device)
        dist.broadcast(held, src=0, group=ctx.group)
        chunks, growth, route = int(held[0]), float(held[1]), routes[int(held[2])]
        if (chunks, growth, route) == (chosen.chunks, chosen.growth, chosen.route):
            return chosen
        mine = f"{chosen.chunks} x {chosen.growth:g}" + (f" {chosen.route}" if chosen.route else "")
        return ChunkChoice(chunks, f"rank 0's (this rank's rule gave {mine})",
                           ctx.world_size, growth=growth, route=route)

    def make_preparer(self) -> Preparer:
        if self.options.data == "sharded":
            return ShardLengths(self.source, self.ctx.rank, self.ctx.world_size)
        if self.sharded and self.routing == "host":  # every rank's routing, computed here
            return RoutedShare(self.balanced, self.tables.layout, self.tables.engine.chunks,
                               self.tables.engine.priority, self.tables.engine.growth)
        if self.sharded:  # the plan and this rank's own request; the step exchanges them
            return OwnRequest(self.balanced, self.tables.layout, self.tables.engine.chunks,
                              self.tables.engine.growth)
        return self.balanced

    def describe(self) -> dict:
        """What really ran (stored in the manifest)."""
        if not self.sharded:
            return {"tables": "replicated"}
        ran = {"tables": "sharded", "sharding": self.options.sharding,
               "chunks": self.tables.engine.chunks, "chunk_rule": self.chunking.record(),
               "transport": self.tables.engine.transport.name,
               "routing": self.routing, "routing_rule": self.routing_rule}
        if self._priority() != self.options.priority:
            ran["priority"] = self._priority()
        if self.options.a2a != "flat" and not ran["transport"].startswith("hierarchical"):
            ran["a2a"] = f"flat (one node: {self.ctx.world_size} ranks; two hops need more than a node's)"
        return ran

    def _priority(self) -> str:
        """What priority ran as: off where the switch says so, and under a table optimizer
        that steps every row (dense Adam), which leaves no row final before an update."""
        if self.tables.engine.priority:
            return "on"
        if self.options.priority == "on":
            return f"off (optimizer.tables={self.run.workload.table_optimizer} moves every row every step)"
        return "off"

    def trained_model(self) -> torch.nn.Module | None:
        """The trained model as a CPU `RecModel` on rank 0 (None elsewhere); sharded
        tables are gathered (a collective: call on every rank, between steps)."""
        if self.sharded:
            return self.tables.trained_model()
        return super().trained_model()

    def step(self, inputs) -> StepStats:
        if self.options.data == "sharded":
            inputs = map(self._sharded_input, inputs)
        if self.sharded:
            return self.tables.step(inputs)
        return super().step(inputs)

    def _sharded_input(self, prepared: StepInput) -> StepInput:
        """All-gather every shard's lengths (what balancing costs in communication), plan,
        then move the planned samples between ranks (`exchange_samples`)."""
        shard = prepared.batches[0]
        shards = contiguous_split(self.run.workload.global_batch_size, self.ctx.world_size)
        lengths = self._gather_lengths(shard.lengths, shards)
        with span("plan", kind="input"):
            plan = self.balanced.plan(lengths.numpy())
        starts = [sum(len(s) for s in shards[:r]) for r in range(len(shards) + 1)]
        local = exchange_samples(shard, starts, lengths, [list(map(int, a)) for a in plan.assignment],
                                 self.ctx.rank, group=self.ctx.group)
        return StepInput(prepared.step, self.balanced.micro(local), local.batch_size,
                         local.num_targets, self.balanced.plan_stats(plan))

    def _gather_lengths(self, mine: torch.Tensor, shards: list[list[int]]) -> torch.Tensor:
        width = max(len(s) for s in shards)
        padded = torch.zeros(width, dtype=torch.int64, device=mine.device)
        padded[:len(mine)] = mine
        parts = [torch.empty_like(padded) for _ in shards]
        with span("all_gather", kind="comm"):
            dist.all_gather(parts, padded, group=self.ctx.group)
        return torch.cat([p[:len(s)].cpu() for p, s in zip(parts, shards)])
