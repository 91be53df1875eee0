"""How many chunks a step's embedding exchange is cut into: one rule, which FreeScale's
trainer applies to its run (`freescale.chunks=0`) and the simulator to each world size it
projects (`SimProfile.chunks=0`), so both run and cost the same count.

A chunk is what one sub-batch of whole samples reads: the forward starts on the first
while the later ones fly, and in backward each gradient chunk leaves as soon as its
sub-batch has made it. But each chunk is an all-to-all of its own and pays the
collective's whole fixed cost, which grows with the ranks (tens to hundreds of
microseconds at 256 ranks on the h100 model). So the rule weighs what one more chunk saves against what it costs, on the cost model of
the run or projection (t: an all-to-all's time for a rank's buffer at this world size):

    going from C-1 to C chunks, the forward waits t(b/C) instead of t(b/(C-1)) (saved),
    and the link carries C t(b/C) instead of (C-1) t(b/(C-1)) (added: one more fixed
    cost, where t has one); C = the largest count <= CAP (and <= a rank's samples) up to
    which every step saves at least MARGIN times what it adds.

With a fixed cost a and a bandwidth B, a step to C chunks pays when a chunk's transfer
b/(C B) is at least (C - 1) a: each chunk's bytes against the collective's latency at this
world size, the latency growing with the ranks, the bytes a rank moves shrinking. The
rule reads t itself, so a model whose per-peer cost shrinks with small messages (the h100
model below 32 MiB) prices chunks as the simulator does. A chunk's bytes are a rank's
expected unique rows a step (sim_costs.expected_exchange_bytes: deterministic from the
workload) over C. The cost model (`a2a_model`) is the cluster's (h100 on CUDA unless
another is named), or on CPU this machine's `fsbench calibrate --comm` fit, else gloo's
default here. The record gives the chosen chunk's bytes, its transfer (at the bandwidth
of large messages) and the rest of its time (its fixed cost).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from fsbench.config import WorkloadConfig
from fsbench.errors import ConfigError

CAP = 4
"""At most 4 chunks: past the first few sub-batches, the part of the exchange that waits
before the forward (one chunk's) shrinks little while the latencies keep adding."""
MARGIN = 1.0
"""Break-even: a chunk is added when the wait it takes off the forward is at least the
link time it adds (the same holds for the gradients in backward, where a chunk leaves as
its sub-batch's backward makes it). Break-even is enough because the added time is
itself mostly hidden where chunks matter: a sub-batch's compute on a GPU (milliseconds)
outlasts a chunk's flight (tens to hundreds of microseconds)."""
LARGE_BYTES = 1 << 30
"""Messages large enough that their time grows by bandwidth alone (the fixed part is
saturated on every model here: the h100 model's from 32 MiB): where the slope is read."""

# (world size, a rank's buffer in bytes) -> milliseconds of one all-to-all
A2aMs = Callable[[int, float], float]


@dataclasses.dataclass(frozen=True)
class ChunkChoice:
    """The count an exchange runs with, and why (stored in a run's manifest and in every
    simulated summary)."""
    chunks: int
    why: str
    """replay (the shortest replayed step: fsbench.scaling.chunk_replay) | rule (the links
    alone, where no encoder cost is known) | asked (freescale.chunks=N) | blocking (one exchange before the forward) |
    one rank (nothing crosses a link) | rank 0's (a rank whose rule gave another count
    takes rank 0's)"""
    world_size: int
    model: str | None = None
    """The all-to-all cost model the rule read (None where it read none)."""
    chunk_bytes: float | None = None
    """A rank's bytes a chunk at the chosen count."""
    latency_us: float | None = None
    """That chunk's fixed cost."""
    transfer_us: float | None = None
    """That chunk's time at the all-to-all's bandwidth."""
    predicted_ms: dict | None = None
    """`replay`: each tried candidate's predicted step, '4' or '8x1.5' (count x growth:
    fsbench.scaling.chunk_replay)."""
    growth: float = 1.0
    """Each sub-batch's tokens against the one before's (1: equal)."""
    route: str = ""
    """How the exchanges are routed, where the replay chose it among a trainer's routes
    (FreeScale's a2a=auto: flat or hierarchical); empty where nothing was chosen."""

    def record(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for logs and tables: 'chunks=2 (rule on h100 at 256 ranks: ...)'."""
        grown = f" growth={self.growth:g}" if self.growth != 1.0 and self.chunks > 1 else ""
        grown += f" {self.route}" if self.route else ""
        if self.why == "replay":
            steps = ", ".join(f"{c}: {ms:.4g}" for c, ms in self.predicted_ms.items())
            return (f"chunks={self.chunks}{grown} (replay on {self.model} at {self.world_size} ranks, "
                    f"predicted step ms by count (x growth) {steps})")
        if self.why != "rule":
            return f"chunks={self.chunks}{grown} ({self.why})"
        return f"chunks={self.chunks} (rule on {self.model} at {self.world_size} ranks: {self.figures()})"

    def figures(self) -> str:
        """What the rule weighed at the chosen count: '5.75 MB a chunk, transfer 14.3 us
        against latency 12 us'."""
        def us(v: float) -> str:
            return f"{v:.3g}" if v < 1000 else f"{v:,.0f}"

        return (f"{self.chunk_bytes / 1e6:.3g} MB a chunk, transfer {us(self.transfer_us)} us "
                f"against latency {us(self.latency_us)} us")


def choose_chunks(workload: WorkloadConfig, n: int, a2a_ms: A2aMs | None, model: str | None,
                  asked: int = 0, blocking: bool = False, estimate=None,
                  growths: tuple[float, ...] = (1.0,)) -> ChunkChoice:
    """The chunk count of `workload`'s embedding exchange on n ranks: `asked` where > 0
    (freescale.chunks=N wins), 1 for the blocking exchange and on one rank; else, with an
    `estimate` of the step (fsbench.scaling.chunk_replay.StepEstimate), the count whose
    replayed step is shortest; else the module's rule on `a2a_ms` (the all-to-all's cost
    model, named `model`)."""
    if blocking:
        return ChunkChoice(1, "blocking", n)
    if asked > 0:  # with the cut asked (one growth), else equal tokens
        return ChunkChoice(asked, "asked", n, growth=growths[0] if len(growths) == 1 else 1.0)
    if n <= 1:
        return ChunkChoice(1, "one rank", n)
    if estimate is not None:
        from fsbench.scaling.chunk_replay import choose_by_replay

        chosen, growth, route, predicted = choose_by_replay(workload, n, estimate, growths)
        return ChunkChoice(chosen, "replay", n, estimate.name or model, predicted_ms=predicted, growth=growth,
                           route=route)
    from fsbench.scaling.sim_costs import expected_exchange_bytes

    total = expected_exchange_bytes(workload, n)
    s_per_byte = (a2a_ms(n, 2 * LARGE_BYTES) - a2a_ms(n, LARGE_BYTES)) / LARGE_BYTES / 1e3
    cap = max(1, min(CAP, workload.global_batch_size // n))  # a sub-batch holds whole samples

    def measure(c: int) -> tuple[float, float, float]:
        b = total / c
        transfer = b * s_per_byte
        return b, max(0.0, a2a_ms(n, b) / 1e3 - transfer), transfer

    def t(c: int) -> float:  # one chunk's all-to-all, in seconds
        return a2a_ms(n, total / c) / 1e3

    chosen = 1
    for c in range(2, cap + 1):  # what a step saves only shrinks as chunks shrink
        saved, added = t(c - 1) - t(c), c * t(c) - (c - 1) * t(c - 1)
        if saved < MARGIN * added:
            break
        chosen = c
    b, latency, transfer = measure(chosen)
    return ChunkChoice(chosen, "rule", n, model, b, latency * 1e6, transfer * 1e6)


# gloo's all-to-all where no comm fit is stored: 0.25 ms a peer, 1 ns a byte moved
# ((N - 1) / N of a rank's buffer). From `fsbench calibrate --comm` on this repository's
# 2-core VM at 2 ranks: 4 KiB 0.26 ms, 2 MiB 1.25 ms, 32 MiB 16.1 ms (its six sizes within
# 15% of this line).
GLOO_DEFAULT = "gloo default (0.25 ms a peer, 1 ns a byte)"


def _gloo_default() -> A2aMs:
    from fsbench.scaling.commcal import CommFit

    fit = CommFit("all_to_all", 0.0, 0.25e-3, 1e-9, 0.0, [])
    return lambda n, b: fit.seconds(n, b) * 1e3


def a2a_model(spec: str, device: str, store: str | Path | None) -> tuple[A2aMs, str]:
    """(the all-to-all's cost, its name) that a run's rule reads. `spec` (freescale.chunk_cluster):
    auto: on CUDA the h100 preset, on CPU the store's gloo fit (`fsbench calibrate --comm`)
    where there is one, else GLOO_DEFAULT; local: the store's comm fit, whatever made it
    (gloo here, or a cluster's nccl-tests logs); a preset name or a cluster file."""
    from fsbench.scaling.collectives import collective_s
    from fsbench.scaling.commcal import CommFit, comm_fit_path, load_comm_fits
    from fsbench.scaling.sim_inputs import load_cluster

    if spec in ("auto", "local"):
        if spec == "auto" and device == "cuda":
            return a2a_model("h100", device, store)
        fit = ((load_comm_fits(store) if store is not None else None) or {}).get("all_to_all")
        if fit is not None and (spec == "local" or isinstance(fit, CommFit)):
            return (lambda n, b: fit.seconds(n, b) * 1e3), f"local ({comm_fit_path(store)})"
        if spec == "local":
            raise ConfigError(f"freescale.chunk_cluster=local: no all_to_all fit in "
                              f"{comm_fit_path(store or '.')}: run fsbench calibrate --comm, or "
                              "choose auto, a preset or a cluster file")
        return _gloo_default(), GLOO_DEFAULT
    cluster = load_cluster(spec)
    return (lambda n, b: collective_s(cluster, "all_to_all", n, b) * 1e3), cluster.name


def check_chunk_cluster(spec: str, name: str) -> None:
    """A one-line error unless `spec` names a cost model a2a_model reads."""
    from fsbench.scaling.sim_inputs import CLUSTERS

    if spec in ("auto", *CLUSTERS) or Path(spec).suffix in (".toml", ".json"):
        return
    raise ConfigError(f"{name}={spec!r} is not allowed; choose auto, {', '.join(CLUSTERS)} "
                      "or a cluster file (.toml, .json)")
