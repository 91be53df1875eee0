"""One description of a training step, shared by a trainer and the simulator.

A trainer declares its steady-state step as a program (`StepProgram`): an ordered list of
ops, the order the trainer's own code runs them in on every rank:

    Compute(phase, share)   the rank computes: `share` of `phase`'s time (forward,
                            backward, table_update, optimizer); a phase split by hooks
                            (DDP's buckets, a gradient chunk's send) appears in parts,
                            one split into spans (sub-batches' forwards) in `own_span` parts
    Issue(name)             a collective is issued (async); it carries `Comm.payload`
                            on `Comm.channel` (the process group or stream it runs on)
    Wait(name)              the rank blocks until it has arrived; `implicit`: inside a
                            phase, where no span of its own records it (DDP's finalize
                            inside backward, TorchRec's awaitables inside forward)
    HostSync()              the host reads a device value (on a GPU it drains the queue)

A collective whose `Comm.next_step` is true carries the next step's data: it is issued in
this step and waited in the next (the simulator carries its arrival over the boundary).

The simulator (fsbench.scaling.step_engine) costs exactly these ops: each collective's
bytes from its payload, each compute part from the phase's modelled time. The trainer's
recorded timeline (fsbench.measurement.recorded_step) reads back as the same ops, and
tests/test_step_programs.py compares the two on real emulated runs: if the code's order
of issues and waits drifts from the program, that test fails, so the simulator cannot go
on costing a step the trainer no longer runs.
"""
from __future__ import annotations

import dataclasses

PHASES = ("forward", "backward", "table_update", "optimizer")


@dataclasses.dataclass(frozen=True)
class Comm:
    """A collective of the step: its name as its flight records it, the operation (for its
    cost) and what it carries (`payload`: a key the simulator turns into bytes)."""
    name: str
    op: str  # all_reduce | all_to_all | all_gather
    payload: str
    share: float = 1.0
    """The part of the payload it carries (a chunk's, a bucket's)."""
    next_step: bool = False
    flight: str | None = None
    """The name its flight record carries, where not `name` (TorchRec's are its torch
    functions' names)."""
    scope: str = "all"
    """Which peers it reaches: all, the node's (`node`) or the other nodes' (`nodes`): an
    exchange split by node (FreeScale's sm_free beyond one node); every row among the
    node's ranks (`in_node`), then along a rail, one rank a node (`rail`): an exchange in
    two hops (FreeScale's a2a=hierarchical)."""
    channel: str = "world"
    """The communicator (process group) or copy stream that carries it: one stream on the
    GPU, so a channel's collectives run one after another, while different channels' run
    at once and share the links (fsbench.scaling.step_engine). `world`: the rank context's
    default group (fsbench.training.dist.RankContext.group), which DDP's buckets and every
    collective of a trainer without groups of its own go through."""

    @property
    def recorded(self) -> str:
        return self.flight or self.name


@dataclasses.dataclass(frozen=True)
class Compute:
    phase: str
    share: float = 1.0
    own_span: bool = False
    """The part is a span of its own (a sub-batch's forward): what follows it is `after`
    the phase even where more of the phase follows (else `in` it: a phase split by hooks)."""


@dataclasses.dataclass(frozen=True)
class Issue:
    comm: Comm


@dataclasses.dataclass(frozen=True)
class Wait:
    comm: Comm
    implicit: bool = False
    span: str | None = None  # the span that records the wait, where not `<name>.wait`


@dataclasses.dataclass(frozen=True)
class HostSync:
    pass


@dataclasses.dataclass(frozen=True)
class Span:
    """A comm span in which the rank only issues (TorchRec's `start_sparse_data_dist`):
    it blocks on nothing, but the timeline records it."""
    name: str


Op = Compute | Issue | Wait | HostSync | Span


