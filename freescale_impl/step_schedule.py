"""FreeScale's step with sharded tables as ops (fsbench.training.step_program): what
`freescale_impl.sharded_step` runs, in its order, for each switch set. The simulator costs
this program; tests/test_step_programs.py holds it against the trainer's recorded timeline
at 2 and 4 ranks, so a change to the step that is not made here too fails there.

Payloads (the simulator turns them into bytes): rows / final_rows / fresh_rows (a rank's
rows, all of them, those the previous update cannot change, those it can), row_grads,
control / control_priority (exchanged routing's control message: later steps' counts and
ids, with priority their fresh masks), samples (data=sharded's exchange), barrier (the
copy-engine transport's own collective)."""
from __future__ import annotations

import dataclasses

from fsbench.training.step_program import (Bucket, Comm, Compute, HostSync, Issue, Op, Span, StepProgram,
                                           Wait, ddp_backward)


# The channels (Comm.channel: one GPU stream each) its collectives run on, as
# freescale_impl.sharded_step builds them: the exchanges get a group of their own
# (ShardedTableTrainer.__init__'s `dist.new_group`), so they never queue behind DDP's
# buckets, which go through the rank context's group (`world`: fsbench.training.dp's comm
# hook on `ctx.group`), as data=sharded's sample exchange does (exchange_samples(...,
# group=ctx.group)).
EMB = "emb"
"""The exchanges' group: the collective transport's rows and gradients and the control
messages (ShardedEmbeddings.control is a CollectiveTransport on it)."""
COPY = "emb.copy"
"""The copy-engine transport's stream (SmFreeTransport.stream): an exchange's staging, its
two barriers and its pulls, one after another, so an exchange starts once the one before
it is done."""
NODES = "emb.nodes"
"""Beyond one node, the group across nodes with NCCL's CTAs capped (node_split_transport's
`across`): the other nodes' rows."""
RAIL = "emb.rail"
"""a2a=hierarchical (freescale_impl.rail_transport): both hops of an exchange, one after
the other, as one channel: hop 2 leaves once hop 1 has arrived (on a GPU its side stream
waits, not the rank). A bound: on a GPU the next exchange's hop 1 may fly beside this
one's hop 2."""


def _parts(comm: Comm, mode: str) -> list[Comm]:
    """A row exchange's collectives on the transport (`mode`: collective | sm_free |
    sm_free between nodes | rail*, two hops): itself on the exchanges' group; the copy
    engines' pulls; the node's pulls and the other nodes' part beside them; every row
    among the node's ranks, then every row along the rail (one rank a node)."""
    if mode == "collective":
        return [dataclasses.replace(comm, channel=EMB)]
    if mode == "sm_free":
        return [dataclasses.replace(comm, channel=COPY)]
    if mode.startswith("rail"):
        return [dataclasses.replace(comm, name=f"{comm.name}.node", scope="in_node", channel=RAIL),
                dataclasses.replace(comm, name=f"{comm.name}.nodes", scope="rail", channel=RAIL)]
    return [dataclasses.replace(comm, name=f"{comm.name}.node", scope="node", channel=COPY),
            dataclasses.replace(comm, name=f"{comm.name}.nodes", scope="nodes", channel=NODES)]


def _exchange(comm: Comm, mode: str) -> list[Op]:
    """Issuing one row exchange on the transport. The copy-engine transport queues on its
    stream its staging, a barrier (every rank staged), the pulls (the exchange) and a
    barrier (every peer pulled): the rank waits for none of them here, and for the pulls
    alone where it needs the rows (`_arrived`); no offsets are swapped and the host never
    waits (freescale_impl.transport.SmFreeTransport). Between nodes it does so for the
    node's rows only, while NCCL carries the other nodes' rows, its CTAs capped
    (freescale_impl.node_transport)."""
    parts = _parts(comm, mode)
    if mode == "collective":
        return [Issue(parts[0])]
    node = parts[0]
    staged = Comm(f"{node.name}.staged", "all_to_all", "barrier", scope=node.scope, channel=node.channel)
    pulled = Comm(f"{node.name}.pulled", "all_to_all", "barrier", scope=node.scope, channel=node.channel)
    if mode.startswith("rail"):
        # The node's send splits, all-gathered on the host first (no device time); on CPU
        # ranks the host then waits for hop 1 before it issues hop 2.
        hop1 = [Issue(staged), Issue(node), Issue(pulled)] if mode == "rail_sm_free" else [Issue(node)]
        waited = [Wait(node)] if mode == "rail_host" else []
        return [Span(f"{comm.name}.splits"), *hop1, *waited, Issue(parts[1])]
    return [Issue(staged), Issue(node), Issue(pulled), *(Issue(p) for p in parts[1:])]


