"""The simulator costs the step each trainer runs: a trainer's declared program
(fsbench.training.step_program; SimProfile.program, what `fsbench simulate` replays) against
its recorded timeline, on real emulated runs at 2 and 4 ranks (gloo, the encoder's compute
replaced by waiting its calibrated time).

For ddp, torchrec and each of FreeScale's switch sets (overlap, priority, chunks; the
transport is `collective` here: sm_free needs GPUs, docs/gpu.md): in every steady step
(a step before it, and steps after it for the requests travelling ahead) and on every
rank, the order of issues and waits and the phase each falls in equal the program's; and the program replayed by the simulator's
engine on that step's measured compute and collective times exposes what the rank was
measured to wait in its transports' waits. A change to a trainer's step that its program
does not follow fails here, so the simulator never costs a schedule the trainer left."""
import json
import warnings

import numpy as np
import pytest

from timing import ContendedMachineWarning

from fsbench.cli import main
from fsbench.config_io import run_from_dict
from fsbench.measurement.recorded_step import PHASE_OF_SPAN, same_order, step_events
from fsbench.scaling.ddp_buckets import step_buckets
from fsbench.scaling.simulate import profile_of
from fsbench.scaling.step_engine import Carry, replay
from fsbench.training.step_program import Compute, Issue, StepProgram, Wait

pytestmark = pytest.mark.dist

