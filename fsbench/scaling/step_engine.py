"""Cost a step's program (fsbench.training.step_program) on one rank's timeline.

The simulator's one account of communication: it walks the trainer's declared ops in
order. Compute advances the clock by its phase's share; a wait blocks until its collective
has arrived, and that block is exposed communication; a host sync costs its drain.

Collectives move as a fluid over the rank's links. A collective uses the links of the
peers it reaches (`LINKS_OF_SCOPE`): one over every peer the node's (NVLink) and the NIC's,
one among the node's peers only the node's, one among the other nodes' only the NIC's.
Within one channel (`Comm.channel`: a process group's communicator, or a copy stream, each
one stream on the GPU) collectives run one after another, each starting once the one
before it has arrived. Across channels they run at once and share each link equally: a
collective progresses at the smallest of 1 / (collectives active on the link) over its
links, and arrives once it has done its cost (`cost_ms(comm)`, its time alone) at that
rate. So a small exchange on its own group beside DDP's all-reduce takes twice its time,
not the all-reduce's; two parts of one exchange split by node, on links of their own, fly
side by side at full rate.

A collective that carries the next step's data arrives across the step boundary: what is
still in flight at the step's end (its work left, and what queues behind it on its
channel) is carried into the next step's replay, where it goes on sharing the links.

Nothing here knows a trainer: what hides and what is exposed follows from where the
program issues and waits each collective, and on which channel.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Callable

from fsbench.training.step_program import Compute, HostSync, Issue, StepProgram, Wait

NEXT = "@next"  # marks a next-step collective issued in this step, in flight
LINKS_OF_SCOPE = {"all": ("node", "nic"), "node": ("node",), "nodes": ("nic",),
                  "in_node": ("node",), "rail": ("nic",)}
"""The links a collective uses, by the peers it reaches (Comm.scope; fsbench.scaling.sim_costs
`scope_ranks`)."""


@dataclasses.dataclass
class Flight:
    """A collective issued and not yet arrived."""
    name: str
    channel: str
    links: tuple[str, ...]
    left_ms: float  # its work left, in ms at rate 1 (all of it while queued)
    started: bool = False  # at the head of its channel, progressing (else queued behind it)


@dataclasses.dataclass
class Carry:
    """What one step leaves for the next. `arrivals`: next-step collectives' fixed arrival
    times in ms from the next step's start (those arrived already, <= 0, or measured ones);
    `in_flight`: the collectives still moving at the step's end, then those queued behind
    them (each channel's in its order), each with its work left."""
    arrivals: dict[str, float] = dataclasses.field(default_factory=dict)
    in_flight: tuple[Flight, ...] = ()


@dataclasses.dataclass
class Replay:
    step_ms: float  # the rank's time through the program, blocks included
    exposed_ms: float  # blocked in waits (and in host syncs' drains: `sync_ms`)
    sync_ms: float
    comm_ms: dict[str, float]  # each collective's cost alone on its links
    exposed_by: dict[str, float]  # each collective's part of `exposed_ms`
    waits: list[str]  # the order the rank waited in
    carry: Carry

    def exposed_by_kind(self) -> dict[str, float]:
        """`exposed_by` summed over each kind of collective, a chunk's or bucket's index
        dropped (`emb.fetch_c2.nodes` -> `emb.fetch.nodes`, `ddp.allreduce:3` ->
        `ddp.allreduce`): what limits a step's hiding, by what the trainer waits for."""
        out: dict[str, float] = {}
        for name, ms in self.exposed_by.items():
            kind = re.sub(r"_c\d+|:\d+", "", name)
            out[kind] = out.get(kind, 0.0) + ms
        return out


class Fluid:
    """The rank's collectives in flight: each channel's queue, each started collective's
    work left, and when each arrived. `shared=False`: every collective starts at its issue
    and moves at rate 1 (links of its own, no queue)."""

    def __init__(self, shared: bool, flights: tuple[Flight, ...] = ()) -> None:
        self.shared, self.now = shared, 0.0
        self.running: dict[str, Flight] = {}
        self.queued: dict[str, collections.deque[Flight]] = collections.defaultdict(collections.deque)
        self.arrived: dict[str, float] = {}
        for f in flights:  # copies: the carry stays as the step before left it
            self._enter(dataclasses.replace(f))

    def _enter(self, f: Flight) -> None:
        busy = any(g.channel == f.channel for g in self.running.values()) or self.queued[f.channel]
        if f.started or not self.shared or not busy:
            f.started = True
            self.running[f.name] = f
        else:
            self.queued[f.channel].append(f)

    def issue(self, name: str, channel: str, links: tuple[str, ...], work_ms: float, at: float) -> None:
        self.advance(at)
        # A name is issued again only once its last flight was waited (a step's control
        # message, the next step's rows), or arrived where nobody waits for it (a copy
        # stream's barrier: FreeScale's sm_free transport): two of one name in flight would be a
        # program bug.
        assert name in self.arrived or not self.holds(name), f"{name} issued twice in flight"
        self.arrived.pop(name, None)
        self._enter(Flight(name, channel, links, work_ms))

    def holds(self, name: str) -> bool:
        return (name in self.running or name in self.arrived
                or any(f.name == name for q in self.queued.values() for f in q))

    def _rates(self) -> dict[str, float]:
        if not self.shared:
            return {name: 1.0 for name in self.running}
        active = collections.Counter(link for f in self.running.values() for link in f.links)
        return {name: min(1.0 / active[link] for link in f.links) for name, f in self.running.items()}

    def advance(self, until: float, awaited: str | None = None) -> None:
        """Move the fluid to `until`, or (`awaited`) until that collective has arrived."""
        while self.running and (awaited is None or awaited not in self.arrived):
            rates = self._rates()
            dt = min(f.left_ms / rates[name] for name, f in self.running.items())
            if awaited is None and self.now + dt > until:
                dt = max(0.0, until - self.now)
            for name, f in self.running.items():
                f.left_ms -= rates[name] * dt
            self.now += dt
            done = [name for name, f in self.running.items() if f.left_ms <= 1e-9]  # ms: rounding
            if not done:
                break  # reached `until` with every collective still moving
            for name in done:
                f = self.running.pop(name)
                self.arrived[name] = self.now
                if self.queued[f.channel]:  # the next of its channel starts now
                    nxt = self.queued[f.channel].popleft()
                    nxt.started = True
                    self.running[nxt.name] = nxt
        if awaited is None:
            self.now = max(self.now, until)
        assert awaited is None or awaited in self.arrived, f"{awaited} waited, never issued"

    def left(self) -> tuple[Flight, ...]:
        """What is in flight now: the started, then each channel's queue in order."""
        return (*self.running.values(), *(f for q in self.queued.values() for f in q))


def replay(program: StepProgram, cost_ms: Callable[[object], float], phase_ms: dict[str, float],
           host_sync_ms: float = 0.0, carry: Carry | None = None, shared_link: bool = True) -> Replay:
    """One step of `program`: `cost_ms(comm)` each collective's time alone on its links,
    `phase_ms[phase]` each compute phase's whole time. `carry`: the previous step's (None:
    the first step, whose next-step collectives were issued at its start, all at once, in
    the order it waits for them). `shared_link=False`: every collective has links of its
    own and no queue (to tell what sharing costs)."""
    carry = carry or Carry()
    fluid = Fluid(shared_link, carry.in_flight)
    fixed = dict(carry.arrivals)
    comm_ms: dict[str, float] = {}
    exposed_by: dict[str, float] = {}
    waits: list[str] = []
    sync = 0.0

    def issue(comm, at: float, key: str) -> None:
        d = comm_ms[comm.name] = cost_ms(comm)
        fluid.issue(key, comm.channel, LINKS_OF_SCOPE[comm.scope], d, at)

    for op in program.ops:  # the first step: what it waits for from the step before
        if isinstance(op, Wait) and op.comm.next_step and op.comm.name not in fixed \
                and not fluid.holds(op.comm.name):
            issue(op.comm, 0.0, op.comm.name)
    t = 0.0
    for op in program.ops:
        if isinstance(op, Compute):
            t += phase_ms.get(op.phase, 0.0) * op.share
        elif isinstance(op, HostSync):
            t += host_sync_ms
            sync += host_sync_ms
        elif isinstance(op, Issue):
            # A next-step collective's wait in this step is for the one the step before
            # issued (FreeScale's final rows are sent before the last ones are waited):
            # this step's flies under a name of its own until the boundary.
            issue(op.comm, t, op.comm.name + NEXT if op.comm.next_step else op.comm.name)
        elif isinstance(op, Wait):
            name = op.comm.name
            if name in fixed:
                end = fixed.pop(name)
            else:
                fluid.advance(t)
                if name not in fluid.arrived:  # the rank blocks; it issues nothing meanwhile
                    fluid.advance(math.inf, awaited=name)
                end = fluid.arrived.pop(name)
            waits.append(name)
            if end > t:
                exposed_by[name] = exposed_by.get(name, 0.0) + end - t
                t = end
    fluid.advance(t)
    arrived = {k.removesuffix(NEXT): v - t for k, v in fluid.arrived.items() if k.endswith(NEXT)}
    left = tuple(dataclasses.replace(f, name=f.name.removesuffix(NEXT)) for f in fluid.left())
    exposed = sum(exposed_by.values())
    return Replay(t, exposed + sync, sync, comm_ms, exposed_by, waits, Carry(arrived, left))
