"""`fsbench simulate`: project step time and bubbles to world sizes nobody here owns.

SIMULATED numbers, labelled so everywhere (`"simulated": true` in every summary and
manifest; reports draw them apart). Per step, over the workload's real sampled global
batches (the same length draws the generator makes for that seed and step):

  compute   each rank's samples under the trainer's own split (contiguous for the
            baselines; FreeScale's balanced plan, look-ahead window included, planned
            with the costs its cost model predicts, as the trainer plans), each sample
            costing cost(L): the calibrated fit `fsbench calibrate` stored (cluster
            `local`), or the encoder's FLOPs at a stated share of peak (GPU presets).
            A third in forward, the rest in backward.
  tables    the optimizer's step over the table elements a rank updates, after backward,
            on every rank: all rows x dim of a replicated table (a dense gradient; `local`:
            the fit's replica cost per element at the real table sizes, dense gradients
            included), the expected distinct rows of the global batch over N for sharded
            ones; at the `fsbench calibrate` fit's cost per element (`local`) or a preset's.
            `local` also adds each rank's batch terms (fixed, and per attention bucket
            among its samples' lengths: a rank's few samples of many lengths cost more
            than their cost(L) sum).
  co-run    `local` at 2+ ranks: a rank's CPU work times the fit's measured slowdown when
            every core runs it at once (ranks share the host; the encoder's and the
            memory-bound table work's apart); with more ranks than cores it also waits
            its turn (time-sharing): its wall time 1 + e (ranks / cores - 1) times its
            CPU time, where e, the share of full time-sharing that steps meet (ranks'
            CPU work does not all fall at once), is measured at four times the cores
            (fsbench.scaling.timeshare; 1 in a fit without it). A run with
            `compute=emulated` waits for its encoder instead (no core), so there only
            the real CPU work (table step, overhead) time-shares.
  overhead  `local`: each trainer's per-step work beyond this model in each compute mode,
            measured by real 1-rank runs at the calibrated batch and a quarter of it
            and followed along the global batch's expected tokens (up to the calibrated
            batch's) (fsbench.scaling.step_overhead): its wall time, the
            part that is the rank's CPU (time-shares), the part counted busy, input waits,
            and its loader worker's CPU (a process of its own, on a spare core at 1 rank;
            its planning and routing at the simulated size are timed here instead):
            at n ranks the n workers' CPU beyond what the spare cores take lengthens the
            step by its share per core (beyond the cores, times e), booked as the preempted rank's run-queue wait
            (other idle) and its peers' wait in communication (`worker_preemption_ms`).
            The collectives' own CPU on each rank's other threads (gloo's, measured by
            `fsbench calibrate --comm` beside their times) preempts the ranks alike for
            the part of each transfer hidden under compute (`comm_cpu_ms`; none in a
            comm fit from before).
  comm      the trainer's own step (`SimProfile.program`: fsbench.training.step_program,
            held against its recorded timeline by tests/test_step_programs.py) replayed
            on the fastest rank's compute (fsbench.scaling.step_engine): each collective
            issued where the trainer issues it on its channel (process group or copy
            stream): one channel's collectives one after another, different channels'
            at once, sharing the rank's links equally (what sharing exposes is
            `shared_link_ms`), waited where the trainer waits for it; a collective for
            the next step arrives across the boundary, its work left carried over; host syncs drain the device
            (`Cluster.host_sync_s`, GPU presets). Its cost: fitted on this machine by
            `fsbench calibrate --comm` (`local`), on a cluster's nccl-tests logs
            (`--from-nccl-tests`), or a preset's figures (fsbench.scaling.collectives);
            its bytes from what it carries (sim_costs.step_payloads): DDP's real buckets
            (1 MiB first, then 25 MiB, in the order gradients are ready: `ddp_buckets`;
            the encoder's through the backward by bytes, a replicated table's at its end;
            together one transfer's cost), sharded tables' unique rows (expected under
            the workload's Zipf popularity; with priority those the previous update
            changed, `expected_fresh`, apart from the others), requests and input dists.
  input     the trainer's planning at the simulated size (what its input stage computes:
            predicted costs and the partitioner, a window's spread over its steps), timed
            on this machine's CPU (one thread, warm; the median over the run's windows),
            and its routing (FreeScale with sharded tables: every rank's request and this
            rank's service, computed in the loader worker; `route_ms`): the real
            `RoutedShare` timed at the simulated world size and global batch (beyond a
            million tokens, on the line through two smaller batches:
            freescale_impl.routing_cost); the baselines plan and route nothing. The input
            stage prepares it ahead of the step, so it costs nothing until it takes longer
            than the step; beyond that every rank waits for it (input stall,
            `plan_stall_ms`). On `local` it is also the loader worker's CPU (below).
  SM        overlapped communication on SMs slows the compute it overlaps by
            `sm_slowdown` (a preset's parameter; `fsbench micro sm-contention` measures it
            where a GPU exists); copy-engine transport (FreeScale's sm_free) costs nothing.

  T = max_r wall_r + what the program's waits exposed + the table step (after the
  gradients, on every rank).
  Per rank, as the metrics count a measured run (fsbench.measurement.metrics.rank_causes): busy_r =
  its compute's CPU time (an emulated encoder's wait), the rest of its own wall time
  (run-queue waits, overhead that is not busy) other idle or input stall, and T less its
  wall time waiting in communication; straggler = max busy - busy_r, taken from the
  waits first. On a GPU preset busy_r = wall_r, so exposed communication = T - max busy.

What is not modelled: the dense parameters' optimizer step (outside `local`'s measured
overhead), the CPU of communication on GPU presets (NCCL's host threads), congestion
beyond one rank's links (switches, other jobs).
A trainer class declares how it behaves with `sim_profile(options, world_size)`
(`SimProfile`, its step's program included); trainers that do not are modelled as DDP.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from fsbench.config import RunConfig, WorkloadConfig
from fsbench.scaling.ddp_buckets import step_buckets
from fsbench.errors import ConfigError
from fsbench.measurement.metrics import rank_causes
from fsbench.scaling.chunk_replay import StepEstimate, hosts
from fsbench.scaling.chunking import choose_chunks
from fsbench.scaling.sim_costs import (INPUT_PAYLOADS, OVERHEAD_KEYS, ROW_PAYLOADS, SAMPLE_PAYLOADS, Costs,
                                      comm_bytes as shared_comm_bytes, expected_fresh, expected_tokens, step_payloads,
                                      unique_rows, worker_preemption_ms)
from fsbench.scaling.step_engine import replay
from fsbench.scaling.sim_inputs import Cluster, PlanInputs, SimProfile, contiguous_plan
from fsbench.scaling.sim_summary import summarize_steps

def profile_of(trainer: str, options: dict[str, str], n: int) -> SimProfile:
    from fsbench.training.trainer import option_defaults, resolve_trainer_class

    cls = resolve_trainer_class(trainer)
    declare = getattr(cls, "sim_profile", None)
    return declare({**option_defaults(cls), **options}, n) if declare else SimProfile()


def simulate_run(run: RunConfig, cluster: Cluster, store: str | Path,
                 profile: SimProfile | None = None, step_overhead: bool = True,
                 planner_time: bool = True, timeshare_efficiency: float | None = None,
                 planner_ms: float | None = None, route_ms: float | None = None,
                 prep_ms: float | None = None) -> tuple[dict, list[dict]]:
    """Summary (the measured schema, `simulated: true`) and per-step rows of one
    (trainer, world size) on `cluster`; `step_overhead=False` leaves out the fit's
    measured per-step overhead (to measure it); `planner_time=False` leaves out the
    planner's time measured here (for outputs that must not depend on this CPU);
    `planner_ms`, `route_ms` and `prep_ms` charge that planning, routing and exchange
    preparation per step instead of timing them (a variant of a run already timed: fsbench.scaling.sensitivity); `timeshare_efficiency` replaces
    the fit's (to measure it)."""
    from fsbench.specs import parse_popularity
    from fsbench.workloads.distributions import parse_length_spec
    from fsbench.workloads.generator import step_rng

    w, n = run.workload, run.world_size
    prof = profile or profile_of(run.trainer, run.trainer_options, n)
    costs_model = Costs(cluster, w, store, timeshare_efficiency)
    dist = parse_length_spec(w.lengths)
    zipf_s = float(parse_popularity(w.popularity).s)
    dim_bytes = 4.0 * w.model.row_dim
    vocabs = [w.item_vocab, w.user_vocab, *w.context_vocabs]
    held_rows = prof.tables.rows_held(vocabs, n)
    # DDP's gradient buckets: the encoder's parameters in the order their gradients are
    # ready, then the tables where a trainer replicates them (read first in forward, so
    # ready last in backward; among themselves in reverse registration order).
    replicas = [rows * dim_bytes for rows in vocabs] if prof.tables.placement == "replicated" else []
    ready_buckets = step_buckets(w, replicas[::-1])
    buckets = [b.nbytes for b in ready_buckets]
    transport_slow = cluster.sm_slowdown
    # CPU work slows when ranks share the host's cores (co-run), and beyond the cores it
    # waits its turn (time-sharing): thread CPU time grows by the first, the wall by both;
    # the wait is run-queue time, which the metrics count as other idle. An emulated
    # encoder waits without a core and is all busy; the real CPU work around it is not
    # busy (fsbench.models.emulation), so the simulator books it as the metrics do.
    emulated = w.compute == "emulated" and cluster.compute == "fit"
    corun, share = costs_model.corun_factor(n), costs_model.time_sharing(n, run.trainer)
    table_corun = costs_model.table_corun_factor(n)
    enc_busy, enc_wall = (1.0, 1.0) if emulated else (corun, corun * share)
    over = (costs_model.step_overhead(run.trainer, w.compute, expected_tokens(w)) if step_overhead
            else dict.fromkeys(OVERHEAD_KEYS, 0.0))
    # Waiting for input is waiting for the loader worker's CPU work, which time-shares
    # too; the rest of the overhead off the rank's CPU (other waits) does not.
    input_wait = over["input_ms"] * share
    cores = costs_model.cores()
    over_wall = (over["cpu_ms"] * corun * share + input_wait
                 + (over["wall_ms"] - over["cpu_ms"] - over["input_ms"]))
    plan = prof.plan or contiguous_plan
    # `local`: the trainer would find this machine's fit in the store. A GPU preset's GPUs
    # are not this machine's: no fit of theirs is stored, so the trainer would use FLOPs.
    # With an encoder fit given, the trainer there would plan with that fit.
    planning = (PlanInputs(w, store, "cpu") if cluster.compute == "fit"
                else PlanInputs(w, None, "cuda", fit=costs_model.fit))
    # The row exchange's chunks and cut: as asked, else the trainer's rule on this
    # cluster's costs (its program replayed, chunk_replay; the links alone, chunking, where
    # no encoder cost is known), so the routing and the program are the trainer's there.
    per_node, sync_ms = hosts(cluster, n)
    per_node = min(n, prof.ranks_a_node or per_node)
    gpu_hosts = cluster.compute != "fit"
    estimate = StepEstimate(lambda k, g, r="": prof.program(ready_buckets, per_node, k, w, g, gpu_hosts, r),
                            costs_model, per_node, tuple(buckets), sync_ms, cluster.name, prof.routes)
    chunking = None if prof.exchange == "none" else choose_chunks(
        w, n, lambda k, nbytes: costs_model.collective_ms("all_to_all", k, nbytes), cluster.name,
        asked=prof.chunks, blocking=prof.exchange == "blocking", estimate=estimate, growths=prof.growths)
    chunks, growth, route = (chunking.chunks, chunking.growth, chunking.route) if chunking else (1, 1.0, "")
    # The encoder's passes a step: FreeScale's overlapped exchange runs a sub-batch a chunk.
    passes = chunks if prof.exchange in ("overlapped", "prioritized") else 1
    # The trainer plans with its own predicted costs; the cluster's costs are booked.
    # Its planning is the input stage's work at the simulated size, timed on this
    # machine's CPU: the first window is planned once more untimed (compiling the planner
    # is once per process), and every step is charged the median over the windows, per
    # step, so one preempted plan does not make a step.
    windows = []
    for start in range(0, w.steps, prof.window):
        window = range(start, min(start + prof.window, w.steps))
        lengths = [dist.sample(step_rng(run.seed, k), w.global_batch_size, w.max_seq_len) for k in window]
        if planner_time and start == 0:
            plan(lengths, n, planning)
        plans, planning_ms = plan(lengths, n, planning)
        windows.append((window, lengths, plans, planning_ms / len(window)))
    plan_ms = float(np.median([ms for *_, ms in windows])) if planner_time else 0.0
    if planner_time and planner_ms is not None:
        plan_ms = planner_ms
    # The routing at the simulated size, timed once (every step routes alike): the loader
    # worker's (`route_ms`) and the rank thread's exchange preparation (`prep_ms`).
    routed_by_line = False
    if not planner_time or prof.route is None:
        route_ms = prep_ms = 0.0
    elif route_ms is None:
        timed = prof.route(w, n, run.seed, planning, expected_tokens(w), chunks)
        route_ms, prep_ms, routed_by_line = timed.route_ms, timed.prep_ms, timed.extrapolated
    prep_ms = prep_ms or 0.0
    stage_ms = plan_ms + route_ms
    # On the cluster's hosts: cores host_cpu_speed times this machine's, and input_workers
    # loader workers a rank preparing different steps, so the stage keeps up with steps of
    # stage / speed / workers ms. The rank thread's preparation runs while the device
    # computes (the host launches ahead of it), so on a GPU it costs the step only beyond
    # the step; on `local` it is the rank's own CPU work (below).
    speed, workers = cluster.host_cpu_speed, cluster.input_workers
    if prof.sample_exchange:
        # data=sharded: the plan and the request are made on the rank's thread once the
        # lengths are gathered (no loader worker can: it holds one shard), beside its prep.
        prep_ms, stage_ms = prep_ms + stage_ms, 0.0
    stage_pace_ms = max(stage_ms / speed / workers, prep_ms / speed if gpu_hosts else 0.0)
    # The loader worker's CPU (`local`): what was measured at 1 rank beyond the input
    # stage's planning and routing there, plus theirs at this size.
    worker_ms = over["worker_ms"] + (stage_ms if costs_model.worker_excludes_stage(run.trainer, w.compute) else 0.0)
    # The previous step's global item draws (negatives shared by all ranks) and samples:
    # the rows it updated, which the prioritized exchange cannot send before its update.
    prev = None
    program = prof.program(ready_buckets, per_node, chunks, w, growth, gpu_hosts, route)
    carry = carry_alone = None  # what each step leaves in flight for the next
    rows = []
    for window, lengths, plans, _ in windows:
        costs = [costs_model.sample_ms(L) for L in lengths]  # alone on a core
        all_lengths, all_costs = np.concatenate(lengths), np.concatenate(costs)
        for k, owners in zip(window, plans):
            # Each rank's encoder pass by pass (FreeScale's sub-batches: one pass each):
            # its kernels (busy) and the device's time, launch gaps included (idle).
            enc, enc_device = np.array([costs_model.encoder_passes(all_costs[idx], all_lengths[idx], passes, growth)
                                        for idx in owners]).T
            # Communication hides under the encoder's forward and backward only; the
            # overhead (input, Python, row gathering) comes before them.
            model_ms = enc_device * enc_wall
            c = model_ms + over_wall  # each rank's wall until its gradients
            busy = enc * enc_busy + over["busy_ms"] * corun
            cpu = (0.0 if emulated else enc * corun) + over["cpu_ms"] * corun
            tokens = np.array([all_lengths[idx].sum() for idx in owners], dtype=np.float64)
            samples = np.array([len(idx) for idx in owners], dtype=np.float64)
            draws = tokens + samples + w.negatives_per_step
            rows_r = fresh_r = None
            if prof.exchange != "none":
                # Unique rows a rank reads: items and targets (one table), shared negatives,
                # one user row and one row per context table per sample; of them, those the
                # previous step updated (all at the first step: nothing was sent before it).
                rows_r = unique_rows(w, draws, samples, zipf_s)
                fresh_r = None if prev is None else (
                    expected_fresh(draws, w.item_vocab, zipf_s, prev[0])
                    + samples * sum(-math.expm1(-prev[1] / v) for v in (w.user_vocab, *w.context_vocabs)))
            prev = (float(tokens.sum() + samples.sum() + w.negatives_per_step), float(samples.sum()))
            payload = step_payloads(w, n, chunks, rows_r, fresh_r, samples, tokens)
            t_ar = costs_model.collective_ms("all_reduce", n, sum(buckets))
            t_last = costs_model.collective_ms("all_reduce", n, buckets[-1]) if buckets else 0.0

            def comm_bytes(comm) -> float:
                return shared_comm_bytes(comm, payload, sum(buckets), per_node, n)

            def cost(comm) -> float:
                if comm.payload == "dense_grads" and not gpu_hosts:
                    # gloo (`local`): DDP's buckets follow each other on its group and cost
                    # as one transfer of their sum, one latency (measured: DDP's two calls of
                    # small at 16 emulated ranks are in flight 118 and 123 ms, not twice the
                    # 67 ms one costs alone); the last, issued once the backward is done, at
                    # least its own cost. On GPUs each bucket is an NCCL call of its own and
                    # pays its own latency, as nccl-tests times every call (below).
                    last = comm.name.endswith(f":{len(buckets) - 1}")
                    return max(t_ar * comm.share, t_last if last else 0.0)
                return costs_model.comm_ms(comm, n, per_node, comm_bytes(comm))

            # The step the trainer runs (its program), on the fastest rank's compute: what
            # it hides under its forward, backward and table step, and what it waits for.
            phases = {"forward": float(model_ms.min()) / 3, "backward": 2 * float(model_ms.min()) / 3,
                      "table_update": 0.0, "optimizer": 0.0}
            ran = replay(program, cost, phases, sync_ms, carry)
            alone = replay(program, cost, phases, sync_ms, carry_alone, shared_link=False)
            carry, carry_alone = ran.carry, alone.carry
            # Collectives in flight together share the links: what sharing exposed.
            shared = max(0.0, ran.exposed_ms - alone.exposed_ms)
            hidden_by = {name: ms - ran.exposed_by.get(name, 0.0) for name, ms in ran.comm_ms.items()}
            kinds = {op.comm.name: op.comm for op in program.ops if hasattr(op, "comm")}
            # Communication kernels on SMs slow the compute they overlap: a copy-engine
            # transport's row exchanges do not, NCCL's between nodes with its CTAs capped less.
            def sm_share(comm) -> float:
                if not (prof.sm_free and comm.payload in ROW_PAYLOADS):
                    return 1.0
                return prof.nodes_sm_share if comm.scope in ("nodes", "rail") else 0.0

            on_sm = sum(ms * sm_share(kinds[name]) for name, ms in hidden_by.items())
            slowed = transport_slow * min(max(on_sm, 0.0), float(model_ms.min()))
            # Host syncs inside the step (a GPU drains its launch queue; the host then
            # relaunches): the device waits, outside communication.
            c, busy = c + slowed + ran.sync_ms, busy + slowed
            if not gpu_hosts and prep_ms:  # `local`: the rank thread's own CPU, a compute span
                c, busy, cpu = c + prep_ms * corun * share, busy + prep_ms * corun, cpu + prep_ms * corun
            t = float(c.max()) + ran.exposed_ms - ran.sync_ms
            t_in = sum(ms for name, ms in ran.comm_ms.items() if kinds[name].payload in INPUT_PAYLOADS)
            t_samples = sum(ms for name, ms in ran.comm_ms.items() if kinds[name].payload in SAMPLE_PAYLOADS)
            # The optimizer steps the tables after the gradients arrived, on every rank.
            if prof.tables.placement == "replicated":
                updated = held_rows
            else:
                updated = float(unique_rows(w, np.array([tokens.sum() + samples.sum() + w.negatives_per_step]),
                                            samples.sum(), zipf_s)[0]) / n
            upd = costs_model.table_ms(updated * w.model.row_dim, replicated=prof.tables.placement == "replicated")
            upd_wall = upd * table_corun * share
            c, t = c + upd_wall, t + upd_wall
            busy = busy + (0.0 if emulated else upd * table_corun)
            cpu = cpu + upd * table_corun
            # The input stage plans ahead of the step (prefetched), so the plan costs the
            # step nothing until it takes longer than the step: then every rank waits for it.
            plan_stall = max(0.0, stage_pace_ms - t)
            c, t = c + plan_stall, t + plan_stall
            # Each rank's loader worker is a process of its own: spare cores run it, and
            # what they cannot take preempts the ranks, a share per core. A preempted
            # rank waits in the run queue (other idle) and delays its peers at their next
            # collective (they wait in communication).
            # The collectives' own CPU (`local`: gloo's threads) competes for the cores
            # with the compute while it is hidden under it; exposed, the rank waits anyway.
            comm_cpu = sum(costs_model.collective_cpu_ms(kinds[name].op, n, comm_bytes(kinds[name])) * hid / ms
                           for name, ms in ran.comm_ms.items() if (hid := hidden_by[name]) > 0 and ms > 0)
            steal = worker_preemption_ms(n, cores, worker_ms + comm_cpu, t,
                                         costs_model.timeshare_efficiency(run.trainer, n))
            c, t = c + steal / n, t + steal
            # A rank waits in communication for the rest of the step (for its peers
            # included); the metrics' one split of idle time into causes does the rest.
            causes = rank_causes(t, busy, t - c, np.full(n, input_wait + plan_stall))
            rows.append({
                "step": k, "step_time_ms": t, "busy_max_ms": float(busy.max()),
                "busy_mean_ms": float(busy.mean()), "cpu_mean_ms": float(np.mean(cpu)),
                "idle_ms": float(causes["idle"].sum()), "straggler_ms": float(causes["straggler"].sum()),
                "exposed_comm_ms": float(causes["exposed_comm"].sum()),
                "input_stall_ms": float(causes["input_stall"].sum()),
                "other_idle_ms": float(causes["other_idle"].sum()), "capacity_ms": n * t,
                "num_samples": float(samples.sum()), "num_targets": float(tokens.sum()),
                "plan_ms": plan_ms, "route_ms": route_ms, "prep_ms": prep_ms,
                "input_exchange_ms": t_in, "sample_exchange_ms": t_samples, "plan_stall_ms": plan_stall,
                "comm_cpu_ms": comm_cpu,
                # Every transfer of the step, and what the shared links exposed of them.
                "link_ms": sum(ran.comm_ms.values()), "shared_link_ms": shared,
                "host_sync_ms": ran.sync_ms,
                **{f"exposed_ms:{kind}": ms for kind, ms in ran.exposed_by_kind().items()},
                # No split of whole samples can beat the larger of the mean load and the
                # costliest single sample: the bubble's floor for this batch.
                "bound_busy_max_ms": max(float(busy.mean()),
                                         float(all_costs[np.concatenate(owners)].max()) * enc_busy
                                         + (0.0 if emulated else upd * table_corun)),
            })
    return summarize_steps(run, rows, cluster, routed_by_line, chunking), rows


