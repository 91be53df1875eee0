"""Cost a step's program (fsbench.training.step_program) on one rank's timeline.

The simulator's one account of communication: it walks the trainer's declared ops in
order. Compute advances the clock by its phase's share; an issued collective takes the
links it uses when they are free (collectives in flight together share one rank's links,
so they follow each other) and holds them for its cost: a collective over every peer the
node's (NVLink) and the NIC's, one among the node's peers only the node's, one among the
other nodes' only the NIC's (an exchange split by node: its two parts fly side by side); a wait blocks until its collective
has arrived, and that block is exposed communication; a host sync costs its drain. A
collective that carries the next step's data arrives across the step boundary: its
arrival, and the link's backlog, are carried into the next step's replay.

Nothing here knows a trainer: what hides and what is exposed follows from where the
program issues and waits each collective.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from fsbench.training.step_program import Compute, HostSync, Issue, StepProgram, Wait


@dataclasses.dataclass
class Carry:
    """What one step leaves in flight for the next: arrival of each next-step collective
    and each link's backlog, in ms from the next step's start."""
    arrivals: dict[str, float] = dataclasses.field(default_factory=dict)
    link_free: dict[str, float] = dataclasses.field(default_factory=dict)


LINKS_OF_SCOPE = {"all": ("node", "nic"), "node": ("node",), "nodes": ("nic",)}
"""The links a collective holds, by the peers it reaches (Comm.scope)."""


@dataclasses.dataclass
class Replay:
    step_ms: float  # the rank's time through the program, blocks included
    exposed_ms: float  # blocked in waits (and in host syncs' drains: `sync_ms`)
    sync_ms: float
    comm_ms: dict[str, float]  # each collective's cost on the link
    exposed_by: dict[str, float]  # each collective's part of `exposed_ms`
    waits: list[str]  # the order the rank waited in
    carry: Carry


def replay(program: StepProgram, cost_ms: Callable[[object], float], phase_ms: dict[str, float],
           host_sync_ms: float = 0.0, carry: Carry | None = None, shared_link: bool = True) -> Replay:
    """One step of `program`: `cost_ms(comm)` each collective's time on the link,
    `phase_ms[phase]` each compute phase's whole time. `carry`: the previous step's (None:
    the first step, whose next-step collectives were issued at its start, all at once).
    `shared_link=False`: every collective has links of its own (to tell what sharing costs)."""
    carry = carry or Carry()
    t, free = 0.0, {link: carry.link_free.get(link, 0.0) for link in ("node", "nic")}
    arrival = dict(carry.arrivals)
    comm_ms: dict[str, float] = {}
    exposed_by: dict[str, float] = {}
    waits: list[str] = []
    sync = 0.0
    next_step: dict[str, float] = {}
    for op in program.ops:
        if isinstance(op, Compute):
            t += phase_ms.get(op.phase, 0.0) * op.share
        elif isinstance(op, HostSync):
            t += host_sync_ms
            sync += host_sync_ms
        elif isinstance(op, Issue):
            d = comm_ms[op.comm.name] = cost_ms(op.comm)
            links = LINKS_OF_SCOPE[op.comm.scope]
            start = max(t, *(free[k] for k in links)) if shared_link else t
            end = start + d
            if shared_link:
                free.update({k: end for k in links})
            (next_step if op.comm.next_step else arrival)[op.comm.name] = end
        elif isinstance(op, Wait):
            name = op.comm.name
            if name not in arrival:  # the first step: issued at its start
                d = comm_ms.setdefault(name, cost_ms(op.comm))
                links = LINKS_OF_SCOPE[op.comm.scope]
                start = max(free[k] for k in links) if shared_link else 0.0
                arrival[name] = start + d
                if shared_link:
                    free.update({k: arrival[name] for k in links})
            end = arrival.pop(name)
            waits.append(name)
            if end > t:
                exposed_by[name] = exposed_by.get(name, 0.0) + end - t
                t = end
    exposed = sum(exposed_by.values())
    out = Carry({k: v - t for k, v in next_step.items()}, {k: max(0.0, v - t) for k, v in free.items()})
    return Replay(t, exposed + sync, sync, comm_ms, exposed_by, waits, out)