def _arrived(comm: Comm, mode: str) -> list[Op]:
    parts = _parts(comm, mode)
    if mode == "collective":
        return [Wait(parts[0])]
    if mode.startswith("rail"):
        return [Wait(parts[1])]  # hop 2's output is the exchange's
    return [Wait(p) for p in parts]


def sharded_step_program(exchange: str, chunks: int, routing: str, transport: str,
                         buckets: list[Bucket], sample_exchange: bool = False,
                         cut: tuple[tuple[float, ...], tuple[float, ...]] | None = None) -> StepProgram:
    """The steady-state step (neither the first nor the last two) of
    `ShardedTableTrainer`: exchange is blocking | overlapped | prioritized; routing host |
    exchanged (the requests' counts and ids travel over the steps before); transport
    collective | sm_free | sm_free_nodes (sm_free beyond one node) | rail, rail_host,
    rail_sm_free (a2a=hierarchical beyond one node: on GPUs, on CPU ranks, with copy
    engines inside the node). `cut`: (each
    sub-batch's share of the forward and backward, each chunk's share of the rows), as the
    trainer cuts them (exchange_plan.expected_sub_batches: about equal tokens, so chunk 0,
    which holds the negatives and the popular items, is the largest); None: equal."""
    chunks = 1 if exchange == "blocking" else chunks
    if cut is None:
        cut = ((1 / chunks,) * chunks, (1 / chunks,) * chunks)
    assert len(cut[0]) == len(cut[1]) == chunks, (cut, chunks)
    sub_shares, row_shares = cut
    priority = exchange == "prioritized"
    rows = "fresh_rows" if priority else "rows"
    # Priority: this step's rows were sent during the step before (next_step there).
    fetch = [Comm(f"emb.fetch_c{c}", "all_to_all", rows, row_shares[c], next_step=priority)
             for c in range(chunks)]
    final = Comm("emb.fetch_final", "all_to_all", "final_rows", next_step=True)
    grads = [Comm(f"emb.grad_c{c}", "all_to_all", "row_grads", row_shares[c]) for c in range(chunks)]
    ops: list[Op] = []
    if sample_exchange:  # data=sharded: lengths gathered, planned samples exchanged, blocking
        for name, payload in (("samples.lengths", "samples.lengths"), ("samples.meta", "sample_meta"),
                              ("samples.tokens", "sample_tokens")):
            comm = Comm(name, "all_to_all", payload)  # on the rank context's group: `world`
            ops += [Issue(comm), Wait(comm)]
    exchanged = routing == "exchanged"
    # Exchanged routing: one control message a step carries later steps' counts, ids and
    # fresh masks (freescale_impl.request_pipeline), read at the next step's start.
    control = Comm("emb.control", "all_to_all", "control_priority" if priority else "control",
                   next_step=True, channel=EMB)
    if not priority:
        for f in fetch:  # every row of this step, now
            ops += _exchange(f, transport)
    if exchanged:  # the last step's control read on the host (the step's one host sync)
        ops += [Wait(control), HostSync(), Issue(control)]
    elif priority:
        ops += _exchange(final, transport)  # host routing: the next step's final rows, now
    if exchange == "blocking":  # every row before the forward
        ops += [w for f in fetch for w in _arrived(f, transport)]
    # The forward runs sub-batch by sub-batch, each in a span of its own after the waits
    # for its chunk (freescale_impl.sub_batches): chunk 0 (and with priority the final
    # rows, sent the step before) before the first; chunk c after sub-batch c-1.
    for c in range(chunks):
        if exchange != "blocking":
            ops += [w for f in ([final] if priority and c == 0 else []) + [fetch[c]]
                    for w in _arrived(f, transport)]
        ops += [Compute("forward", sub_shares[c], own_span=True)]
    if exchanged and priority:  # the next step's final rows, planned at the step's start
        ops += _exchange(final, transport)
    # The backward runs sub-batch by sub-batch, the last first, and the backward's
    # collectives go through one queue in one order on every rank
    # (ShardedEmbeddings.grad_order): gradient chunk c >= 1 as soon as sub-batch c's
    # backward has made it; DDP's buckets in sub-batch 0's backward, which finishes every
    # dense gradient; chunk 0 (the shared negatives) after the last bucket. The blocking
    # version sends its one chunk after the backward.
    if exchange == "blocking":
        ops += ddp_backward(buckets) + [o for o in _exchange(grads[0], transport)]
    else:
        for c in range(chunks - 1, 0, -1):
            ops += [Compute("backward", sub_shares[c]), *_exchange(grads[c], transport)]
        ops += ddp_backward(buckets, share=sub_shares[0], after_last=tuple(_exchange(grads[0], transport)))
    ops += [w for g in reversed(grads) for w in _arrived(g, transport)]
    ops += [Compute("table_update")]
    if priority:  # the next step's fresh rows, first in line, after the update made them
        ops += [o for f in fetch for o in _exchange(f, transport)]
    return StepProgram((*ops, Compute("optimizer")))
