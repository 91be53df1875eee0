"""Where two calibrations' predictions part: one calibration's fit with the other's
figures put in, one group at a time (encoder cost(L), batch terms, co-run, table work,
step overhead), and the `local` simulation of a run redone each time. Both stores
must hold a fit for the workload; A's collective fits are used throughout.

    python scripts/calibration_diff.py STORE_A STORE_B --set lengths=hist:FILE [--world-size 2]
(for scripts/sim_hist_check.py's stores: STORE/calibration-1 and STORE/calibration-2)
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

import torch

from fsbench.config import RunConfig
from fsbench.config_io import override_all
from fsbench.costmodel.fit import fit_path, load_fit
from fsbench.running.store import write_json_atomic
from fsbench.scaling.commcal import comm_fit_path
from fsbench.scaling.sim_inputs import CLUSTERS
from fsbench.scaling.simulate import simulate_run
from fsbench.training.trainer import trainer_options
from fsbench.workloads.presets import get_workload

GROUPS = {"encoder cost(L)": ("a", "b", "c", "lengths", "per_sample_ms"),
          "batch terms": ("batch_ms", "batch_sample_ms", "bucket_ms", "wide_ms_per_melem",
                          "wide_threshold_melem", "footprint_per_ktoken"),
          "co-run": ("corun_slowdown", "table_corun_slowdown"),
          "table work": ("table_ns_per_element", "replicated_ns_per_element"),
          "step overhead": ("step_overhead",)}


def step_ms(fit, run: RunConfig, comm: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = fit_path(tmp, run.workload, "cpu")
        path.parent.mkdir(parents=True)
        write_json_atomic(path, dataclasses.asdict(fit))
        shutil.copy(comm, path.parent)
        return simulate_run(run, CLUSTERS["local"], tmp)[0]["step_time_ms_median"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store_a")
    ap.add_argument("store_b")
    ap.add_argument("--workload", default="small")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--trainers", default="ddp,freescale")
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the fits' key: the ranks' thread count
    w = override_all(get_workload(args.workload), [tuple(kv.split("=", 1)) for kv in args.set])
    a, b = load_fit(args.store_a, w), load_fit(args.store_b, w)
    if a is None or b is None:
        raise SystemExit(f"no fit for {w.name} in {args.store_a if a is None else args.store_b}")
    comm = comm_fit_path(args.store_a)
    for trainer in args.trainers.split(","):
        run = RunConfig(workload=w, trainer=trainer, world_size=args.world_size,
                        trainer_options=trainer_options(trainer, {}))
        base = step_ms(a, run, comm)
        print(f"{trainer}: A {base:.1f} ms, B {step_ms(b, run, comm):.1f} ms; A with B's ...")
        for group, fields in GROUPS.items():
            moved = step_ms(dataclasses.replace(a, **{k: getattr(b, k) for k in fields}), run, comm)
            print(f"  {group}: {moved:.1f} ms ({moved - base:+.1f})")


if __name__ == "__main__":
    main()
