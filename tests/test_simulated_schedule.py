"""The simulator books FreeScale's exchange as the trainer runs it (freescale_impl.sharded_step,
embedding_exchange, transport): a latency per chunk, a forward that runs sub-batch by
sub-batch (each after its own chunk), gradient chunks as the backward makes them (chunk 0 after DDP's
last bucket), host syncs inside the step, and no SM-free transport
across nodes. Each test changes one thing and checks what it costs, on the h100 preset
with the planner's time left out (nothing here depends on this machine's speed)."""
import dataclasses

import pytest

from fsbench.config import RunConfig
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import profile_of, scaled_workload, simulate_run
from fsbench.training.step_program import Bucket, Compute, HostSync, StepProgram
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import get_workload

H100 = CLUSTERS["h100"]
NO_LAUNCHES = dataclasses.replace(H100, name="no-launches", layer_overhead_ms=0.0)
SHARDED = {"balance": "off", "tables": "sharded", "overlap": "on", "priority": "off",
           "transport": "collective"}


def run_at(n: int, **sets) -> RunConfig:
    w = scaled_workload(dataclasses.replace(get_workload("medium"), steps=4, warmup=1), n, "weak", 32)
    return RunConfig(workload=w, trainer="freescale", world_size=n,
                     trainer_options=trainer_options("freescale", {**SHARDED, **sets}))


def steps_of(run: RunConfig, cluster=H100, **profile_changes):
    profile = dataclasses.replace(profile_of(run.trainer, run.trainer_options, run.world_size),
                                  **profile_changes)
    return simulate_run(run, cluster, "unused", profile=profile, planner_time=False)[1][1:]


def test_sm_free_beyond_a_node_splits_each_exchange_and_its_capped_ctas_take_fewer_sms():
    """Beyond one node each row exchange is the node's rows on copy engines and the other
    nodes' on NCCL (freescale_impl.node_transport): both in the program, and the part
    between nodes slows the compute it overlaps by its share of NCCL's CTAs."""
    program = profile_of("freescale", trainer_options("freescale", {**SHARDED, "transport": "sm_free"}),
                         16).program([Bucket(1.0, 1.0)], 8, 1)
    names = {op.comm.name for op in program.ops if hasattr(op, "comm")}
    assert {"emb.fetch_c0.node", "emb.fetch_c0.nodes", "emb.grad_c0.node", "emb.grad_c0.nodes"} <= names
    run = run_at(64, transport="sm_free", priority="on")
    capped = steps_of(run_at(64, transport="sm_free", priority="on", comm_ctas="4"))
    for full, few in zip(steps_of(run)[1:], capped[1:]):
        assert few["busy_max_ms"] < full["busy_max_ms"]  # less of the compute slowed


