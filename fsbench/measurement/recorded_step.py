"""A recorded step read back as the ops of its program (fsbench.training.step_program).

From one rank's timeline records of one step:
  issue   every collective's flight (each collective leaves one: fsbench.measurement.flights),
          at its start, under its flight's name;
  wait    every comm span `<name>.wait` (a transport's wait), at its end (when what it
          waited for had come: a collective issued inside the wait comes before it);
  comm    every other comm span that is not an issue (`input_dist`: TorchRec's pipeline
          starts, or waits for, a later batch's ids inside it), at its end;
  where   the compute span the event falls in (`in forward`), else the last one that
          ended before it (`after backward`), else `start`. Only the step's phases count
          (forward, backward, sparse_optimizer as table_update, optimizer); smaller
          compute spans (routing, lookups) are part of whatever surrounds them.

Chunk suffixes stay (`emb.grad_c3`): a program names each chunk's collective.
"""
from __future__ import annotations

PHASE_OF_SPAN = {"forward": "forward", "backward": "backward", "sparse_optimizer": "table_update",
                 "optimizer": "optimizer"}


def step_events(records: list[dict], step: int) -> list[tuple[str, str, str]]:
    """(issue | wait | comm, name, where) of `step`, in the order they happened."""
    mine = [r for r in records if r.get("step") == step]
    phases = sorted(((r["start_ns"], r["start_ns"] + r["dur_ns"], PHASE_OF_SPAN[r["name"]])
                     for r in mine if r["kind"] == "compute" and r["name"] in PHASE_OF_SPAN))
    events = []
    for r in mine:
        if r["kind"] == "flight":
            events.append((r["start_ns"], "issue", r["name"]))
        elif r["kind"] == "comm" and not r["name"].endswith(".issue"):
            kind = "wait" if r["name"].endswith(".wait") else "comm"
            events.append((r["start_ns"] + r["dur_ns"], kind, r["name"].removesuffix(".wait")))
    out = []
    for t, kind, name in sorted(events):
        where = "start"
        for start, end, phase in phases:
            if start <= t <= end:
                where = f"in {phase}"
                break
            if end <= t:
                where = f"after {phase}"
        out.append((kind, name, where))
    return out


def grouped(events: list[tuple[str, str, str]]) -> list:
    """Waits that follow each other in one place as one set: which of a step's chunks a
    lookup reads first depends on the data, and nothing runs between them."""
    out = []
    for e in events:
        if e[0] == "wait" and out and isinstance(out[-1], tuple) and len(out[-1]) == 2 and out[-1][0] == e[2]:
            out[-1][1].add(e[1])
        elif e[0] == "wait":
            out.append((e[2], {e[1]}))
        else:
            out.append(e)
    return out


def same_order(recorded: list, declared: list) -> bool:
    """The recorded step runs the declared ops in order. A group of waits may lack some
    of the declared ones, or all of them: a chunk whose rows came in another chunk's
    message leaves nothing to wait for, and a message no lookup read (a rank whose later
    sub-batches are empty) is completed after the backward
    (ShardedEmbeddings.finish_gradients), in the first waits there."""
    rec, dec = grouped(recorded), grouped(declared)
    unread: set[str] = set()
    skipped: set[str] = set()  # groups recorded nowhere they were declared: must come late
    i = 0
    for d in dec:
        r = rec[i] if i < len(rec) else None
        if len(d) == 2 and not _waits_match(r, d, unread):
            unread |= d[1]  # none of this group's waits was needed where declared
            skipped |= d[1]
            continue
        if r is None or (len(r) == 2) != (len(d) == 2) or (len(r) == 3 and r != d):
            return False
        if len(r) == 2:
            unread = (unread - r[1]) | (d[1] - r[1])
            skipped -= r[1] if r[0] == "after backward" else set()
        i += 1
    return i == len(rec) and not skipped


def _waits_match(r, d, unread: set[str]) -> bool:
    """Recorded wait group `r` stands for declared group `d` (where they fall, and waits
    the declaration has there or left unread before, when after the backward)."""
    if r is None or len(r) != 2:
        return False
    late = unread if r[0] == "after backward" else set()
    return r[0] == d[0] and r[1] <= d[1] | late