STEPS = 7
STEADY = (1, 2)  # a step before each; the requests travel up to four steps ahead, so
#                   each reads and sends a control message (freescale_impl.request_pipeline)
SETS = {
    "ddp": ("ddp", {}),
    "torchrec": ("torchrec", {}),
    "blocking": ("freescale", {"overlap": "off", "priority": "off"}),
    "overlap": ("freescale", {"priority": "off", "chunks": "1"}),
    "overlap-chunks": ("freescale", {"priority": "off", "chunks": "4"}),
    "priority": ("freescale", {"chunks": "1"}),
    "priority-chunks": ("freescale", {"chunks": "4"}),
    # two "nodes" of 2 ranks: each exchange in two hops (freescale_impl.rail_transport)
    "hierarchical": ("freescale", {"chunks": "2", "a2a": "hierarchical", "node_ranks": "2"}),
}
# Every set at 2 ranks and 4 (twice the cores), the two hops at 4 (at 2: one node, flat).
CASES = [(name, n) for n in (2, 4) for name in SETS if n == 4 or name != "hierarchical"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """One folder of fits every run's store shares: the first emulated run calibrates the
    encoder into it, the others read it."""
    store = tmp_path_factory.mktemp("programs")
    (store / "calibrations").mkdir()
    return store


def recorded_run(store, name: str, n: int, attempt: int = 0):
    """(the trainer's declared program, each rank's timeline records, whether the run was
    contended) of one emulated run."""
    trainer, sets = SETS[name]
    here = store / f"{name}-{n}-{attempt}"
    args = ["run", "--workload", "tiny", "--set", "compute=emulated", "--trainer", trainer,
            "--world-size", str(n), "--steps", str(STEPS), "--warmup", "1", "--store", str(here)]
    for key, value in sets.items():
        args += ["--set", f"{trainer}.{key}={value}"]
    here.mkdir()
    (here / "calibrations").symlink_to(store / "calibrations")
    assert main(args) == 0
    (run_dir,) = [d for d in here.iterdir() if (d / "summary.json").exists()]
    run = run_from_dict(json.loads((run_dir / "run_spec.json").read_text()))
    # with the chunks the run chose (its manifest): the simulator chooses them by the same rule
    ran = json.loads((run_dir / "manifest.json").read_text()).get("trainer_ran", {})
    program = profile_of(run.trainer, run.trainer_options, n).program(step_buckets(run.workload), n,  # one host
                                                                      ran.get("chunks", 1), run.workload)
    ranks = [[json.loads(line) for line in open(run_dir / f"rank-{r}.jsonl")] for r in range(n)]
    return program, ranks, bool(json.loads((run_dir / "summary.json").read_text())["contended"])


def measured_replay(program, records: list[dict], step: int) -> tuple[float, float, float]:
    """(exposed by the program replayed on this step's measured times, exposed measured,
    the step's time):
    compute phases their spans' time; each collective its flight's time, from the later
    of its issue and the end of the flight before it (the engine queues them itself);
    a collective issued the step before arrives when its flight ended. Only the waits a
    span records (transports' and TorchRec's input dist) are compared."""
    def flights(k):
        return sorted((r for r in records if r["kind"] == "flight" and r.get("step") == k),
                      key=lambda r: r["start_ns"])
    start = next(r["start_ns"] for r in records if r["kind"] == "step" and r.get("step") == step)
    issues = [op.comm for op in program.ops if isinstance(op, Issue)]
    mine, before = flights(step), flights(step - 1)
    assert len(mine) == len(issues)
    ms, link_end = {}, 0
    for comm, f in zip(issues, mine):
        begin = max(f["start_ns"], link_end)
        ms[comm.name] = max(0, f["start_ns"] + f["dur_ns"] - begin) / 1e6
        link_end = max(link_end, f["start_ns"] + f["dur_ns"])
    arrivals = {comm.name: (f["start_ns"] + f["dur_ns"] - start) / 1e6
                for comm, f in zip(issues, before) if comm.next_step}
    phase_ms = {}
    for r in records:
        if r.get("step") == step and r["kind"] == "compute" and r["name"] in PHASE_OF_SPAN:
            phase = PHASE_OF_SPAN[r["name"]]
            phase_ms[phase] = phase_ms.get(phase, 0.0) + r["dur_ns"] / 1e6
    forwards = sorted((r for r in records if r.get("step") == step and r["kind"] == "compute"
                       and r["name"] == "forward"), key=lambda r: r["start_ns"])
    parts = [i for i, op in enumerate(program.ops) if isinstance(op, Compute) and op.phase == "forward"]
    ops = list(program.ops)
    if all(ops[i].own_span for i in parts):
        # Sub-batches' forwards, each in its own span after its chunk's waits (FreeScale):
        # each part its span's share of the forward; the empty sub-batches (last: they
        # leave no span) none.
        total = sum(r["dur_ns"] for r in forwards) or 1
        shares = [r["dur_ns"] / total for r in forwards] + [0.0] * (len(parts) - len(forwards))
        for i, share in zip(parts, shares):
            ops[i] = Compute("forward", share, own_span=True)
    else:
        # Where in the forward the rows are read: the real encoder reads them first (the
        # simulator's share 0), the emulated one after its wait; the replay reads them
        # where this run did.
        fwd = forwards[0]
        reads = [r["start_ns"] for r in records if r.get("step") == step and r["kind"] == "comm"
                 and r["name"].endswith(".wait") and fwd["start_ns"] <= r["start_ns"] <= fwd["start_ns"] + fwd["dur_ns"]]
        if reads:
            read = (min(reads) - fwd["start_ns"]) / fwd["dur_ns"]
            ops = [Compute("forward", read if op.share == 0.0 else 1.0 - read)
                   if isinstance(op, Compute) and op.phase == "forward" else op for op in ops]
    program = StepProgram(tuple(ops))
    ran = replay(program, lambda c: ms[c.name], phase_ms, carry=Carry(arrivals))
    spanned = {op.comm.name for op in program.ops if isinstance(op, Wait) and not op.implicit}
    predicted = sum(v for k, v in ran.exposed_by.items() if k in spanned)
    measured = sum(r["dur_ns"] for r in records if r.get("step") == step and r["kind"] == "comm"
                   and not r["name"].endswith(".issue")) / 1e6
    step_ms = next(r["dur_ns"] for r in records if r["kind"] == "step" and r.get("step") == step) / 1e6
    return predicted, measured, step_ms


def check(store, name: str, n: int, tries: int = 3) -> None:
    """The order on every try (it cannot depend on the machine's load); the exposure on
    the first uncontended run (a neighbour's load lengthens gloo's flights, not the
    waits' share of the step alike)."""
    for attempt in range(tries):
        program, ranks, contended = recorded_run(store, name, n, attempt)
        expected = program.events()
        for rank, records in enumerate(ranks):
            for step in STEADY:
                recorded = step_events(records, step)
                assert same_order(recorded, expected), (name, n, rank, step, recorded, expected)
        if not contended:
            break
    else:
        # Not failed even under CI=true: 4 emulated ranks on 2 cores can read contended on
        # an idle machine (they wait their turn for a core); the order was checked above.
        warnings.warn(ContendedMachineWarning(f"{name} at {n} ranks: every run contended, exposure not judged"))
        return
    predicted, measured, step_ms = np.array([measured_replay(program, records, step)
                                             for records in ranks for step in STEADY]).sum(0)
    # The engine books what the spans measured, give or take what it does not see: the
    # work between ops that no phase holds (routing, lookups, Python: it hides more in
    # the run than in the replay) and a flight's wait for its slowest peer. Within a
    # quarter of the step.
    assert abs(predicted - measured) <= step_ms / 4, (name, n, predicted, measured, step_ms)


@pytest.mark.parametrize("name,n", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_the_recorded_step_is_the_declared_program(calibrated, name, n):
    check(calibrated, name, n)