def test_the_two_hop_exchange_goes_inside_the_node_then_along_the_rail_and_pays_fewer_peers():
    """a2a=hierarchical beyond one node (freescale_impl.rail_transport): each exchange is
    hop 1 among the node's ranks, then hop 2 among one rank a node, on one channel (hop 2
    leaves once hop 1 has arrived); the rank waits for hop 2 alone on GPUs, and on CPU
    ranks the host waits for hop 1 too. On h100, two hops at 256 ranks cost less than one
    flat all-to-all of the same rows (M - 1 + G - 1 peers against N - 1), and the
    simulated step is shorter; on one node nothing changes."""
    from fsbench.scaling.sim_costs import Costs
    from fsbench.training.step_program import Issue, Span, Wait

    def ops(n, gpu, **sets):
        opts = trainer_options("freescale", {**SHARDED, "a2a": "hierarchical", **sets})
        return profile_of("freescale", opts, n).program([Bucket(1.0, 1.0)], 8, 1, None, 1.0, gpu).ops

    on_gpus = ops(64, True)
    fetch = [op for op in on_gpus if getattr(op, "comm", None) and op.comm.name.startswith("emb.fetch_c0")]
    assert [(type(op), op.comm.name) for op in fetch] == [
        (Issue, "emb.fetch_c0.node"), (Issue, "emb.fetch_c0.nodes"), (Wait, "emb.fetch_c0.nodes")]
    assert {op.comm.channel for op in fetch} == {"emb.rail"}
    assert [op.comm.scope for op in fetch[:2]] == ["in_node", "rail"]
    assert Span("emb.fetch_c0.splits") in on_gpus
    on_cpus = [(type(op), op.comm.name) for op in ops(64, False) if getattr(op, "comm", None)]
    assert (Wait, "emb.fetch_c0.node") in on_cpus
    one_node = ops(8, True)
    assert not [op for op in one_node if getattr(op, "comm", None) and op.comm.channel == "emb.rail"]

    costs = Costs(H100, run_at(256).workload, ".")
    nbytes = 8 << 20
    flat = costs.collective_ms("all_to_all", 256, nbytes)
    two = sum(costs.comm_ms(op.comm, 256, 8, nbytes) for op in fetch[:2])
    assert two < flat
    assert costs.comm_ms(fetch[1].comm, 256, 8, nbytes) == pytest.approx(
        costs.collective_ms("all_to_all", 32, nbytes, gpus_per_node=1))
    hops, one = (steps_of(run_at(256, a2a=a, priority="on")) for a in ("hierarchical", "flat"))
    for a, b in zip(hops, one):
        assert a["step_time_ms"] < b["step_time_ms"]


def test_each_chunk_pays_its_own_latency_and_the_forward_starts_on_the_first():
    # The exchange alone: launches (each sub-batch's pass repeats them) held out, below.
    one, four = (steps_of(run_at(256, chunks=c), NO_LAUNCHES) for c in ("1", "4"))
    for a, b in zip(one, four):
        # forward rows and backward gradients, 3 more all-to-alls each: their fixed cost
        # at 256 ranks at least (alpha) on the link, whatever the chunks' sizes
        assert b["link_ms"] - a["link_ms"] >= 2 * 3 * H100.alpha_s * 1e3 * 0.99
        # but sub-batch c waits only for chunk c: the later chunks fly under the forward
        assert b["exposed_comm_ms"] < a["exposed_comm_ms"]
        assert b["step_time_ms"] < a["step_time_ms"]


def test_the_overlapped_forward_waits_for_every_chunk_and_the_gradients_follow_the_backward():
    """As built, `overlap=on` without priority and with one chunk hides nothing of the
    embedding exchange: its step is the blocking one's."""
    run = run_at(256)
    blocking = steps_of(dataclasses.replace(run, trainer_options=trainer_options(
        "freescale", {**SHARDED, "overlap": "off"})))
    overlapped = steps_of(run_at(256, chunks="1"))
    for a, b in zip(blocking, overlapped):
        assert b["step_time_ms"] == pytest.approx(a["step_time_ms"], rel=1e-9)
        assert b["exposed_comm_ms"] == pytest.approx(a["exposed_comm_ms"], rel=1e-9)


def test_priority_hides_the_final_rows_under_the_backward_only():
    run = run_at(256, priority="on")
    with_priority = steps_of(run)
    without = steps_of(run_at(256))
    # the next step's final rows fly during this backward: less exposed than waiting for all
    assert sum(r["exposed_comm_ms"] for r in with_priority) < sum(r["exposed_comm_ms"] for r in without)


def test_host_syncs_cost_the_device_its_relaunch_on_gpus_and_nothing_is_busy_in_them():
    run = run_at(64, tables="replicated")  # a step without syncs of its own
    program = profile_of(run.trainer, run.trainer_options, 64).program
    quiet = steps_of(run)
    synced = steps_of(run, program=lambda b, g, c, w, x=1.0, gpu=False, r="": StepProgram(program(b, g, c, w, x, gpu, r).ops + (HostSync(),) * 5))
    for a, b in zip(quiet, synced):
        assert b["step_time_ms"] - a["step_time_ms"] == pytest.approx(5 * H100.host_sync_s * 1e3, rel=1e-6)
        assert b["busy_max_ms"] == pytest.approx(a["busy_max_ms"])
        assert b["other_idle_ms"] > a["other_idle_ms"]