def write_simulated(run: RunConfig, cluster: Cluster, out_dir: str | Path, store: str | Path,
                    scaling: str, profile: SimProfile | None = None,
                    planner_time: bool = True) -> tuple[Path, dict]:
    """Simulate one (trainer, world size) and store it as a run: manifest (`simulated`),
    summary.json in the measured schema, steps.csv."""
    import pandas as pd

    from fsbench.running import store as runs_store

    summary, rows = simulate_run(run, cluster, store, profile, planner_time=planner_time)
    run_dir = runs_store.create_run_dir(out_dir, run)
    summary["run_id"] = run_dir.name
    pd.DataFrame(rows).to_csv(run_dir / "steps.csv", index=False)
    summary = runs_store.write_summary(run_dir, summary)
    runs_store.update_manifest(run_dir, status="complete", simulated=True, oversubscribed=False,
                               cluster=dataclasses.asdict(cluster), scaling=scaling)
    return run_dir, summary


def scaled_workload(workload: WorkloadConfig, world_size: int, scaling: str,
                    batch_per_rank: int | None) -> WorkloadConfig:
    """weak: batch_per_rank samples per rank at every world size; strong: the workload's
    global batch at every world size."""
    if scaling == "weak":
        return dataclasses.replace(workload, global_batch_size=world_size * batch_per_rank)
    if workload.global_batch_size < world_size:
        raise ConfigError(f"--scaling strong: global_batch_size={workload.global_batch_size} "
                          f"is smaller than world size {world_size}")
    return workload
