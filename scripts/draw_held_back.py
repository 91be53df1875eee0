"""Draw a held-back set for scripts/sim_validation.py: five groups of the sets' shape,
each variant drawn at random, so that nobody picks points the model happens to fit.

Groups, in order (the shape of every set since the sixth):
  1. `small`, lengths and batch size, at 1 and 2 ranks (model) and 8 (emulated);
  2. `small`, lengths, at 2 (model) and 4 (emulated);
  3. `comm-heavy`, lengths and batch size, at 2 (model) and 16 (emulated);
  4. `small` with the SASRec encoder, lengths, at 2 (model) and 8 (emulated);
  5. `small`, batch size, at 4 (emulated).
Per group: the lengths' kind (lognormal, power law, uniform or a preset, in equal
chance), then its parameters (lognormal mu 2-4.5, sigma 0.5-1.5; power law alpha
1.5-2.5, xmin 2-10; uniform low 2-30, high 60-200; one of the length presets), then the
batch size (48, 64, 96, 160, 192, 256; for the batch-only group, once all six were
drawn, 32 to 320 in steps of 16), in that order from one generator. A group equal
to one of an earlier set is drawn again (the generator's next draws). Prints the set as
a Python tuple, to paste into sim_validation.py and commit before any point runs. With
--number N, the sets before N count as earlier (to draw set N again: set 9 is
`python scripts/draw_held_back.py 202612069 --number 9`).

    python scripts/draw_held_back.py SEED [--number N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_validation import HELD_BACK_SETS  # noqa: E402

from fsbench.specs import LENGTH_PRESET_SPECS  # noqa: E402

BATCHES = (48, 64, 96, 160, 192, 256)
WIDER_BATCHES = tuple(range(32, 321, 16))
"""Drawn from once a shape that draws a batch size alone has used every one of BATCHES
(set 12 on: sets 6-11 used all six)."""
SHAPES = (  # (preset, model changes, draws lengths, draws batch, points)
    ("small", (), True, True, ((1, "model"), (2, "model"), (8, "emulated"))),
    ("small", (), True, False, ((2, "model"), (4, "emulated"))),
    ("comm-heavy", (), True, True, ((2, "model"), (16, "emulated"))),
    ("small", (("model.family", "sasrec"),), True, False, ((2, "model"), (8, "emulated"))),
    ("small", (), False, True, ((4, "emulated"),)),
)


def lengths(rng: np.random.Generator) -> str:
    kind = rng.integers(4)
    if kind == 0:
        return f"lognormal:mu={rng.uniform(2.0, 4.5):.1f},sigma={rng.uniform(0.5, 1.5):.1f}"
    if kind == 1:
        return f"powerlaw:alpha={rng.uniform(1.5, 2.5):.1f},xmin={rng.integers(2, 11)}"
    if kind == 2:
        return f"uniform:{rng.integers(2, 31)}-{rng.integers(60, 201)}"
    return sorted(LENGTH_PRESET_SPECS)[rng.integers(len(LENGTH_PRESET_SPECS))]


def draw(seed: int, number: int) -> tuple:
    rng = np.random.default_rng(seed)
    earlier = {(preset, changes) for k, s in HELD_BACK_SETS.items() if k < number
               for preset, changes, _ in s}
    groups = []
    for preset, model, with_lengths, with_batch, points in SHAPES:
        batches = BATCHES
        if with_batch and not with_lengths and all(
                (preset, model + (("global_batch_size", str(b)),)) in earlier for b in BATCHES):
            batches = WIDER_BATCHES
        for _ in range(10_000):
            changes = model + ((("lengths", lengths(rng)),) if with_lengths else ())
            if with_batch:
                changes += (("global_batch_size", str(batches[rng.integers(len(batches))])),)
            if (preset, changes) not in earlier:
                break
        else:
            raise SystemExit(f"every variant of the shape {preset} {model} was drawn before")
        groups.append((preset, changes, points))
    return tuple(groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("--number", type=int, default=max(HELD_BACK_SETS) + 1,
                    help="the set's number: the sets before it count as earlier (default: a new set)")
    args = ap.parse_args()
    for group in draw(args.seed, args.number):
        print(f"    {group!r},")


if __name__ == "__main__":
    main()