def test_freescale_declares_the_host_syncs_of_its_step():
    def syncs(**sets):
        return profile_of("freescale", trainer_options("freescale", {**SHARDED, **sets}), 64).program(
            [Bucket(1.0, 1.0)], 8, int(sets.get("chunks", 1))).host_syncs

    # the last control message (later steps' counts, ids, fresh masks), read at the
    # step's start: one, with or without priority, and none between forward and backward
    assert syncs() == 1
    assert syncs(priority="on") == 1
    assert syncs(tables="replicated") == 0
    ops = profile_of("freescale", trainer_options("freescale", SHARDED), 64).program([Bucket(1.0, 1.0)], 8, 1).ops
    first_forward = next(i for i, op in enumerate(ops) if isinstance(op, Compute) and op.phase == "forward")
    assert [i for i, op in enumerate(ops) if isinstance(op, HostSync)][0] < first_forward
    # copy engines: no more, each receiver pulls its own slot (freescale_impl.transport
    # slot_plan; each exchange read its peers' offsets back before: 1 + 4 here)
    assert syncs(transport="sm_free", chunks="2") == 1
    names = {op.comm.name for op in profile_of("freescale", trainer_options(
        "freescale", {**SHARDED, "transport": "sm_free"}), 8).program([Bucket(1.0, 1.0)], 8, 2).ops
        if hasattr(op, "comm")}
    assert "emb.fetch_c0.staged" in names and not [n for n in names if "offsets" in n]


def test_the_order_check_tells_chunks_made_in_the_backward_from_chunks_held_for_dense():
    """FreeScale's gradient chunks used to wait for DDP's last bucket; now chunk 1 leaves
    as sub-batch 1's backward makes it, ahead of DDP's buckets. Written as a program, the
    order check (tests/test_step_programs.py) tells the schedule the trainer left from the
    one it runs. (Where inside a phase a wait falls, the first chunk's or the last's,
    leaves the order alone: that one the exposed-time comparison there checks.)"""
    from fsbench.measurement.recorded_step import same_order
    from fsbench.training.step_program import Issue
    from freescale_impl.step_schedule import sharded_step_program

    built = sharded_step_program("overlapped", 2, "exchanged", "collective", [Bucket(1.0, 1.0)])
    assert same_order(built.events(), built.events())
    ops = list(built.ops)
    issued = [op.comm.name for op in ops if isinstance(op, Issue)]
    assert issued.index("emb.grad_c1") < issued.index("ddp.allreduce:0") < issued.index("emb.grad_c0")
    grad = next(op for op in ops if isinstance(op, Issue) and op.comm.name == "emb.grad_c1")
    held = [op for op in ops if op is not grad]
    last_bucket = next(i for i, op in enumerate(held) if isinstance(op, Issue) and op.comm.name == "ddp.allreduce:0")
    held[last_bucket + 1:last_bucket + 1] = [grad]
    assert not same_order(built.events(), StepProgram(tuple(held)).events())


