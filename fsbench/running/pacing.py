"""Lockstep pacing: two runs on one machine take turns, a block of steps at a time.

Why: on a shared VM the CPU's speed wanders by +-15% within seconds and the median step
time of identical code differs by up to 30% between runs a minute apart (whole-run
pairs resolved only 21.9% of step time: results/gate_calibration_cpu.md at 4c37a91), so a gate
that runs A, then B, needs dozens of pairs to see a 10% change. Blocks of a few steps
that alternate between A and B a fraction of a second apart see nearly the same machine:
the difference of two adjacent windows varies far less than that of two runs (fsbench
gate pairs block k of A with block k of B; fsbench.gates.compare). A and B run the same seed,
so block k holds the same batches on both sides.

Protocol (files in a shared directory; `fsbench.gates.gate` is the other end):
  the run, on rank 0, at every step that is a multiple of `block_steps`, and once more
  after its last step, creates `<side>.parked.<k>` (k = step // block_steps) and waits
  for `<side>.go.<k>`; the other ranks wait in the start barrier meanwhile (a blocking
  socket wait: no CPU). Parked time falls before the step's start barrier returns, so no
  step's time contains it.
The run learns its turn-taking from FSBENCH_PACE=<dir>:<side>:<block_steps> (set by the
gate), and rank 0 writes `pace.json` into the run directory so that compare can pair the
blocks.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "FSBENCH_PACE"
# A run waits at most this long for its turn; the gate gives one within a block's time
# unless it died.
TURN_TIMEOUT_S = 900.0
POLL_S = 0.005  # a parked run and the gate wake this often: under 1% of a core


@dataclass(frozen=True)
class Pace:
    directory: Path
    side: str
    block_steps: int

    @staticmethod
    def from_env() -> "Pace | None":
        value = os.environ.get(ENV)
        if not value:
            return None
        rest = value.rsplit(":", 2)
        if len(rest) != 3 or not rest[2].isdigit() or int(rest[2]) < 1:
            raise ValueError(f"{ENV}={value!r}: expected DIR:SIDE:BLOCK_STEPS with BLOCK_STEPS >= 1")
        return Pace(Path(rest[0]), rest[1], int(rest[2]))

    def env_value(self) -> str:
        return f"{self.directory}:{self.side}:{self.block_steps}"

    def parked(self, block: int) -> Path:
        return self.directory / f"{self.side}.parked.{block}"

    def go(self, block: int) -> Path:
        return self.directory / f"{self.side}.go.{block}"


class Pacer:
    """The run's end of the protocol; a no-op without FSBENCH_PACE or off rank 0."""

    def __init__(self, rank: int, run_dir: Path, steps: int) -> None:
        self.pace = Pace.from_env()
        self.active = self.pace is not None and rank == 0
        self.steps = steps
        if self.active:
            (run_dir / "pace.json").write_text(json.dumps(
                {"group": str(self.pace.directory), "side": self.pace.side,
                 "block_steps": self.pace.block_steps}))

    def before_step(self, step: int) -> None:
        """At a block's first step (and with step == steps, after the last): park, wait."""
        if not self.active or step % self.pace.block_steps and step != self.steps:
            return
        block = -(-step // self.pace.block_steps)
        self.pace.parked(block).touch()
        go, deadline = self.pace.go(block), time.monotonic() + TURN_TIMEOUT_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"pacing: no turn for block {block} within {TURN_TIMEOUT_S:.0f} s "
                                   f"({go} never appeared: did the gate stop?)")
            time.sleep(POLL_S)


def blocks(steps: int, block_steps: int) -> int:
    """Pace points of a run of `steps` steps: one per block, and one after the last step."""
    return -(-steps // block_steps) + 1
