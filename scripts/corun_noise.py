"""How noisy is `fsbench calibrate`'s co-run slowdown on this machine?

Measures it `--times` times the way calibrate does (fsbench.costmodel.corun: 2 rounds, the
median of 10 timings of a 64-token batch, solo and on every core), and beside each, 5
rounds paired (solo then co-run, a ratio per round). Backs the co-run paragraph of
results/sim_hist_check_cpu.md. Keep the machine quiet while it runs (about 40 s a line).

    python scripts/corun_noise.py [--lengths hist:FILE] [--times 3] [--repeats 10 --rounds 2]
"""
from __future__ import annotations

import argparse
import statistics

from fsbench.config_io import override_all
from fsbench.costmodel import corun
from fsbench.workloads.presets import get_workload


def paired(workload, rounds: int) -> list[float]:
    ratios = []
    for _ in range(rounds):
        solo = statistics.median(corun._time_in_processes("encoder", workload, 64, 10, 1))
        both = statistics.median(corun._time_in_processes("encoder", workload, 64, 10, 2))
        ratios.append(both / solo)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="movielens-100k")
    ap.add_argument("--times", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timings per process (median)")
    ap.add_argument("--rounds", type=int, default=2, help="solo / co-run rounds")
    ap.add_argument("--no-paired", action="store_true", help="skip the 5 paired rounds")
    args = ap.parse_args()
    w = override_all(get_workload("small"), [("lengths", args.lengths)])
    for _ in range(args.times):
        as_calibrate = corun.measure_corun_slowdown(w, repeats=args.repeats, rounds=args.rounds)[0]
        line = f"calibrate's way ({args.repeats} timings, {args.rounds} rounds) {as_calibrate:.3f}"
        if not args.no_paired:
            rounds = paired(w, 5)
            line += f"; paired rounds {[round(r, 3) for r in rounds]} (median {statistics.median(rounds):.3f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