def test_the_order_check_takes_unread_chunks_late_and_nowhere_else():
    """A rank whose later sub-batches are empty reads none of chunks 1..3 in its forward:
    their messages are completed after the backward (ShardedEmbeddings.finish_gradients).
    The order check takes the declared waits there; waits that never come, or come
    anywhere else, fail it."""
    from fsbench.measurement.recorded_step import same_order
    from freescale_impl.step_schedule import sharded_step_program

    declared = sharded_step_program("overlapped", 4, "exchanged", "collective", [Bucket(1.0, 1.0)]).events()
    late = {f"emb.fetch_c{c}" for c in (1, 2, 3)}
    after_forward = [e for e in declared if e[0] == "wait" and e[1] in late]
    assert [e[2] for e in after_forward] == ["after forward"] * 3
    rest = [e for e in declared if e not in after_forward]
    first_late = next(i for i, e in enumerate(rest) if e[0] == "wait" and e[2] == "after backward")
    unread = [("wait", name, "after backward") for name in sorted(late)]
    assert same_order(rest[:first_late] + unread + rest[first_late:], declared)
    assert not same_order(rest, declared)  # never waited
    assert not same_order(rest[:first_late] + [("wait", n, "in backward") for n in sorted(late)]
                          + rest[first_late:], declared)  # waited elsewhere


def test_smaller_dense_buckets_leave_a_smaller_last_bucket_after_the_backward():
    """dense_bucket_mb (every trainer's DDP buckets): at 256 GPUs on `medium` DDP's 25 MiB
    holds the whole dense part in one bucket, ready only when the backward ends; the
    default (4 MiB) leaves a last bucket of at most 4 MiB and the rest hides under the
    backward, though each bucket pays its own latency. FreeScale in full at 128 samples a
    GPU (the paper table's point): with fewer a GPU the first sub-batch, which hosts every
    dense bucket, holds a sample or two and 4 MiB gains nothing (docs/simulation.md,
    "Dense buckets")."""
    from fsbench.scaling.ddp_buckets import ddp_buckets, dense_grad_bytes

    w = get_workload("medium")
    assert w.dense_bucket_mb == 4.0
    default, ddps = (ddp_buckets(list(dense_grad_bytes(w)), mb * 2**20) for mb in (w.dense_bucket_mb, 25.0))
    assert len(ddps) == 1 and default[-1] <= 4 * 2**20 < ddps[-1] and len(default) > 1
    w = scaled_workload(dataclasses.replace(get_workload("medium"), steps=4, warmup=1), 256, "weak", 128)
    run = RunConfig(workload=w, trainer="freescale", world_size=256, trainer_options=trainer_options("freescale", {}))
    coarse = dataclasses.replace(run, workload=dataclasses.replace(run.workload, dense_bucket_mb=25.0))
    for a, b in zip(steps_of(coarse), steps_of(run)):
        assert b["exposed_comm_ms"] < a["exposed_comm_ms"]


def test_each_sub_batch_is_a_pass_that_launches_every_layer_again():
    """A sub-batch is a pass of the encoder: 4 chunks launch every layer 4 times. The host
    launches ahead, so a pass takes the longer of its kernels and its launches; the
    kernels (busy) are the same however the samples are cut, and a launch-bound pass's gap
    is idle, not busy (ARCHITECTURE: busy is compute kernels)."""
    # no slowdown of compute by communication on SMs: busy is the kernels alone
    launching = dataclasses.replace(H100, sm_slowdown=0.0)
    quiet = dataclasses.replace(launching, layer_overhead_ms=0.0)
    launch = H100.layer_overhead_ms * get_workload("medium").model.num_layers
    one, four = (steps_of(run_at(256, chunks=c), launching) for c in ("1", "4"))
    held_out = steps_of(run_at(256, chunks="4"), quiet)
    for a, b, c in zip(one, four, held_out):
        assert b["busy_max_ms"] == pytest.approx(c["busy_max_ms"], rel=1e-9)  # launches: never busy
        assert b["busy_max_ms"] == pytest.approx(a["busy_max_ms"], rel=1e-9)  # the same kernels
        # 32 samples a GPU of `medium`: a rank's kernels take less than one pass's
        # launches, so four passes take four launches at least, and one pass one
        assert c["busy_max_ms"] < launch
        assert b["step_time_ms"] >= 4 * launch > a["step_time_ms"] >= launch
