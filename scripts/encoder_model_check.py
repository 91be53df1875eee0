"""How well stored encoder fits predict jagged batches of other length distributions.

The simulator and the emulation book a rank's encoder time as the sum of its samples'
cost(L) plus the batch terms (fsbench.costmodel.fit.CostFit.batch_extra_ms), both
calibrated on the preset's own lengths. This times the real model's forward + backward
on batches drawn from length distributions the calibration never saw, at several
per-rank sizes, once, and sets each store's fit against the same timings (side by side:
this host's speed drifts by 5-20% within tens of minutes, so fits are compared on one
set of timings, never across runs). Each fit's drift, the encoder now on the preset's
own batches at the calibration seed against what the fit says of them
(fsbench.scaling.step_overhead.encoder_drift), is timed right after, and the errors are
also given with it taken out: what is left is the model's, not the host's.

    python scripts/encoder_model_check.py --store runs_a [--store runs_b ...] [--workload small]
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import torch

from fsbench.config_io import override_all
from fsbench.models import build_model
from fsbench.costmodel.batch_terms import bucket_count
from fsbench.costmodel.fit import fit_path, load_fit
from fsbench.costmodel.timing import CALIBRATION_SEED, time_encoder_ms
from fsbench.scaling.step_overhead import encoder_drift
from fsbench.workloads.generator import SyntheticBatches
from fsbench.workloads.presets import get_workload

DISTRIBUTIONS = ("powerlaw:alpha=1.8,xmin=3", "lognormal:mu=2.4,sigma=0.9", "lognormal:mu=3.3,sigma=0.9",
                 "powerlaw:alpha=2.3,xmin=3", "lognormal:mu=4.0,sigma=0.5")
"""Not a preset's (calibration's) lengths: held-back set 9's three (whose misses led to the
padded square and the footprint term, so these are development lengths for that model)
and two more."""


def time_batches(workload, distributions, sizes, batches: int, repeats: int) -> list[dict]:
    model = build_model(workload, seed=0)
    timed = []
    for spec in distributions:
        for n in sizes:
            source = SyntheticBatches(dataclasses.replace(workload, lengths=spec, global_batch_size=n), seed=100 + n)
            for k in range(batches):
                batch = source.global_batch(k)
                timed.append({"lengths": spec, "samples": n, "batch": batch.lengths.numpy(),
                              "ms": time_encoder_ms(model, batch, repeats, warmup=1)})
        print(f"timed {spec}", flush=True)
    return timed


def footprint_lines(workload, fit, repeats: int) -> list[str]:
    """Fixed-length batches of growing size against cost(L) (timed on ~2,048 tokens): the
    per-token slowdown the footprint term books (fsbench.costmodel.batch_terms)."""
    model = build_model(workload, seed=0)
    lines = ["## A batch's footprint: fixed lengths at growing token counts, over cost(L)\n",
             "| length | 2,048 tokens | 4,096 | 8,192 | 16,384 |", "|--:|--:|--:|--:|--:|"]
    for length in (8, 32, 100, 200):
        ratios = []
        for tokens in (2048, 4096, 8192, 16384):
            n = max(1, tokens // length)
            w = dataclasses.replace(workload, lengths=f"fixed:{length}", global_batch_size=n)
            ms = time_encoder_ms(model, SyntheticBatches(w, seed=0).global_batch(0), repeats, warmup=1)
            ratios.append(ms / float(np.sum(fit.cost_ms(np.full(n, length)))))
        lines.append(f"| {length} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", action="append", required=True, help="a store holding the fit (repeatable)")
    ap.add_argument("--workload", default="small")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a model change")
    ap.add_argument("--sizes", default="16,32,64,128", help="samples per batch")
    ap.add_argument("--batches", type=int, default=2, help="batches per distribution and size")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per batch (median)")
    ap.add_argument("--out", default="results/encoder_model_check_cpu.md")
    ap.add_argument("--footprint", action="store_true",
                    help="also time fixed lengths at 2,048-16,384 tokens against the first fit's cost(L)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the ranks' setting: part of the fit's key
    workload = override_all(get_workload(args.workload), [tuple(kv.split("=", 1)) for kv in args.set])
    fits = {}
    for store in args.store:
        fit = load_fit(Path(store), workload, "cpu")
        if fit is None:
            raise SystemExit(f"--store {store}: no fit at {fit_path(store, workload, 'cpu')}; "
                             f"run: fsbench calibrate --workload {args.workload} --store {store}")
        fits[store] = fit
    timed = time_batches(workload, DISTRIBUTIONS, [int(s) for s in args.sizes.split(",")],
                         args.batches, args.repeats)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# Encoder cost model against jagged batches of unseen lengths ({workload.name}), this machine\n",
             f"Commit `{commit}`, torch {torch.__version__}, 1 thread. Command: `python "
             f"scripts/encoder_model_check.py {' '.join('--store ' + s for s in args.store)}`. "
             f"{len(timed)} batches ({args.batches} per distribution and size), each timed once "
             f"(median of {args.repeats}), every fit set against the same timings.\n"]
    drifts = {store: encoder_drift(workload, CALIBRATION_SEED, store)[1] for store in fits}
    for store, fit in fits.items():
        errors = np.array([fit.encoder_ms(t["batch"]) / t["ms"] - 1 for t in timed])
        own = np.array([fit.encoder_ms(t["batch"]) * drifts[store] / t["ms"] - 1 for t in timed])
        lines += [f"## `{store}` (fit of {fit.created[:19]})\n", f"Batch terms: {fit.batch_terms_text()}; "
                  f"cost(L)'s square of the {'padded' if fit.padded else 'plain'} length.\n",
                  f"- mean |error| **{100 * np.mean(np.abs(errors)):.1f}%**, within 15%: "
                  f"**{np.mean(np.abs(errors) < 0.15):.0%}**, worst {100 * np.max(np.abs(errors)):.0f}%, "
                  f"mean signed error {100 * np.mean(errors):+.1f}%.",
                  f"- the host's drift against this fit (its own preset's batches now over the fit): "
                  f"{drifts[store]:.2f}x; taken out, mean |error| **{100 * np.mean(np.abs(own)):.1f}%**, "
                  f"within 15%: **{np.mean(np.abs(own) < 0.15):.0%}**, worst {100 * np.max(np.abs(own)):.0f}%.\n",
                  "| lengths | samples | buckets | tokens | measured ms | predicted ms | error | error, drift out |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        lines += [f"| {t['lengths']} | {t['samples']} | {bucket_count(t['batch'])} | {int(t['batch'].sum())} | "
                  f"{t['ms']:.1f} | {fit.encoder_ms(t['batch']):.1f} | {100 * e:+.0f}% | {100 * o:+.0f}% |"
                  for t, e, o in zip(timed, errors, own)]
        lines.append("")
        print(f"{store}: mean |error| {100 * np.mean(np.abs(errors)):.1f}%, within 15% "
              f"{np.mean(np.abs(errors) < 0.15):.0%}, worst {100 * np.max(np.abs(errors)):.0f}%; "
              f"drift {drifts[store]:.2f}x, taken out: {100 * np.mean(np.abs(own)):.1f}%, within 15% "
              f"{np.mean(np.abs(own) < 0.15):.0%}")
    if args.footprint:
        lines += footprint_lines(workload, fits[args.store[0]], args.repeats)
        print("\n".join(lines[-7:]))
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