@dataclasses.dataclass(frozen=True)
class StepProgram:
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        for op in self.ops:
            if isinstance(op, Compute):
                assert op.phase in PHASES, op.phase
        # Every collective of this step is waited in it, unless it carries the next step's
        # data; every wait of this step's data follows its issue.
        issued = {op.comm.name for op in self.ops if isinstance(op, Issue)}
        for op in self.ops:
            if isinstance(op, Wait) and not op.comm.next_step:
                assert op.comm.name in issued, f"{op.comm.name} waited, never issued"

    @property
    def host_syncs(self) -> int:
        return sum(isinstance(op, HostSync) for op in self.ops)

    def events(self) -> list[tuple[str, str, str]]:
        """What a recorded timeline can show of the step, in order
        (fsbench.measurement.recorded_step): (issue | wait | comm, the collective's or
        span's name, where: `in <phase>` or `after <phase>` (`start` before any compute)).
        `comm`: a comm span other than a transport's `<name>.wait`. Implicit waits and host
        syncs leave no record of their own."""
        out, where = [], "start"
        ops = [op for op in self.ops if not isinstance(op, HostSync)]
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                # Inside the phase while more of the same phase follows (hooks split it).
                later = next((o for o in ops[i + 1:] if isinstance(o, Compute)), None)
                inside = later is not None and later.phase == op.phase and not op.own_span
                where = f"in {op.phase}" if inside else f"after {op.phase}"
            elif isinstance(op, Issue):
                out.append(("issue", op.comm.recorded, where))
            elif isinstance(op, Span):
                out.append(("comm", op.name, where))
            elif not op.implicit:
                out.append(("comm", op.span, where) if op.span else ("wait", op.comm.recorded, where))
        return out


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One of DDP's gradient buckets: its bytes, and how far into the backward (0..1) its
    last gradient is ready (the encoder's gradients through the backward; a replicated
    table's, read first in forward, at its end)."""
    nbytes: float
    ready: float


def ddp_backward(buckets: list[Bucket], name: str = "ddp.allreduce", flight: str | None = None,
                 after_last: tuple[Op, ...] = (), share: float = 1.0) -> list[Op]:
    """DDP's backward: each bucket's all-reduce issued from the comm hook once it is full
    (`Bucket.ready`), all waited at backward's end inside it (DDP's finalize). `flight`:
    the name its flights carry (fsbench.training.dp's comm hook: `name`). `after_last`:
    what a trainer's hook issues right after the last bucket. `share`: the part of the
    backward in which every dense gradient is made (its last part, where the backward
    runs sub-batch by sub-batch: each parameter's gradient is complete only after the
    last sub-batch's backward), `Bucket.ready` read within it."""
    # Every bucket on the rank context's group (channel `world`): dp.wrap_ddp's comm hook
    # all-reduces on `ctx.group`, and TorchRec's DDP wrapper on its ShardingEnv's group,
    # the world group (torchrec.distributed.model_parallel.DefaultDataParallelWrapper).
    total = sum(b.nbytes for b in buckets) or 1.0
    ops: list[Op] = []
    comms, done = [], 0.0
    for i, b in enumerate(buckets):
        comm = Comm(f"{name}:{i}", "all_reduce", "dense_grads", b.nbytes / total, flight=flight or name)
        ops += [Compute("backward", share * max(0.0, b.ready - done)), Issue(comm)]
        comms.append(comm)
        done = max(done, b.ready)
    ops.append(Compute("backward", share * (1.0 - done)))
    # The hook's own issues and DDP's waits all sit inside the backward's span.
    return ops + list(after_last) + [Wait(comm, implicit=True) for comm in comms] + [Compute("backward", 0.0)]


def ddp_program(buckets: list[Bucket]) -> StepProgram:
    """A data-parallel step (fsbench.training.dp): forward, backward with DDP's buckets,
    the optimizer's step (tables included where they are replicated)."""
    return StepProgram((Compute("forward"), *ddp_backward(buckets), Compute("table_update"),
                        Compute("optimizer")))
